//! Table tests of the state machine: hand-written rows for each transition, and
//! safety properties checked over the full cross product of states and
//! observations.

use super::*;
use NodeState::*;

use crate::drain::{PodRef, RunOutcome};
use crate::fixtures::{desired as want, observation as obs};
use crate::slots::Holder;
use ttdrv_api::vfio::Passthrough;

fn rec(state: NodeState) -> NodeRecord {
    let mut r = NodeRecord::new("fleet", "2.8.0", 900);
    r.state = state;
    if state.is_in_progress() || state == Failed {
        r.cordon = Cordon::Ours;
        r.started = Some(900);
    }
    r
}

impl NodeRecord {
    fn clone_with(&self, state: NodeState) -> NodeRecord {
        NodeRecord {
            state,
            ..self.clone()
        }
    }
}

fn run(r: &NodeRecord, o: &Observation, w: &Desired) -> (NodeState, Vec<Command>) {
    let s = step(r, o, w);
    (s.record.state, s.commands)
}

#[test]
fn table() {
    use Command::*;
    let ready = InstallerPod::Current { ready: true };
    let w = want();
    let paused = Desired {
        paused: true,
        ..want()
    };
    let no_drain = Desired {
        drain_enabled: false,
        ..want()
    };
    struct Row {
        name: &'static str,
        rec: NodeRecord,
        obs: Observation,
        want: Desired,
        expect: (NodeState, Vec<Command>),
    }
    let rows = vec![
        Row {
            name: "pending, slot: cordon + gates",
            rec: rec(Pending),
            obs: obs(),
            want: w.clone(),
            expect: (Cordoning, vec![Cordon, CloseGates]),
        },
        Row {
            name: "pending, no slot: wait",
            rec: rec(Pending),
            obs: Observation {
                slot: false,
                ..obs()
            },
            want: w.clone(),
            expect: (Pending, vec![]),
        },
        Row {
            name: "pending, paused",
            rec: rec(Pending),
            obs: obs(),
            want: paused.clone(),
            expect: (Pending, vec![]),
        },
        Row {
            name: "pending, drain disabled: replace pod directly",
            rec: rec(Pending),
            obs: obs(),
            want: no_drain.clone(),
            expect: (Upgrading, vec![DeleteInstallerPod]),
        },
        Row {
            name: "pending, admin-cordoned: gates only, no cordon",
            rec: rec(Pending),
            obs: Observation {
                unschedulable: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Cordoning, vec![CloseGates]),
        },
        Row {
            name: "pending, up to date",
            rec: rec(Pending),
            obs: Observation {
                loaded: Some("2.8.0".into()),
                installer: ready.clone(),
                ..obs()
            },
            want: w.clone(),
            expect: (Done, vec![]),
        },
        Row {
            name: "pending, restart-only: waits for a slot",
            rec: rec(Pending),
            obs: Observation {
                loaded: Some("2.8.0".into()),
                slot: false,
                ..obs()
            },
            want: w.clone(),
            expect: (Pending, vec![]),
        },
        Row {
            name: "pending, restart-only, slot: pod replaced",
            rec: rec(Pending),
            obs: Observation {
                loaded: Some("2.8.0".into()),
                ..obs()
            },
            want: w.clone(),
            expect: (Upgrading, vec![DeleteInstallerPod]),
        },
        Row {
            name: "pending, first install",
            rec: rec(Pending),
            obs: Observation {
                loaded: None,
                installer: InstallerPod::Current { ready: false },
                slot: false,
                ..obs()
            },
            want: w.clone(),
            expect: (Upgrading, vec![]),
        },
        Row {
            name: "pending, host-managed",
            rec: rec(Pending),
            obs: Observation {
                host_managed: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Done, vec![]),
        },
        Row {
            name: "cordoning, not yet cordoned",
            rec: rec(Cordoning),
            obs: obs(),
            want: w.clone(),
            expect: (Cordoning, vec![Cordon, CloseGates]),
        },
        Row {
            name: "cordoning, done",
            rec: rec(Cordoning),
            obs: Observation {
                unschedulable: true,
                gates_closed: true,
                gates_present: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Draining, vec![Evict]),
        },
        Row {
            name: "cordoning, paused: hold",
            rec: rec(Cordoning),
            obs: Observation {
                unschedulable: true,
                gates_closed: true,
                ..obs()
            },
            want: paused.clone(),
            expect: (Cordoning, vec![]),
        },
        Row {
            name: "draining, pods left",
            rec: rec(Draining),
            obs: Observation {
                unschedulable: true,
                drain: Some(DrainProgress {
                    remaining: vec!["ml/a".into()],
                    blocking_pdbs: vec![],
                }),
                ..obs()
            },
            want: w.clone(),
            expect: (Draining, vec![Evict]),
        },
        Row {
            name: "draining, empty",
            rec: rec(Draining),
            obs: Observation {
                unschedulable: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Upgrading, vec![DeleteInstallerPod]),
        },
        Row {
            name: "draining, empty but paused",
            rec: rec(Draining),
            obs: Observation {
                unschedulable: true,
                ..obs()
            },
            want: paused.clone(),
            expect: (Draining, vec![]),
        },
        Row {
            name: "draining, timeout",
            rec: rec(Draining),
            obs: Observation {
                now: 900 + 601,
                unschedulable: true,
                drain: Some(DrainProgress {
                    remaining: vec!["ml/a".into()],
                    blocking_pdbs: vec!["ml/pdb".into()],
                }),
                ..obs()
            },
            want: w.clone(),
            expect: (Failed, vec![]),
        },
        Row {
            name: "upgrading, stale pod",
            rec: rec(Upgrading),
            obs: obs(),
            want: w.clone(),
            expect: (Upgrading, vec![DeleteInstallerPod]),
        },
        Row {
            name: "upgrading, stale pod deleting",
            rec: rec(Upgrading),
            obs: Observation {
                installer: InstallerPod::Stale { deleting: true },
                ..obs()
            },
            want: w.clone(),
            expect: (Upgrading, vec![]),
        },
        Row {
            name: "upgrading, new pod not ready",
            rec: rec(Upgrading),
            obs: Observation {
                installer: InstallerPod::Current { ready: false },
                ..obs()
            },
            want: w.clone(),
            expect: (Upgrading, vec![]),
        },
        Row {
            name: "upgrading, ready but label old",
            rec: rec(Upgrading),
            obs: Observation {
                installer: ready.clone(),
                ..obs()
            },
            want: w.clone(),
            expect: (Upgrading, vec![]),
        },
        Row {
            name: "upgrading, done",
            rec: rec(Upgrading),
            obs: Observation {
                loaded: Some("2.8.0".into()),
                installer: ready.clone(),
                unschedulable: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Uncordoning, vec![Uncordon, OpenGates]),
        },
        Row {
            name: "upgrading, timeout",
            rec: rec(Upgrading),
            obs: Observation {
                now: 900 + 901,
                installer: InstallerPod::Current { ready: false },
                ..obs()
            },
            want: w.clone(),
            expect: (Failed, vec![]),
        },
        Row {
            name: "uncordoning, pending",
            rec: rec(Uncordoning),
            obs: Observation {
                unschedulable: true,
                gates_present: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Uncordoning, vec![Uncordon, OpenGates]),
        },
        Row {
            name: "uncordoning, done",
            rec: rec(Uncordoning),
            obs: Observation {
                loaded: Some("2.8.0".into()),
                installer: ready.clone(),
                ..obs()
            },
            want: w.clone(),
            expect: (Done, vec![]),
        },
        Row {
            name: "done, stays",
            rec: rec(Done),
            obs: Observation {
                loaded: Some("2.8.0".into()),
                installer: ready.clone(),
                ..obs()
            },
            want: w.clone(),
            expect: (Done, vec![]),
        },
        Row {
            name: "done, new version: back to Pending for a slot",
            rec: NodeRecord {
                target: "2.7.0".into(),
                ..rec(Done)
            },
            obs: obs(),
            want: w.clone(),
            expect: (Pending, vec![]),
        },
        Row {
            name: "failed, stays",
            rec: rec(Failed),
            obs: Observation {
                unschedulable: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Failed, vec![]),
        },
        Row {
            name: "failed, retry: back to Pending",
            rec: rec(Failed),
            obs: Observation {
                unschedulable: true,
                retry_token: Some("1".into()),
                ..obs()
            },
            want: w.clone(),
            expect: (Pending, vec![]),
        },
        Row {
            name: "pending after retry, still cordoned by us: keeps ownership",
            rec: rec(Failed).clone_with(Pending),
            obs: Observation {
                unschedulable: true,
                ..obs()
            },
            want: w.clone(),
            expect: (Cordoning, vec![Cordon, CloseGates]),
        },
    ];
    for row in rows {
        assert_eq!(
            run(&row.rec, &row.obs, &row.want),
            row.expect,
            "row: {}",
            row.name
        );
    }
}

/// What will still hold the device after the gates and the drain is said
/// while the node waits for its slot and when it is cordoned; it warns and
/// holds nothing back.
#[test]
fn ungated_holders_are_said_while_waiting_and_at_the_cordon() {
    let warning =
        "warning: after the gates close and the drain, 1 DaemonSet pod will still hold the device";
    let o = Observation {
        ungated_holders: Some(warning.into()),
        slot: false,
        ..obs()
    };
    let s = step(&rec(Pending), &o, &want());
    assert_eq!(s.record.state, Pending);
    let m = s.record.message.unwrap_or_default();
    assert!(m.starts_with("waiting for a maxUnavailable slot"), "{m}");
    assert!(m.ends_with(warning), "{m}");
    let s = step(&rec(Pending), &Observation { slot: true, ..o }, &want());
    assert_eq!(s.record.state, Cordoning, "the cordon goes on");
    assert_eq!(s.record.message.as_deref(), Some(warning));
    // Building ahead, it says so too.
    let preparing = Observation {
        prepared: false,
        installer: InstallerPod::Current { ready: true },
        ungated_holders: Some(warning.into()),
        ..obs()
    };
    let prepare = Desired {
        prepare: true,
        ..want()
    };
    let s = step(&rec(Pending), &preparing, &prepare);
    assert_eq!(s.record.reason.as_deref(), Some(reason::PREPARING));
    assert!(s.record.message.unwrap_or_default().ends_with(warning));
    // Without holders, the messages are as before.
    let s = step(
        &rec(Pending),
        &Observation {
            slot: false,
            ..obs()
        },
        &want(),
    );
    assert!(!s.record.message.unwrap_or_default().contains("warning"));
    assert_eq!(step(&rec(Pending), &obs(), &want()).record.message, None);
}

#[test]
fn admin_cordon_is_remembered_through_the_cycle() {
    let w = want();
    let o = Observation {
        unschedulable: true,
        ..obs()
    };
    let s = step(&rec(Pending), &o, &w);
    assert_eq!(s.record.cordon, Cordon::Theirs);
    let mut r = s.record;
    r.state = Upgrading;
    let done = Observation {
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        unschedulable: true,
        ..obs()
    };
    let s = step(&r, &done, &w);
    assert_eq!(s.record.state, Uncordoning);
    assert!(
        !s.commands.contains(&Command::Uncordon),
        "an admin's cordon must stay"
    );
    let s = step(
        &s.record,
        &Observation {
            gates_present: false,
            ..done
        },
        &w,
    );
    assert_eq!(s.record.state, Done);
}

#[test]
fn failure_messages_name_pods_pdbs_and_the_retry() {
    let o = Observation {
        now: 2000,
        unschedulable: true,
        drain: Some(DrainProgress {
            remaining: vec!["ml/train-0".into()],
            blocking_pdbs: vec!["ml/train".into()],
        }),
        ..obs()
    };
    let s = step(&rec(Draining), &o, &want());
    let msg = s.record.message.unwrap_or_default();
    assert_eq!(s.record.reason.as_deref(), Some(reason::DRAIN_TIMEOUT));
    for needle in [
        "ml/train-0",
        "PodDisruptionBudgets: ml/train",
        "kubectl tt driver retry fleet n1",
        "kubectl annotate node n1 driver.tenstorrent.com/retry",
    ] {
        assert!(msg.contains(needle), "message lacks {needle}: {msg}");
    }
    // Without the node's name (a plan's observation), a placeholder.
    let unnamed = Observation {
        node: String::new(),
        ..o
    };
    let msg = step(&rec(Draining), &unnamed, &want())
        .record
        .message
        .unwrap_or_default();
    assert!(msg.contains("retry fleet <node>"), "{msg}");
}

/// A drain a PodDisruptionBudget blocks says so while it waits: the pod,
/// the budget and the deadline, in a message that stays the same from one
/// pass to the next (the record is written only when it changes); the usual
/// reason comes back once nothing is blocked.
#[test]
fn a_blocked_drain_names_the_pod_the_budget_and_the_deadline() {
    use crate::drain::BlockedEviction;
    let blocked = |now: i64| Observation {
        now,
        unschedulable: true,
        gates_closed: true,
        drain: Some(DrainProgress {
            remaining: vec!["ml/web-0".into(), "ml/dev".into()],
            blocking_pdbs: vec!["ml/web".into()],
        }),
        drain_blocked: vec![BlockedEviction {
            pod: "ml/web-0".into(),
            pdb: "ml/web".into(),
        }],
        ..obs()
    };
    let w = want();
    let mut r = rec(Draining);
    r.since = 1000;
    r.reason = Some(reason::DRAIN.into());
    let s = step(&r, &blocked(1010), &w);
    assert_eq!(s.record.state, Draining);
    assert_eq!(s.commands, [Command::Evict], "evictions go on");
    assert_eq!(s.record.reason.as_deref(), Some(reason::EVICTION_BLOCKED));
    let msg = s.record.message.clone().unwrap_or_default();
    let deadline = rfc3339(1000 + w.drain_timeout_seconds);
    for needle in [
        "PodDisruptionBudget ml/web refuses to evict ml/web-0",
        deadline.as_str(),
        "DrainTimeout",
    ] {
        assert!(msg.contains(needle), "message lacks {needle}: {msg}");
    }
    assert!(
        !msg.contains("ml/dev"),
        "a pod no budget blocks is not named: {msg}"
    );
    let later = step(&s.record, &blocked(1100), &w);
    assert_eq!(later.record, s.record, "the same record on the next pass");
    // The budget allows the eviction now: the usual reason, no message.
    let free = Observation {
        drain_blocked: vec![],
        ..blocked(1200)
    };
    let s = step(&later.record, &free, &w);
    assert_eq!(s.record.reason.as_deref(), Some(reason::DRAIN));
    assert_eq!(s.record.message, None);
}

#[test]
fn a_blocked_message_names_a_few_pods_per_budget() {
    use crate::drain::BlockedEviction;
    let b = |pod: &str, pdb: &str| BlockedEviction {
        pod: pod.into(),
        pdb: pdb.into(),
    };
    let list = [
        b("ml/w-0", "ml/web"),
        b("ml/db-0", "ml/db"),
        b("ml/w-1", "ml/web"),
        b("ml/w-2", "ml/web"),
        b("ml/w-3", "ml/web"),
    ];
    let m = cordon::blocked_message(&list, 0, 600);
    assert!(
        m.contains("PodDisruptionBudget ml/web refuses to evict ml/w-0, ml/w-1, ml/w-2 and 1 more; PodDisruptionBudget ml/db refuses to evict ml/db-0"),
        "{m}"
    );
}

/// A hand-back under way (`handback --wait`) holds new starts but, unlike
/// `spec.paused`, lets the cycle under way go on to its end.
#[test]
fn a_handback_holds_new_starts_and_lets_cycles_end() {
    let policy: ttdrv_api::TenstorrentDriverPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": { "name": "fleet",
            "annotations": { ttdrv_api::labels::HANDBACK: "2026-12-06T14:00:00Z" } },
        "spec": { "version": "2.8.0" }
    }))
    .expect("a policy");
    let hold = crate::rollout::handback_hold(&policy);
    assert_eq!(hold.as_ref().map(|h| h.reason), Some(reason::HANDING_BACK));
    let w = Desired { hold, ..want() };
    // A Pending node (the rollout grants no slot under a hold) waits.
    let waiting = Observation {
        slot: false,
        ..obs()
    };
    let s = step(&rec(Pending), &waiting, &w);
    assert_eq!(s.record.state, Pending);
    assert_eq!(s.record.reason.as_deref(), Some(reason::HANDING_BACK));
    assert!(s.commands.is_empty());
    // A drained node goes on to its swap: not held where it is.
    let drained = Observation {
        unschedulable: true,
        gates_closed: true,
        ..obs()
    };
    let s = step(&rec(Draining), &drained, &w);
    assert_eq!(s.record.state, Upgrading, "the cycle under way goes on");
    let mut no_annotation = policy.clone();
    no_annotation.metadata.annotations = None;
    assert_eq!(crate::rollout::handback_hold(&no_annotation), None);
}

/// Every state x a broad set of observations x policies: safety properties.
#[test]
fn safety_properties_over_the_cross_product() {
    let installers = [
        InstallerPod::Missing,
        InstallerPod::Stale { deleting: false },
        InstallerPod::Stale { deleting: true },
        InstallerPod::Current { ready: false },
        InstallerPod::Current { ready: true },
    ];
    let mut checked = 0;
    for state in NodeState::ALL {
        for cordon in [Cordon::None, Cordon::Ours, Cordon::Theirs] {
            {
                for no_drain in [false, true] {
                    let mut r = rec(state);
                    r.cordon = cordon;
                    r.no_drain = no_drain;
                    for installer in &installers {
                        // The policy sets max_devices=4: 2.8.0 loaded with
                        // it is the target, with 32 it is not (a reload).
                        for (loaded, parameters) in [
                            (None, None),
                            (Some("2.7.0"), None),
                            (Some("2.8.0"), Some("4")),
                            (Some("2.8.0"), Some("32")),
                        ] {
                            let wrong_parameters = parameters == Some("32");
                            for bits in 0..256u32 {
                                let b = |i: u32| bits & (1 << i) != 0;
                                let o = Observation {
                                    now: if b(5) { 100_000 } else { 1000 },
                                    node: "n1".into(),
                                    ready: !b(6),
                                    unschedulable: b(0),
                                    loaded: loaded.map(String::from),
                                    parameters: parameters.map(|v| {
                                        [("max_devices".to_string(), v.to_string())].into()
                                    }),
                                    host_managed: b(1),
                                    // Every function on vfio-pci, or some.
                                    passthrough: match (b(7) && b(6), b(7) && b(0)) {
                                        (true, _) => Passthrough::All { vfio: 2 },
                                        (_, true) => Passthrough::Some { vfio: 1, total: 2 },
                                        _ => Passthrough::None,
                                    },
                                    installer: installer.clone(),
                                    gates_closed: b(2),
                                    gates_present: b(2) || b(3),
                                    drain: Some(DrainProgress {
                                        remaining: if b(4) { vec!["ml/p".into()] } else { vec![] },
                                        blocking_pdbs: vec![],
                                    }),
                                    drain_blocked: vec![],
                                    retry_token: if b(3) { Some("t".into()) } else { None },
                                    slot: b(0) ^ b(4),
                                    installer_problem: None,
                                    installer_failure: None,
                                    inherited_cordon: false,
                                    handed_over_stood_down: vec![],
                                    rollback_verdict: None,
                                    vacated: b(1) && b(3),
                                    nothing_loaded: loaded.is_none() && b(5),
                                    rebooted_unreported: loaded.is_none() && !b(5) && b(6),
                                    installer_created: b(6).then_some(100),
                                    prepared: !b(7),
                                    // The turn matters only while not prepared.
                                    prepare_turn: b(7) && !b(2),
                                    // The DaemonSet controller behind, now and then.
                                    template_pending: b(7) && b(3),
                                    held_by: (b(1) && b(4)).then(|| Holder::firmware("fw".into())),
                                    firmware_version: None,
                                    firmware_first: (b(2) && b(5)).then(|| "fw".into()),
                                    device_pods_crash_looping: if b(2) {
                                        vec!["ml/p".into()]
                                    } else {
                                        vec![]
                                    },
                                    ungated_holders: (b(0) && b(6))
                                        .then(|| "warning: DaemonSet x/y holds the device".into()),
                                    // A DRA plugin from before the swap, one card short.
                                    surface: if b(5) && b(6) {
                                        crate::surface::Surface {
                                            driver: "tenstorrent.com".into(),
                                            plugin_selector: "app=dra".into(),
                                            cards: Some(2),
                                            plugin_pods: vec![crate::surface::PublisherPod {
                                                pod: PodRef {
                                                    namespace: "tt".into(),
                                                    name: "dra".into(),
                                                },
                                                created: 10,
                                                ready_since: Some(11),
                                                deleting: false,
                                            }],
                                            dra_devices: Some(1),
                                            extended: None,
                                            stack: vec![],
                                        }
                                    } else {
                                        Default::default()
                                    },
                                    validation_pod: match (b(3), b(4), b(5)) {
                                        (false, _, _) => None,
                                        (true, false, _) => Some(ValidationPod {
                                            pod: "ns/v".into(),
                                            created: 500,
                                            outcome: RunOutcome::Running,
                                        }),
                                        (true, true, false) => Some(ValidationPod {
                                            pod: "ns/v".into(),
                                            created: 500,
                                            outcome: RunOutcome::Succeeded,
                                        }),
                                        (true, true, true) => Some(ValidationPod {
                                            pod: "ns/v".into(),
                                            created: 500,
                                            outcome: RunOutcome::Failed("exit 1".into()),
                                        }),
                                    },
                                };
                                for (paused, drain_enabled, refused, unmanage) in [
                                    (false, true, false),
                                    (true, true, false),
                                    (false, false, false),
                                    (true, false, false),
                                    (false, true, true),
                                    (false, false, true),
                                ]
                                .into_iter()
                                .flat_map(|(p, d, r)| [(p, d, r, false), (p, d, r, true)])
                                {
                                    // Build-ahead on or off: one of the two per
                                    // observation keeps the product's size.
                                    // (Vacating builds nothing: never both.)
                                    let prepare = (b(7) ^ b(3) ^ b(4)) && !unmanage;
                                    let w = Desired {
                                        paused,
                                        drain_enabled,
                                        refused,
                                        unmanage,
                                        prepare,
                                        parameters: [("max_devices".to_string(), "4".to_string())]
                                            .into(),
                                        soak_seconds: if b(6) { 600 } else { 0 },
                                        validation_pod: (b(0) ^ b(4)).then(|| "check".into()),
                                        hold: (b(1) ^ b(6)).then(|| Hold {
                                            reason: reason::SOAKING,
                                            why: "soaking".into(),
                                        }),
                                        ..want()
                                    };
                                    let s = step(&r, &o, &w);
                                    checked += 1;
                                    let ctx = format!("{r:?}\n{o:?}\n{w:?}\n-> {s:?}");
                                    let cordons = s.commands.contains(&Command::Cordon);
                                    assert!(
                                        o.held_by.is_none()
                                            || r.state != Pending
                                            || !matches!(
                                                s.record.state,
                                                Cordoning | Draining | Upgrading | Unloading
                                            ),
                                        "no driver cycle starts while a firmware cycle has the node: {ctx}"
                                    );
                                    // The machine asks for a slot exactly when one
                                    // would start a disruptive cycle (what the
                                    // NodeActor once found out by stepping twice).
                                    let other = Observation {
                                        slot: !o.slot,
                                        ..o.clone()
                                    };
                                    let other = step(&r, &other, &w);
                                    let (without, with) =
                                        if o.slot { (&other, &s) } else { (&s, &other) };
                                    assert_eq!(
                                        without.needs_slot,
                                        with != without
                                            && with.record.occupies_slot()
                                            && !r.occupies_slot(),
                                        "needs_slot: {ctx}\nwith a slot: {with:?}"
                                    );
                                    assert!(
                                        !with.needs_slot,
                                        "a granted slot is not asked for again: {ctx}"
                                    );
                                    if cordons {
                                        assert!(
                                            matches!(r.state, Pending | Cordoning | Draining),
                                            "cordon only when starting (or re-cordon a drain): {ctx}"
                                        );
                                        assert!(
                                            drain_enabled
                                                || matches!(r.state, Cordoning | Draining),
                                            "no cordon with drain disabled: {ctx}"
                                        );
                                        assert_ne!(
                                            s.record.cordon,
                                            Cordon::Theirs,
                                            "never cordon a node someone else cordoned: {ctx}"
                                        );
                                    }
                                    if s.commands.contains(&Command::Uncordon) {
                                        assert!(
                                            r.cordon != Cordon::Theirs
                                                && s.record.cordon != Cordon::Theirs,
                                            "never uncordon an admin's cordon: {ctx}"
                                        );
                                    }
                                    if r.state == Pending && !o.ready {
                                        assert!(
                                            !matches!(
                                                s.record.state,
                                                Cordoning | Draining | Upgrading
                                            ),
                                            "a NotReady node starts no cycle, not even without drain: {ctx}"
                                        );
                                    }
                                    if r.state == Pending && s.record.state == Cordoning {
                                        assert!(
                                            o.slot && !paused && o.ready,
                                            "start only with a slot, Ready and not paused: {ctx}"
                                        );
                                        assert!(
                                            !o.host_managed || r.cordoned_by_us(),
                                            "never start on a host-managed node: {ctx}"
                                        );
                                        assert!(
                                            !matches!(o.passthrough, Passthrough::All { .. })
                                                || r.cordoned_by_us(),
                                            "never start on a node whose functions are all on vfio-pci: {ctx}"
                                        );
                                    }
                                    if r.state == Pending
                                        && s.record.reason.as_deref() == Some(reason::RESTART)
                                        && s.commands.contains(&Command::DeleteInstallerPod)
                                    {
                                        assert!(
                                            o.slot && s.record.bounded,
                                            "a restart-only cycle replaces the installer pod only with a slot, kept by the cycle: {ctx}"
                                        );
                                    }
                                    if s.record.state.is_in_progress() && s.record.no_drain {
                                        assert_eq!(
                                            s.record.occupies_slot(),
                                            s.record.bounded,
                                            "a cycle without drain holds a slot exactly when bounded: {ctx}"
                                        );
                                    }
                                    if !s.record.state.is_in_progress() {
                                        assert!(
                                            !s.record.bounded,
                                            "a slot ends with the cycle: {ctx}"
                                        );
                                    }
                                    if !drain_enabled && r.state == Pending {
                                        assert!(
                                            !matches!(s.record.state, Cordoning | Draining),
                                            "drain disabled skips cordon/drain: {ctx}"
                                        );
                                    }
                                    if s.record.state == Done
                                        && r.state != Done
                                        && s.record.reason.as_deref() != Some(reason::HOST_MANAGED)
                                    {
                                        assert!(
                                            !s.record.cordoned_by_us(),
                                            "Done never leaves our cordon behind: {ctx}"
                                        );
                                    }
                                    if s.record.state == Draining && r.state != Draining {
                                        assert!(
                                            o.unschedulable,
                                            "drain only a cordoned node: {ctx}"
                                        );
                                    }
                                    folded_write_is_safe(&r, &o, &w, &s, &ctx);
                                    if paused && r.state.is_in_progress() {
                                        assert!(
                                            s.commands.is_empty() && s.record.state == r.state,
                                            "paused holds a node mid-cycle where it is: {ctx}"
                                        );
                                        assert!(
                                            s.record.paused_at.is_some(),
                                            "and remembers since when: {ctx}"
                                        );
                                    }
                                    if s.record.state == Upgrading
                                        && r.state != Upgrading
                                        && !s.record.no_drain
                                        && drain_enabled
                                    {
                                        assert!(
                                            (r.state == Draining && o.unschedulable)
                                                || (r.state == Unloading && !unmanage),
                                            "a drained cycle reaches Upgrading only from Draining (or from Unloading when the policy manages again): {ctx}"
                                        );
                                    }
                                    if wrong_parameters && !unmanage {
                                        // Other parameters are a swap like
                                        // another version: never in place,
                                        // never Done without the reload.
                                        assert!(
                                            !(s.record.state == Upgrading
                                                && r.state == Pending
                                                && s.record.no_drain),
                                            "a parameter change is never a restart in place: {ctx}"
                                        );
                                        if matches!(r.state, Pending | Upgrading)
                                            && s.record.state == Done
                                        {
                                            assert!(
                                                matches!(
                                                    s.record.reason.as_deref(),
                                                    Some(
                                                        reason::HOST_MANAGED
                                                            | reason::VFIO_PASSTHROUGH
                                                    )
                                                ),
                                                "Done without the parameters in effect: {ctx}"
                                            );
                                        }
                                    }
                                    vacate_properties(&r, &o, &w, &s, &ctx);
                                    prepare_properties(&r, &o, &w, &s, &ctx);
                                    if o.template_pending {
                                        assert!(
                                            !s.commands.contains(&Command::DeleteInstallerPod),
                                            "no installer pod replaced before the DaemonSet controller saw the template: {ctx}"
                                        );
                                    }
                                    if refused && r.state == Pending {
                                        assert!(
                                            !matches!(
                                                s.record.state,
                                                Cordoning | Draining | Upgrading
                                            ) && !s.commands.iter().any(|c| matches!(
                                                c,
                                                Command::Cordon | Command::DeleteInstallerPod
                                            )),
                                            "a refused policy starts no cycle: {ctx}"
                                        );
                                    }
                                    if paused && r.state == Pending {
                                        assert!(
                                            s.commands.is_empty() || s.record.no_drain,
                                            "paused starts nothing disruptive: {ctx}"
                                        );
                                    }
                                    // Idempotence: stepping again on the same observation is stable.
                                    let again = step(&s.record, &o, &w);
                                    if s.commands.is_empty() && s.record.state == r.state {
                                        assert_eq!(
                                            again.record.state, s.record.state,
                                            "stable when settled: {ctx}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 50_000, "cross product too small: {checked}");
}

#[test]
fn a_parameter_change_sends_a_done_node_through_a_drained_cycle() {
    let w = Desired {
        parameters: [("max_devices".to_string(), "4".to_string())].into(),
        ..want()
    };
    let mut done = rec(Done);
    done.reason = Some(reason::UPGRADED.into());
    let at = |v: &str| Observation {
        loaded: Some("2.8.0".into()),
        parameters: Some([("max_devices".to_string(), v.to_string())].into()),
        installer: InstallerPod::Stale { deleting: false },
        ..obs()
    };
    // Loaded with 32: back to Pending and, with its slot, cordoned.
    let s = step(&done, &at("32"), &w);
    assert_eq!(s.record.state, Pending, "{s:?}");
    let s = step(&s.record, &at("32"), &w);
    assert_eq!(s.record.state, Cordoning, "{s:?}");
    assert_eq!(s.commands, vec![Command::Cordon, Command::CloseGates]);
    // Without a slot it waits, saying what changes.
    let s = step(
        &NodeRecord::new("fleet", "2.8.0", 900),
        &Observation {
            slot: false,
            ..at("32")
        },
        &w,
    );
    assert!(
        s.record.message.as_deref().is_some_and(
            |m| m.contains("2.8.0 -> 2.8.0 (module parameters: max_devices=32 (wanted 4))")
        ),
        "{s:?}"
    );
    // Loaded with 4 and a stale pod: a restart in place, no cordon.
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &at("4"), &w);
    assert_eq!(
        (s.record.state, s.record.no_drain),
        (Upgrading, true),
        "{s:?}"
    );
    // Upgrading ends only once the parameters are in effect.
    let mut upgrading = rec(Upgrading);
    upgrading.cordon = Cordon::Ours;
    let current = |v: &str| Observation {
        installer: InstallerPod::Current { ready: true },
        ..at(v)
    };
    assert_eq!(step(&upgrading, &current("32"), &w).record.state, Upgrading);
    assert_eq!(
        step(&upgrading, &current("4"), &w).record.state,
        Uncordoning
    );
}

#[test]
fn draining_never_ends_without_a_drain_plan() {
    let o = Observation {
        unschedulable: true,
        drain: None,
        now: 1000,
        ..obs()
    };
    let s = step(&rec(Draining), &o, &want());
    assert_eq!(s.record.state, Draining, "no plan: never Upgrading");
    assert!(s.commands.is_empty(), "no plan: nothing to evict");
    // The deadline still runs: a cordoned node is never held forever.
    let late = Observation { now: 100_000, ..o };
    let s = step(&rec(Draining), &late, &want());
    assert_eq!(s.record.state, Failed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::DRAIN_TIMEOUT));
}

#[test]
fn record_keeps_its_wire_format() {
    // A record written by an earlier release (and by every release so far).
    let theirs = r#"{"policy":"fleet","state":"Draining","target":"2.8.0","since":5,"cordonedByUs":false,"wasUnschedulable":true,"noDrain":false}"#;
    let r: NodeRecord = serde_json::from_str(theirs).expect("old record parses");
    assert_eq!(r.cordon, Cordon::Theirs);
    let ours =
        r#"{"policy":"fleet","state":"Draining","target":"2.8.0","since":5,"cordonedByUs":true}"#;
    let r: NodeRecord = serde_json::from_str(ours).expect("old record parses");
    assert_eq!(r.cordon, Cordon::Ours);
    let back = serde_json::to_value(&r).expect("serializes");
    assert_eq!(back["cordonedByUs"], true);
    assert_eq!(back["wasUnschedulable"], false);
    let none: NodeRecord =
        serde_json::from_str(r#"{"policy":"fleet","state":"Pending","target":"2.8.0","since":5}"#)
            .expect("minimal record parses");
    assert_eq!(none.cordon, Cordon::None);
}

#[test]
fn pause_holds_mid_cycle_and_resumes_with_the_deadline_moved_on() {
    let paused = Desired {
        paused: true,
        ..want()
    };
    let mut r = rec(Draining);
    r.since = 900;
    let o = Observation {
        unschedulable: true,
        drain: Some(DrainProgress {
            remaining: vec!["ml/a".into()],
            blocking_pdbs: vec![],
        }),
        now: 1000,
        ..obs()
    };
    let held = step(&r, &o, &paused);
    assert_eq!(held.record.state, Draining);
    assert!(held.commands.is_empty(), "no eviction while paused");
    assert_eq!(held.record.paused_at, Some(1000));
    // Paused far past the drain deadline (600 s): still held, not Failed.
    let later = Observation {
        now: 5000,
        ..o.clone()
    };
    let s = step(&held.record, &later, &paused);
    assert_eq!(s.record.state, Draining);
    assert_eq!(
        s.record.paused_at,
        Some(1000),
        "held since the first paused step"
    );
    // Resumed at 5000: 100 s of the deadline were used before the pause.
    let s = step(&s.record, &later, &want());
    assert_eq!(s.record.state, Draining);
    assert_eq!(s.record.paused_at, None);
    assert_eq!(s.record.since, 4900);
    assert_eq!(s.commands, vec![Command::Evict]);
    let s = step(
        &s.record,
        &Observation {
            now: 5400,
            ..o.clone()
        },
        &want(),
    );
    assert_eq!(s.record.state, Draining, "100 + 400 s < 600 s");
    let s = step(&s.record, &Observation { now: 5600, ..o }, &want());
    assert_eq!(s.record.state, Failed);
}

#[test]
fn not_ready_keeps_the_slot_and_says_so() {
    let o = Observation {
        ready: false,
        unschedulable: true,
        drain: Some(DrainProgress {
            remaining: vec!["ml/a".into()],
            blocking_pdbs: vec![],
        }),
        ..obs()
    };
    let s = step(&rec(Draining), &o, &want());
    assert_eq!(s.record.state, Draining);
    assert_eq!(s.record.reason.as_deref(), Some(reason::NODE_NOT_READY));
    let back = step(
        &s.record,
        &Observation {
            ready: true,
            ..o.clone()
        },
        &want(),
    );
    assert_eq!(back.record.reason.as_deref(), Some(reason::DRAIN));
    // The deadline passes while it is not Ready: the reason is the node's.
    let late = Observation { now: 100_000, ..o };
    let s = step(&s.record, &late, &want());
    assert_eq!(s.record.state, Failed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::NODE_NOT_READY));
    // A Pending node that is not Ready never starts, slot or not.
    let s = step(
        &rec(Pending),
        &Observation {
            ready: false,
            ..obs()
        },
        &want(),
    );
    assert_eq!(s.record.state, Pending);
    assert!(s.commands.is_empty());
}

#[test]
fn installer_failure_fails_the_node_at_once_with_its_cause() {
    let o = Observation {
        unschedulable: true,
        installer: InstallerPod::Current { ready: false },
        installer_failure: Some(Failure {
            reason: reason::DEVICE_BUSY,
            message: "the agent gave up: pid 42 (python) in pod ml/train-0".into(),
            pod_created: Some(950),
            terminated_at: None,
        }),
        ..obs()
    };
    // A drained cycle that drained again once already (below): fails.
    let mut r = rec(Upgrading);
    r.redrained = Some(920);
    let s = step(&r, &o, &want());
    assert_eq!(s.record.state, Failed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::DEVICE_BUSY));
    assert_eq!(s.record.redrained, None, "ends with the cycle");
    let msg = s.record.message.unwrap_or_default();
    assert!(msg.contains("pid 42") && msg.contains("retry"), "{msg}");
    assert!(msg.contains("The node stays cordoned"), "{msg}");
    // An install in place (after a reboot, never cordoned) says the node
    // serves, not that it stays cordoned.
    let mut in_place = rec(Upgrading);
    in_place.no_drain = true;
    in_place.cordon = Cordon::None;
    let s = step(
        &in_place,
        &Observation {
            unschedulable: false,
            ..o.clone()
        },
        &want(),
    );
    assert_eq!(s.record.state, Failed);
    let msg = s.record.message.unwrap_or_default();
    assert!(msg.contains("The node is not cordoned"), "{msg}");
    // The old pod's troubles are not the new installer's.
    let stale = Observation {
        installer: InstallerPod::Stale { deleting: false },
        ..o
    };
    assert_eq!(
        step(&rec(Upgrading), &stale, &want()).record.state,
        Upgrading
    );
}

#[test]
fn a_device_busy_refusal_drains_again_once_per_cycle() {
    let busy = |at: i64| Observation {
        unschedulable: true,
        installer: InstallerPod::Current { ready: false },
        installer_failure: Some(Failure {
            reason: reason::DEVICE_BUSY,
            message: "the agent gave up: pid 4242 (sim) in pod ml/train-9 holds /dev/tenstorrent/0"
                .into(),
            pod_created: Some(901),
            terminated_at: Some(at),
        }),
        now: at + 1,
        ..obs()
    };
    let mut r = rec(Upgrading);
    r.since = 950;
    // The first refusal of the cycle: back to Draining to evict the
    // newcomer; the go-ahead goes with the Upgrading state.
    let s = step(&r, &busy(950), &want());
    assert_eq!(
        (s.record.state, s.commands.clone()),
        (Draining, vec![Command::Evict])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::DRAIN_AGAIN));
    assert_eq!(s.record.redrained, Some(950));
    assert_eq!(s.record.started, r.started, "the same cycle");
    assert!(s.record.cordoned_by_us());
    assert!(crate::go_ahead::for_record("n1", &s.record).is_none());
    let msg = s.record.message.clone().unwrap_or_default();
    assert!(msg.contains("ml/train-9") && msg.contains("once"), "{msg}");
    // Drained again (the same second): Upgrading, where the refusal the
    // cycle drained again for is not a failure; the agent's next answer is.
    let drained = Observation {
        drain: Some(DrainProgress::default()),
        ..busy(950)
    };
    let s = step(&s.record, &drained, &want());
    assert_eq!(s.record.state, Upgrading);
    assert!(crate::go_ahead::for_record("n1", &s.record).is_some());
    let again = step(&s.record, &busy(950), &want());
    assert_eq!(again.record.state, Upgrading, "{:?}", again.record);
    let failed = step(&s.record, &busy(953), &want());
    assert_eq!(failed.record.state, Failed);
    assert_eq!(failed.record.reason.as_deref(), Some(reason::DEVICE_BUSY));
    // Not in a cycle without drain (nothing to drain), nor once the module
    // is swapped (the refusal is not about this swap).
    let no_drain = Desired {
        drain_enabled: false,
        ..want()
    };
    assert_eq!(step(&r, &busy(950), &no_drain).record.state, Failed);
    let swapped = Observation {
        loaded: Some("2.8.0".into()),
        ..busy(950)
    };
    assert_eq!(step(&r, &swapped, &want()).record.state, Failed);
    // The record keeps it across a controller restart.
    let wire = serde_json::to_string(&failed.record).expect("ser");
    let mut mid = r.clone();
    mid.redrained = Some(950);
    let back: NodeRecord =
        serde_json::from_str(&serde_json::to_string(&mid).expect("ser")).expect("de");
    assert_eq!(back.redrained, Some(950));
    assert!(!wire.contains("redrained"), "absent when None: {wire}");
}

#[test]
fn a_failed_validation_rolled_back_returns_the_node_to_service_then_fails() {
    let failure = |message: &str| Failure {
        reason: reason::VALIDATION_FAILED,
        message: message.into(),
        pod_created: Some(950),
        terminated_at: Some(960),
    };
    // Rolled back: the agent reports 2.7.0 loaded again.
    let o = Observation {
        unschedulable: true,
        gates_present: true,
        loaded: Some("2.7.0".into()),
        installer: InstallerPod::Current { ready: false },
        installer_failure: Some(failure(
            "the agent gave up: tenstorrent 2.8.0 loaded but failed validation: ...; rolled back",
        )),
        ..obs()
    };
    let s = step(&rec(Upgrading), &o, &want());
    assert_eq!(s.record.state, Uncordoning);
    assert_eq!(s.record.reason.as_deref(), Some(reason::VALIDATION_FAILED));
    assert_eq!(s.commands, vec![Command::Uncordon, Command::OpenGates]);
    assert!(s.record.halts_rollout(), "no node starts meanwhile");
    let msg = s.record.message.clone().unwrap_or_default();
    assert!(
        msg.contains("back in service on tt-kmd 2.7.0") && msg.contains("retry"),
        "{msg}"
    );
    // Uncordoned and gates open: Failed, with nothing of ours left on the node.
    let back = Observation {
        unschedulable: false,
        gates_present: false,
        ..o.clone()
    };
    let f = step(&s.record, &back, &want());
    assert_eq!(f.record.state, Failed);
    assert_eq!(f.record.reason.as_deref(), Some(reason::VALIDATION_FAILED));
    assert_eq!(f.record.cordon, Cordon::None);
    assert_eq!(f.record.message, s.record.message);
    assert!(f.commands.is_empty());
    // An admin's cordon is left as it was.
    let mut theirs = rec(Upgrading);
    theirs.cordon = Cordon::Theirs;
    assert_eq!(
        step(&theirs, &o, &want()).commands,
        vec![Command::OpenGates]
    );

    // Held (onValidationFailure: hold): the target stays loaded, the node
    // stays cordoned and Failed.
    let held = Observation {
        loaded: Some("2.8.0".into()),
        parameters: Some(want().parameters.clone()),
        ..o
    };
    let h = step(&rec(Upgrading), &held, &want());
    assert_eq!(h.record.state, Failed);
    assert_eq!(h.record.reason.as_deref(), Some(reason::VALIDATION_FAILED));
    assert_eq!(h.record.cordon, Cordon::Ours);
    assert!(h.commands.is_empty(), "{:?}", h.commands);
}

#[test]
fn a_cycle_without_drain_never_swaps_a_module_it_finds() {
    let mut r = rec(Upgrading);
    r.no_drain = true;
    r.cordon = Cordon::None;
    r.reason = Some(reason::INSTALL.into());
    let o = Observation {
        loaded: Some("2.7.0".into()),
        installer: InstallerPod::Current { ready: false },
        ..obs()
    };
    let s = step(&r, &o, &want());
    assert_eq!(s.record.state, Pending);
    assert!(!s.record.no_drain, "the next cycle is a drained one");
    assert!(s.commands.is_empty());
}

#[test]
fn a_cordon_left_by_another_policy_of_ours_is_ours_to_undo() {
    let o = Observation {
        unschedulable: true,
        inherited_cordon: true,
        ..obs()
    };
    let s = step(&rec(Pending), &o, &want());
    assert_eq!(s.record.state, Cordoning);
    assert_eq!(s.record.cordon, Cordon::Ours, "not an admin's cordon");
    let admin = Observation {
        inherited_cordon: false,
        ..o
    };
    assert_eq!(
        step(&rec(Pending), &admin, &want()).record.cordon,
        Cordon::Theirs
    );
}

/// A node the Go operator left mid-upgrade: cordoned for this policy
/// (`cordoned-by`, seen as an inherited cordon), gates at "false".
fn go_era(loaded: Option<&str>, installer: InstallerPod) -> Observation {
    Observation {
        unschedulable: true,
        inherited_cordon: true,
        gates_closed: true,
        gates_present: true,
        loaded: loaded.map(String::from),
        installer,
        ..obs()
    }
}

#[test]
fn a_go_era_cordon_on_an_up_to_date_node_is_undone_with_its_gates() {
    let r = NodeRecord::new("fleet", "2.8.0", 900);
    let o = go_era(Some("2.8.0"), InstallerPod::Current { ready: true });
    let s = step(&r, &o, &want());
    assert_eq!(s.record.state, Uncordoning);
    assert!(s.record.cordoned_by_us());
    assert_eq!(s.commands, vec![Command::Uncordon, Command::OpenGates]);
    let done = step(
        &s.record,
        &Observation {
            unschedulable: false,
            gates_closed: false,
            gates_present: false,
            ..o
        },
        &want(),
    );
    assert_eq!(done.record.state, Done);
    assert_eq!(done.record.cordon, Cordon::None);
}

#[test]
fn gates_left_at_false_on_an_up_to_date_node_are_removed() {
    let r = NodeRecord::new("fleet", "2.8.0", 900);
    let o = Observation {
        gates_closed: true,
        gates_present: true,
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        ..obs()
    };
    let s = step(&r, &o, &want());
    assert_eq!(s.record.state, Uncordoning);
    assert_eq!(s.commands, vec![Command::OpenGates]);
    assert!(!s.record.cordoned_by_us(), "nobody's cordon is taken");
}

#[test]
fn a_go_era_cordoned_node_without_kmd_version_gets_a_drained_cycle() {
    // No kmd-version: not assumed empty. The cordon is ours, so the node waits
    // for a slot and goes through cordon and drain before any swap.
    let r = NodeRecord::new("fleet", "2.8.0", 900);
    let o = go_era(None, InstallerPod::Stale { deleting: false });
    let waiting = step(
        &r,
        &Observation {
            slot: false,
            ..o.clone()
        },
        &want(),
    );
    assert_eq!(waiting.record.state, Pending);
    assert!(waiting.commands.is_empty());
    let s = step(&r, &o, &want());
    assert_eq!(s.record.state, Cordoning);
    assert!(s.record.cordoned_by_us());
    assert!(!s.record.no_drain);
}

#[test]
fn a_cordon_of_someone_else_is_not_adopted() {
    let r = NodeRecord::new("fleet", "2.8.0", 900);
    let o = Observation {
        unschedulable: true,
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        ..obs()
    };
    let s = step(&r, &o, &want());
    assert_eq!(s.record.state, Done);
    assert!(s.commands.is_empty());
}

/// The vacate cycle's rules, checked on every step of the cross product.
fn vacate_properties(r: &NodeRecord, o: &Observation, w: &Desired, s: &Step, ctx: &str) {
    let vacates = s.commands.contains(&Command::Vacate);
    let enters = s.record.state == Unmanaged && r.state != Unmanaged;
    assert!(
        !vacates || enters,
        "vacate only on entering Unmanaged: {ctx}"
    );
    assert!(
        !enters || vacates || o.vacated,
        "entering Unmanaged vacates, unless vacated before (then nothing is written): {ctx}"
    );
    if !w.unmanage {
        assert!(
            !matches!(s.record.state, Unloading | Unmanaged | UnloadFailed)
                || (w.paused && s.record.state == r.state),
            "only an unmanaged policy unloads (a paused one holds a node where it is): {ctx}"
        );
        return;
    }
    assert!(
        !(s.record.state == Failed && r.state != Failed),
        "a vacate cycle fails as UnloadFailed: {ctx}"
    );
    if r.state == Unmanaged {
        assert!(
            s.commands.is_empty() && s.record.state == Unmanaged,
            "an Unmanaged node is left alone: {ctx}"
        );
    }
    if s.record.state == Unloading && r.state != Unloading {
        assert!(
            matches!(r.state, Pending | Draining | Upgrading),
            "Unloading follows the drain, an interrupted upgrade, or a start without drain: {ctx}"
        );
        if r.state == Pending {
            assert!(
                o.slot && !w.drain_enabled && o.ready && !w.paused && !w.refused,
                "an unload without drain starts only with a slot: {ctx}"
            );
        }
        if r.state == Draining {
            assert!(o.unschedulable, "unload only a cordoned node: {ctx}");
        }
    }
    if r.state == Pending && s.record.state == Cordoning && o.firmware_first.is_some() {
        assert!(
            !w.combine_with_firmware
                || w.unmanage
                || r.cordoned_by_us()
                || (o.inherited_cordon && o.unschedulable),
            "a swap never cordons on its own while a flash of the node waits its turn: {ctx}"
        );
    }
    if r.state == Pending && o.host_managed && !r.cordoned_by_us() && !o.inherited_cordon {
        assert!(
            !s.commands.iter().any(|c| matches!(
                c,
                Command::Cordon | Command::DeleteInstallerPod | Command::Evict
            )),
            "a host-managed node is never cordoned, drained or unloaded: {ctx}"
        );
    }
    if s.commands.contains(&Command::Vacate) && r.cordon == Cordon::Theirs {
        assert!(
            !s.commands.contains(&Command::Uncordon),
            "the vacate keeps someone else's cordon: {ctx}"
        );
    }
}

fn unmanage() -> Desired {
    Desired {
        unmanage: true,
        ..want()
    }
}

#[test]
fn vacate_cycle_walks_pending_to_unmanaged() {
    use Command::*;
    let w = unmanage();
    let o = Observation {
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        ..obs()
    };
    // No slot: waits.
    let s = step(
        &NodeRecord::new("fleet", "2.8.0", 900),
        &Observation {
            slot: false,
            ..o.clone()
        },
        &w,
    );
    assert_eq!(s.record.state, Pending);
    assert!(s.commands.is_empty());
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("vacate"))
    );
    // Slot: cordon and gates first, as an upgrade.
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &o, &w);
    assert_eq!(
        (s.record.state, s.commands.clone()),
        (Cordoning, vec![Cordon, CloseGates])
    );
    assert!(s.record.occupies_slot());
    let cordoned = Observation {
        unschedulable: true,
        gates_closed: true,
        gates_present: true,
        ..o.clone()
    };
    let s = step(&s.record, &cordoned, &w);
    assert_eq!(
        (s.record.state, s.commands.clone()),
        (Draining, vec![Evict])
    );
    // Drained: Unloading, the installer pod replaced.
    let s = step(&s.record, &cordoned, &w);
    assert_eq!(
        (s.record.state, s.commands.clone()),
        (Unloading, vec![DeleteInstallerPod])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::UNLOAD));
    assert!(s.record.occupies_slot(), "the slot is held until the end");
    // The old pod (Ready, module loaded) does not end the cycle.
    let s = step(&s.record, &cordoned, &w);
    assert_eq!(s.record.state, Unloading);
    let unloading = s.record.clone();
    let new_pod_waiting = Observation {
        installer: InstallerPod::Current { ready: false },
        ..cordoned.clone()
    };
    assert_eq!(
        step(&unloading, &new_pod_waiting, &w).record.state,
        Unloading
    );
    // The new installer unloaded: one patch undoes the cordon, the gates, and vacates.
    let unloaded = Observation {
        loaded: None,
        installer: InstallerPod::Current { ready: true },
        ..cordoned.clone()
    };
    let s = step(&unloading, &unloaded, &w);
    assert_eq!(
        (s.record.state, s.commands.clone()),
        (Unmanaged, vec![Uncordon, OpenGates, Vacate])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::VACATED));
    assert!(!s.record.occupies_slot() && !s.record.cordoned_by_us());
    // Left alone afterwards, including after a restart (no record, the label).
    let after = Observation {
        unschedulable: false,
        gates_closed: false,
        gates_present: false,
        installer: InstallerPod::Missing,
        vacated: true,
        ..unloaded
    };
    assert!(step(&s.record, &after, &w).commands.is_empty());
    let fresh = step(&NodeRecord::new("fleet", "2.8.0", 2000), &after, &w);
    assert_eq!((fresh.record.state, fresh.commands), (Unmanaged, vec![]));
}

#[test]
fn vacate_keeps_someone_elses_cordon() {
    let w = unmanage();
    let o = Observation {
        unschedulable: true,
        ..obs()
    };
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &o, &w);
    assert_eq!(s.record.state, Cordoning);
    assert_eq!(s.record.cordon, Cordon::Theirs);
    assert_eq!(s.commands, vec![Command::CloseGates]);
    let mut r = s.record;
    r.state = Unloading;
    let done = Observation {
        loaded: None,
        installer: InstallerPod::Current { ready: true },
        gates_present: true,
        ..o
    };
    let s = step(&r, &done, &w);
    assert_eq!(s.record.state, Unmanaged);
    assert_eq!(s.commands, vec![Command::OpenGates, Command::Vacate]);
}

#[test]
fn a_host_managed_node_is_marked_unmanaged_without_a_cycle() {
    let o = Observation {
        host_managed: true,
        slot: true,
        ..obs()
    };
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &o, &unmanage());
    assert_eq!(s.record.state, Unmanaged);
    assert_eq!(s.record.reason.as_deref(), Some(reason::HOST_MANAGED));
    assert_eq!(s.commands, vec![Command::OpenGates, Command::Vacate]);
    assert!(!s.record.occupies_slot(), "no slot taken");
}

#[test]
fn without_drain_the_unload_starts_with_the_slot() {
    let w = Desired {
        drain_enabled: false,
        ..unmanage()
    };
    let r = NodeRecord::new("fleet", "2.8.0", 900);
    let s = step(
        &r,
        &Observation {
            slot: false,
            ..obs()
        },
        &w,
    );
    assert_eq!(s.record.state, Pending);
    let s = step(&r, &obs(), &w);
    assert_eq!(
        (s.record.state, s.commands),
        (Unloading, vec![Command::DeleteInstallerPod])
    );
    assert!(s.record.occupies_slot());
}

#[test]
fn a_failed_unload_halts_as_unload_failed_until_retried() {
    let w = unmanage();
    let mut r = rec(Unloading);
    r.since = 900;
    // The agent's refusal (device busy) on the new pod.
    let busy = Observation {
        unschedulable: true,
        installer: InstallerPod::Current { ready: false },
        installer_failure: Some(Failure {
            reason: reason::DEVICE_BUSY,
            message: "pid 42 (python) holds /dev/tenstorrent/0".into(),
            pod_created: Some(950),
            terminated_at: None,
        }),
        ..obs()
    };
    // The first refusal of the cycle drains again (a pod that came after
    // the drain); the second fails.
    let s = step(&r, &busy, &w);
    assert_eq!(
        (s.record.state, s.commands.clone()),
        (Draining, vec![Command::Evict])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::DRAIN_AGAIN));
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("refused the unload"))
    );
    r.redrained = Some(920);
    let s = step(&r, &busy, &w);
    assert_eq!(s.record.state, UnloadFailed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::DEVICE_BUSY));
    assert!(s.commands.is_empty(), "stays cordoned");
    assert!(s.record.cordoned_by_us());
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("pid 42") && m.contains("kubectl tt driver retry"))
    );
    // Stays until a retry, which starts the vacate cycle again.
    assert_eq!(step(&s.record, &busy, &w).record.state, UnloadFailed);
    let retried = step(
        &s.record,
        &Observation {
            retry_token: Some("t1".into()),
            installer_failure: None,
            ..busy.clone()
        },
        &w,
    );
    assert_eq!(retried.record.state, Pending);
    assert_eq!(retried.record.retry_token.as_deref(), Some("t1"));
    // A deadline that passes fails the same way.
    let late = Observation {
        now: 900 + 901,
        installer_failure: None,
        ..busy
    };
    let s = step(&r, &late, &w);
    assert_eq!(s.record.state, UnloadFailed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::UNLOAD_TIMEOUT));
    // And a drain that outlives its timeout, too.
    let mut d = rec(Draining);
    d.since = 0;
    let s = step(
        &d,
        &Observation {
            unschedulable: true,
            now: 1000,
            drain: Some(DrainProgress {
                remaining: vec!["ml/p".into()],
                blocking_pdbs: vec![],
            }),
            ..obs()
        },
        &w,
    );
    assert_eq!(s.record.state, UnloadFailed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::DRAIN_TIMEOUT));
}

#[test]
fn pause_holds_the_unload() {
    let w = Desired {
        paused: true,
        ..unmanage()
    };
    let s = step(&rec(Unloading), &obs(), &w);
    assert_eq!(s.record.state, Unloading);
    assert!(s.commands.is_empty());
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &obs(), &w);
    assert_eq!((s.record.state, s.commands), (Pending, vec![]));
}

#[test]
fn managing_again_resumes_from_the_vacate_states() {
    let w = want();
    let s = step(&rec(Unloading), &obs(), &w);
    assert_eq!(
        (s.record.state, s.commands),
        (Upgrading, vec![Command::DeleteInstallerPod])
    );
    let mut u = rec(Unmanaged);
    u.cordon = Cordon::None;
    let s = step(
        &u,
        &Observation {
            slot: false,
            ..obs()
        },
        &w,
    );
    assert_eq!(s.record.state, Pending);
    let s = step(&rec(UnloadFailed), &obs(), &w);
    assert_eq!(s.record.state, Failed, "still halted until retried");
    // An upgrade cut short by `unmanage`: drained already, so straight to Unloading.
    let s = step(&rec(Upgrading), &obs(), &unmanage());
    assert_eq!(
        (s.record.state, s.commands),
        (Unloading, vec![Command::DeleteInstallerPod])
    );
}

#[test]
fn a_node_the_agent_reported_empty_is_vacated_without_a_cycle() {
    let o = Observation {
        loaded: None,
        nothing_loaded: true,
        ..obs()
    };
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &o, &unmanage());
    assert_eq!(
        (s.record.state, s.commands),
        (Unmanaged, vec![Command::OpenGates, Command::Vacate])
    );
    // Without the agent's report, a node without kmd-version is not assumed empty.
    let unknown = Observation {
        loaded: None,
        ..obs()
    };
    let s = step(
        &NodeRecord::new("fleet", "2.8.0", 900),
        &unknown,
        &unmanage(),
    );
    assert_eq!(s.record.state, Cordoning);
}

#[test]
fn the_pod_that_unloads_is_this_cycles() {
    let mut r = rec(Unloading);
    r.since = 900;
    // A pod from before the cycle (not yet in the cache when it started):
    // replaced; its failure does not count.
    let old = Observation {
        unschedulable: true,
        installer: InstallerPod::Current { ready: false },
        installer_created: Some(850),
        installer_failure: Some(Failure {
            reason: reason::DEVICE_BUSY,
            message: "an earlier cycle".into(),
            pod_created: Some(850),
            terminated_at: None,
        }),
        ..obs()
    };
    let s = step(&r, &old, &unmanage());
    assert_eq!(
        (s.record.state, s.commands),
        (Unloading, vec![Command::DeleteInstallerPod])
    );
    // This cycle's pod: its failure counts.
    let new = Observation {
        installer_created: Some(950),
        installer_failure: Some(Failure {
            reason: reason::DEVICE_BUSY,
            message: "pid 7".into(),
            pod_created: Some(950),
            terminated_at: None,
        }),
        ..old
    };
    assert_eq!(step(&r, &new, &unmanage()).record.state, Draining);
    r.redrained = Some(920);
    assert_eq!(step(&r, &new, &unmanage()).record.state, UnloadFailed);
}

/// Build-ahead's safety properties, over the cross product.
fn prepare_properties(r: &NodeRecord, o: &Observation, w: &Desired, s: &Step, ctx: &str) {
    if !w.prepare || r.state != Pending || o.prepared {
        if w.prepare
            && r.state == Draining
            && s.record.state == Upgrading
            && matches!(o.installer, InstallerPod::Current { .. })
        {
            assert!(
                !s.commands.contains(&Command::DeleteInstallerPod),
                "the pod that built ahead is kept into the window: {ctx}"
            );
        }
        return;
    }
    // Not prepared: nothing disruptive starts.
    assert!(
        !(matches!(s.record.state, Cordoning | Draining | Unloading)
            || (s.record.state == Upgrading && !s.record.no_drain)),
        "a node is cordoned only once its target is built ahead: {ctx}"
    );
    assert!(
        !s.commands
            .iter()
            .any(|c| matches!(c, Command::Cordon | Command::Evict | Command::CloseGates)),
        "no cordon, gate or eviction before the build is done: {ctx}"
    );
    if s.commands.contains(&Command::DeleteInstallerPod) && !s.record.no_drain {
        assert!(
            o.prepare_turn && o.installer == (InstallerPod::Stale { deleting: false }),
            "a pod is replaced ahead only in its turn: {ctx}"
        );
    }
}

fn prepare_on() -> Desired {
    Desired {
        prepare: true,
        ..want()
    }
}

#[test]
fn build_ahead_replaces_the_pod_in_its_turn_and_holds_the_cycle_until_prepared() {
    let pending = NodeRecord::new("fleet", "2.8.0", 900);
    let waiting = Observation {
        prepared: false,
        ..obs()
    };
    // A slot is no use yet: no place to build, no cordon.
    let s = step(&pending, &waiting, &prepare_on());
    assert_eq!(s.record.state, Pending);
    assert_eq!(s.record.reason.as_deref(), Some(reason::PREPARING));
    assert!(s.commands.is_empty(), "{s:?}");
    // Its turn: the stale pod is replaced, the node keeps serving.
    let s = step(
        &pending,
        &Observation {
            prepare_turn: true,
            ..waiting.clone()
        },
        &prepare_on(),
    );
    assert_eq!(s.record.state, Pending);
    assert_eq!(s.commands, vec![Command::DeleteInstallerPod]);
    assert_eq!(s.record.cordon, Cordon::None);
    // The new agent builds: still nothing.
    let building = Observation {
        installer: InstallerPod::Current { ready: false },
        ..waiting.clone()
    };
    let s = step(&s.record, &building, &prepare_on());
    assert!(s.commands.is_empty() && s.record.state == Pending, "{s:?}");
    // Prepared, with a slot: the cycle starts.
    let prepared = Observation {
        prepared: true,
        ..building.clone()
    };
    let s = step(&s.record, &prepared, &prepare_on());
    assert_eq!(s.record.state, Cordoning);
    // Drained: Upgrading keeps the pod that built ahead (it waits for the
    // go-ahead, which comes with this record).
    let drained = Observation {
        unschedulable: true,
        gates_closed: true,
        ..prepared.clone()
    };
    let s = step(&s.record, &drained, &prepare_on());
    assert_eq!(s.record.state, Draining);
    let s = step(&s.record, &drained, &prepare_on());
    assert_eq!(s.record.state, Upgrading);
    assert!(s.commands.is_empty(), "{s:?}");
    // Off: the pod is replaced after the drain, as before.
    let mut off = s.record.clone();
    off.state = Draining;
    let s = step(&off, &drained, &want());
    assert_eq!(s.commands, vec![Command::DeleteInstallerPod]);
}

#[test]
fn a_build_that_fails_ahead_fails_the_node_uncordoned_and_a_retry_builds_again() {
    let pending = NodeRecord::new("fleet", "2.8.0", 900);
    let failed_build = |at: i64| Observation {
        prepared: false,
        installer: InstallerPod::Current { ready: false },
        installer_failure: Some(Failure {
            reason: reason::BUILD_FAILED,
            message: "the agent gave up: make exited 2".into(),
            pod_created: Some(950),
            terminated_at: Some(at),
        }),
        ..obs()
    };
    // A pod from before the wait began, failing: replaced, not failed.
    let old_pod = step(&pending, &failed_build(990), &prepare_on());
    let mut late = pending.clone();
    late.since = 960;
    assert_eq!(
        step(&late, &failed_build(990), &prepare_on()).commands,
        vec![Command::DeleteInstallerPod]
    );
    assert_eq!(old_pod.record.state, Failed, "{old_pod:?}");
    let s = step(&pending, &failed_build(990), &prepare_on());
    assert_eq!(s.record.state, Failed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::BUILD_FAILED));
    assert_eq!(s.record.cordon, Cordon::None);
    assert!(s.commands.is_empty(), "{s:?}");
    let msg = s.record.message.clone().unwrap_or_default();
    assert!(
        msg.contains("not cordoned") && msg.contains("make exited 2"),
        "{msg}"
    );
    // Retried: the pod is older than the retry, so a new pod builds, even
    // if it failed once more meanwhile (on the cause just fixed).
    let retried = step(
        &s.record,
        &Observation {
            now: 2000,
            retry_token: Some("t1".into()),
            ..failed_build(2000)
        },
        &prepare_on(),
    );
    assert_eq!(retried.record.state, Pending);
    assert_eq!(retried.commands, vec![Command::DeleteInstallerPod]);
}

#[test]
fn failures_of_the_pod_kept_from_build_ahead_count_only_after_the_cycle_started() {
    let mut up = rec(Upgrading);
    up.since = 1000;
    let failed = |at: i64| Observation {
        installer: InstallerPod::Current { ready: false },
        unschedulable: true,
        installer_failure: Some(Failure {
            reason: reason::LOAD_FAILED,
            message: "the kernel refused it".into(),
            // Created ahead, long before the cycle.
            pod_created: Some(100),
            terminated_at: Some(at),
        }),
        now: 1010,
        ..obs()
    };
    let s = step(&up, &failed(1005), &prepare_on());
    assert_eq!(s.record.state, Failed);
    assert_eq!(s.record.reason.as_deref(), Some(reason::LOAD_FAILED));
    // A failure from its build-ahead, already over: not this cycle's.
    let s = step(&up, &failed(500), &prepare_on());
    assert_eq!(s.record.state, Upgrading);
}

#[test]
fn a_passthrough_node_is_left_alone_until_a_function_returns_to_tt_kmd() {
    // Out of date, a slot offered: with every function on vfio-pci there is
    // nothing to swap for, so no cordon, no drain, no slot.
    let all = Observation {
        loaded: Some("2.7.0".into()),
        passthrough: Passthrough::All { vfio: 4 },
        ..obs()
    };
    let s = step(&rec(Pending), &all, &want());
    assert_eq!(s.record.state, Done);
    assert_eq!(s.record.reason.as_deref(), Some(reason::VFIO_PASSTHROUGH));
    assert!(s.commands.is_empty() && !s.needs_slot, "{:?}", s.commands);
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("all 4")),
        "{:?}",
        s.record.message
    );
    // Stays so while the binder holds every function.
    let again = step(&s.record, &all, &want());
    assert_eq!((again.record.state, again.commands.len()), (Done, 0));
    // A mixed node is upgraded as any other: tt-kmd serves the rest.
    let some = Observation {
        passthrough: Passthrough::Some { vfio: 1, total: 4 },
        ..all.clone()
    };
    assert_eq!(run(&rec(Pending), &some, &want()).0, Cordoning);
    // A function back on tt-kmd: the node needs the target again.
    // (Back to Pending: it waits for a slot like any other.)
    let back = step(&s.record, &some, &want());
    assert_eq!(back.record.state, Pending, "{:?}", back.record);
    assert_ne!(
        back.record.reason.as_deref(),
        Some(reason::VFIO_PASSTHROUGH)
    );
    assert_eq!(run(&back.record, &some, &want()).0, Cordoning);
    // A cordon of ours (a cycle cut short) is still undone by a cycle.
    let mut ours = rec(Pending);
    ours.cordon = Cordon::Ours;
    assert_ne!(step(&ours, &all, &want()).record.state, Done);
}

#[test]
fn a_done_node_stays_done_when_its_installer_is_only_not_ready() {
    let mut done = rec(Done);
    done.reason = Some(reason::UPGRADED.into());
    // A partition: the node Unknown, its pods marked NotReady; then back,
    // the kubelet not reporting the pod yet; or the pod recreated.
    for (ready, installer) in [
        (false, InstallerPod::Current { ready: false }),
        (true, InstallerPod::Current { ready: false }),
        (true, InstallerPod::Missing),
        (false, InstallerPod::Missing),
    ] {
        let o = Observation {
            ready,
            installer: installer.clone(),
            loaded: Some("2.8.0".into()),
            slot: true,
            ..obs()
        };
        let s = step(&done, &o, &want());
        assert_eq!(
            (s.record.state, s.commands.len()),
            (Done, 0),
            "ready {ready}, {installer:?}: {:?}",
            s.record
        );
    }
    // A new installer template is a change: the pod is to be replaced in
    // place, with a slot (asked for from Pending).
    let stale = Observation {
        installer: InstallerPod::Stale { deleting: false },
        loaded: Some("2.8.0".into()),
        ..obs()
    };
    let s = step(&done, &stale, &want());
    assert_eq!(s.record.state, Pending, "{:?}", s.record);
    assert!(s.commands.is_empty());
    assert_eq!(
        run(&s.record, &stale, &want()).1,
        vec![Command::DeleteInstallerPod]
    );
    // And so is a module that is not the target any more.
    let other = Observation {
        loaded: Some("2.7.0".into()),
        ..obs()
    };
    assert_ne!(step(&done, &other, &want()).record.state, Done);
}

#[test]
fn a_done_node_stays_done_across_a_reboot_until_its_agent_reports() {
    let mut done = rec(Done);
    done.reason = Some(reason::UPGRADED.into());
    // Rebooted: the labels are the last boot's, so nothing is known loaded;
    // the installer pod restarts (not Ready), or the node is not Ready yet.
    let rebooted = |ready: bool, installer: InstallerPod| Observation {
        ready,
        installer,
        loaded: None,
        rebooted_unreported: true,
        ..obs()
    };
    for o in [
        rebooted(false, InstallerPod::Current { ready: false }),
        rebooted(true, InstallerPod::Current { ready: false }),
        rebooted(true, InstallerPod::Missing),
    ] {
        let s = step(&done, &o, &want());
        assert_eq!((s.record.state, s.commands.len()), (Done, 0), "{o:?}");
    }
    // What the agent then reports decides: the target again stays Done;
    // nothing or another version loaded at this boot is a change.
    let reported = |loaded: Option<&str>| Observation {
        loaded: loaded.map(String::from),
        nothing_loaded: loaded.is_none(),
        installer: InstallerPod::Current { ready: true },
        ..obs()
    };
    assert_eq!(
        step(&done, &reported(Some("2.8.0")), &want()).record.state,
        Done
    );
    assert_ne!(step(&done, &reported(None), &want()).record.state, Done);
    assert_ne!(
        step(&done, &reported(Some("2.7.0")), &want()).record.state,
        Done
    );
    // An installer that fails before it reports is a change: the node
    // goes through a cycle that fails with the cause.
    let failing = Observation {
        installer_failure: Some(Failure {
            reason: reason::INSTALLER_CRASH_LOOP,
            message: "crash loop".into(),
            pod_created: None,
            terminated_at: None,
        }),
        ..rebooted(true, InstallerPod::Current { ready: false })
    };
    assert_ne!(step(&done, &failing, &want()).record.state, Done);
    // A new installer template is a change, rebooted or not.
    let stale = Observation {
        installer: InstallerPod::Stale { deleting: false },
        ..rebooted(true, InstallerPod::Missing)
    };
    assert_ne!(step(&done, &stale, &want()).record.state, Done);
}

#[test]
fn a_new_installer_template_replaces_the_pod_in_place_with_a_slot() {
    let stale = Observation {
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Stale { deleting: false },
        ..obs()
    };
    // Without a slot: it waits, and asks for one.
    let wait = step(
        &rec(Pending),
        &Observation {
            slot: false,
            ..stale.clone()
        },
        &want(),
    );
    assert_eq!(wait.record.state, Pending);
    assert!(wait.needs_slot && wait.commands.is_empty(), "{wait:?}");
    assert!(
        wait.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("replace the installer pod in place")),
        "{:?}",
        wait.record.message
    );
    // With one: no cordon, the pod replaced, the slot held until Done.
    let go = step(&rec(Pending), &stale, &want());
    assert_eq!(go.record.state, Upgrading);
    assert_eq!(go.record.reason.as_deref(), Some(reason::RESTART));
    assert_eq!(go.commands, vec![Command::DeleteInstallerPod]);
    assert!(go.record.no_drain && go.record.bounded && go.record.occupies_slot());
    let ready = Observation {
        installer: InstallerPod::Current { ready: true },
        ..stale.clone()
    };
    let done = step(&go.record, &ready, &want());
    assert_eq!(done.record.state, Done);
    assert!(!done.record.bounded && !done.record.occupies_slot());
    // A first install (nothing loaded) and a pod that is only not Ready
    // replace nothing, and take no slot.
    for o in [
        Observation {
            loaded: None,
            slot: false,
            ..stale.clone()
        },
        Observation {
            installer: InstallerPod::Current { ready: false },
            slot: false,
            ..stale.clone()
        },
    ] {
        let s = step(&rec(Pending), &o, &want());
        assert_eq!(s.record.state, Upgrading, "{o:?}");
        assert!(!s.record.bounded && !s.record.occupies_slot());
    }
    // The record keeps the flag across a controller restart.
    let json = serde_json::to_string(&go.record).expect("record");
    assert!(json.contains("\"bounded\":true"), "{json}");
    let back: NodeRecord = serde_json::from_str(&json).expect("record");
    assert_eq!(back, go.record);
}

#[test]
fn a_module_that_needs_newer_firmware_waits_for_it() {
    use crate::fixtures::{desired, observation};
    let want = Desired {
        min_firmware: Some("19.8.0".into()),
        ..desired()
    };
    let rec = NodeRecord::new("fleet", "2.8.0", 0);
    let old = Observation {
        slot: true,
        firmware_version: Some("19.7.0.0".into()),
        ..observation()
    };
    let s = step(&rec, &old, &want);
    assert_eq!(
        (s.record.state, s.record.reason.as_deref()),
        (
            NodeState::Pending,
            Some(reason::WAITING_FOR_FIRMWARE_VERSION)
        )
    );
    assert!(s.commands.is_empty() && !s.needs_slot, "{s:?}");
    let there = Observation {
        firmware_version: Some("19.8.0.0".into()),
        ..old
    };
    assert_eq!(step(&rec, &there, &want).record.state, NodeState::Cordoning);
}

#[test]
fn a_swap_waits_for_a_flash_due_and_takes_its_cordon() {
    let due = Observation {
        firmware_first: Some("fw".into()),
        ..obs()
    };
    // A drained swap with a flash due: it waits (no slot asked), even with one.
    let s = step(&rec(Pending), &due, &want());
    assert_eq!((s.record.state, s.needs_slot), (Pending, false), "{s:?}");
    assert_eq!(
        s.record.reason.as_deref(),
        Some(reason::WAITING_FOR_FIRMWARE)
    );
    assert!(s.commands.is_empty());
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("fw"))
    );
    // Build-ahead goes on while it waits.
    let building = Observation {
        prepared: false,
        ..due.clone()
    };
    let prep = Desired {
        prepare: true,
        ..want()
    };
    assert_eq!(
        step(&rec(Pending), &building, &prep)
            .record
            .reason
            .as_deref(),
        Some(reason::PREPARING)
    );
    // Off (--combine-firmware-and-driver=false): the swap goes on its own.
    let apart = Desired {
        combine_with_firmware: false,
        ..want()
    };
    assert_eq!(step(&rec(Pending), &due, &apart).record.state, Cordoning);
    // Nothing to drain for: a first install and a restart keep going.
    let first = Observation {
        loaded: None,
        ..due.clone()
    };
    assert_eq!(step(&rec(Pending), &first, &want()).record.state, Upgrading);
    let same = Observation {
        loaded: Some("2.8.0".into()),
        ..due.clone()
    };
    assert_ne!(
        step(&rec(Pending), &same, &want()).record.reason.as_deref(),
        Some(reason::WAITING_FOR_FIRMWARE)
    );

    // The flash handed its cordon over: the swap takes it as its own (the
    // cordon patch re-asserts it, idempotent), and its cycle ends uncordoned.
    let handed = Observation {
        unschedulable: true,
        inherited_cordon: true,
        firmware_first: None,
        ..obs()
    };
    let s = step(&rec(Pending), &handed, &want());
    assert_eq!(s.record.state, Cordoning);
    assert_eq!(s.record.cordon, Cordon::Ours);
    assert!(!s.commands.contains(&Command::Uncordon), "{s:?}");
    let mut r = s.record.clone_with(Uncordoning);
    r.since = 1000;
    let s = step(
        &r,
        &Observation {
            loaded: Some("2.8.0".into()),
            installer: InstallerPod::Current { ready: true },
            ..handed
        },
        &want(),
    );
    assert_eq!(s.commands, vec![Command::Uncordon]);
}

/// The user's validation pod (`upgradePolicy.validation.podTemplateName`):
/// after the module validated, on the node still cordoned.
#[test]
fn a_user_validation_pod_must_succeed_before_the_uncordon() {
    let w = Desired {
        validation_pod: Some("check".into()),
        validation_timeout_seconds: 60,
        ..want()
    };
    let swapped = |run: Option<(i64, RunOutcome)>| Observation {
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        unschedulable: true,
        validation_pod: run.map(|(created, outcome)| ValidationPod {
            pod: "ops/ttdrv-validate-n1".into(),
            created,
            outcome,
        }),
        ..obs()
    };
    // Not created yet: create it, stay Upgrading.
    let s = step(&rec(Upgrading), &swapped(None), &w);
    assert_eq!(s.record.state, Upgrading);
    assert_eq!(s.record.reason.as_deref(), Some(reason::VALIDATING));
    assert_eq!(s.commands, vec![Command::RunValidationPod]);
    // Running within the timeout (now 1000, created 990): wait.
    let s = step(&s.record, &swapped(Some((990, RunOutcome::Running))), &w);
    assert_eq!((s.record.state, s.commands.clone()), (Upgrading, vec![]));
    // Succeeded: back into service.
    let ok = step(&s.record, &swapped(Some((990, RunOutcome::Succeeded))), &w);
    assert_eq!(ok.record.state, Uncordoning);
    assert_eq!(
        ok.commands,
        vec![
            Command::Uncordon,
            Command::OpenGates,
            Command::DeleteValidationPod
        ]
    );
    // Failed: Failed, still cordoned, the pod named.
    let bad = step(
        &s.record,
        &swapped(Some((990, RunOutcome::Failed("check: exit code 3".into())))),
        &w,
    );
    assert_eq!(bad.record.state, Failed);
    assert_eq!(
        bad.record.reason.as_deref(),
        Some(reason::VALIDATION_FAILED)
    );
    assert!(bad.commands.is_empty(), "{:?}", bad.commands);
    assert_eq!(bad.record.cordon, Cordon::Ours, "kept cordoned");
    let m = bad.record.message.clone().unwrap_or_default();
    for part in [
        "ops/ttdrv-validate-n1",
        "exit code 3",
        "stays cordoned",
        "retry",
    ] {
        assert!(m.contains(part), "{part}: {m}");
    }
    // Running past the timeout (created 900, now 1000 > 60 s): Failed.
    let late = step(&s.record, &swapped(Some((900, RunOutcome::Running))), &w);
    assert_eq!(late.record.state, Failed);
    assert!(
        late.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("within 60s")),
        "{:?}",
        late.record.message
    );
    // Without a template nothing runs.
    let plain = step(&rec(Upgrading), &swapped(None), &want());
    assert_eq!(plain.record.state, Uncordoning);
    // An admin's cordon, a drained cycle: the pod runs too.
    let mut theirs = rec(Upgrading);
    theirs.cordon = Cordon::Theirs;
    let s = step(&theirs, &swapped(None), &w);
    assert_eq!(s.commands, vec![Command::RunValidationPod]);
    // A cycle without a cordon (drain disabled): none.
    let mut open = rec(Upgrading);
    open.cordon = Cordon::None;
    let no_drain = Desired {
        drain_enabled: false,
        ..w.clone()
    };
    let s = step(&open, &swapped(None), &no_drain);
    assert_eq!(s.record.state, Done, "{s:?}");
}

#[test]
fn a_missing_installer_pod_is_not_called_building() {
    let w = Desired {
        prepare: true,
        ..want()
    };
    let o = Observation {
        installer: InstallerPod::Missing,
        prepared: false,
        ..obs()
    };
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &o, &w);
    assert_eq!(s.record.state, Pending);
    let msg = s.record.message.unwrap_or_default();
    assert!(
        msg.contains("waiting for the DaemonSet controller"),
        "{msg}"
    );
    // A stale pod, its turn come, while the DaemonSet controller has not
    // seen the template: kept, and said so.
    let pending = Observation {
        installer: InstallerPod::Stale { deleting: false },
        prepare_turn: true,
        template_pending: true,
        ..o
    };
    let s = step(&NodeRecord::new("fleet", "2.8.0", 900), &pending, &w);
    assert!(s.commands.is_empty(), "{:?}", s.commands);
    let msg = s.record.message.unwrap_or_default();
    assert!(msg.contains("observe the installer template"), "{msg}");
}

#[test]
fn a_parameter_written_at_run_time_replaces_the_pod_in_place_never_cordons() {
    let values = |s: &str| ttdrv_api::module_params::parse(s).expect("values");
    let mut w = want();
    w.parameters = values("idle_power_down_grace_ms=50");
    // The target loaded, only the run-time parameter differs.
    let stale = Observation {
        loaded: Some("2.8.0".into()),
        parameters: Some(values("idle_power_down_grace_ms=5000 max_devices=32")),
        installer: InstallerPod::Stale { deleting: false },
        ..obs()
    };
    let go = step(&rec(Pending), &stale, &w);
    assert_eq!(go.record.state, Upgrading, "{go:?}");
    assert_eq!(go.record.reason.as_deref(), Some(reason::RESTART));
    assert_eq!(go.commands, vec![Command::DeleteInstallerPod]);
    assert!(go.record.no_drain && !go.record.cordoned_by_us(), "{go:?}");
    // The new pod is Ready but has not written it yet: no drained cycle.
    let current = Observation {
        installer: InstallerPod::Current { ready: true },
        ..stale.clone()
    };
    let wait = step(&go.record, &current, &w);
    assert_eq!(wait.record.state, Upgrading, "{wait:?}");
    assert!(
        !wait.record.cordoned_by_us() && wait.commands.is_empty(),
        "{wait:?}"
    );
    // Written: Done, never cordoned.
    let written = Observation {
        parameters: Some(values("idle_power_down_grace_ms=50 max_devices=32")),
        ..current
    };
    let done = step(&wait.record, &written, &w);
    assert_eq!(done.record.state, Done, "{done:?}");
    // A load-time parameter too: a drained cycle, as before.
    w.parameters = values("idle_power_down_grace_ms=50 max_devices=4");
    let both = step(&rec(Pending), &stale, &w);
    assert_eq!(both.record.state, Cordoning, "{both:?}");
}

#[test]
fn a_refused_spec_leaves_a_cycle_under_way_on_the_deployed_target() {
    // The node swaps towards 2.8.0 (the installers' version); the spec now
    // says 2.9.0 and is refused.
    let upgrading = rec(Upgrading);
    let mut refused = want();
    refused.version = "2.9.0".into();
    let kept = refused
        .clone()
        .refused_keeping(Some(("2.8.0".into(), Default::default())));
    assert!(kept.refused);
    let next = step(&upgrading, &obs(), &kept);
    assert_eq!(next.record.target, "2.8.0", "{next:?}");
    // Read from the refused spec instead, the node is sent after 2.9.0,
    // which no installer deploys.
    let mut naive = refused.clone();
    naive.refused = true;
    assert_eq!(step(&upgrading, &obs(), &naive).record.target, "2.9.0");
    // With nothing deployed, the spec's target stays (and nothing starts).
    let none = refused.refused_keeping(None);
    assert_eq!(none.version, "2.9.0");
    let pending = step(&rec(Pending), &obs(), &none);
    assert_eq!(pending.record.state, Pending, "{pending:?}");
}

#[test]
fn the_gates_open_and_the_stack_is_back_before_the_dra_plugin_restarts() {
    use crate::surface::{PublisherPod, StackPod, Surface};
    let fabric = "tt/fabric".to_string();
    let surface = |stack: Vec<StackPod>| Surface {
        driver: "tenstorrent.com".into(),
        plugin_selector: "app=dra".into(),
        cards: Some(2),
        plugin_pods: vec![PublisherPod {
            pod: PodRef {
                namespace: "tt".into(),
                name: "dra-a".into(),
            },
            created: 500,
            ready_since: Some(500),
            deleting: false,
        }],
        dra_devices: Some(2),
        extended: None,
        stack,
    };
    let fm = |ready: bool| StackPod {
        daemon_set: fabric.clone(),
        ready,
        deleting: false,
    };
    let w = want();
    // The cycle starts with the agent's pod on the node: it is remembered.
    let start = step(
        &rec(Pending),
        &Observation {
            slot: true,
            loaded: Some("2.7.0".into()),
            surface: surface(vec![fm(true)]),
            ..obs()
        },
        &w,
    );
    assert_eq!(start.record.state, Cordoning);
    assert_eq!(start.record.stood_down, vec![fabric.clone()]);
    // A cordon a flash handed over: the stack left with the flash, and the
    // flash's record says which DaemonSets to wait for.
    let taken_over = step(
        &rec(Pending),
        &Observation {
            slot: true,
            loaded: Some("2.7.0".into()),
            unschedulable: true,
            inherited_cordon: true,
            handed_over_stood_down: vec![fabric.clone(), "tt/telemetry".into()],
            surface: surface(vec![fm(true)]),
            ..obs()
        },
        &w,
    );
    assert_eq!(taken_over.record.state, Cordoning);
    assert_eq!(
        taken_over.record.stood_down,
        vec![fabric.clone(), "tt/telemetry".to_string()],
        "once each, sorted"
    );
    let mut upgrading = start.record.clone();
    upgrading.state = Upgrading;
    let swapped = |now: i64, gates: bool, stack: Vec<StackPod>| Observation {
        now,
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        unschedulable: true,
        gates_present: gates,
        gates_closed: gates,
        surface: surface(stack),
        ..obs()
    };
    // Swapped, the gates still closed: they open first, the node cordoned.
    let open = step(&upgrading, &swapped(1000, true, vec![]), &w);
    assert_eq!(open.record.state, Upgrading);
    assert_eq!(open.commands, vec![Command::OpenGates]);
    assert_eq!(open.record.surface_since, Some(1000));
    assert!(
        open.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("tt/fabric")),
        "{:?}",
        open.record.message
    );
    // Open, the agent's pod back but not Ready: the plugin is not touched.
    for stack in [vec![], vec![fm(false)]] {
        let wait = step(&open.record, &swapped(1010, false, stack), &w);
        assert_eq!(
            (wait.record.state, wait.commands.clone()),
            (Upgrading, vec![])
        );
        assert_eq!(wait.record.surface_since, Some(1000));
    }
    // Ready: the plugin from before is restarted.
    let restart = step(&open.record, &swapped(1020, false, vec![fm(true)]), &w);
    assert!(
        matches!(restart.commands.as_slice(), [Command::RestartPublishers(_)]),
        "{:?}",
        restart.commands
    );
    // Never back within the surface timeout: Failed, cordoned, named
    // (held: `onValidationFailure: hold`).
    let held = Desired {
        rollback: false,
        ..w.clone()
    };
    let late = step(
        &open.record,
        &swapped(1001 + w.surface_timeout_seconds, false, vec![]),
        &held,
    );
    assert_eq!(late.record.state, Failed);
    assert_eq!(
        late.record.reason.as_deref(),
        Some(reason::DEVICES_NOT_PUBLISHED)
    );
    assert!(
        late.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("tt/fabric"))
    );
    assert_eq!(late.record.cordon, Cordon::Ours);
    assert!(
        late.record.stood_down.is_empty(),
        "a finished cycle forgets"
    );
    // The target changes while the gates are open for the check: they
    // close again before the next swap, and the check starts anew.
    let mut retarget = w.clone();
    retarget.version = "2.9.0".into();
    let again = step(
        &open.record,
        &swapped(1015, false, vec![fm(true)]),
        &retarget,
    );
    assert_eq!(again.record.state, Upgrading);
    assert_eq!(again.commands, vec![Command::CloseGates]);
    assert_eq!(again.record.surface_since, None);
}

#[test]
fn the_scheduler_sees_every_card_again_before_the_uncordon() {
    use crate::surface::{PublisherPod, Surface};
    let plugin = |name: &str, created: i64, ready: bool, deleting: bool| PublisherPod {
        pod: PodRef {
            namespace: "tt".into(),
            name: name.into(),
        },
        created,
        ready_since: ready.then_some(created),
        deleting,
    };
    let swapped = |now: i64, pods: Vec<PublisherPod>, listed: Option<u32>| Observation {
        now,
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        unschedulable: true,
        surface: Surface {
            driver: "tenstorrent.com".into(),
            plugin_selector: "app=dra".into(),
            cards: Some(2),
            plugin_pods: pods,
            dra_devices: listed,
            extended: None,
            stack: vec![],
        },
        ..obs()
    };
    let w = want();
    // The check begins; creation times are whole seconds, so the plugin is
    // restarted only once the check's first second is over (a replacement
    // made in it could not be told from a pod from before).
    let s = step(
        &rec(Upgrading),
        &swapped(1000, vec![plugin("dra-a", 500, true, false)], Some(2)),
        &w,
    );
    assert_eq!((s.record.state, s.commands.clone()), (Upgrading, vec![]));
    assert_eq!(s.record.surface_since, Some(1000));
    // A pod created in that same second is from before the check as far
    // as anyone can tell: restarted with the others.
    let s = step(
        &s.record,
        &swapped(
            1001,
            vec![
                plugin("dra-a", 500, true, false),
                plugin("dra-c", 1000, true, false),
            ],
            Some(2),
        ),
        &w,
    );
    assert!(
        matches!(&s.commands[..], [Command::RestartPublishers(p)] if p.len() == 2),
        "{:?}",
        s.commands
    );
    // The plugin from before the swap: restarted, the check's start kept.
    let s = step(
        &s.record,
        &swapped(1001, vec![plugin("dra-a", 500, true, false)], Some(2)),
        &w,
    );
    assert_eq!(s.record.state, Upgrading);
    assert_eq!(s.record.reason.as_deref(), Some(reason::REFRESHING_DEVICES));
    assert_eq!(s.record.surface_since, Some(1000));
    assert_eq!(
        s.commands,
        vec![Command::RestartPublishers(vec![PodRef {
            namespace: "tt".into(),
            name: "dra-a".into()
        }])]
    );
    // Deleting, the new one not Ready yet: wait, nothing sent again.
    let s = step(
        &s.record,
        &swapped(
            1010,
            vec![
                plugin("dra-a", 500, true, true),
                plugin("dra-b", 1005, false, false),
            ],
            Some(2),
        ),
        &w,
    );
    assert_eq!((s.record.state, s.commands.clone()), (Upgrading, vec![]));
    assert_eq!(
        s.record.surface_since,
        Some(1000),
        "the deadline counts from the start"
    );
    // One card short: still waiting, the message gives both counts.
    let short = step(
        &s.record,
        &swapped(1020, vec![plugin("dra-b", 1005, true, false)], Some(1)),
        &w,
    );
    assert_eq!(short.record.state, Upgrading);
    let m = short.record.message.clone().unwrap_or_default();
    assert!(
        m.contains("list 1 device(s)") && m.contains("counted 2 card(s)"),
        "{m}"
    );
    // Whole: back into service.
    let ok = step(
        &short.record,
        &swapped(1030, vec![plugin("dra-b", 1005, true, false)], Some(2)),
        &w,
    );
    assert_eq!(ok.record.state, Uncordoning);
    assert_eq!(ok.record.surface_since, None);
    assert_eq!(ok.commands, vec![Command::Uncordon, Command::OpenGates]);
    // Short past the deadline, with `onValidationFailure: rollback` (the
    // default): a failed validation, rolled back; the gates close first.
    let late = 1000 + w.surface_timeout_seconds + 1;
    let rb = step(
        &short.record,
        &swapped(late, vec![plugin("dra-b", 1005, true, false)], Some(1)),
        &w,
    );
    assert_eq!(rb.record.state, Upgrading);
    assert_eq!(rb.record.reason.as_deref(), Some(reason::ROLLING_BACK));
    assert_eq!(rb.commands, vec![Command::CloseGates]);
    assert_eq!(rb.record.cordon, Cordon::Ours);
    // Held: Failed, kept cordoned, never uncordoned.
    let held = Desired {
        rollback: false,
        ..w.clone()
    };
    let bad = step(
        &short.record,
        &swapped(late, vec![plugin("dra-b", 1005, true, false)], Some(1)),
        &held,
    );
    assert_eq!(bad.record.state, Failed);
    assert_eq!(
        bad.record.reason.as_deref(),
        Some(reason::DEVICES_NOT_PUBLISHED)
    );
    assert!(bad.commands.is_empty(), "{:?}", bad.commands);
    assert_eq!(bad.record.cordon, Cordon::Ours);
    // Nothing publishes: nothing to wait for.
    let plain = step(&rec(Upgrading), &swapped(1000, vec![], None), &w);
    assert_eq!(plain.record.state, Uncordoning);
    // A cycle that never cordoned (no drain): no check.
    let mut nodrain = rec(Upgrading);
    nodrain.cordon = Cordon::None;
    nodrain.no_drain = true;
    let s = step(
        &nodrain,
        &swapped(1000, vec![plugin("dra-a", 500, true, false)], Some(1)),
        &w,
    );
    assert_eq!(s.record.state, Done);
}

#[test]
fn a_surface_short_of_cards_is_rolled_back_once_the_stack_has_left() {
    use crate::surface::{StackPod, Surface};
    let w = want();
    let mut r = rec(Upgrading);
    r.reason = Some(reason::ROLLING_BACK.into());
    r.message = Some("short (300s after the swap was validated): rolled back".into());
    let at_target = |now: i64, gates_closed: bool, stack: Vec<StackPod>| Observation {
        now,
        loaded: Some("2.8.0".into()),
        installer: InstallerPod::Current { ready: true },
        installer_created: Some(950),
        unschedulable: true,
        gates_present: true,
        gates_closed,
        surface: Surface {
            stack,
            ..Default::default()
        },
        ..obs()
    };
    let fm = StackPod {
        daemon_set: "tt/fabric".into(),
        ready: true,
        deleting: true,
    };
    // The gates close first, the node still cordoned.
    let s = step(&r, &at_target(1300, false, vec![]), &w);
    assert_eq!(s.commands, vec![Command::CloseGates]);
    assert_eq!(s.record.rollback_at, None);
    // The stack's pods hold the device: no verdict until they are gone.
    let s = step(&s.record, &at_target(1301, true, vec![fm]), &w);
    assert!(s.commands.is_empty(), "{:?}", s.commands);
    assert_eq!(s.record.rollback_at, None);
    let msg = s.record.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with("short (300s") && msg.contains("waiting for tt/fabric to leave"),
        "{msg}"
    );
    // Gone: the record gives the verdict (its patch carries the annotation).
    let s = step(&s.record, &at_target(1302, true, vec![]), &w);
    assert_eq!(s.record.rollback_at, Some(1302));
    assert!(s.commands.is_empty(), "{:?}", s.commands);
    assert_eq!(s.record.reason.as_deref(), Some(reason::ROLLING_BACK));
    // Not on the node yet as the cache shows it: the agent is not restarted.
    let s = step(&s.record, &at_target(1303, true, vec![]), &w);
    assert!(s.commands.is_empty(), "{:?}", s.commands);
    // Shown: the agent from before it is restarted to read it, once.
    let shown = |now: i64, created: i64| Observation {
        rollback_verdict: Some(900),
        installer_created: Some(created),
        ..at_target(now, true, vec![])
    };
    let s = step(&s.record, &shown(1304, 950), &w);
    assert_eq!(s.commands, vec![Command::DeleteInstallerPod]);
    let again = step(&s.record, &shown(1306, 1305), &w);
    assert!(again.commands.is_empty(), "{:?}", again.commands);
    // The agent loaded 2.7.0 again and gave up ValidationFailed: back in
    // service on it, then Failed (the rollout halts); the verdict goes.
    let rolled_back = Observation {
        loaded: Some("2.7.0".into()),
        installer: InstallerPod::Current { ready: false },
        installer_failure: Some(Failure {
            reason: reason::VALIDATION_FAILED,
            message:
                "tenstorrent 2.8.0: the scheduler did not see every card; rolled back to 2.7.0"
                    .into(),
            pod_created: Some(1305),
            terminated_at: Some(1310),
        }),
        ..shown(1311, 1305)
    };
    let back = step(&again.record, &rolled_back, &w);
    let msg = back.record.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with("short (300s") && msg.contains("back in service on tt-kmd 2.7.0"),
        "{msg}"
    );
    assert_eq!(back.record.state, Uncordoning);
    assert_eq!(
        back.record.reason.as_deref(),
        Some(reason::VALIDATION_FAILED)
    );
    assert_eq!(back.commands, vec![Command::Uncordon, Command::OpenGates]);
    assert_eq!(back.record.rollback_at, None);
    // An agent that never rolls back: Failed at the deadline, cordoned.
    let late = step(
        &again.record,
        &shown(1302 + w.upgrade_timeout_seconds + 1, 1305),
        &w,
    );
    assert_eq!(late.record.state, Failed);
    assert_eq!(
        late.record.reason.as_deref(),
        Some(reason::DEVICES_NOT_PUBLISHED)
    );
    assert_eq!(late.record.cordon, Cordon::Ours);
    assert_eq!(late.record.rollback_at, None);
    // A new target meanwhile: the rollback is moot, the verdict goes, and
    // the swap to the new target follows under the cycle's cordon.
    let newer = Desired {
        version: "2.9.0".into(),
        ..w.clone()
    };
    let moot = step(&again.record, &shown(1307, 1305), &newer);
    assert_eq!(moot.record.state, Upgrading);
    assert_eq!(moot.record.rollback_at, None);
    assert_ne!(moot.record.reason.as_deref(), Some(reason::ROLLING_BACK));
    assert_eq!(moot.record.cordon, Cordon::Ours);
}

/// The step as the NodeActor carries it out, with a Cordoning or Uncordoning
/// state folded into its write ([`own_write::through_own_write`]), keeps the rules.
fn folded_write_is_safe(r: &NodeRecord, o: &Observation, w: &Desired, s: &Step, ctx: &str) {
    let (f, folded) = own_write::through_own_write(s.clone(), o, w);
    let Some(mid) = folded else {
        assert_eq!(&f, s, "nothing folded, nothing changed: {ctx}");
        return;
    };
    let ctx = format!("{ctx}\nfolded -> {f:?}");
    assert_eq!(mid, s.record, "the folded record is the step's: {ctx}");
    let at = |c: Command| f.commands.iter().position(|x| *x == c);
    match f.record.state {
        Draining => {
            assert!(
                o.unschedulable || at(Command::Cordon).is_some(),
                "drain only a node cordoned, or cordoned by this very patch: {ctx}"
            );
        }
        Done | Failed => {
            assert!(
                !f.record.cordoned_by_us(),
                "back in service with nothing of ours left: {ctx}"
            );
            if at(Command::Uncordon).is_some() {
                assert_ne!(
                    r.cordon,
                    Cordon::Theirs,
                    "never uncordon an admin's cordon: {ctx}"
                );
            }
        }
        other => panic!("folded into {other:?}: {ctx}"),
    }
    assert!(
        !(w.paused && r.state.is_in_progress()),
        "paused holds a node mid-cycle where it is: {ctx}"
    );
    assert!(!f.needs_slot, "{ctx}");
}

#[test]
fn after_a_rollback_the_dra_plugin_restarted_on_the_new_module_is_restarted_again() {
    use crate::surface::{PublisherPod, Surface};
    let plugin = |name: &str, created: i64, deleting: bool| PublisherPod {
        pod: PodRef {
            namespace: "tt".into(),
            name: name.into(),
        },
        created,
        ready_since: Some(created + 1),
        deleting,
    };
    let mut r = rec(Upgrading);
    r.reason = Some(reason::ROLLING_BACK.into());
    r.surface_since = Some(1000);
    r.rollback_at = Some(1290);
    let rolled_back = Observation {
        now: 1320,
        loaded: Some("2.7.0".into()),
        installer: InstallerPod::Current { ready: false },
        installer_failure: Some(Failure {
            reason: reason::VALIDATION_FAILED,
            message: "tenstorrent 2.8.0: one card short; rolled back to 2.7.0".into(),
            pod_created: Some(1300),
            terminated_at: Some(1310),
        }),
        unschedulable: true,
        gates_present: true,
        surface: Surface {
            plugin_pods: vec![
                // Restarted by the check: it read 2.8.0.
                plugin("dra-check", 1100, false),
                // Created in the give-up's second: it may have read 2.8.0
                // before the rollback (creation times are whole seconds).
                plugin("dra-same-second", 1310, false),
                // Already on its way out, and one started after the rollback.
                plugin("dra-leaving", 1090, true),
                plugin("dra-after", 1315, false),
            ],
            ..Default::default()
        },
        ..obs()
    };
    let s = step(&r, &rolled_back, &want());
    assert_eq!(s.record.state, Uncordoning);
    let restart: Vec<PodRef> = ["dra-check", "dra-same-second"]
        .iter()
        .map(|n| PodRef {
            namespace: "tt".into(),
            name: n.to_string(),
        })
        .collect();
    assert_eq!(
        s.commands,
        vec![
            Command::Uncordon,
            Command::OpenGates,
            Command::RestartPublishers(restart.clone())
        ]
    );
    // Carried out in one write with the Failed record, the restart after it.
    let (f, folded) = own_write::through_own_write(s, &rolled_back, &want());
    assert_eq!(f.record.state, Failed);
    assert!(folded.is_some());
    assert_eq!(
        f.commands.last(),
        Some(&Command::RestartPublishers(restart))
    );
    // The agent's report of 2.7.0 seen before its give-up (the gates closed
    // for the rollback): that is the rollback under way, not a swap still to
    // come; the record and the gates stay as they are, and the restart
    // follows the give-up.
    let early = Observation {
        installer_failure: None,
        gates_closed: true,
        ..rolled_back.clone()
    };
    let between = step(&r, &early, &want());
    assert_eq!(between.record.surface_since, Some(1000));
    assert_eq!(between.record.rollback_at, Some(1290));
    assert_eq!(between.record.reason.as_deref(), Some(reason::ROLLING_BACK));
    assert!(between.commands.is_empty(), "{:?}", between.commands);
    // Even had a pass forgotten the check's start, the verdict says the
    // check restarted the plugin.
    let mut forgot = between.record.clone();
    forgot.surface_since = None;
    let s = step(&forgot, &rolled_back, &want());
    assert!(
        matches!(s.commands.last(), Some(Command::RestartPublishers(p)) if p.len() == 2),
        "{:?}",
        s.commands
    );
    let s = step(&between.record, &rolled_back, &want());
    assert!(
        matches!(s.commands.last(), Some(Command::RestartPublishers(p)) if p.len() == 2),
        "{:?}",
        s.commands
    );
    // A cycle that never restarted the plugin (no check, no verdict) leaves
    // it alone: it still publishes from the module that stays.
    r.surface_since = None;
    r.rollback_at = None;
    let s = step(&r, &rolled_back, &want());
    assert_eq!(s.commands, vec![Command::Uncordon, Command::OpenGates]);
}
