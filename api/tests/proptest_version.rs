//! Property tests of `spec.version` as the API server validates it: the CRD's
//! pattern (read from the generated CRD, not copied) against a reference
//! definition of `MAJOR.MINOR.PATCH` with at most 9 digits per part, and against
//! `validation::is_valid_version` (the agent's check: one definition), and what
//! such a version becomes downstream (git tag, node label value). The agent's
//! side (trimming, comparison with sysfs) is property-tested in
//! `agent/tests/proptest_parsers.rs`.

use std::sync::LazyLock;

use kube::CustomResourceExt;
use proptest::prelude::*;
use regex::Regex;
use ttdrv_api::TenstorrentDriverPolicy;
use ttdrv_api::validation::{
    INVALID_VERSION_EXAMPLES, VALID_VERSION_EXAMPLES, VERSION_MAX_LENGTH, is_valid_version,
    version_pattern,
};

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

/// Reference: three runs of 1 to 9 ASCII digits joined by dots, nothing else.
fn reference(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| (1..=9).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
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
            "0",
            "1",
            "2",
            "8",
            "10",
            "007",
            "12345",
            "123456789",
            ".",
            ".",
            "-rc1",
            "v",
            " ",
            "\n",
            "a",
            "+",
            "٣",
            "１",
        ]),
        0..9,
    )
    .prop_map(|v| v.concat())
}

#[test]
fn crd_carries_the_spec_pattern() {
    assert_eq!(crd_version_pattern(), version_pattern());
    assert_eq!(
        crd_version_pattern(),
        r"^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}$"
    );
    let crd = serde_json::to_value(TenstorrentDriverPolicy::crd()).expect("CRD serializes");
    assert_eq!(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["version"]["maxLength"],
        VERSION_MAX_LENGTH
    );
}

#[test]
fn known_examples() {
    let re = &*PATTERN;
    for ok in VALID_VERSION_EXAMPLES {
        assert!(re.is_match(ok), "{ok}");
    }
    for bad in INVALID_VERSION_EXAMPLES {
        assert!(!re.is_match(bad), "{bad:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn pattern_is_exactly_major_minor_patch(s in version_like()) {
        let re = &*PATTERN;
        prop_assert_eq!(re.is_match(&s), reference(&s), "{:?}", s);
        prop_assert_eq!(is_valid_version(&s), reference(&s), "{:?}", s);
    }

    #[test]
    fn pattern_is_exactly_major_minor_patch_on_any_input(s in any::<String>()) {
        let re = &*PATTERN;
        prop_assert_eq!(re.is_match(&s), reference(&s), "{:?}", s);
        prop_assert_eq!(is_valid_version(&s), reference(&s), "{:?}", s);
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

    /// A part of 10 digits or more (which the agent would refuse after the node
    /// is drained) is refused by the API server: same rule, one definition.
    #[test]
    fn overlong_parts_are_refused(a in "[0-9]{10,70}", b in "[0-9]{1,9}", pos in 0usize..3) {
        let mut parts = [b.as_str(); 3];
        parts[pos] = &a;
        let v = parts.join(".");
        let re = &*PATTERN;
        prop_assert!(!re.is_match(&v));
        prop_assert!(!is_valid_version(&v));
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
