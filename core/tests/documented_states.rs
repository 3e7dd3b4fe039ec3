//! The node states docs/metrics.md says are exported, and those
//! docs/crd-reference.md says a node's status takes, are the states the API
//! defines, as documented_reasons.rs does for the reasons: the metrics export
//! every `NodeState::ALL` (and `FirmwareNodeState::ALL`) value, so a state
//! added to or dropped from the API must show in the docs' lists.

use std::collections::BTreeSet;
use std::path::PathBuf;

use ttdrv_api::NodeState;
use ttdrv_api::firmware::FirmwareNodeState;

fn doc(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn metrics_doc() -> String {
    doc("metrics.md")
}

/// Backticked CamelCase words (`Draining`) in `text`.
fn states_in(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && w.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map(String::from)
        .collect()
}

/// The table row of `doc` for `name` (empty when there is none: the checks
/// against it then fail).
fn row(doc: &str, name: &str) -> String {
    let start = format!("| `{name}` |");
    doc.lines()
        .find(|l| l.starts_with(&start))
        .map(String::from)
        .unwrap_or_default()
}

/// The "States." bullet of the Conventions section, up to the next bullet.
fn states_bullet(doc: &str) -> String {
    doc.lines()
        .skip_while(|l| !l.starts_with("- **States.**"))
        .enumerate()
        .take_while(|(i, l)| *i == 0 || l.starts_with("  "))
        .map(|(_, l)| format!("{l}\n"))
        .collect()
}

fn names(states: impl IntoIterator<Item = &'static str>) -> BTreeSet<String> {
    states.into_iter().map(String::from).collect()
}

/// The count spelled out in the docs ("the ten per-node states").
fn spelled(n: usize) -> &'static str {
    const WORDS: [&str; 16] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen",
    ];
    WORDS.get(n).copied().unwrap_or("many")
}

#[test]
fn exported_node_states_in_the_metrics_doc() {
    let doc = metrics_doc();
    let all = names(NodeState::ALL.map(NodeState::as_str));
    let node_state = row(&doc, "ttdriver_node_state");
    assert_eq!(
        states_in(&node_state),
        all,
        "the ttdriver_node_state row of docs/metrics.md"
    );
    let count = spelled(NodeState::ALL.len());
    assert!(
        node_state.contains(&format!("All {count} states")),
        "the ttdriver_node_state row says how many states: {count}"
    );

    let bullet = states_bullet(&doc);
    let (listed, in_progress) = bullet
        .split_once("In-progress")
        .expect("the States bullet names the in-progress states");
    assert_eq!(
        states_in(listed),
        all,
        "the States bullet of docs/metrics.md"
    );
    assert!(
        listed.contains(&format!("the {count} per-node states")),
        "the States bullet says how many states: {count}"
    );
    let busy = names(
        NodeState::ALL
            .into_iter()
            .filter(|s| s.is_in_progress())
            .map(NodeState::as_str),
    );
    assert_eq!(
        states_in(in_progress),
        busy,
        "the in-progress states of docs/metrics.md's States bullet"
    );
}

#[test]
fn exported_firmware_states_in_the_metrics_doc() {
    let doc = metrics_doc();
    assert_eq!(
        states_in(&row(&doc, "ttfw_policy_nodes")),
        names(FirmwareNodeState::ALL.map(FirmwareNodeState::as_str)),
        "the ttfw_policy_nodes row of docs/metrics.md"
    );
}

/// The `state` row of crd-reference.md's per-node status table.
#[test]
fn node_states_in_the_crd_reference() {
    assert_eq!(
        states_in(&row(&doc("crd-reference.md"), "state")),
        names(NodeState::ALL.map(NodeState::as_str)),
        "the state row of docs/crd-reference.md"
    );
}
