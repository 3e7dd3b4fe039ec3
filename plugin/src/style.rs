//! Colors: only on a terminal, never when `NO_COLOR` is set (https://no-color.org).

use anstyle::{AnsiColor, Style};
use ttdrv_api::NodeState;

/// `--color` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

/// Decides whether to color. `NO_COLOR` (set and non-empty) wins over `auto` and
/// `always` alike; `auto` colors only a terminal.
pub fn use_color(choice: ColorChoice, is_terminal: bool, no_color: Option<&str>) -> bool {
    if no_color.is_some_and(|v| !v.is_empty()) {
        return false;
    }
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => is_terminal,
    }
}

/// Applies styles, or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Palette {
    pub color: bool,
}

pub const GREEN: Style = Style::new().fg_color(Some(anstyle::Color::Ansi(AnsiColor::Green)));
pub const RED: Style = Style::new()
    .fg_color(Some(anstyle::Color::Ansi(AnsiColor::Red)))
    .bold();
pub const YELLOW: Style = Style::new().fg_color(Some(anstyle::Color::Ansi(AnsiColor::Yellow)));
pub const CYAN: Style = Style::new().fg_color(Some(anstyle::Color::Ansi(AnsiColor::Cyan)));
pub const BLUE: Style = Style::new().fg_color(Some(anstyle::Color::Ansi(AnsiColor::Blue)));
pub const DIM: Style = Style::new().dimmed();
pub const BOLD: Style = Style::new().bold();

impl Palette {
    pub const PLAIN: Palette = Palette { color: false };
    pub const COLOR: Palette = Palette { color: true };

    pub fn paint(&self, text: &str, style: Style) -> String {
        if self.color && style != Style::new() {
            format!("{}{text}{}", style.render(), style.render_reset())
        } else {
            text.to_string()
        }
    }
}

/// Style of a node state; host-managed nodes (Done, left alone) are blue.
pub fn state_style(state: NodeState, host_managed: bool) -> Style {
    match state {
        NodeState::Done if host_managed => BLUE,
        NodeState::Done => GREEN,
        NodeState::Failed | NodeState::UnloadFailed => RED,
        NodeState::Pending => DIM,
        NodeState::Cordoning | NodeState::Uncordoning => CYAN,
        NodeState::Draining | NodeState::Upgrading | NodeState::Unloading => YELLOW,
        // Vacated for DKMS (`spec.unmanage`): left alone, as host-managed.
        NodeState::Unmanaged => BLUE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_color_wins_and_auto_follows_the_terminal() {
        assert!(use_color(ColorChoice::Auto, true, None));
        assert!(!use_color(ColorChoice::Auto, false, None));
        assert!(!use_color(ColorChoice::Auto, true, Some("1")));
        assert!(!use_color(ColorChoice::Always, true, Some("1")));
        assert!(
            use_color(ColorChoice::Auto, true, Some("")),
            "an empty NO_COLOR is ignored"
        );
        assert!(use_color(ColorChoice::Always, false, None));
        assert!(!use_color(ColorChoice::Never, true, None));
    }

    #[test]
    fn plain_palette_adds_no_escapes() {
        assert_eq!(Palette::PLAIN.paint("Done", GREEN), "Done");
        let c = Palette::COLOR.paint("Done", GREEN);
        assert!(c.starts_with('\u{1b}') && c.contains("Done") && c.ends_with('m'));
    }
}
