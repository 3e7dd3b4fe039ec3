//! The reasons the state machine writes and the reasons the docs promise are
//! the same set: a reason documented but never produced, or produced but not
//! documented, fails here. The same for the reasons of the Events the
//! controller emits.

use std::collections::BTreeSet;
use std::path::PathBuf;

use ttdrv_core::event::EventReason;
use ttdrv_core::reason;

fn doc(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// Backticked CamelCase words (`DrainTimeout`) in `text`.
fn reasons_in(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            w.len() > 2
                && w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && w.chars().all(|c| c.is_ascii_alphanumeric())
                && w.chars().any(|c| c.is_ascii_lowercase())
        })
        .map(String::from)
        .collect()
}

/// The lines of `text` from the heading `start` to the next heading.
fn section(text: &str, start: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with('#') {
            if inside {
                break;
            }
            inside = line.trim_start_matches('#').trim() == start;
            continue;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(!out.is_empty(), "no section {start:?}");
    out
}

/// The first column of the table in troubleshooting.md's section `title`.
fn troubleshooting_first_column(title: &str) -> String {
    section(&doc("troubleshooting.md"), title)
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split('|').nth(1).unwrap_or_default().to_string())
        .collect()
}

fn set(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn failure_reasons_in_the_troubleshooting_table() {
    let table = troubleshooting_first_column("A node is Failed");
    assert_eq!(reasons_in(&table), set(reason::FAILURES));
}

#[test]
fn failure_reasons_of_the_failure_metric() {
    let line = doc("metrics.md")
        .lines()
        .find(|l| l.starts_with("| `ttdriver_node_failures_total`"))
        .map(String::from)
        .unwrap_or_default();
    let mut documented = reasons_in(&line);
    assert!(
        documented.remove("Other"),
        "the fallback label is documented"
    );
    documented.remove("Failed");
    documented.remove("UnloadFailed");
    assert_eq!(documented, set(reason::FAILURES));
}

/// The reasons of the `Failed` and `UnloadFailed` rows together.
#[test]
fn failure_reasons_of_the_failed_state() {
    let flow = doc("upgrade-flow.md");
    let row = |state: &str| {
        flow.lines()
            .find(|l| l.starts_with(&format!("| `{state}`")))
            .map(String::from)
            .unwrap_or_default()
    };
    let mut documented = reasons_in(&row("Failed"));
    documented.extend(reasons_in(&row("UnloadFailed")));
    for s in ["Failed", "UnloadFailed"] {
        documented.remove(s);
    }
    assert_eq!(documented, set(reason::FAILURES));
}

/// The row of docs/crd-reference.md's status table for `field` (empty when
/// there is none: the checks against it then fail).
fn crd_reference_row(field: &str) -> String {
    let start = format!("| `{field}` |");
    doc("crd-reference.md")
        .lines()
        .find(|l| l.starts_with(&start))
        .map(String::from)
        .unwrap_or_default()
}

#[test]
fn every_reason_in_the_crd_reference() {
    let row = crd_reference_row("reason");
    let mut documented = reasons_in(&row);
    documented.remove("Failed");
    documented.remove("UnloadFailed");
    let produced = set(reason::ALL);
    let unknown: Vec<&String> = documented.difference(&produced).collect();
    assert!(
        unknown.is_empty(),
        "documented, never produced: {unknown:?}"
    );
    for f in reason::FAILURES {
        assert!(documented.contains(*f), "failure reason {f} not listed");
    }
}

#[test]
fn failures_are_reasons() {
    for f in reason::FAILURES {
        assert!(reason::ALL.contains(f), "{f}");
    }
    let unique: BTreeSet<&str> = reason::ALL.iter().copied().collect();
    assert_eq!(unique.len(), reason::ALL.len(), "no reason twice");
}

#[test]
fn go_reason_codes_in_the_crd_reference() {
    let row = crd_reference_row("goReason");
    let mut documented = reasons_in(&row);
    documented.remove("Failed");
    let mut expected = BTreeSet::new();
    for (ours, go) in reason::GO_CODES {
        expected.insert(ours.to_string());
        expected.insert(go.to_string());
    }
    assert_eq!(documented, expected);
}

/// The Events table of the troubleshooting guide lists every Event reason,
/// and nothing else.
#[test]
fn event_reasons_in_the_troubleshooting_table() {
    let table = troubleshooting_first_column("Events");
    let produced: BTreeSet<String> = EventReason::ALL
        .iter()
        .map(|r| r.as_str().to_string())
        .collect();
    assert_eq!(reasons_in(&table), produced);
}

/// Every condition type a policy's status carries has a row in
/// docs/crd-reference.md's Conditions table, is in the `conditions[]` row's
/// list, and the table lists no other.
#[test]
fn condition_types_in_the_crd_reference() {
    use ttdrv_api::ConditionType;
    let text = doc("crd-reference.md");
    let documented: BTreeSet<String> = text
        .lines()
        .skip_while(|l| !l.starts_with("| type | status True when | reasons |"))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .map(String::from)
        .collect();
    let produced: BTreeSet<String> = ConditionType::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    assert_eq!(
        documented, produced,
        "the Conditions table of crd-reference.md"
    );
    let listed = reasons_in(&crd_reference_row("conditions[]"));
    assert_eq!(listed, produced, "the conditions[] row of crd-reference.md");
}

/// The firmware policy's reasons: every one the firmware cycle can write is
/// in the reason table of docs/firmware.md, and the table names no other.
#[test]
fn firmware_reasons_in_the_firmware_doc() {
    let table = section(&doc("firmware.md"), "Node states");
    let mut documented = reasons_in(&table);
    for state in ttdrv_api::firmware::FirmwareNodeState::ALL {
        documented.remove(state.as_str());
    }
    let all = set(&ttdrv_api::firmware::reason::ALL);
    // The states' own names that are also reasons (Cordoning, ...).
    let missing: Vec<&String> = all
        .iter()
        .filter(|r| !reasons_in(&table).contains(*r))
        .collect();
    assert!(missing.is_empty(), "not documented: {missing:?}");
    let unknown: Vec<&String> = documented.difference(&all).collect();
    assert!(
        unknown.is_empty(),
        "documented, never produced: {unknown:?}"
    );
}
