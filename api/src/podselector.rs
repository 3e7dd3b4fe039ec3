//! `upgradePolicy.drain.podSelectorLabel`: the label-selector string grammar of
//! `kubectl -l`, limited to what the spec promises:
//! `key=value`, `key==value`, `key!=value`, `key`, `!key`, `key in (a,b)`,
//! `key notin (a,b)`, joined by commas; keys and values follow the label syntax
//! of `metav1.LabelSelector` ([`crate::validation`]). The CRD carries
//! [`POD_SELECTOR_PATTERN`], a regular expression for the same language, and
//! [`token_length_rule`], the length limits of its keys and values, so the API
//! server rejects what this parser would reject; tests keep them in agreement.

use std::collections::BTreeMap;
use std::fmt;

use crate::validation;

/// One requirement: `!key`, `key op value`, `key in|notin (values)`, `key`.
macro_rules! requirement_re {
    () => {
        concat!(
            r"!\s*",
            key_re!(),
            "|",
            key_re!(),
            r"\s*(==|=|!=)\s*",
            value_re!(),
            "|",
            key_re!(),
            r"\s+(in|notin)\s*\(\s*",
            value_re!(),
            r"(\s*,\s*",
            value_re!(),
            r")*\s*\)",
            "|",
            key_re!(),
        )
    };
}

/// RE2 pattern (used in the CRD's CEL rule) accepting exactly the strings
/// [`PodSelector::parse`] accepts, but for the length of keys and values, which
/// [`token_length_rule`] checks. Empty means "every pod".
pub const POD_SELECTOR_PATTERN: &str = concat!(
    r"^(\s*|\s*(",
    requirement_re!(),
    r")\s*(,\s*(",
    requirement_re!(),
    r")\s*)*)$"
);

/// The keys, values and keywords of a selector: maximal runs of these characters
/// (`/` appears in keys only, so a token with `/` is a prefixed key).
pub const POD_SELECTOR_TOKEN_PATTERN: &str = "[-A-Za-z0-9_./]+";

/// CEL: every key and value of the selector `self` is within the label limits
/// (a prefix of at most 253 characters; a name or value of at most 63). Together
/// with [`POD_SELECTOR_PATTERN`] this is exactly what [`PodSelector::parse`] accepts.
pub fn token_length_rule() -> String {
    use crate::validation::{LABEL_NAME_MAX_LENGTH, LABEL_PREFIX_MAX_LENGTH, cel_string};
    format!(
        "self.findAll({tokens}).all(t, t.indexOf('/') <= {LABEL_PREFIX_MAX_LENGTH} \
         && size(t) - t.indexOf('/') - 1 <= {LABEL_NAME_MAX_LENGTH})",
        tokens = cel_string(POD_SELECTOR_TOKEN_PATTERN),
    )
}

/// One requirement of a pod selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            // kubectl semantics: `k!=v` also matches pods without the key.
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        }
    }
}

/// A parsed `podSelectorLabel`; all requirements must hold (logical AND).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSelector {
    pub requirements: Vec<Requirement>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid podSelectorLabel {input:?} at byte {position}: {expected}")]
pub struct PodSelectorError {
    pub input: String,
    pub position: usize,
    pub expected: String,
}

impl PodSelector {
    /// Parses the selector grammar; an empty (or all-blank) string selects every pod.
    pub fn parse(input: &str) -> Result<Self, PodSelectorError> {
        let mut p = Parser { s: input, pos: 0 };
        let mut requirements = Vec::new();
        p.skip_ws();
        if p.at_end() {
            return Ok(Self { requirements });
        }
        loop {
            requirements.push(p.requirement()?);
            p.skip_ws();
            if p.at_end() {
                break;
            }
            p.expect_char(',', "',' between requirements or end of input")?;
        }
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for PodSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.s[self.pos..]
    }
    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }
    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }
    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }
    fn err(&self, expected: &str) -> PodSelectorError {
        PodSelectorError {
            input: self.s.to_string(),
            position: self.pos,
            expected: expected.to_string(),
        }
    }
    fn expect_char(&mut self, c: char, expected: &str) -> Result<(), PodSelectorError> {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            Ok(())
        } else {
            Err(self.err(expected))
        }
    }
    /// Scans `[A-Za-z0-9]([-A-Za-z0-9_.<extra>]*[A-Za-z0-9])?`.
    fn token(&mut self, allow_slash: bool) -> Option<String> {
        let start = self.pos;
        let body = |c: char| {
            c.is_ascii_alphanumeric()
                || c == '-'
                || c == '_'
                || c == '.'
                || (allow_slash && c == '/')
        };
        while let Some(c) = self.peek() {
            if body(c) {
                self.pos += 1;
            } else {
                break;
            }
        }
        let tok = &self.s[start..self.pos];
        let ok = tok.starts_with(|c: char| c.is_ascii_alphanumeric())
            && tok.ends_with(|c: char| c.is_ascii_alphanumeric());
        if ok {
            Some(tok.to_string())
        } else {
            self.pos = start;
            None
        }
    }
    fn key(&mut self) -> Result<String, PodSelectorError> {
        let start = self.pos;
        match self.token(true) {
            Some(k) if validation::is_label_key(&k) => Ok(k),
            _ => {
                self.pos = start;
                Err(self.err(validation::LABEL_KEY_HELP))
            }
        }
    }
    /// A value may be empty (`key=` selects pods whose label is the empty string).
    fn value(&mut self) -> Result<String, PodSelectorError> {
        let start = self.pos;
        let v = self.token(false).unwrap_or_default();
        if v.len() > validation::LABEL_VALUE_MAX_LENGTH {
            self.pos = start;
            return Err(self.err(validation::LABEL_VALUE_HELP));
        }
        Ok(v)
    }
    fn requirement(&mut self) -> Result<Requirement, PodSelectorError> {
        self.skip_ws();
        if self.peek() == Some('!') {
            self.pos += 1;
            self.skip_ws();
            return Ok(Requirement::NotExists(self.key()?));
        }
        let key = self.key()?;
        let before_ws = self.pos;
        self.skip_ws();
        let rest = self.rest();
        if let Some(r) = rest.strip_prefix("!=") {
            self.pos = self.s.len() - r.len();
            self.skip_ws();
            return Ok(Requirement::NotEquals(key, self.value()?));
        }
        if let Some(r) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
            self.pos = self.s.len() - r.len();
            self.skip_ws();
            return Ok(Requirement::Equals(key, self.value()?));
        }
        let had_ws = self.pos > before_ws;
        for (word, notin) in [("notin", true), ("in", false)] {
            if had_ws && rest.starts_with(word) && rest[word.len()..].trim_start().starts_with('(')
            {
                self.pos += word.len();
                self.skip_ws();
                self.expect_char('(', "'(' after in/notin")?;
                let mut values = Vec::new();
                loop {
                    self.skip_ws();
                    values.push(self.value()?);
                    self.skip_ws();
                    match self.peek() {
                        Some(',') => self.pos += 1,
                        Some(')') => {
                            self.pos += 1;
                            break;
                        }
                        _ => return Err(self.err("',' or ')' in a value list")),
                    }
                }
                return Ok(if notin {
                    Requirement::NotIn(key, values)
                } else {
                    Requirement::In(key, values)
                });
            }
        }
        self.pos = before_ws;
        Ok(Requirement::Exists(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::labels;

    #[test]
    fn parses_every_form_of_the_grammar() {
        let cases: &[(&str, Vec<Requirement>)] = &[
            ("", vec![]),
            (
                "app=train",
                vec![Requirement::Equals("app".into(), "train".into())],
            ),
            (
                "app==train",
                vec![Requirement::Equals("app".into(), "train".into())],
            ),
            (
                "app != train",
                vec![Requirement::NotEquals("app".into(), "train".into())],
            ),
            (
                "tenstorrent.com/job",
                vec![Requirement::Exists("tenstorrent.com/job".into())],
            ),
            ("!batch", vec![Requirement::NotExists("batch".into())]),
            (
                "tier in (a, b)",
                vec![Requirement::In("tier".into(), vec!["a".into(), "b".into()])],
            ),
            (
                "tier notin (a,b),x",
                vec![
                    Requirement::NotIn("tier".into(), vec!["a".into(), "b".into()]),
                    Requirement::Exists("x".into()),
                ],
            ),
            ("in", vec![Requirement::Exists("in".into())]),
        ];
        for (input, want) in cases {
            let got = PodSelector::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
            assert_eq!(&got.requirements, want, "input {input:?}");
        }
    }

    #[test]
    fn rejects_malformed_selectors_with_position() {
        let long_value = format!("a={}", "v".repeat(64));
        let long_name = format!("{}=v", "k".repeat(64));
        let long_prefix = format!("{}/k", "p".repeat(254));
        let long_in = format!("a in (b,{})", "v".repeat(64));
        for input in [
            "=x",
            "a b",
            "a in b",
            "a in (b",
            "-a",
            "a,",
            "a=(b)",
            "a notin",
            "a/b/c",
            "Example.com/a",
            "!a./b",
            &long_value,
            &long_name,
            &long_prefix,
            &long_in,
        ] {
            let err = PodSelector::parse(input).expect_err(input);
            assert_eq!(err.input, input);
            assert!(
                err.to_string().contains("invalid podSelectorLabel"),
                "{err}"
            );
        }
    }

    #[test]
    fn keys_and_values_at_the_label_limits_parse() {
        let input = format!(
            "{p}/{n}={v},{n} in ({v}),!{p}/{n}",
            p = format!("{}.{}", "p".repeat(126), "q".repeat(126)),
            n = "n".repeat(63),
            v = "v".repeat(63)
        );
        let sel = PodSelector::parse(&input).expect("at the limits");
        assert_eq!(sel.requirements.len(), 3);
    }

    #[test]
    fn matching_follows_kubectl_semantics() {
        let sel = PodSelector::parse("app=train,tier notin (dev),!skip").expect("valid");
        assert!(sel.matches(&labels(&[("app", "train")])));
        assert!(sel.matches(&labels(&[("app", "train"), ("tier", "prod")])));
        assert!(!sel.matches(&labels(&[("app", "train"), ("tier", "dev")])));
        assert!(!sel.matches(&labels(&[("app", "train"), ("skip", "")])));
        assert!(!sel.matches(&labels(&[("app", "infer")])));
        assert!(PodSelector::parse("").expect("empty").matches(&labels(&[])));
        let ne = PodSelector::parse("app!=x").expect("valid");
        assert!(ne.matches(&labels(&[])));
    }

    #[test]
    fn display_round_trips() {
        for input in [
            "app=train",
            "a!=b",
            "k",
            "!k",
            "k in (a,b)",
            "k notin (a),z=1",
        ] {
            let sel = PodSelector::parse(input).expect(input);
            assert_eq!(PodSelector::parse(&sel.to_string()).expect("reparse"), sel);
        }
    }

    /// The CRD's regular expression and this parser must accept the same language.
    #[test]
    fn crd_pattern_agrees_with_parser() {
        let re = regex::Regex::new(POD_SELECTOR_PATTERN).expect("pattern compiles");
        let corpus = [
            "",
            " ",
            "a",
            "a=b",
            "a==b",
            "a!=b",
            "a=",
            "!a",
            "! a",
            "a in (b)",
            "a in (b, c)",
            "a notin (b,c)",
            "a in ()",
            "a,b",
            "a , b=c",
            "x.y/z=1",
            "a b",
            "=x",
            "a in b",
            "a in (b",
            "-a",
            "a-",
            "a,",
            ",a",
            "a=(b)",
            "a notin",
            "a=b=c",
            "a in (b),",
            "a!b",
            "a in(b)",
            "ain (b)",
            "a=b c",
            "a==",
            "!",
            "a/b/c",
            "a_b.c-d=e_f.g-h",
        ];
        for input in corpus {
            assert_eq!(
                re.is_match(input),
                PodSelector::parse(input).is_ok(),
                "pattern and parser disagree on {input:?}"
            );
        }
    }
}
