//! Property tests of `spec.version` as the API server validates it: the CRD's
//! pattern (read from the generated CRD, not copied) against a reference
//! definition of `MAJOR.MINOR.PATCH`, and what such a version becomes
//! downstream (git tag, node label value). The agent's side (its own validation
//! and comparison with sysfs) is property-tested in `agent/tests/proptest_parsers.rs`.

use std::sync::LazyLock;

use kube::CustomResourceExt;
use proptest::prelude::*;
use regex::Regex;
use ttdrv_api::TenstorrentDriverPolicy;

static PATTERN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&crd_version_pattern()).expect("compiles"));

/// `spec.version.pattern` of the generated CRD.
fn crd_version_pattern() -> String {
    let crd = serde_json::to_value(TenstorrentDriverPolicy::crd()).expect("CRD serializes");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["version"]["pattern"]
        .as_str()
        .expect("spec.version has a pattern")
        .to_string()
}

/// Reference: three non-empty runs of ASCII digits joined by dots, nothing else.
fn reference(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// A Kubernetes label value (the agent labels the node with the loaded version).
fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()))
}

fn version_like() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "0", "1", "2", "8", "10", "007", ".", ".", "-rc1", "v", " ", "\n", "a", "+", "٣", "１",
        ]),
        0..9,
    )
    .prop_map(|v| v.concat())
}

#[test]
fn crd_carries_the_spec_pattern() {
    assert_eq!(crd_version_pattern(), r"^[0-9]+\.[0-9]+\.[0-9]+$");
}

#[test]
fn known_examples() {
    let re = &*PATTERN;
    for ok in ["2.8.0", "0.0.0", "10.20.30", "02.8.0"] {
        assert!(re.is_match(ok), "{ok}");
    }
    for bad in [
        "",
        "2.8",
        "2.8.0.1",
        "v2.8.0",
        "2.8.0-rc1",
        " 2.8.0",
        "2.8.0\n",
        "2..0",
        "٣.1.1",
        "2.8.x",
    ] {
        assert!(!re.is_match(bad), "{bad:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn pattern_is_exactly_major_minor_patch(s in version_like()) {
        let re = &*PATTERN;
        prop_assert_eq!(re.is_match(&s), reference(&s), "{:?}", s);
    }

    #[test]
    fn pattern_is_exactly_major_minor_patch_on_any_input(s in any::<String>()) {
        let re = &*PATTERN;
        prop_assert_eq!(re.is_match(&s), reference(&s), "{:?}", s);
    }

    /// Every admitted version of realistic size (each part at most 9 digits, what
    /// the agent accepts) makes a valid git ref suffix and a valid label value.
    #[test]
    fn admitted_versions_are_usable_downstream(a in "[0-9]{1,9}", b in "[0-9]{1,9}", c in "[0-9]{1,9}") {
        let v = format!("{a}.{b}.{c}");
        let re = &*PATTERN;
        prop_assert!(re.is_match(&v));
        prop_assert!(label_value_ok(&v), "{} is not a label value", v);
        let tag = format!("ttkmd-{v}");
        prop_assert!(!tag.contains("..") && !tag.ends_with('.') && !tag.contains(char::is_whitespace));
    }

    /// The pattern has no length limit: versions of more than 63 characters are
    /// admitted although no node label can carry them. The agent refuses parts of
    /// more than 9 digits with a clear error (see docs/reliability.md); this test
    /// pins down that the API server alone does not stop them.
    #[test]
    fn overlong_versions_pass_the_pattern_but_are_not_label_values(a in "[1-9][0-9]{61,70}") {
        let v = format!("{a}.0.0");
        let re = &*PATTERN;
        prop_assert!(re.is_match(&v));
        prop_assert!(!label_value_ok(&v));
    }

    /// A spec whose version the pattern admits survives a serde round trip unchanged.
    #[test]
    fn spec_round_trips(a in "[0-9]{1,4}", b in "[0-9]{1,4}", c in "[0-9]{1,4}") {
        let v = format!("{a}.{b}.{c}");
        let yaml = format!("version: \"{v}\"\nnodeAffinity: {{}}\n");
        let spec: ttdrv_api::TenstorrentDriverPolicySpec = serde_yaml::from_str(&yaml).expect("parses");
        prop_assert_eq!(&spec.version, &v);
        let back: ttdrv_api::TenstorrentDriverPolicySpec =
            serde_json::from_value(serde_json::to_value(&spec).expect("to json")).expect("from json");
        prop_assert_eq!(back.version, v);
    }
}
