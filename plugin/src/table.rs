//! Left-aligned text tables whose column widths ignore color escapes.

use anstyle::Style;

use crate::style::Palette;

#[derive(Clone, Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<(String, Style)>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: vec![],
        }
    }

    pub fn row(&mut self, cells: Vec<(String, Style)>) {
        self.rows.push(cells);
    }

    /// Unstyled cells.
    pub fn plain_row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.into_iter().map(|c| (c, Style::new())).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Renders with `indent` spaces before every line; two spaces between columns;
    /// no trailing spaces.
    pub fn render(&self, pal: Palette, indent: usize) -> String {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut widths = vec![0usize; cols];
        let cells = std::iter::once(
            self.header
                .iter()
                .map(|h| (h.clone(), Style::new()))
                .collect::<Vec<_>>(),
        )
        .chain(self.rows.iter().cloned());
        let all: Vec<Vec<(String, Style)>> = cells.collect();
        for row in &all {
            for (i, (text, _)) in row.iter().enumerate() {
                widths[i] = widths[i].max(text.chars().count());
            }
        }
        let pad = " ".repeat(indent);
        let mut out = String::new();
        for (r, row) in all.iter().enumerate() {
            let mut line = String::new();
            for (i, (text, style)) in row.iter().enumerate() {
                let style = if r == 0 { crate::style::BOLD } else { *style };
                line.push_str(&pal.paint(text, style));
                if i + 1 < row.len() {
                    let fill = widths[i] - text.chars().count() + 2;
                    line.push_str(&" ".repeat(fill));
                }
            }
            out.push_str(&pad);
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_without_trailing_spaces() {
        let mut t = Table::new(&["NODE", "STATE"]);
        t.plain_row(vec!["node-a".into(), "Done".into()]);
        t.plain_row(vec!["b".into(), "".into()]);
        assert_eq!(
            t.render(Palette::PLAIN, 2),
            "  NODE    STATE\n  node-a  Done\n  b\n"
        );
    }

    #[test]
    fn color_escapes_do_not_shift_columns() {
        let mut t = Table::new(&["A", "B"]);
        t.row(vec![
            ("x".into(), crate::style::GREEN),
            ("y".into(), Style::new()),
        ]);
        let colored = t.render(Palette::COLOR, 0);
        let stripped: String = strip(&colored);
        assert_eq!(stripped, t.render(Palette::PLAIN, 0));
    }

    fn strip(s: &str) -> String {
        let mut out = String::new();
        let mut esc = false;
        for c in s.chars() {
            if c == '\u{1b}' {
                esc = true;
            } else if esc {
                if c == 'm' {
                    esc = false;
                }
            } else {
                out.push(c);
            }
        }
        out
    }
}
