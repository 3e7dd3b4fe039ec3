//! Canary promotion (`spec.promoteAfter`): whether a policy may start new
//! disruptive cycles at its version, from what the canary policy's status
//! says. One definition for the controller (which holds its nodes through
//! [`crate::machine::Desired::hold`], as a soak or a closed maintenance
//! window does) and the kubectl plugin (which shows the chain).

use ttdrv_api::{ConditionType, TenstorrentDriverPolicy};

use crate::machine::Hold;
use crate::reason;

/// What the canary's status says, as far as promotion goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Canary {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.desiredVersion`: the version its controller rolls out.
    pub desired_version: Option<String>,
    /// Its Ready condition, if written.
    pub ready: Option<Ready>,
    /// `status.summary.failedNodes`.
    pub failed_nodes: i32,
    /// The latest `lastTransitionTime` of its nodes' entries, Unix seconds:
    /// the soak counts from it too, so a rollout finished between two
    /// status writes (Ready never seen False) is not taken for an old one.
    pub last_node_change: Option<i64>,
    /// Its own `spec.promoteAfter.policy`: the next link of the chain.
    pub promotes_after: Option<String>,
}

/// A Ready condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    pub status: bool,
    /// `lastTransitionTime`, Unix seconds.
    pub since: i64,
    pub observed_generation: Option<i64>,
}

impl Canary {
    pub fn of(p: &TenstorrentDriverPolicy) -> Self {
        let status = p.status.as_ref();
        let ready = status
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == ConditionType::Ready.as_str())
            })
            .map(|c| Ready {
                status: c.status == "True",
                since: c.last_transition_time.0.as_second(),
                observed_generation: c.observed_generation,
            });
        Self {
            generation: p.metadata.generation,
            desired_version: status.and_then(|s| s.desired_version.clone()),
            ready,
            failed_nodes: status.map_or(0, |s| s.summary.failed_nodes),
            last_node_change: status.and_then(|s| {
                s.nodes
                    .iter()
                    .filter_map(|n| n.last_transition_time.as_ref())
                    .map(|t| t.0.as_second())
                    .max()
            }),
            promotes_after: p.spec.promote_after.as_ref().map(|a| a.policy.clone()),
        }
    }
}

/// Whether new disruptive cycles may start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    Open,
    /// The canary is on its way: the gate opens by itself, at `ready_at`
    /// (Unix seconds) when known.
    Wait {
        why: String,
        ready_at: Option<i64>,
    },
    /// The canary is halted (a Failed node) or missing: a person must act.
    Blocked {
        why: String,
    },
}

impl Gate {
    /// The hold on new cycles ([`crate::machine::Desired::hold`], reason
    /// [`reason::WAITING_FOR_PROMOTION`]); `None` when the gate is open.
    /// Stable between passes (no running clock in it), so a node's record
    /// is not rewritten while nothing changes.
    pub fn hold(&self) -> Option<Hold> {
        match self {
            Gate::Open => None,
            Gate::Wait { why, .. } | Gate::Blocked { why } => Some(Hold {
                reason: reason::WAITING_FOR_PROMOTION,
                why: why.clone(),
            }),
        }
    }

    pub fn is_blocked(&self) -> bool {
        matches!(self, Gate::Blocked { .. })
    }
}

/// The gate of a policy at `version` that promotes after `name`, whose
/// policy object is `canary` (`None`: it does not exist).
pub fn gate(name: &str, version: &str, canary: Option<&Canary>, soak: i64, now: i64) -> Gate {
    let Some(c) = canary else {
        return Gate::Blocked {
            why: format!(
                "promotion blocked: the canary policy {name} (spec.promoteAfter) does not exist"
            ),
        };
    };
    if c.failed_nodes > 0 {
        return Gate::Blocked {
            why: format!(
                "promotion blocked: the canary policy {name} has {} Failed node(s); \
                 retry or fix them there first",
                c.failed_nodes
            ),
        };
    }
    let wait = |what: String| Gate::Wait {
        why: format!("waiting for the canary policy {name}: {what}"),
        ready_at: None,
    };
    if c.desired_version.as_deref() != Some(version) {
        return wait(format!(
            "it is not at {version} yet (it rolls out {})",
            c.desired_version.as_deref().unwrap_or("nothing yet")
        ));
    }
    let ready = c
        .ready
        .as_ref()
        .filter(|r| r.status && r.observed_generation == c.generation);
    let Some(r) = ready else {
        return wait(format!("it is not Ready at {version} yet"));
    };
    // Ready since its condition turned True, and since its last node
    // settled, whichever is later.
    let since = c.last_node_change.map_or(r.since, |n| n.max(r.since));
    let at = since.saturating_add(soak);
    if now >= at {
        return Gate::Open;
    }
    Gate::Wait {
        why: format!(
            "waiting for the canary policy {name}: Ready at {version} since {}, \
             for less than soakSeconds {soak}: the promotion opens at {}",
            rfc3339(since),
            rfc3339(at)
        ),
        ready_at: Some(at),
    }
}

/// The gate of `policy`, with `canary` looked up by the name it gives;
/// `None` when it promotes after no one.
pub fn of(
    policy: &TenstorrentDriverPolicy,
    canary: impl Fn(&str) -> Option<Canary>,
    now: i64,
) -> Option<Gate> {
    let p = policy.spec.promote_after.as_ref()?;
    let me = policy.metadata.name.as_deref().unwrap_or_default();
    if let Some(chain) = cycle(me, &p.policy, &canary) {
        // Each waits for the next to be Ready at the version: none ever is.
        return Some(Gate::Blocked {
            why: format!(
                "promotion blocked: spec.promoteAfter makes a cycle ({}): no policy in it can ever \
                 start a cycle; remove promoteAfter from one of them",
                chain.join(" -> ")
            ),
        });
    }
    let c = canary(&p.policy);
    Some(gate(
        &p.policy,
        &policy.spec.version,
        c.as_ref(),
        p.soak_seconds,
        now,
    ))
}

/// The `promoteAfter` chain from `me` (whose canary is `first`) when it
/// comes back to `me`: `[me, first, ..., me]`. `None` when the chain ends
/// (a policy without promoteAfter, or missing) or loops without `me` (that
/// loop's policies are blocked by it; `me` waits on them).
pub fn cycle(
    me: &str,
    first: &str,
    canary: &impl Fn(&str) -> Option<Canary>,
) -> Option<Vec<String>> {
    let mut chain = vec![me.to_string()];
    let mut cur = first.to_string();
    loop {
        if cur == me {
            chain.push(cur);
            return Some(chain);
        }
        if chain.contains(&cur) {
            return None;
        }
        chain.push(cur.clone());
        cur = canary(&cur)?.promotes_after?;
    }
}

fn rfc3339(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_780_000_000;

    fn canary(version: &str, ready: Option<(bool, i64, i64)>, failed: i32) -> Canary {
        Canary {
            generation: Some(3),
            desired_version: Some(version.into()),
            ready: ready.map(|(status, since, observed)| Ready {
                status,
                since,
                observed_generation: Some(observed),
            }),
            failed_nodes: failed,
            last_node_change: None,
            promotes_after: None,
        }
    }

    #[test]
    fn each_branch_of_the_gate() {
        let soak = 600;
        let cases: Vec<(&str, Option<Canary>, Gate)> = vec![
            (
                "missing",
                None,
                Gate::Blocked {
                    why: "promotion blocked: the canary policy canary (spec.promoteAfter) does not exist".into(),
                },
            ),
            (
                "a Failed node, even Ready long enough at the version",
                Some(canary("2.8.0", Some((true, NOW - 10_000, 3)), 1)),
                Gate::Blocked {
                    why: "promotion blocked: the canary policy canary has 1 Failed node(s); retry or fix them there first".into(),
                },
            ),
            (
                "at another version",
                Some(canary("2.7.0", Some((true, NOW - 10_000, 3)), 0)),
                Gate::Wait {
                    why: "waiting for the canary policy canary: it is not at 2.8.0 yet (it rolls out 2.7.0)".into(),
                    ready_at: None,
                },
            ),
            (
                "no status yet",
                Some(Canary::default()),
                Gate::Wait {
                    why: "waiting for the canary policy canary: it is not at 2.8.0 yet (it rolls out nothing yet)".into(),
                    ready_at: None,
                },
            ),
            (
                "at the version, not Ready",
                Some(canary("2.8.0", Some((false, NOW - 10_000, 3)), 0)),
                Gate::Wait {
                    why: "waiting for the canary policy canary: it is not Ready at 2.8.0 yet".into(),
                    ready_at: None,
                },
            ),
            (
                "no Ready condition",
                Some(canary("2.8.0", None, 0)),
                Gate::Wait {
                    why: "waiting for the canary policy canary: it is not Ready at 2.8.0 yet".into(),
                    ready_at: None,
                },
            ),
            (
                "Ready of an older generation",
                Some(canary("2.8.0", Some((true, NOW - 10_000, 2)), 0)),
                Gate::Wait {
                    why: "waiting for the canary policy canary: it is not Ready at 2.8.0 yet".into(),
                    ready_at: None,
                },
            ),
            (
                "Ready for 120 s of 600",
                Some(canary("2.8.0", Some((true, NOW - 120, 3)), 0)),
                Gate::Wait {
                    why: "waiting for the canary policy canary: Ready at 2.8.0 since 2026-05-28T20:24:40Z, \
                          for less than soakSeconds 600: the promotion opens at 2026-05-28T20:34:40Z"
                        .into(),
                    ready_at: Some(NOW + 480),
                },
            ),
            (
                "Ready long enough, but a node settled 120 s ago",
                Some(Canary {
                    last_node_change: Some(NOW - 120),
                    ..canary("2.8.0", Some((true, NOW - 10_000, 3)), 0)
                }),
                Gate::Wait {
                    why: "waiting for the canary policy canary: Ready at 2.8.0 since 2026-05-28T20:24:40Z, \
                          for less than soakSeconds 600: the promotion opens at 2026-05-28T20:34:40Z"
                        .into(),
                    ready_at: Some(NOW + 480),
                },
            ),
            (
                "Ready for exactly the soak",
                Some(canary("2.8.0", Some((true, NOW - 600, 3)), 0)),
                Gate::Open,
            ),
            (
                "Ready for longer",
                Some(canary("2.8.0", Some((true, NOW - 6000, 3)), 0)),
                Gate::Open,
            ),
        ];
        for (what, c, want) in cases {
            assert_eq!(
                gate("canary", "2.8.0", c.as_ref(), soak, NOW),
                want,
                "{what}"
            );
        }
        // No soak: open as soon as it is Ready at the version.
        let c = canary("2.8.0", Some((true, NOW, 3)), 0);
        assert_eq!(gate("canary", "2.8.0", Some(&c), 0, NOW), Gate::Open);
    }

    #[test]
    fn a_promote_after_cycle_is_found_from_each_of_its_policies() {
        let chain = |links: &[(&str, &str)]| {
            let links: Vec<(String, String)> = links
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            move |name: &str| {
                Some(Canary {
                    promotes_after: links
                        .iter()
                        .find(|(a, _)| a == name)
                        .map(|(_, b)| b.clone()),
                    ..Canary::default()
                })
            }
        };
        let two = chain(&[("a", "b"), ("b", "a")]);
        assert_eq!(
            cycle("a", "b", &two),
            Some(vec!["a".into(), "b".into(), "a".into()])
        );
        assert_eq!(
            cycle("b", "a", &two),
            Some(vec!["b".into(), "a".into(), "b".into()])
        );
        let three = chain(&[("a", "b"), ("b", "c"), ("c", "a")]);
        assert_eq!(
            cycle("a", "b", &three).map(|c| c.join(" -> ")).as_deref(),
            Some("a -> b -> c -> a")
        );
        assert_eq!(
            cycle("a", "a", &chain(&[])),
            Some(vec!["a".into(), "a".into()])
        );
        // A chain that ends, a missing canary, a loop further up without `a`.
        assert_eq!(cycle("a", "b", &chain(&[("b", "c")])), None);
        assert_eq!(cycle("a", "b", &|_: &str| None), None);
        assert_eq!(cycle("a", "b", &chain(&[("b", "c"), ("c", "b")])), None);
    }

    #[test]
    fn a_cycle_blocks_the_gate_naming_its_policies() {
        let policy = |name: &str, after: &str| {
            let mut p = TenstorrentDriverPolicy::new(
                name,
                serde_json::from_value(serde_json::json!({
                    "version": "2.8.0", "nodeAffinity": {},
                    "promoteAfter": {"policy": after}
                }))
                .unwrap_or_else(|e| panic!("spec: {e}")),
            );
            p.metadata.generation = Some(1);
            p
        };
        let (a, b) = (policy("a", "b"), policy("b", "a"));
        let lookup = |n: &str| match n {
            "a" => Some(Canary::of(&a)),
            "b" => Some(Canary::of(&b)),
            _ => None,
        };
        let gate = of(&a, lookup, NOW);
        assert!(
            matches!(&gate, Some(Gate::Blocked { why }) if why.contains("cycle (a -> b -> a)")),
            "{gate:?}"
        );
    }

    #[test]
    fn hold_and_blocked() {
        assert_eq!(Gate::Open.hold(), None);
        let w = Gate::Wait {
            why: "w".into(),
            ready_at: None,
        };
        let hold = |why: &str| Hold {
            reason: reason::WAITING_FOR_PROMOTION,
            why: why.into(),
        };
        assert_eq!((w.hold(), w.is_blocked()), (Some(hold("w")), false));
        let b = Gate::Blocked { why: "b".into() };
        assert_eq!((b.hold(), b.is_blocked()), (Some(hold("b")), true));
    }

    /// The state machine's side, through the one hold mechanism
    /// ([`crate::machine::Desired::hold`], no slot granted while it lasts):
    /// which Pending nodes it keeps from starting, and that build-ahead goes
    /// on meanwhile.
    #[test]
    fn a_held_node_waits_and_builds_ahead() {
        use crate::fixtures::{desired, observation};
        use crate::machine::{InstallerPod, NodeRecord, Observation, step};
        use ttdrv_api::NodeState::{self, *};

        let gate = Gate::Wait {
            why: "waiting for the canary policy canary: it is not Ready at 2.8.0 yet".into(),
            ready_at: None,
        };
        let held = crate::machine::Desired {
            hold: gate.hold(),
            ..desired()
        };
        let pending = NodeRecord::new("fleet", "2.8.0", 900);
        let current = InstallerPod::Current { ready: true };
        // The rollout grants no slot while a hold lasts.
        let no_slot = || Observation {
            slot: false,
            ..observation()
        };
        // (what, observation, build-ahead, expected state and reason)
        let rows: Vec<(&str, Observation, bool, NodeState, &str)> = vec![
            (
                "a drained swap",
                no_slot(),
                false,
                Pending,
                reason::WAITING_FOR_PROMOTION,
            ),
            (
                "a bounded restart-only cycle (new template, module stays)",
                Observation {
                    loaded: Some("2.8.0".into()),
                    ..no_slot()
                },
                false,
                Pending,
                reason::WAITING_FOR_PROMOTION,
            ),
            (
                "build-ahead goes on while held",
                Observation {
                    prepared: false,
                    ..no_slot()
                },
                true,
                Pending,
                reason::PREPARING,
            ),
            (
                "prepared ahead, still held",
                no_slot(),
                true,
                Pending,
                reason::WAITING_FOR_PROMOTION,
            ),
            (
                "a first install is not held",
                Observation {
                    loaded: None,
                    ..no_slot()
                },
                false,
                Upgrading,
                reason::INSTALL,
            ),
            (
                "a node at the target is not held",
                Observation {
                    loaded: Some("2.8.0".into()),
                    installer: current.clone(),
                    ..no_slot()
                },
                false,
                Done,
                reason::UP_TO_DATE,
            ),
            (
                "a host-managed node is not held",
                Observation {
                    host_managed: true,
                    ..no_slot()
                },
                false,
                Done,
                reason::HOST_MANAGED,
            ),
        ];
        for (what, obs, prepare, state, why) in rows {
            let want = crate::machine::Desired {
                prepare,
                ..held.clone()
            };
            let s = step(&pending, &obs, &want);
            assert_eq!(
                (s.record.state, s.record.reason.as_deref()),
                (state, Some(why)),
                "{what}: {s:?}"
            );
            if why == reason::WAITING_FOR_PROMOTION {
                assert!(s.commands.is_empty(), "{what}: {s:?}");
                let msg = s.record.message.as_deref().unwrap_or_default();
                assert!(msg.contains("canary policy canary"), "{what}: {msg}");
            }
        }
        // A cycle in progress finishes.
        let mut draining = pending.clone();
        draining.state = Draining;
        draining.cordon = crate::machine::Cordon::Ours;
        let drained = Observation {
            unschedulable: true,
            gates_closed: true,
            ..no_slot()
        };
        assert_eq!(step(&draining, &drained, &held).record.state, Upgrading);
        // Open again: the node starts with its slot.
        assert_eq!(
            step(&pending, &observation(), &desired()).record.state,
            Cordoning
        );
    }

    #[test]
    fn read_from_the_policies() {
        let policy = |name: &str, yaml: &str| -> TenstorrentDriverPolicy {
            let mut p = TenstorrentDriverPolicy::new(
                name,
                serde_yaml::from_str(yaml).expect("spec parses"),
            );
            p.metadata.generation = Some(1);
            p
        };
        let prod = policy(
            "prod",
            "version: 2.8.0\nnodeAffinity: {}\npromoteAfter: {policy: canary, soakSeconds: 60}",
        );
        let mut c = policy("canary", "version: 2.8.0\nnodeAffinity: {}");
        let status: ttdrv_api::TenstorrentDriverPolicyStatus =
            serde_json::from_value(serde_json::json!({
                "desiredVersion": "2.8.0",
                "summary": {"failedNodes": 0},
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "RolloutComplete", "message": "",
                    "observedGeneration": 1, "lastTransitionTime": "2026-05-28T20:25:40Z"
                }],
                "nodes": [],
            }))
            .expect("status");
        c.status = Some(status);
        assert_eq!(of(&prod, |_| Some(Canary::of(&c)), NOW), Some(Gate::Open));
        assert_eq!(
            of(&prod, |_| Some(Canary::of(&c)), NOW - 1).map(|g| g.is_blocked()),
            Some(false)
        );
        assert!(of(&prod, |_| None, NOW).is_some_and(|g| g.is_blocked()));
        assert_eq!(of(&c, |_| None, NOW), None);
    }
}
