//! What a policy may make the nodes run. The installer pod is privileged,
//! builds the code it clones as root and loads it into the kernel, so its
//! image and its source repository are root on every matched node: the
//! controller's allow-lists bound what a policy may name, and a version is
//! built only from the commit its tag is pinned to (the chart's table, or the
//! policy's own `installer.sourceCommit`). See docs/security.md.

use std::collections::BTreeMap;

/// The images and source repositories a policy may name. An empty list
/// allows any value (the default, as before the lists existed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    pub images: Vec<String>,
    pub repositories: Vec<String>,
}

/// Whether `value` matches an entry of `list`: equal to it, or, for an entry
/// ending in `*`, starting with what comes before the `*`. An empty list
/// allows everything.
pub fn allowed(list: &[String], value: &str) -> bool {
    list.is_empty()
        || list.iter().any(|e| match e.strip_suffix('*') {
            Some(prefix) => value.starts_with(prefix),
            None => value == e,
        })
}

/// Why a policy naming `image` and `repository` (its own values; None when
/// it uses the chart's) is refused, or Ok. The chart's own defaults are set
/// by whoever sets the lists, so they are not checked.
pub fn check(
    image: Option<&str>,
    repository: Option<&str>,
    allow: &AllowList,
) -> Result<(), String> {
    let mut wrong = Vec::new();
    if let Some(i) = image.filter(|i| !allowed(&allow.images, i)) {
        wrong.push(format!(
            "spec.installer.image {i:?} is not in the controller's allowed installer images ({})",
            allow.images.join(", ")
        ));
    }
    if let Some(r) = repository.filter(|r| !allowed(&allow.repositories, r)) {
        wrong.push(format!(
            "spec.installer.sourceRepository {r:?} is not in the controller's allowed source repositories ({})",
            allow.repositories.join(", ")
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}: the installer runs privileged and loads what it builds into the kernel, so only allowed images and repositories are deployed (chart values driver.allowedImages / driver.allowedSourceRepositories)",
            wrong.join("; ")
        ))
    }
}

/// A full git object name: 40 (SHA-1) or 64 (SHA-256) hex digits, returned in
/// lowercase. An abbreviation pins nothing an attacker cannot match.
pub fn validate_commit(commit: &str) -> Result<String, String> {
    let c = commit.trim().to_ascii_lowercase();
    if matches!(c.len(), 40 | 64) && c.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(c)
    } else {
        Err(format!(
            "invalid source commit {commit:?}: expected a full git object name (40 or 64 hex digits)"
        ))
    }
}

/// The version → commit table from `VERSION=COMMIT` entries (the chart's
/// `driver.sourceCommits`, passed as `--source-commit`).
pub fn parse_commit_table(entries: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut table = BTreeMap::new();
    for e in entries.iter().filter(|e| !e.trim().is_empty()) {
        let (v, c) = e
            .split_once('=')
            .ok_or_else(|| format!("source commit entry {e:?} is not VERSION=COMMIT"))?;
        let v = v.trim();
        if !ttdrv_api::validation::is_valid_version(v) {
            return Err(format!(
                "source commit entry {e:?}: {v:?} is not a MAJOR.MINOR.PATCH version"
            ));
        }
        if table.insert(v.to_string(), validate_commit(c)?).is_some() {
            return Err(format!("source commit entry for {v} given twice"));
        }
    }
    Ok(table)
}

/// The commit `version` must be built from: the policy's own pin, else the
/// table's; None leaves the build unpinned.
pub fn source_commit(
    version: &str,
    policy_commit: Option<&str>,
    table: &BTreeMap<String, String>,
) -> Option<String> {
    policy_commit
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_ascii_lowercase)
        .or_else(|| table.get(version.trim()).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn empty_lists_allow_everything_entries_match_exactly_or_by_prefix() {
        assert!(allowed(&[], "anything"));
        let l = list(&["ghcr.io/tenstorrent/*", "registry.local/agent:1.2.3"]);
        assert!(allowed(&l, "ghcr.io/tenstorrent/agent:1"));
        assert!(allowed(&l, "registry.local/agent:1.2.3"));
        assert!(!allowed(&l, "registry.local/agent:1.2.4"));
        assert!(
            !allowed(&l, "ghcr.io/tenstorrent-evil/agent"),
            "the prefix ends at the slash"
        );
        assert!(!allowed(&l, "evil.io/ghcr.io/tenstorrent/x"));
    }

    #[test]
    fn check_names_each_value_outside_its_list() {
        let allow = AllowList {
            images: list(&["ghcr.io/tenstorrent/*"]),
            repositories: list(&["https://github.com/tenstorrent/tt-kmd.git"]),
        };
        assert_eq!(check(None, None, &allow), Ok(()), "chart defaults");
        assert_eq!(
            check(
                Some("ghcr.io/tenstorrent/agent:1"),
                Some("https://github.com/tenstorrent/tt-kmd.git"),
                &allow
            ),
            Ok(())
        );
        let e = check(Some("evil.io/agent"), None, &allow).expect_err("image");
        assert!(e.contains("spec.installer.image \"evil.io/agent\""), "{e}");
        assert!(!e.contains("sourceRepository"), "{e}");
        let e = check(
            Some("evil.io/agent"),
            Some("https://evil.io/tt-kmd.git"),
            &allow,
        )
        .expect_err("both");
        assert!(
            e.contains("evil.io/agent") && e.contains("https://evil.io/tt-kmd.git"),
            "{e}"
        );
    }

    #[test]
    fn commits_are_full_names_and_the_policy_pin_wins() {
        let a = "a".repeat(40);
        let b = "B".repeat(40);
        assert_eq!(validate_commit(&b), Ok("b".repeat(40)));
        assert!(validate_commit("abc1234").is_err());
        assert!(validate_commit(&"z".repeat(40)).is_err());
        assert!(validate_commit(&"c".repeat(64)).is_ok());
        let table = parse_commit_table(&list(&[&format!("2.8.0={a}"), ""])).expect("table");
        assert_eq!(source_commit("2.8.0", None, &table), Some(a.clone()));
        assert_eq!(source_commit("2.7.0", None, &table), None);
        assert_eq!(
            source_commit("2.8.0", Some(&b), &table),
            Some("b".repeat(40))
        );
        assert_eq!(source_commit("2.8.0", Some(" "), &table), Some(a.clone()));
        for bad in [
            "2.8.0".to_string(),
            format!("2.8={a}"),
            "2.8.0=abc".to_string(),
        ] {
            assert!(
                parse_commit_table(std::slice::from_ref(&bad)).is_err(),
                "{bad}"
            );
        }
        assert!(
            parse_commit_table(&list(&[&format!("2.8.0={a}"), &format!("2.8.0={a}")])).is_err(),
            "twice"
        );
    }
}
