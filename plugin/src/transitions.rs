//! The node state changes `watch` prints, one line each
//! (`12:03:04 UTC  node-3  Cordoning → Draining  (Drain)`), from the records
//! the controller writes on each Node. The policy's status is written in
//! batches, so the table alone never shows a state that lasts one write
//! (Cordoning, Uncordoning); a watch on the Nodes sees every record write.

use std::collections::{BTreeMap, VecDeque};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use ttdrv_api::NodeState;
use ttdrv_core::machine::NodeRecord;
use ttdrv_core::reason;

use crate::render::clock;
use crate::style::{BOLD, DIM, Palette, state_style};
use crate::view::record_of;

/// How many transitions the terminal screen keeps under the table.
pub const RECENT: usize = 10;

/// One node leaving a state for another, as its record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub node: String,
    pub from: NodeState,
    pub to: NodeState,
    /// Unix seconds the node entered `to` (the record's `since`).
    pub at: i64,
    pub reason: Option<String>,
}

/// The state last seen of each node, and the transitions seen lately.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Only records of this policy (all, when none).
    policy: Option<String>,
    /// Each node's state and target version, as its record last said.
    seen: BTreeMap<String, (NodeState, String)>,
    recent: VecDeque<Transition>,
}

impl Tracker {
    pub fn new(policy: Option<&str>) -> Self {
        Self {
            policy: policy.map(str::to_string),
            ..Self::default()
        }
    }

    /// A node's record as read now: the transition from the state last seen
    /// on it, if that changed. The first record seen of a node only sets where
    /// it stands (the table shows it), so nothing is printed at start-up.
    pub fn observe(&mut self, node: &str, record: Option<&NodeRecord>) -> Option<Transition> {
        // An unreadable or missing record says nothing about the state.
        let r = record?;
        if self.policy.as_deref().is_some_and(|p| p != r.policy) {
            // Claimed by another policy: its next cycle is not this watch's.
            self.seen.remove(node);
            return None;
        }
        let (last, target) = self
            .seen
            .insert(node.to_string(), (r.state, r.target.clone()))?;
        // The controller does not write the Pending record of a Done node
        // a new version sends back (it follows from the Done record and the
        // policy, as the status shows): the record goes from Done at the old
        // version to Cordoning at the new, and the node was Pending between.
        let implicit_pending =
            last == NodeState::Done && target != r.target && r.state != NodeState::Pending;
        let from = if implicit_pending {
            NodeState::Pending
        } else {
            last
        };
        if from == r.state {
            return None;
        }
        let t = Transition {
            node: node.to_string(),
            from,
            to: r.state,
            at: r.since,
            reason: r.reason.clone(),
        };
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(t.clone());
        Some(t)
    }

    /// The node is gone: a new one of that name starts afresh.
    pub fn forget(&mut self, node: &str) {
        self.seen.remove(node);
    }

    /// One event of a watch on the Nodes.
    pub fn event(&mut self, event: &Event<Node>) -> Option<Transition> {
        match event {
            Event::Apply(n) | Event::InitApply(n) => {
                let name = n.metadata.name.as_deref()?;
                self.observe(name, record_of(n).as_ref())
            }
            Event::Delete(n) => {
                if let Some(name) = n.metadata.name.as_deref() {
                    self.forget(name);
                }
                None
            }
            Event::Init | Event::InitDone => None,
        }
    }

    /// The last [`RECENT`] transitions, oldest first.
    pub fn recent(&self) -> impl Iterator<Item = &Transition> {
        self.recent.iter()
    }
}

/// `12:03:04 UTC  node-3  Cordoning → Draining  (Drain)`, states in their
/// table colours.
pub fn line(t: &Transition, pal: Palette) -> String {
    let host = t.reason.as_deref() == Some(reason::HOST_MANAGED);
    let mut s = format!(
        "{}  {}  {} → {}",
        pal.paint(&clock(t.at), DIM),
        pal.paint(&t.node, BOLD),
        pal.paint(t.from.as_str(), state_style(t.from, false)),
        pal.paint(t.to.as_str(), state_style(t.to, host)),
    );
    if let Some(r) = &t.reason {
        s.push_str(&format!("  ({r})"));
    }
    s
}

/// The terminal screen's tail: the recent transitions, or nothing.
pub fn section(tracker: &Tracker, pal: Palette) -> String {
    let mut out = String::new();
    for t in tracker.recent() {
        if out.is_empty() {
            out.push_str(&format!("\n{}\n", pal.paint("TRANSITIONS", BOLD)));
        }
        out.push_str(&line(t, pal));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(policy: &str, state: NodeState, reason: Option<&str>, since: i64) -> NodeRecord {
        let mut r = NodeRecord::new(policy, "2.8.0", since);
        r.state = state;
        r.reason = reason.map(str::to_string);
        r
    }

    /// Feeds (node, state) records of policy `canary` in order; the printed
    /// transitions as `node from→to`.
    fn printed(tracker: &mut Tracker, seq: &[(&str, NodeState)]) -> Vec<String> {
        seq.iter()
            .enumerate()
            .filter_map(|(i, (node, s))| {
                tracker.observe(node, Some(&rec("canary", *s, None, i as i64)))
            })
            .map(|t| format!("{} {}→{}", t.node, t.from.as_str(), t.to.as_str()))
            .collect()
    }

    #[test]
    fn a_full_cycle_prints_every_state_change_and_nothing_at_start() {
        use NodeState::*;
        let mut t = Tracker::new(Some("canary"));
        let seq = [
            ("n1", Done),
            ("n1", Pending),
            ("n1", Cordoning),
            ("n1", Draining),
            ("n1", Upgrading),
            ("n1", Uncordoning),
            ("n1", Done),
        ];
        assert_eq!(
            printed(&mut t, &seq),
            [
                "n1 Done→Pending",
                "n1 Pending→Cordoning",
                "n1 Cordoning→Draining",
                "n1 Draining→Upgrading",
                "n1 Upgrading→Uncordoning",
                "n1 Uncordoning→Done",
            ]
        );
    }

    #[test]
    fn a_done_node_sent_to_a_new_version_left_pending_unwritten() {
        let mut t = Tracker::new(Some("canary"));
        let mut done = rec("canary", NodeState::Done, None, 1);
        done.target = "2.7.0".into();
        assert_eq!(t.observe("n1", Some(&done)), None);
        // The next record on the Node is the cordon of the 2.8.0 cycle.
        let cordoning = rec("canary", NodeState::Cordoning, None, 2);
        let first = t.observe("n1", Some(&cordoning));
        assert_eq!(
            first.map(|x| (x.from, x.to)),
            Some((NodeState::Pending, NodeState::Cordoning))
        );
        // A Done record rewritten at the same version is no transition; a
        // Pending record that is written prints Done → Pending.
        let mut t = Tracker::new(Some("canary"));
        t.observe("n2", Some(&done));
        assert_eq!(t.observe("n2", Some(&done)), None);
        let pending = rec("canary", NodeState::Pending, None, 3);
        let next = t.observe("n2", Some(&pending));
        assert_eq!(
            next.map(|x| (x.from, x.to)),
            Some((NodeState::Done, NodeState::Pending))
        );
    }

    #[test]
    fn a_rewrite_in_the_same_state_prints_nothing() {
        let mut t = Tracker::new(Some("canary"));
        assert_eq!(
            t.observe("n1", Some(&rec("canary", NodeState::Pending, None, 1))),
            None
        );
        let again = rec("canary", NodeState::Pending, Some(reason::PREPARING), 2);
        assert_eq!(
            t.observe("n1", Some(&again)),
            None,
            "reason changed, state not"
        );
        assert_eq!(t.observe("n1", None), None, "no record: no change");
        let next = t.observe("n1", Some(&rec("canary", NodeState::Cordoning, None, 3)));
        assert_eq!(next.map(|x| x.from), Some(NodeState::Pending));
    }

    #[test]
    fn nodes_are_tracked_apart_and_interleave() {
        use NodeState::*;
        let mut t = Tracker::new(None);
        let seq = [
            ("a", Pending),
            ("b", Pending),
            ("a", Cordoning),
            ("b", Cordoning),
            ("a", Draining),
        ];
        assert_eq!(
            printed(&mut t, &seq),
            [
                "a Pending→Cordoning",
                "b Pending→Cordoning",
                "a Cordoning→Draining"
            ]
        );
    }

    #[test]
    fn records_of_another_policy_are_not_printed() {
        let mut t = Tracker::new(Some("canary"));
        t.observe("n1", Some(&rec("canary", NodeState::Done, None, 1)));
        let other = rec("prod", NodeState::Cordoning, None, 2);
        assert_eq!(t.observe("n1", Some(&other)), None);
        // Back in canary after prod's cycle: a first sighting again.
        assert_eq!(
            t.observe("n1", Some(&rec("canary", NodeState::Pending, None, 3))),
            None
        );
    }

    #[test]
    fn a_deleted_node_starts_afresh() {
        let mut t = Tracker::new(None);
        t.observe("n1", Some(&rec("canary", NodeState::Draining, None, 1)));
        t.forget("n1");
        assert_eq!(
            t.observe("n1", Some(&rec("canary", NodeState::Pending, None, 2))),
            None
        );
    }

    #[test]
    fn the_screen_keeps_the_last_transitions_oldest_first() {
        let mut t = Tracker::new(None);
        assert_eq!(
            section(&t, Palette::PLAIN),
            "",
            "no transitions, no heading"
        );
        let states = [NodeState::Pending, NodeState::Cordoning];
        // The first record sets where n1 stands; then RECENT + 1 transitions.
        for i in 0..=RECENT + 1 {
            t.observe("n1", Some(&rec("canary", states[i % 2], None, i as i64)));
        }
        let kept: Vec<i64> = t.recent().map(|x| x.at).collect();
        assert_eq!(kept, (2..=RECENT as i64 + 1).collect::<Vec<_>>());
        let s = section(&t, Palette::PLAIN);
        assert!(s.starts_with("\nTRANSITIONS\n"), "{s}");
        assert_eq!(s.lines().count(), RECENT + 2);
    }

    #[test]
    fn a_line_says_when_which_node_from_to_and_why() {
        let t = Transition {
            node: "node-3".into(),
            from: NodeState::Cordoning,
            to: NodeState::Draining,
            at: 43_384,
            reason: Some(reason::DRAIN.into()),
        };
        assert_eq!(
            line(&t, Palette::PLAIN),
            "12:03:04 UTC  node-3  Cordoning → Draining  (Drain)"
        );
        let bare = Transition {
            reason: None,
            ..t.clone()
        };
        assert_eq!(
            line(&bare, Palette::PLAIN),
            "12:03:04 UTC  node-3  Cordoning → Draining"
        );
        let c = line(&t, Palette::COLOR);
        assert!(c.contains('\u{1b}') && c.contains("Draining"), "{c}");
    }

    #[test]
    fn watch_events_feed_the_tracker() {
        let node = |state: NodeState| {
            let mut n = Node::default();
            n.metadata.name = Some("n1".into());
            let r = serde_json::to_string(&rec("canary", state, None, 5)).unwrap_or_default();
            n.metadata.annotations = Some(
                [(ttdrv_api::labels::UPGRADE_STATE.to_string(), r)]
                    .into_iter()
                    .collect(),
            );
            n
        };
        let mut t = Tracker::new(Some("canary"));
        assert_eq!(t.event(&Event::Init), None);
        assert_eq!(t.event(&Event::InitApply(node(NodeState::Pending))), None);
        let seen = t.event(&Event::Apply(node(NodeState::Cordoning)));
        assert_eq!(seen.map(|x| x.to), Some(NodeState::Cordoning));
        assert_eq!(t.event(&Event::Delete(node(NodeState::Cordoning))), None);
        assert_eq!(
            t.event(&Event::Apply(node(NodeState::Draining))),
            None,
            "forgotten"
        );
    }
}
