//! What a `TenstorrentDriverPolicy` may contain, defined once: the CRD's schema
//! (OpenAPI bounds and the CEL rules built here) and the Rust code that checks
//! the same things (the agent's version check, the `podSelectorLabel` parser)
//! are generated from these constants and functions, so the API server refuses
//! exactly what the controller and the agent could not use.
//!
//! Bounds (also in docs/crd-reference.md):
//!
//! | what | bound | why |
//! |---|---|---|
//! | `metadata.name` | [`POLICY_NAME_MAX_LENGTH`] = 63 | it is the value of the label `driver.tenstorrent.com/policy` on the installer pods and on the claimed nodes; `ttdrv-<name>` (≤ 69) names the DaemonSet |
//! | `spec.version` | [`VERSION_PART_MAX_DIGITS`] = 9 digits per part | the agent's limit (a part fits a 32-bit integer) |
//! | label keys | prefix ≤ 253, name ≤ 63 ([`LABEL_KEY_MAX_LENGTH`] = 317) | `metav1.LabelSelector` |
//! | label values | [`LABEL_VALUE_MAX_LENGTH`] = 63 | `metav1.LabelSelector` |
//! | `matchLabels` | [`MATCH_LABELS_MAX`] = 64 entries | bounded size |
//! | `matchExpressions` | [`MATCH_EXPRESSIONS_MAX`] = 32 requirements | bounded size |
//! | `matchExpressions[].values` | [`SELECTOR_VALUES_MAX`] = 128 values | bounded size |
//! | `podSelectorLabel` | [`POD_SELECTOR_MAX_LENGTH`] = 1024 characters | bounded size |
//! | `installer.image` | [`IMAGE_MAX_LENGTH`] = 512 characters | bounded size |
//! | `installer.sourceRepository` | [`SOURCE_REPOSITORY_MAX_LENGTH`] = 2048 characters | bounded size |
//! | `promoteAfter.policy` | [`POLICY_NAME_MAX_LENGTH`] = 63, [`DNS_SUBDOMAIN_PATTERN`] | a policy's name; not this policy's own (CEL at the root) |
//! | `promoteAfter.soakSeconds` | 0 to [`SOAK_SECONDS_MAX`] = 604800 (7 days) | bounded wait |
//!
//! With these bounds the largest admissible spec is about 300 KB (32 × 128
//! values of 63 characters dominate), far below the API server's 1.5 MB.

/// Most digits in one part of `MAJOR.MINOR.PATCH`. The agent refuses longer
/// parts; the CRD's `spec.version` pattern is built from the same constant.
pub const VERSION_PART_MAX_DIGITS: usize = 9;
/// Longest admissible `spec.version`: three parts and two dots.
pub const VERSION_MAX_LENGTH: usize = 3 * VERSION_PART_MAX_DIGITS + 2;

/// Longest policy name: the name is a label value (`driver.tenstorrent.com/policy`).
pub const POLICY_NAME_MAX_LENGTH: usize = LABEL_VALUE_MAX_LENGTH;
/// Prefix of every name derived from a policy's (the DaemonSet `ttdrv-<name>`).
pub const DERIVED_NAME_PREFIX: &str = "ttdrv-";

/// Name part of a label key (after the optional `prefix/`).
pub const LABEL_NAME_MAX_LENGTH: usize = 63;
/// Optional DNS-subdomain prefix of a label key.
pub const LABEL_PREFIX_MAX_LENGTH: usize = 253;
/// Longest label key: prefix, `/`, name.
pub const LABEL_KEY_MAX_LENGTH: usize = LABEL_PREFIX_MAX_LENGTH + 1 + LABEL_NAME_MAX_LENGTH;
/// Longest label value.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;

/// Entries in a selector's `matchLabels`.
pub const MATCH_LABELS_MAX: usize = 64;
/// Requirements in a selector's `matchExpressions`.
pub const MATCH_EXPRESSIONS_MAX: usize = 32;
/// Values of one `matchExpressions` requirement.
pub const SELECTOR_VALUES_MAX: usize = 128;
/// Longest `upgradePolicy.drain.podSelectorLabel`.
pub const POD_SELECTOR_MAX_LENGTH: usize = 1024;
/// Longest `installer.image`.
pub const IMAGE_MAX_LENGTH: usize = 512;
/// Longest `installer.sourceRepository`.
pub const SOURCE_REPOSITORY_MAX_LENGTH: usize = 2048;
/// Longest `installer.signingSecret` (a Secret's name: a DNS subdomain).
pub const SECRET_NAME_MAX_LENGTH: usize = 253;
/// `installer.signingSecret`: a Secret's name, a lowercase DNS subdomain
/// (RFC 1123), as the API server requires of it.
pub const SECRET_NAME_PATTERN: &str = DNS_SUBDOMAIN_PATTERN;
/// A lowercase DNS subdomain (RFC 1123): the names of Secrets and of
/// policies (`spec.promoteAfter.policy`).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// Longest `spec.promoteAfter.soakSeconds`: 7 days.
pub const SOAK_SECONDS_MAX: i64 = 7 * 24 * 3600;

/// Unanchored structure of a label key (`metav1` qualified name): an optional
/// lowercase DNS-subdomain prefix and `/`, then a name of alphanumerics, `-`,
/// `_`, `.` starting and ending alphanumeric. Also used inside the
/// `podSelectorLabel` pattern.
macro_rules! key_re {
    () => {
        r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
    };
}

/// Unanchored label value, possibly empty.
macro_rules! value_re {
    () => {
        r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
    };
}

/// Structure of a label key; lengths are checked apart ([`label_key_rule`]).
pub const LABEL_KEY_PATTERN: &str = concat!("^", key_re!(), "$");
/// A label value (may be empty); at most [`LABEL_VALUE_MAX_LENGTH`] characters.
pub const LABEL_VALUE_PATTERN: &str = concat!("^", value_re!(), "$");

/// Installer image reference: `[registry[:port]/]repository[:tag][@digest]`
/// (the distribution reference grammar): a lowercase repository path, a tag of
/// at most 128 characters, a `sha256` (64 hex) or `sha512` (128 hex) digest.
/// No whitespace or control character can match.
pub const IMAGE_PATTERN: &str = concat!(
    "^",
    // registry host (DNS name or [IPv6]) and optional port, then '/'
    r"((([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])(:[0-9]+)?/)?",
    // repository path: lowercase components joined by '/', separators . _ __ -
    r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*",
    // tag
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
    // digest
    r"(@(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}))?",
    "$"
);

/// `installer.sourceRepository`: `https://host[:port]/path`, `ssh://[user@]host[:port]/path`
/// or the scp-like `user@host:path`; no whitespace, control character (C0, DEL,
/// C1) or user/host starting with `-` (read as an option by ssh).
pub const SOURCE_REPOSITORY_PATTERN: &str = concat!(
    "^(",
    r"(https|ssh)://([A-Za-z0-9][^@/\x00-\x20\x7f-\x9f]*@)?",
    r"([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])",
    r"(:[0-9]{1,5})?(/[^\x00-\x20\x7f-\x9f]*)?",
    "|",
    r"[A-Za-z0-9][-A-Za-z0-9._]*@",
    r"([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])",
    r":[^\x00-\x20\x7f-\x9f]+",
    ")$"
);

/// The `spec.version` pattern: `MAJOR.MINOR.PATCH`, 1 to [`VERSION_PART_MAX_DIGITS`]
/// ASCII digits each.
pub fn version_pattern() -> String {
    let part = format!("[0-9]{{1,{VERSION_PART_MAX_DIGITS}}}");
    format!(r"^{part}\.{part}\.{part}$")
}

/// True when `v` is a target version the agent can install: exactly
/// [`version_pattern`] (no surrounding whitespace; callers trim if they accept it).
pub fn is_valid_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= VERSION_PART_MAX_DIGITS
                && p.bytes().all(|b| b.is_ascii_digit())
        })
}

/// True when `s` is a label name or a non-empty label value: alphanumerics, `-`,
/// `_`, `.`, starting and ending alphanumeric, at most 63 characters.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= LABEL_NAME_MAX_LENGTH
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A lowercase RFC 1123 DNS subdomain of at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= LABEL_PREFIX_MAX_LENGTH
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A label key as `metav1.LabelSelector` accepts it (Kubernetes' `IsQualifiedName`).
pub fn is_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(k),
    }
}

/// A label value as `metav1.LabelSelector` accepts it (may be empty).
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_label_name(v)
}

/// A CEL string literal holding `s` (backslashes and single quotes escaped), so a
/// regular expression reaches RE2 unchanged.
pub fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', r"\\").replace('\'', r"\'"))
}

/// CEL: the string `var` is a label key (structure and the three length limits).
/// `indexOf('/')` is -1 without a prefix, so the name-length term covers both forms.
pub fn label_key_rule(var: &str) -> String {
    format!(
        "(size({var}) <= {LABEL_KEY_MAX_LENGTH} && {var}.matches({pattern}) \
         && {var}.indexOf('/') <= {LABEL_PREFIX_MAX_LENGTH} \
         && size({var}) - {var}.indexOf('/') - 1 <= {LABEL_NAME_MAX_LENGTH})",
        pattern = cel_string(LABEL_KEY_PATTERN),
    )
}

/// CEL: the string `var` is a label value.
pub fn label_value_rule(var: &str) -> String {
    format!(
        "(size({var}) <= {LABEL_VALUE_MAX_LENGTH} && {var}.matches({pattern}))",
        pattern = cel_string(LABEL_VALUE_PATTERN),
    )
}

/// CEL `messageExpression`: `invalid <what> "<value of expr>": <help>`.
pub fn invalid_message(what: &str, expr: &str, help: &str) -> String {
    format!(
        "{} + {expr} + {}",
        cel_string(&format!("invalid {what} \"")),
        cel_string(&format!("\": {help}"))
    )
}

/// What a label key must look like, for error messages.
pub const LABEL_KEY_HELP: &str = "a label key is an optional DNS subdomain prefix (lowercase, at most 253 characters) and '/', then a name of at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric (e.g. 'pool', 'tt.tenstorrent.com/pool')";
/// What a label value must look like, for error messages.
pub const LABEL_VALUE_HELP: &str = "a label value is empty or at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric (e.g. 'prod', 'training-a')";

/// The root rule on `metadata.name`. Checked at creation only (the name is
/// immutable), so an object created before the rule existed can still be
/// updated, its status written and the object deleted.
pub fn policy_name_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "oldSelf.hasValue() || size(self.metadata.name) <= {POLICY_NAME_MAX_LENGTH}"
    ))
    .message(
        format!(
            "metadata.name must be at most {POLICY_NAME_MAX_LENGTH} characters: it is the value of the label \
             {claim} on the installer pods and the nodes, and names the DaemonSet {DERIVED_NAME_PREFIX}<name>",
            claim = crate::labels::CLAIM
        )
        .as_str(),
    )
    .optional_old_self(true)
}

/// A policy does not promote after itself (it would wait for ever): a rule
/// at the root, where `metadata.name` is visible.
pub fn promote_after_rule() -> kube::core::Rule {
    kube::core::Rule::new(
        "!has(self.spec.promoteAfter) || self.spec.promoteAfter.policy != self.metadata.name",
    )
    .message("spec.promoteAfter.policy names this policy: a policy cannot be its own canary")
    .field_path(".spec.promoteAfter.policy")
}

/// Versions [`is_valid_version`] accepts: the examples both this crate's
/// tests and the CRD pattern's tests (`api/tests/proptest_version.rs`) check,
/// so that the two definitions are held to one list.
#[doc(hidden)]
pub const VALID_VERSION_EXAMPLES: &[&str] = &[
    "2.8.0",
    "0.0.0",
    "10.20.30",
    "02.8.0",
    "999999999.0.123456789",
];

/// Versions [`is_valid_version`] refuses (see [`VALID_VERSION_EXAMPLES`]).
#[doc(hidden)]
pub const INVALID_VERSION_EXAMPLES: &[&str] = &[
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
    "1234567890.0.0",
    "0.1234567890.0",
    "0.0.1234567890",
    "2.8.0000000000",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_rule_is_the_agents() {
        for ok in VALID_VERSION_EXAMPLES {
            assert!(is_valid_version(ok), "{ok}");
        }
        for bad in INVALID_VERSION_EXAMPLES {
            assert!(!is_valid_version(bad), "{bad:?}");
        }
        assert_eq!(version_pattern(), r"^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}$");
        assert_eq!(VERSION_MAX_LENGTH, 29);
        assert!(is_valid_version(&["123456789"; 3].join(".")));
    }

    #[test]
    fn label_keys_follow_metav1() {
        let long_name = "n".repeat(63);
        let long_prefix = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        assert_eq!(long_prefix.len(), 253);
        for ok in [
            "a",
            "pool",
            "tt.tenstorrent.com/pool",
            "kubernetes.io/hostname",
            "My_Name.x-1",
            "feature.node.kubernetes.io/pci-1200_1e52.present",
            long_name.as_str(),
            &format!("{long_prefix}/{long_name}"),
        ] {
            assert!(is_label_key(ok), "{ok}");
        }
        for bad in [
            "",
            "bad key!",
            "-a",
            "a-",
            "a/b/c",
            "/a",
            "a/",
            "Example.com/a",
            "ex_ample.com/a",
            "a..b/c",
            "-a.com/b",
            "a.com/-b",
            "é",
            &"n".repeat(64),
            &format!("{}a/b", long_prefix),
            &format!("a/{}", "n".repeat(64)),
        ] {
            assert!(!is_label_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn label_values_follow_metav1() {
        for ok in ["", "a", "prod", "training-a", "A_b.c", &"v".repeat(63)] {
            assert!(is_label_value(ok), "{ok}");
        }
        for bad in ["bad value", "-a", "a-", "a/b", "é", "a\n", &"v".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn cel_strings_escape_backslashes_and_quotes() {
        assert_eq!(cel_string(r"^a\.b'c$"), r"'^a\\.b\'c$'");
    }

    #[test]
    fn name_limit_keeps_derived_names_valid() {
        // The policy name is a label value: 63 characters at most.
        let name = "n".repeat(POLICY_NAME_MAX_LENGTH);
        assert!(is_label_value(&name));
        // The DaemonSet name is a DNS subdomain (253).
        assert!(is_dns_subdomain(&format!("{DERIVED_NAME_PREFIX}{name}")));
    }
}
