//! Property tests of the `podSelectorLabel` parser (`PodSelector::parse`) and of
//! its agreement with the CRD's rules: the regular expression
//! (`POD_SELECTOR_PATTERN`) and the length limits of keys and values
//! (`token_length_rule`, mirrored here by [`tokens_fit`]).
//!
//! - the parser never panics, whatever the input, and reports an error position
//!   inside the input on a character boundary;
//! - every selector built from the grammar prints and parses back to itself,
//!   whatever whitespace surrounds its tokens;
//! - printing is a normal form: parse(print(parse(s))) == parse(s);
//! - the pattern (Rust `regex`, Unicode `\s` like the parser's `char::is_whitespace`)
//!   and the length rule accept exactly what the parser accepts, on grammar-shaped
//!   and on arbitrary input;
//! - the pattern as the API server evaluates it (RE2: `\s` is `[\t\n\f\r ]`)
//!   accepts nothing the parser rejects, so an admitted policy never fails to parse.

use std::sync::LazyLock;

use proptest::prelude::*;
use regex::Regex;
use ttdrv_api::podselector::{
    POD_SELECTOR_PATTERN, POD_SELECTOR_TOKEN_PATTERN, PodSelector, Requirement, token_length_rule,
};
use ttdrv_api::validation::{LABEL_NAME_MAX_LENGTH, LABEL_PREFIX_MAX_LENGTH};

static PATTERN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(POD_SELECTOR_PATTERN).expect("pattern compiles"));
static RE2_PATTERN: LazyLock<Regex> = LazyLock::new(|| {
    let ascii = POD_SELECTOR_PATTERN.replace(r"\s", r"[\t\n\x0C\r ]");
    Regex::new(&ascii).expect("RE2-flavoured pattern compiles")
});

static TOKENS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(POD_SELECTOR_TOKEN_PATTERN).expect("token pattern compiles"));

fn pattern() -> &'static Regex {
    &PATTERN
}

/// The CEL rule of [`token_length_rule`], evaluated in Rust: every token has a
/// prefix (before `/`) of at most 253 characters and a name of at most 63.
/// Tokens are ASCII, so byte and code-point positions agree.
fn tokens_fit(s: &str) -> bool {
    TOKENS.find_iter(s).all(|m| {
        let t = m.as_str();
        let slash = t.find('/').map_or(-1, |i| i as i64);
        let size = t.len() as i64;
        slash <= LABEL_PREFIX_MAX_LENGTH as i64 && size - slash - 1 <= LABEL_NAME_MAX_LENGTH as i64
    })
}

/// What the API server admits: the pattern and the length rule.
fn admitted(s: &str) -> bool {
    pattern().is_match(s) && tokens_fit(s)
}

#[test]
fn the_crd_rule_is_the_one_mirrored_here() {
    let rule = token_length_rule();
    assert!(
        rule.contains(&format!("t.indexOf('/') <= {LABEL_PREFIX_MAX_LENGTH}")),
        "{rule}"
    );
    assert!(
        rule.contains(&format!(
            "size(t) - t.indexOf('/') - 1 <= {LABEL_NAME_MAX_LENGTH}"
        )),
        "{rule}"
    );
    assert!(rule.contains("findAll('[-A-Za-z0-9_./]+')"), "{rule}");
}

/// The pattern with RE2's (Go's) ASCII meaning of `\s`, as the API server applies it.
fn re2_pattern() -> &'static Regex {
    &RE2_PATTERN
}

/// Valid label keys (`metav1` qualified names).
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9]",
        "[A-Za-z0-9][-A-Za-z0-9_.]{0,20}[A-Za-z0-9]",
        "[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,2}/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
        // Keywords are valid keys too.
        Just("in".to_string()),
        Just("notin".to_string()),
        Just("tenstorrent.com/job".to_string()),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[A-Za-z0-9]",
        "[A-Za-z0-9][-A-Za-z0-9_.]{0,20}[A-Za-z0-9]",
        "[A-Za-z0-9][-A-Za-z0-9_.]{61}[A-Za-z0-9]",
    ]
}

fn requirement() -> impl Strategy<Value = Requirement> {
    prop_oneof![
        (key(), value()).prop_map(|(k, v)| Requirement::Equals(k, v)),
        (key(), value()).prop_map(|(k, v)| Requirement::NotEquals(k, v)),
        key().prop_map(Requirement::Exists),
        key().prop_map(Requirement::NotExists),
        (key(), prop::collection::vec(value(), 1..4)).prop_map(|(k, v)| Requirement::In(k, v)),
        (key(), prop::collection::vec(value(), 1..4)).prop_map(|(k, v)| Requirement::NotIn(k, v)),
    ]
}

fn selector() -> impl Strategy<Value = PodSelector> {
    prop::collection::vec(requirement(), 0..5).prop_map(|requirements| PodSelector { requirements })
}

/// Whitespace the parser skips (Unicode White_Space), including non-ASCII.
fn ws() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            ' ', '\t', '\n', '\r', '\u{0B}', '\u{0C}', '\u{A0}', '\u{2003}',
        ]),
        0..3,
    )
    .prop_map(|v| v.into_iter().collect())
}

/// Renders a selector with whitespace `w[i]` around each token (where allowed).
fn render_spaced(sel: &PodSelector, w: &[String]) -> String {
    let mut i = 0;
    let mut next = || {
        i += 1;
        w[i % w.len()].clone()
    };
    let mut parts = Vec::new();
    for r in &sel.requirements {
        let s = match r {
            Requirement::Equals(k, v) => format!("{}{k}{}={}{v}{}", next(), next(), next(), next()),
            Requirement::NotEquals(k, v) => {
                format!("{}{k}{}!={}{v}{}", next(), next(), next(), next())
            }
            Requirement::Exists(k) => format!("{}{k}{}", next(), next()),
            Requirement::NotExists(k) => format!("{}!{}{k}{}", next(), next(), next()),
            Requirement::In(k, vs) | Requirement::NotIn(k, vs) => {
                let op = if matches!(r, Requirement::In(..)) {
                    "in"
                } else {
                    "notin"
                };
                // `in`/`notin` needs at least one blank before it.
                let vals: Vec<String> = vs
                    .iter()
                    .map(|v| format!("{}{v}{}", next(), next()))
                    .collect();
                format!(
                    "{}{k} {}{op}{}({}){}",
                    next(),
                    next(),
                    next(),
                    vals.join(","),
                    next()
                )
            }
        };
        parts.push(s);
    }
    parts.join(",")
}

/// Strings over the selector's alphabet, so that many are near-valid.
fn selector_like() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a",
            "b",
            "Z",
            "0",
            "9",
            "-",
            "_",
            ".",
            "/",
            "=",
            "==",
            "!=",
            "!",
            ",",
            "(",
            ")",
            " ",
            "\t",
            "in",
            "notin",
            " in ",
            " notin ",
            "\u{A0}",
            "é",
            "\u{0B}",
            // Long runs, so that the length limits of keys and values are reached.
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "p.example.com/",
        ]),
        0..14,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_and_errors_point_into_the_input(s in any::<String>()) {
        if let Err(e) = PodSelector::parse(&s) {
            prop_assert_eq!(&e.input, &s);
            prop_assert!(e.position <= s.len(), "position {} beyond {}", e.position, s.len());
            prop_assert!(s.is_char_boundary(e.position));
        }
    }

    #[test]
    fn printed_selectors_parse_back_to_themselves(sel in selector()) {
        let text = sel.to_string();
        let back = PodSelector::parse(&text);
        prop_assert_eq!(back.as_ref(), Ok(&sel), "printed as {:?}", text);
        prop_assert!(admitted(&text), "the CRD rules reject {:?}", text);
        prop_assert!(re2_pattern().is_match(&text), "RE2 pattern rejects {:?}", text);
    }

    #[test]
    fn whitespace_around_tokens_does_not_change_the_meaning(
        sel in selector(),
        w in prop::collection::vec(ws(), 1..6),
    ) {
        let text = render_spaced(&sel, &w);
        let back = PodSelector::parse(&text);
        prop_assert_eq!(back.as_ref(), Ok(&sel), "rendered as {:?}", text);
        prop_assert!(admitted(&text), "the CRD rules reject {:?}", text);
    }

    #[test]
    fn printing_is_a_normal_form(s in selector_like()) {
        if let Ok(sel) = PodSelector::parse(&s) {
            let printed = sel.to_string();
            prop_assert_eq!(PodSelector::parse(&printed), Ok(sel), "{:?} printed as {:?}", s, printed);
        }
    }

    #[test]
    fn pattern_agrees_with_parser_on_selector_like_input(s in selector_like()) {
        prop_assert_eq!(
            admitted(&s),
            PodSelector::parse(&s).is_ok(),
            "CRD rules and parser disagree on {:?}", s
        );
    }

    #[test]
    fn pattern_agrees_with_parser_on_arbitrary_input(s in any::<String>()) {
        prop_assert_eq!(
            admitted(&s),
            PodSelector::parse(&s).is_ok(),
            "CRD rules and parser disagree on {:?}", s
        );
    }

    /// What the API server admits (RE2 semantics) the controller can parse.
    #[test]
    fn server_admitted_selectors_always_parse(s in selector_like()) {
        if re2_pattern().is_match(&s) && tokens_fit(&s) {
            prop_assert!(PodSelector::parse(&s).is_ok(), "admitted but unparsable: {:?}", s);
        }
    }
}
