//! The faults of the kinds `not-ready-flap`, `fleet-not-ready`,
//! `installer-pod-deleted` and `relabel`: what happens to the nodes and
//! installer pods around the controller while it rolls out (the controller
//! kills of every trial run alongside). Each schedule is drawn from the
//! trial's seed before anything runs; which node a fault hits is drawn as an
//! index into the nodes that qualify at that moment.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use rand::Rng;
use rand::rngs::StdRng;
use ttdrv_api::{NodeState, labels};
use ttdrv_testkit::TestEnv;

use crate::common::{gate_labels, unschedulable};
use crate::fleet::test_nodes;
use crate::rollout::retrying;
use crate::{OUT_LABEL, OUT_VALUE};

/// The persisted states of a node in its disruptive cycle.
const IN_CYCLE: [&str; 4] = ["Cordoning", "Draining", "Upgrading", "Uncordoning"];
/// How long a fault that wants a node in some state waits for one.
const WAIT_FOR_STATE: Duration = Duration::from_secs(5);
/// How long an installer-pod deletion waits for a node in the phase it wants
/// (shorter: the next deletions should still find the rollout running).
const DELETION_WAIT: Duration = Duration::from_secs(2);

/// One node NotReady for a while.
pub(crate) struct Flap {
    /// Milliseconds into the rollout.
    at: u64,
    hold: u64,
    /// The Ready condition's status meanwhile: "False" or "Unknown".
    status: &'static str,
    /// Hit a node in its cycle (if one is within [`WAIT_FOR_STATE`]), else any node.
    mid_cycle: bool,
    pick: u64,
}

/// Every node NotReady for a while.
pub(crate) struct FleetOutage {
    at: u64,
    hold: u64,
    /// Per node (by name order): Ready=Unknown rather than False.
    unknown: Vec<bool>,
    /// Strike once some node is in its cycle (waiting up to [`WAIT_FOR_STATE`]).
    mid_cycle: bool,
}

/// One installer pod deleted.
pub(crate) struct Deletion {
    at: u64,
    /// The phase of the node whose pod is deleted (None: Pending, i.e.
    /// waiting, or any state of the cycle).
    want: Option<&'static str>,
    pick: u64,
}

/// One node out of the policy for a while.
pub(crate) struct Relabel {
    at: u64,
    hold: u64,
    /// Skip-label it (`driver.tenstorrent.com/skip`), else move it out of the
    /// policy's `nodeAffinity` ([`OUT_LABEL`]).
    skip: bool,
    mid_cycle: bool,
    pick: u64,
}

pub(crate) struct Schedule {
    pub(crate) flaps: Vec<Flap>,
    pub(crate) fleet: FleetOutage,
    pub(crate) deletions: Vec<Deletion>,
    pub(crate) relabels: Vec<Relabel>,
}

impl Schedule {
    /// Drawn for every trial whatever its kind, so that a seed's schedule
    /// does not depend on the kind.
    pub(crate) fn draw(rng: &mut StdRng) -> Self {
        let mut flaps: Vec<Flap> = (0..rng.random_range(1..=2))
            .map(|_| Flap {
                at: rng.random_range(300..7_000),
                hold: rng.random_range(1_500..6_000),
                status: if rng.random_bool(0.5) {
                    "False"
                } else {
                    "Unknown"
                },
                mid_cycle: rng.random_bool(0.6),
                pick: rng.random(),
            })
            .collect();
        flaps.sort_by_key(|f| f.at);
        let fleet = FleetOutage {
            at: rng.random_range(500..6_000),
            hold: rng.random_range(2_000..6_000),
            unknown: (0..32).map(|_| rng.random_bool(0.5)).collect(),
            mid_cycle: rng.random_bool(0.7),
        };
        // Cordoning and Uncordoning are written with the next state (one
        // patch): their draws delete at Draining and at Done.
        let wants = [
            Some("Pending"),
            Some("Draining"),
            Some("Draining"),
            Some("Upgrading"),
            Some("Done"),
            None,
        ];
        let mut deletions: Vec<Deletion> = (0..rng.random_range(3..=5))
            .map(|_| Deletion {
                at: rng.random_range(200..8_000),
                want: wants[rng.random_range(0..wants.len())],
                pick: rng.random(),
            })
            .collect();
        deletions.sort_by_key(|d| d.at);
        let mut relabels: Vec<Relabel> = (0..rng.random_range(1..=2))
            .map(|_| Relabel {
                at: rng.random_range(300..7_000),
                hold: rng.random_range(1_000..6_000),
                skip: rng.random_bool(0.5),
                mid_cycle: rng.random_bool(0.6),
                pick: rng.random(),
            })
            .collect();
        relabels.sort_by_key(|r| r.at);
        Self {
            flaps,
            fleet,
            deletions,
            relabels,
        }
    }
}

async fn sleep_until(t0: Instant, at_ms: u64) {
    tokio::time::sleep(Duration::from_millis(at_ms).saturating_sub(t0.elapsed())).await;
}

/// Where a node is in the rollout to `target`, by its persisted record:
/// "Pending" also for a node still Done at an older version (the controller
/// does not write the Pending record it derives from a Done one: the record
/// changes when the cycle starts), else the record's state.
fn phase(n: &Node, target: &str) -> Option<String> {
    let rec = ttdrv_core::node::record(n).ok().flatten()?;
    if rec.state == NodeState::Done && rec.target != target {
        return Some("Pending".into());
    }
    Some(rec.state.as_str().to_string())
}

/// The test's nodes with their phase in the rollout to `target`, by name.
async fn node_states(env: &TestEnv, target: &str) -> BTreeMap<String, Option<String>> {
    test_nodes(env)
        .await
        .into_iter()
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                phase(&n, target),
            )
        })
        .collect()
}

/// A node whose phase is one of `states` (waiting up to [`WAIT_FOR_STATE`]
/// for one), or else any node; with its phase.
async fn pick_node(
    env: &TestEnv,
    target: &str,
    states: &[&str],
    pick: u64,
) -> (String, Option<String>) {
    let until = Instant::now() + WAIT_FOR_STATE;
    loop {
        let all = node_states(env, target).await;
        let hits: Vec<(&String, &Option<String>)> = all
            .iter()
            .filter(|(_, s)| s.as_deref().is_some_and(|s| states.contains(&s)))
            .collect();
        if !hits.is_empty() {
            let (n, s) = hits[(pick % hits.len() as u64) as usize];
            return (n.clone(), s.clone());
        }
        if states.is_empty() || Instant::now() > until {
            let all: Vec<(String, Option<String>)> = all.into_iter().collect();
            return all[(pick % all.len() as u64) as usize].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until kwok reports every node of the test Ready again.
async fn all_ready(env: &TestEnv) {
    for n in test_nodes(env).await {
        env.wait_node_ready(n.metadata.name.as_deref().unwrap_or_default())
            .await;
    }
}

fn state_of(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("no record")
}

/// `not-ready-flap`: one node NotReady for a few seconds, once or twice.
pub(crate) async fn not_ready_flaps(env: &TestEnv, target: &str, flaps: &[Flap]) -> Vec<String> {
    let t0 = Instant::now();
    let mut log = vec![];
    for f in flaps {
        sleep_until(t0, f.at).await;
        let states: &[&str] = if f.mid_cycle { &IN_CYCLE } else { &[] };
        let (node, state) = pick_node(env, target, states, f.pick).await;
        let at = t0.elapsed().as_millis();
        env.set_node_ready(&node, Some(f.status)).await;
        tokio::time::sleep(Duration::from_millis(f.hold)).await;
        env.set_node_ready(&node, None).await;
        log.push(format!(
            "node {node} ({}) Ready={} at {at}ms for {}ms",
            state_of(&state),
            f.status,
            f.hold
        ));
    }
    all_ready(env).await;
    log
}

/// `fleet-not-ready`: every node NotReady (False or Unknown) for a few seconds.
pub(crate) async fn fleet_not_ready(env: &TestEnv, target: &str, f: &FleetOutage) -> Vec<String> {
    let t0 = Instant::now();
    sleep_until(t0, f.at).await;
    if f.mid_cycle {
        pick_node(env, target, &IN_CYCLE, 0).await;
    }
    let nodes = node_states(env, target).await;
    let at = t0.elapsed().as_millis();
    let in_cycle: Vec<String> = nodes
        .iter()
        .filter(|(_, s)| s.as_deref().is_some_and(|s| IN_CYCLE.contains(&s)))
        .map(|(n, s)| format!("{n} {}", state_of(s)))
        .collect();
    let waiting = nodes
        .values()
        .filter(|s| s.as_deref() == Some("Pending"))
        .count();
    for (i, n) in nodes.keys().enumerate() {
        let status = if f.unknown[i % f.unknown.len()] {
            "Unknown"
        } else {
            "False"
        };
        env.set_node_ready(n, Some(status)).await;
    }
    let down = t0.elapsed().as_millis() - at;
    tokio::time::sleep(Duration::from_millis(f.hold)).await;
    for n in nodes.keys() {
        env.set_node_ready(n, None).await;
    }
    all_ready(env).await;
    vec![format!(
        "all {} nodes NotReady at {at}ms (set in {down}ms) for {}ms, back Ready after {}ms; then {waiting} waiting, in their cycle: {in_cycle:?}",
        nodes.len(),
        f.hold,
        t0.elapsed().as_millis() - at
    )]
}

/// `installer-pod-deleted`: the installer pod of a waiting (Pending) or
/// mid-cycle node deleted, a few times.
pub(crate) async fn delete_installer_pods(
    env: &TestEnv,
    ns: &str,
    target: &str,
    deletions: &[Deletion],
) -> Vec<String> {
    let t0 = Instant::now();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let lp = ListParams::default().labels(labels::CLAIM);
    let mut waiting_or_cycle: Vec<&str> = vec!["Pending"];
    waiting_or_cycle.extend(IN_CYCLE);
    let mut log = vec![];
    for d in deletions {
        sleep_until(t0, d.at).await;
        let until = Instant::now() + DELETION_WAIT;
        let hit = loop {
            let by_node: BTreeMap<String, String> =
                retrying("listing installer pods", || pods.list(&lp))
                    .await
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(|p| Some((p.spec?.node_name?, p.metadata.name?)))
                    .collect();
            let states = node_states(env, target).await;
            let qualifies = |want: &[&str]| -> Vec<(String, String, String)> {
                states
                    .iter()
                    .filter_map(|(n, s)| {
                        let s = s.as_deref()?;
                        let pod = by_node.get(n)?;
                        want.contains(&s)
                            .then(|| (n.clone(), s.to_string(), pod.clone()))
                    })
                    .collect()
            };
            let wanted = match d.want {
                Some(w) => qualifies(&[w]),
                None => qualifies(&waiting_or_cycle),
            };
            if !wanted.is_empty() {
                break Some(wanted[(d.pick % wanted.len() as u64) as usize].clone());
            }
            if Instant::now() > until {
                let any = qualifies(&waiting_or_cycle);
                break (!any.is_empty()).then(|| any[(d.pick % any.len() as u64) as usize].clone());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let at = t0.elapsed().as_millis();
        match hit {
            Some((node, state, pod)) => match pods.delete(&pod, &DeleteParams::default()).await {
                Ok(_) => log.push(format!(
                    "installer pod {pod} of {node} ({state}) deleted at {at}ms"
                )),
                // Gone meanwhile (the controller replaced it): not a fault injected.
                Err(e) => log.push(format!(
                    "installer pod {pod} of {node} ({state}) not deleted at {at}ms: {}",
                    match e {
                        kube::Error::Api(ae) => format!("{} {}", ae.code, ae.reason),
                        e => e.to_string(),
                    }
                )),
            },
            None => log.push(format!(
                "no installer pod of a waiting or mid-cycle node at {at}ms (wanted {})",
                d.want.unwrap_or("any")
            )),
        }
    }
    log
}

/// `relabel`: a node moved out of the policy's selector (or skip-labelled)
/// for a few seconds and back, once or twice.
pub(crate) async fn relabel(env: &TestEnv, target: &str, relabels: &[Relabel]) -> Vec<String> {
    let t0 = Instant::now();
    let mut log = vec![];
    for r in relabels {
        sleep_until(t0, r.at).await;
        let states: &[&str] = if r.mid_cycle { &IN_CYCLE } else { &[] };
        let (node, state) = pick_node(env, target, states, r.pick).await;
        let (key, value) = if r.skip {
            (labels::SKIP, "true")
        } else {
            (OUT_LABEL, OUT_VALUE)
        };
        let at = t0.elapsed().as_millis();
        env.label_node(&node, key, Some(value)).await;
        tokio::time::sleep(Duration::from_millis(r.hold)).await;
        // What the controller left on the node while it was out.
        let out = env.get_node(&node).await;
        env.label_node(&node, key, None).await;
        log.push(format!(
            "node {node} ({}) {} at {at}ms for {}ms (when taken back: {}, {}, gates {:?}, claim {:?})",
            state_of(&state),
            if r.skip {
                format!("skip-labelled ({key}={value})")
            } else {
                format!("moved out of the selector ({key}={value})")
            },
            r.hold,
            state_of(&phase(&out, target)),
            if unschedulable(&out) {
                "unschedulable"
            } else {
                "schedulable"
            },
            gate_labels(&out),
            out.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::CLAIM))
        ));
    }
    log
}
