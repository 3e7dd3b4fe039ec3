//! The regular expressions and CEL rules of `ttdrv_api::validation`, checked in
//! Rust: the label rules (as the CRD evaluates them) accept exactly what the Rust
//! checks accept (`is_label_key`, `is_label_value`, which the `podSelectorLabel`
//! parser uses), and the image and source repository patterns accept the
//! references people use and refuse malformed ones. The API server's own verdict
//! on the same rules is tested in `tests/cluster_validation.rs`.

use std::sync::LazyLock;

use proptest::prelude::*;
use regex::Regex;
use ttdrv_api::validation::{
    IMAGE_PATTERN, LABEL_KEY_MAX_LENGTH, LABEL_KEY_PATTERN, LABEL_NAME_MAX_LENGTH,
    LABEL_PREFIX_MAX_LENGTH, LABEL_VALUE_MAX_LENGTH, LABEL_VALUE_PATTERN, SECRET_NAME_PATTERN,
    SOURCE_REPOSITORY_PATTERN, cel_string, is_label_key, is_label_value, label_key_rule,
    label_value_rule,
};

fn re(p: &str) -> Regex {
    Regex::new(p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

static KEY: LazyLock<Regex> = LazyLock::new(|| re(LABEL_KEY_PATTERN));
static VALUE: LazyLock<Regex> = LazyLock::new(|| re(LABEL_VALUE_PATTERN));
static IMAGE: LazyLock<Regex> = LazyLock::new(|| re(IMAGE_PATTERN));
static REPO: LazyLock<Regex> = LazyLock::new(|| re(SOURCE_REPOSITORY_PATTERN));

/// [`label_key_rule`] evaluated in Rust (CEL `size` and `indexOf` count code points).
fn key_rule(k: &str) -> bool {
    let size = k.chars().count() as i64;
    let slash = k.chars().position(|c| c == '/').map_or(-1, |i| i as i64);
    size <= LABEL_KEY_MAX_LENGTH as i64
        && KEY.is_match(k)
        && slash <= LABEL_PREFIX_MAX_LENGTH as i64
        && size - slash - 1 <= LABEL_NAME_MAX_LENGTH as i64
}

/// [`label_value_rule`] evaluated in Rust.
fn value_rule(v: &str) -> bool {
    v.chars().count() <= LABEL_VALUE_MAX_LENGTH && VALUE.is_match(v)
}

#[test]
fn the_cel_rules_are_the_ones_mirrored_here() {
    let k = label_key_rule("k");
    for part in [
        format!("size(k) <= {LABEL_KEY_MAX_LENGTH}"),
        format!("k.matches({})", cel_string(LABEL_KEY_PATTERN)),
        format!("k.indexOf('/') <= {LABEL_PREFIX_MAX_LENGTH}"),
        format!("size(k) - k.indexOf('/') - 1 <= {LABEL_NAME_MAX_LENGTH}"),
    ] {
        assert!(k.contains(&part), "{k} lacks {part}");
    }
    let v = label_value_rule("v");
    for part in [
        format!("size(v) <= {LABEL_VALUE_MAX_LENGTH}"),
        format!("v.matches({})", cel_string(LABEL_VALUE_PATTERN)),
    ] {
        assert!(v.contains(&part), "{v} lacks {part}");
    }
}

#[test]
fn label_examples() {
    let prefix = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    let name = "n".repeat(63);
    for ok in [
        "a".to_string(),
        "tt.tenstorrent.com/pool".into(),
        "feature.node.kubernetes.io/pci-1200_1e52.present".into(),
        "Upper_Case.name".into(),
        name.clone(),
        format!("{prefix}/{name}"),
    ] {
        assert!(key_rule(&ok) && is_label_key(&ok), "{ok}");
    }
    for bad in [
        String::new(),
        "bad key!".into(),
        "a/b/c".into(),
        "Example.com/a".into(),
        "-a".into(),
        format!("{name}n"),
        format!("{prefix}c/a"),
        format!("a/{name}n"),
    ] {
        assert!(!key_rule(&bad) && !is_label_key(&bad), "{bad}");
    }
}

fn key_like() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(
            prop::sample::select(vec![
                "a",
                "Z",
                "0",
                "-",
                "_",
                ".",
                "/",
                " ",
                "é",
                "ab.cd",
                "x-y",
                "example.com/",
            ]),
            0..8,
        )
        .prop_map(|v| v.concat()),
        // Around the length limits: prefix 250..=256, name 60..=66.
        (250usize..=256, 60usize..=66, any::<bool>()).prop_map(|(p, n, with_prefix)| {
            let name = "n".repeat(n);
            if with_prefix {
                format!("{}.{}/{name}", "p".repeat(p / 2), "q".repeat(p - p / 2 - 1))
            } else {
                name
            }
        }),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn key_rule_is_is_label_key(k in key_like()) {
        prop_assert_eq!(key_rule(&k), is_label_key(&k), "{:?}", k);
    }

    #[test]
    fn value_rule_is_is_label_value(v in key_like()) {
        prop_assert_eq!(value_rule(&v), is_label_value(&v), "{:?}", v);
    }
}

#[test]
fn image_references() {
    let digest = "a".repeat(64);
    for ok in [
        "ubuntu".to_string(),
        "ubuntu:22.04".into(),
        "library/ubuntu".into(),
        "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:sha-abc1234".into(),
        "localhost:5000/ttdrv/agent:dev".into(),
        "registry.example.internal:443/a/b/c:v1.2.3".into(),
        "[fd00::1]:5000/agent:1".into(),
        "Registry.Example.com/agent:Latest_1".into(),
        "my_repo/agent__x".into(),
        format!("ghcr.io/tenstorrent/agent@sha256:{digest}"),
        format!("ghcr.io/tenstorrent/agent:v1@sha256:{digest}"),
        format!("ghcr.io/tenstorrent/agent@sha512:{}", "0".repeat(128)),
    ] {
        assert!(IMAGE.is_match(&ok), "{ok}");
    }
    for bad in [
        String::new(),
        " ubuntu".into(),
        "ubuntu ".into(),
        "ghcr.io/x/y:tag with space".into(),
        "ghcr.io/x/y\n".into(),
        "ghcr.io/Tenstorrent/agent".into(),
        "ghcr.io/x/y:".into(),
        "ghcr.io/x/y:-tag".into(),
        format!("ghcr.io/x/y:{}", "t".repeat(129)),
        "ghcr.io/x/y@sha256:abc".into(),
        format!("ghcr.io/x/y@md5:{digest}"),
        format!("ghcr.io/x/y@sha256:{}", "A".repeat(64)),
        "ghcr.io//y".into(),
        "-ghcr.io/y".into(),
        "ghcr.io/y/".into(),
        "https://ghcr.io/y".into(),
        "y:1:2".into(),
    ] {
        assert!(!IMAGE.is_match(&bad), "{bad:?}");
    }
}

#[test]
fn source_repositories() {
    for ok in [
        "https://github.com/tenstorrent/tt-kmd.git",
        "https://git.example.internal/mirrors/tt-kmd.git",
        "https://git.example.internal:8443/tt-kmd",
        "https://user:token@git.example.internal/tt-kmd.git",
        "https://github.com",
        "https://[fd00::1]/tt-kmd.git",
        "ssh://git@github.com/tenstorrent/tt-kmd.git",
        "ssh://git.example.internal:2222/srv/tt-kmd.git",
        "git@github.com:tenstorrent/tt-kmd.git",
        "deploy-bot@git.example.internal:/srv/git/tt-kmd.git",
    ] {
        assert!(REPO.is_match(ok), "{ok}");
    }
    for bad in [
        "",
        "http://github.com/tenstorrent/tt-kmd.git",
        "git://github.com/tenstorrent/tt-kmd.git",
        "file:///srv/tt-kmd.git",
        "ftp://x",
        "not a url",
        "/srv/tt-kmd.git",
        "https://github.com/tenstorrent/tt-kmd.git\n",
        "https://github.com/tenstorrent/tt kmd.git",
        "https://github.com/tenstorrent/tt-kmd.git\u{7f}",
        "https://github.com/tenstorrent/tt-kmd.git\u{85}",
        "https://github.com/\ttt-kmd.git",
        "https:///path",
        "https://-host/x",
        "ssh://-oProxyCommand=x/y",
        "-oProxyCommand=x@host:path",
        "git@-host:path",
        "git@github.com:",
        "git@github.com",
        "HTTPS://github.com/x",
    ] {
        assert!(!REPO.is_match(bad), "{bad:?}");
    }
}

#[test]
fn signing_secret_names() {
    let name = re(SECRET_NAME_PATTERN);
    for ok in ["module-signing", "mok", "a", "mok.fleet-1", "0key"] {
        assert!(name.is_match(ok), "{ok} refused");
    }
    for bad in [
        "",
        "Module-Signing",
        "-mok",
        "mok-",
        "mok..a",
        ".mok",
        "mok/key",
        "mok key",
        "mok_key",
        "mok\n",
    ] {
        assert!(!name.is_match(bad), "{bad:?} accepted");
    }
}
