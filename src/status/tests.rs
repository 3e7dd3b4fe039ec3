//! Table tests of the status and its conditions.

use super::*;
use ttdrv_api::TenstorrentDriverPolicySpec;

/// The status input of policy `p` over `recs` at t=100 s: no device users,
/// conflicts, brake, refusal or previous status.
fn input<'a>(
    p: &'a TenstorrentDriverPolicy,
    recs: &'a HashMap<String, NodeRecord>,
) -> StatusInput<'a> {
    static NO_DEVICE_USERS: std::sync::LazyLock<HashSet<String>> =
        std::sync::LazyLock::new(HashSet::new);
    StatusInput {
        policy: p,
        records: recs,
        device_users: &NO_DEVICE_USERS,
        conflicts: &[],
        blocked: None,
        held: None,
        braked: None,
        promotion_blocked: false,
        refused: None,
        daemonset: "ttdrv-fleet",
        previous: None,
        now: Timestamp::from_second(100).expect("time"),
    }
}

fn policy(paused: bool, generation: i64) -> TenstorrentDriverPolicy {
    let mut p = TenstorrentDriverPolicy::new(
        "fleet",
        serde_json::from_value::<TenstorrentDriverPolicySpec>(serde_json::json!({
            "version": "2.8.0",
            "paused": paused,
            "nodeAffinity": { "nodeSelectorTerms": [ { "matchLabels": { "pool": "a" } } ] }
        }))
        .expect("spec"),
    );
    p.metadata.generation = Some(generation);
    p
}

fn rec(state: NodeState, reason: Option<&str>, message: Option<&str>) -> NodeRecord {
    let mut r = NodeRecord::new("fleet", "2.8.0", 50);
    r.state = state;
    r.reason = reason.map(String::from);
    r.message = message.map(String::from);
    r
}

fn records(list: &[(&str, NodeRecord)]) -> HashMap<String, NodeRecord> {
    list.iter()
        .map(|(n, r)| (n.to_string(), r.clone()))
        .collect()
}

fn status_of(
    policy: &TenstorrentDriverPolicy,
    records: &HashMap<String, NodeRecord>,
    device: &HashSet<String>,
    conflicts: &[(String, String)],
    previous: Option<&TenstorrentDriverPolicyStatus>,
    now: i64,
) -> TenstorrentDriverPolicyStatus {
    let input = StatusInput {
        policy,
        records,
        device_users: device,
        conflicts,
        blocked: None,
        held: None,
        braked: None,
        promotion_blocked: false,
        refused: None,
        daemonset: "ttdrv-fleet",
        previous,
        now: Timestamp::from_second(now).expect("time"),
    };
    // A Done node (not host-managed) has the target loaded; others report
    // a version of their own.
    build(&input, |n| Reported {
        version: Some(
            if records[n].state == NodeState::Done
                && records[n].reason.as_deref() != Some(reason::HOST_MANAGED)
            {
                "2.8.0".to_string()
            } else {
                format!("v-{n}")
            },
        ),
        install_mode: None,
        prepared_version: (n == "prepared").then(|| "2.8.0".to_string()),
        next_kernel_build_failed: (n == "prepared").then(|| "6.12.0-1-amd64".to_string()),
        parameters: None,
    })
}

#[test]
fn what_the_agent_prepared_and_its_next_kernel_warning_are_per_node() {
    let p = policy(false, 1);
    let recs = records(&[
        ("prepared", rec(NodeState::Pending, None, None)),
        ("other", rec(NodeState::Pending, None, None)),
    ]);
    let s = status_of(&p, &recs, &HashSet::new(), &[], None, 100);
    let node = |name: &str| {
        s.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", s.nodes))
    };
    assert_eq!(node("prepared").prepared_version.as_deref(), Some("2.8.0"));
    assert_eq!(
        node("prepared").next_kernel_build_failed.as_deref(),
        Some("6.12.0-1-amd64")
    );
    assert_eq!(node("other").prepared_version, None);
    assert_eq!(node("other").next_kernel_build_failed, None);
}

#[test]
fn module_parameters_are_reported_and_a_node_without_them_holds_nothing() {
    let mut p = policy(false, 1);
    p.spec.module_parameters = Some(ttdrv_api::ModuleParameters {
        max_devices: Some(4),
        ..Default::default()
    });
    let recs = records(&[
        ("at", rec(NodeState::Done, Some(reason::UPGRADED), None)),
        ("off", rec(NodeState::Pending, None, None)),
    ]);
    let input = StatusInput { ..input(&p, &recs) };
    let s = build(&input, |n| Reported {
        version: Some("2.8.0".into()),
        parameters: Some(
            ttdrv_api::module_params::parse(if n == "at" {
                "max_devices=4 power_policy=Y"
            } else {
                "max_devices=32 power_policy=Y"
            })
            .expect("values"),
        ),
        ..Default::default()
    });
    let node = |name: &str| {
        s.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", s.nodes))
    };
    assert_eq!(
        node("off").module_parameters.as_deref(),
        Some("max_devices=32 power_policy=Y")
    );
    assert_eq!(
        s.summary.prepared, 1,
        "2.8.0 with max_devices=32 is not the target"
    );
}

fn conditions(s: &TenstorrentDriverPolicyStatus) -> Vec<(String, String, String)> {
    s.conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect()
}

/// The status's condition of type `type_`.
fn condition<'a>(s: &'a TenstorrentDriverPolicyStatus, type_: &str) -> &'a Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", s.conditions))
}

fn c(t: &str, s: &str, r: &str) -> (String, String, String) {
    (t.into(), s.into(), r.into())
}

/// The conditions of a settled rollout, in the order they are written.
fn settled() -> Vec<(String, String, String)> {
    vec![
        c("Ready", "True", "RolloutComplete"),
        c("Progressing", "False", "Idle"),
        c("Degraded", "False", "AsExpected"),
        c("Paused", "False", "Running"),
        c("Conflict", "False", "NoOverlap"),
        c("Prepared", "True", "AllPrepared"),
        c("NextKernelBuildFailed", "False", "NoneReported"),
    ]
}

/// [`settled`] with the conditions in `changed` (type, status, reason)
/// instead; a type it does not have is a mistake in the table.
fn settled_but(changed: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut want = settled();
    for &(t, s, r) in changed {
        let slot = want
            .iter_mut()
            .find(|w| w.0 == t)
            .unwrap_or_else(|| panic!("no condition {t}"));
        *slot = c(t, s, r);
    }
    want
}

/// (name, records, paused, conflicts, expected (type, status, reason) per condition)
type Row<'a> = (
    &'a str,
    Vec<(&'a str, NodeRecord)>,
    bool,
    &'a [(String, String)],
    Vec<(String, String, String)>,
);

#[test]
fn conditions_table() {
    let done = rec(NodeState::Done, Some(reason::UPGRADED), None);
    let host = rec(NodeState::Done, Some(reason::HOST_MANAGED), None);
    let pending = rec(NodeState::Pending, Some(reason::WAITING), None);
    let draining = rec(NodeState::Draining, Some(reason::DRAIN), None);
    let failed = rec(
        NodeState::Failed,
        Some(reason::DRAIN_TIMEOUT),
        Some("stuck"),
    );
    let conflict = vec![("n9".to_string(), "older".to_string())];
    let rows: Vec<Row<'_>> = vec![
        (
            "settled",
            vec![("a", done.clone()), ("b", host.clone())],
            false,
            &[],
            settled(),
        ),
        (
            "rolling",
            vec![
                ("a", done.clone()),
                ("b", draining.clone()),
                ("c", pending.clone()),
            ],
            false,
            &[],
            settled_but(&[
                ("Ready", "False", "RolloutIncomplete"),
                ("Progressing", "True", "Upgrading"),
                ("Prepared", "False", "Preparing"),
            ]),
        ),
        (
            "failed halts progress",
            vec![("a", failed.clone()), ("c", pending.clone())],
            false,
            &[],
            settled_but(&[
                ("Ready", "False", "RolloutIncomplete"),
                ("Progressing", "False", "Halted"),
                ("Degraded", "True", "NodeFailed"),
                ("Prepared", "False", "Preparing"),
            ]),
        ),
        (
            "paused, settled",
            vec![("a", done.clone())],
            true,
            &[],
            settled_but(&[
                ("Ready", "False", "RolloutComplete"),
                ("Progressing", "False", "Paused"),
                ("Paused", "True", "PausedBySpec"),
            ]),
        ),
        (
            "conflict",
            vec![("a", done.clone())],
            false,
            &conflict,
            settled_but(&[("Conflict", "True", "SelectorOverlap")]),
        ),
    ];
    for (name, recs, paused, conflicts, want) in rows {
        let p = policy(paused, 3);
        let s = status_of(&p, &records(&recs), &HashSet::new(), conflicts, None, 100);
        assert_eq!(conditions(&s), want, "row: {name}");
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(3)),
            "row: {name}: every condition carries the generation"
        );
        assert_eq!(s.observed_generation, Some(3));
        let (summary, _) = summarize(&records(&recs));
        assert_eq!(
            flags_of(&s),
            condition_flags(&summary, paused, !conflicts.is_empty(), false, false, false),
            "row: {name}: urgency flags follow the written conditions"
        );
    }
}

#[test]
fn summary_counts_and_messages() {
    let recs = records(&[
        ("a", rec(NodeState::Done, Some(reason::UPGRADED), None)),
        ("b", rec(NodeState::Done, Some(reason::HOST_MANAGED), None)),
        (
            "c",
            rec(
                NodeState::Failed,
                Some(reason::UPGRADE_TIMEOUT),
                Some("late"),
            ),
        ),
        ("d", rec(NodeState::Uncordoning, None, None)),
        ("e", rec(NodeState::Pending, None, None)),
    ]);
    let (s, failed) = summarize(&recs);
    assert_eq!(
        (
            s.matched,
            s.done,
            s.host_managed,
            s.failed_nodes,
            s.in_progress,
            s.pending
        ),
        (5, 1, 1, 1, 1, 1)
    );
    // The Go operator's fields: d (Uncordoning) has the target loaded but is
    // not back in service; failed is desired − available.
    assert_eq!(
        (s.desired, s.ready, s.available, s.up_to_date, s.failed),
        (5, 3, 2, 3, 3)
    );
    assert_eq!(failed, ["c: late"]);
    let p = policy(false, 1);
    let st = status_of(&p, &recs, &HashSet::new(), &[], None, 100);
    let degraded = &st.conditions[2];
    assert_eq!(degraded.message, "c: late");
}

/// A healthy rollout of three nodes: the Go field says 3 (desired −
/// available), `failedNodes`, which the printed `Failed` column shows, says 0.
#[test]
fn a_healthy_rollout_has_no_failed_nodes_but_keeps_the_go_count() {
    let recs = records(&[
        ("a", rec(NodeState::Draining, Some("Drain"), None)),
        ("b", rec(NodeState::Pending, None, None)),
        ("c", rec(NodeState::Pending, None, None)),
    ]);
    let (s, failed) = summarize(&recs);
    assert_eq!((s.failed, s.failed_nodes), (3, 0));
    assert!(failed.is_empty());
}

#[test]
fn prepared_counts_nodes_holding_the_target_and_names_the_rest() {
    let recs = records(&[
        ("a", rec(NodeState::Done, Some(reason::UPGRADED), None)),
        (
            "host",
            rec(NodeState::Done, Some(reason::HOST_MANAGED), None),
        ),
        ("prepared", rec(NodeState::Pending, None, None)),
        ("z", rec(NodeState::Pending, Some(reason::PREPARING), None)),
    ]);
    let p = policy(false, 1);
    let s = status_of(&p, &recs, &HashSet::new(), &[], None, 100);
    assert_eq!(s.summary.prepared, 2, "a loads it, prepared built it");
    let c = condition(&s, "Prepared");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "Preparing")
    );
    assert!(
        c.message.contains("2 of 4") && c.message.ends_with("still to build: z"),
        "the host-managed node builds nothing: {}",
        c.message
    );
    let mut off = policy(false, 1);
    off.spec.upgrade_policy.prepare.enabled = false;
    let s = status_of(&off, &recs, &HashSet::new(), &[], None, 100);
    let c = condition(&s, "Prepared");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "Disabled")
    );
}

#[test]
fn nodes_listed_in_rollout_order_with_reported_labels() {
    let recs = records(&[
        ("a", rec(NodeState::Pending, None, None)),
        ("b", rec(NodeState::Pending, None, None)),
        ("c", rec(NodeState::Pending, None, None)),
    ]);
    let device: HashSet<String> = ["a".to_string()].into();
    let p = policy(false, 1);
    let s = status_of(&p, &recs, &device, &[], None, 100);
    let names: Vec<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["b", "c", "a"], "device users last");
    assert_eq!(s.nodes[0].current_version.as_deref(), Some("v-b"));
    assert_eq!(s.daemon_set.as_deref(), Some("ttdrv-fleet"));
    assert_eq!(s.desired_version.as_deref(), Some("2.8.0"));
}

#[test]
fn transition_time_kept_while_status_holds() {
    let recs = records(&[("a", rec(NodeState::Done, Some(reason::UPGRADED), None))]);
    let p = policy(false, 1);
    let first = status_of(&p, &recs, &HashSet::new(), &[], None, 100);
    let again = status_of(&p, &recs, &HashSet::new(), &[], Some(&first), 500);
    assert_eq!(
        first, again,
        "nothing changed: the same status, nothing to write"
    );
    let pending = records(&[("a", rec(NodeState::Pending, None, None))]);
    let flipped = status_of(&p, &pending, &HashSet::new(), &[], Some(&first), 500);
    assert_eq!(flipped.conditions[0].status, "False");
    assert_eq!(
        flipped.conditions[0].last_transition_time.0.as_second(),
        500,
        "a flip takes the new time"
    );
    assert_eq!(
        flipped.conditions[2].last_transition_time, first.conditions[2].last_transition_time,
        "Degraded did not flip"
    );
}

#[test]
fn fleet_not_ready_brake_is_degraded_and_names_the_nodes() {
    let recs = records(&[
        ("a", rec(NodeState::Pending, None, None)),
        ("b", rec(NodeState::Pending, None, None)),
    ]);
    let p = policy(false, 1);
    let braked = vec!["a".to_string(), "b".to_string()];
    let input = StatusInput {
        blocked: Some("braked"),
        braked: Some(&braked),
        ..input(&p, &recs)
    };
    let s = build(&input, |_| Reported::default());
    assert_eq!(
        conditions(&s)[1..3],
        [
            c("Progressing", "False", "Braked"),
            c("Degraded", "True", "FleetNotReady")
        ]
    );
    assert!(
        s.conditions[2].message.contains("a, b"),
        "{}",
        s.conditions[2].message
    );
}

#[test]
fn phase_from_the_summary() {
    let cases: &[(&str, Vec<NodeState>, bool, &str)] = &[
        ("no node", vec![], false, "Ready"),
        (
            "all done",
            vec![NodeState::Done, NodeState::Done],
            false,
            "Ready",
        ),
        (
            "pending",
            vec![NodeState::Done, NodeState::Pending],
            false,
            "Progressing",
        ),
        (
            "in a cycle",
            vec![NodeState::Draining],
            false,
            "Progressing",
        ),
        (
            "a failed node wins",
            vec![NodeState::Failed, NodeState::Draining],
            false,
            "Degraded",
        ),
        ("paused wins", vec![NodeState::Failed], true, "Paused"),
    ];
    for (what, states, paused, want) in cases {
        let list: Vec<(String, NodeRecord)> = states
            .iter()
            .enumerate()
            .map(|(i, st)| (format!("n{i}"), rec(*st, None, None)))
            .collect();
        let recs: HashMap<String, NodeRecord> = list.into_iter().collect();
        let p = policy(*paused, 1);
        let st = status_of(&p, &recs, &HashSet::new(), &[], None, 100);
        assert_eq!(st.phase.as_deref(), Some(*want), "{what}");
    }
    let mut p = policy(false, 1);
    p.spec.unmanage = true;
    let st = status_of(&p, &HashMap::new(), &HashSet::new(), &[], None, 100);
    assert_eq!(st.phase.as_deref(), Some("Unmanaged"));
    // Vacated nodes are settled; an UnloadFailed one degrades the policy.
    let vacated = records(&[
        ("a", rec(NodeState::Unmanaged, Some(reason::VACATED), None)),
        (
            "b",
            rec(NodeState::Unmanaged, Some(reason::HOST_MANAGED), None),
        ),
    ]);
    let st = status_of(&p, &vacated, &HashSet::new(), &[], None, 100);
    assert_eq!(st.phase.as_deref(), Some("Unmanaged"));
    assert_eq!((st.summary.done, st.summary.failed_nodes), (2, 0));
    // Mid-vacate: a node still Done (not yet vacated) or Unloading keeps
    // the phase off Unmanaged.
    for st_b in [NodeState::Done, NodeState::Draining, NodeState::Unloading] {
        let mid = records(&[
            ("a", rec(NodeState::Unmanaged, Some(reason::VACATED), None)),
            ("b", rec(st_b, None, None)),
        ]);
        let st = status_of(&p, &mid, &HashSet::new(), &[], None, 100);
        assert_eq!(st.phase.as_deref(), Some("Progressing"), "{st_b:?}");
    }
    let failed = records(&[
        ("a", rec(NodeState::Unmanaged, Some(reason::VACATED), None)),
        (
            "b",
            rec(
                NodeState::UnloadFailed,
                Some(reason::DEVICE_BUSY),
                Some("pid 42"),
            ),
        ),
        ("c", rec(NodeState::Unloading, Some(reason::UNLOAD), None)),
    ]);
    let st = status_of(&p, &failed, &HashSet::new(), &[], None, 100);
    assert_eq!(st.phase.as_deref(), Some("Degraded"));
    assert_eq!(
        (st.summary.failed_nodes, st.summary.in_progress),
        (1, 1),
        "{:?}",
        st.summary
    );
    let degraded = condition(&st, "Degraded");
    assert_eq!(degraded.status, "True");
    assert!(degraded.message.contains("pid 42"), "{}", degraded.message);
}

#[test]
fn go_reason_beside_ours() {
    let recs = records(&[
        ("a", rec(NodeState::Done, Some(reason::HOST_MANAGED), None)),
        (
            "b",
            rec(NodeState::Failed, Some(reason::INSTALLER_IMAGE_PULL), None),
        ),
        (
            "c",
            rec(NodeState::Failed, Some(reason::INSTALLER_CRASH_LOOP), None),
        ),
        (
            "d",
            rec(NodeState::Failed, Some(reason::DRAIN_TIMEOUT), None),
        ),
    ]);
    let p = policy(false, 1);
    let st = status_of(&p, &recs, &HashSet::new(), &[], None, 100);
    let got: Vec<(&str, Option<&str>)> = st
        .nodes
        .iter()
        .map(|n| (n.reason.as_deref().unwrap_or(""), n.go_reason.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("HostManaged", Some("HostManagedKMD")),
            ("InstallerImagePull", Some("BuilderImagePullFailed")),
            ("InstallerCrashLoop", Some("BuilderCrashLoop")),
            ("DrainTimeout", None),
        ]
    );
}

#[test]
fn a_daemonset_takeover_is_degraded_under_its_own_reason() {
    let recs = records(&[("a", rec(NodeState::Pending, None, None))]);
    let p = policy(false, 1);
    let why = format!("{TAKEOVER}ttdrv-fleet: deleting it");
    let mut input = StatusInput {
        refused: Some((RefusalKind::Takeover, &why)),
        ..input(&p, &recs)
    };
    let s = build(&input, |_| Reported::default());
    assert_eq!(
        conditions(&s)[1..3],
        [
            c("Progressing", "False", "TakingOver"),
            c("Degraded", "True", "DaemonSetTakeover")
        ]
    );
    assert!(s.conditions[2].message.contains("ttdrv-fleet"));
    input.refused = Some((RefusalKind::Refused, "field is immutable"));
    let s = build(&input, |_| Reported::default());
    assert_eq!(conditions(&s)[2], c("Degraded", "True", "PolicyRefused"));
}

#[test]
fn a_promotion_waiting_or_blocked_shows_on_progressing() {
    let pending = records(&[
        (
            "a",
            rec(
                NodeState::Pending,
                Some(reason::WAITING_FOR_PROMOTION),
                None,
            ),
        ),
        ("b", rec(NodeState::Done, Some(reason::UP_TO_DATE), None)),
    ]);
    let p = policy(false, 1);
    let why = "waiting for the canary policy canary: it is not Ready at 2.8.0 yet";
    let progressing = |recs: &HashMap<String, NodeRecord>, blocked: bool| {
        let i = StatusInput {
            blocked: Some(why),
            held: Some(reason::WAITING_FOR_PROMOTION),
            promotion_blocked: blocked,
            ..input(&p, recs)
        };
        let s = build(&i, |_| Reported::default());
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .cloned()
            .expect("Progressing");
        (c.status, c.reason, c.message)
    };
    // Waiting: opens by itself.
    assert_eq!(
        progressing(&pending, false),
        ("True".into(), "WaitingForPromotion".into(), why.into())
    );
    // Blocked: a person must act on the canary.
    assert_eq!(
        progressing(&pending, true),
        ("False".into(), "PromotionBlocked".into(), why.into())
    );
    // Nothing to do: Idle, and the canary is not mentioned.
    let done = records(&[("a", rec(NodeState::Done, Some(reason::UP_TO_DATE), None))]);
    assert_eq!(
        progressing(&done, false),
        (
            "False".into(),
            "Idle".into(),
            "0 in progress, 0 pending".into()
        )
    );
}
