//! The `firmware-wave` kind: a firmware policy is created the instant the
//! driver's version moves on, so most nodes have work from both policies (a
//! combined wave: the flash goes first and hands its cordon to the swap).
//! One node's flash fails (`flash` or `readback`, the sim flasher's faults):
//! the firmware rollout halts, the driver swaps go on by themselves, and the
//! test retries the node once it is Failed. A controller kill strikes the
//! moment some node is Flashing (between the flash and its hand-over). The
//! invariant watcher checks throughout that no node is in a firmware and a
//! driver cycle at once and that no more than `maxParallel` nodes are in
//! firmware cycles; at the end every node is flashed and swapped with no
//! cordon, record in progress or cordon mark left, and the policy is deleted
//! (the later trials run without it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use rand::Rng;
use rand::rngs::StdRng;
use ttdrv_api::firmware::{FirmwareNodeState, TenstorrentFirmwarePolicy, labels as fw};
use ttdrv_testkit::TestEnv;
use ttdrv_testkit::sim_flasher::FAULT_ANNOTATION;

use crate::MAX_UNAVAILABLE;
use crate::common::unschedulable;
use crate::controller::Controller;
use crate::fleet::test_nodes;
use crate::invariants::Invariants;
use crate::rollout::retrying;

/// A firmware trial's faults, drawn from its seed.
pub(crate) struct FirmwareFaults {
    /// Which node's flash fails (an index into the nodes in name order,
    /// the admin-cordoned one left out).
    pick: u64,
    /// The sim flasher's fault: `flash` or `readback`.
    fault: &'static str,
    /// Kill the controller as some node is Flashing, down this long (ms).
    kill_flashing: Option<u64>,
}

impl FirmwareFaults {
    pub(crate) fn draw(rng: &mut StdRng) -> Self {
        Self {
            pick: rng.random(),
            fault: if rng.random_bool(0.5) {
                "flash"
            } else {
                "readback"
            },
            kill_flashing: rng.random_bool(0.8).then(|| rng.random_range(0..1500)),
        }
    }
}

/// The readback of the firmware the trial `index` flashes.
pub(crate) fn readback(index: usize) -> String {
    format!("19.{index}.0.0")
}

fn policy_name(env: &TestEnv) -> String {
    env.name("fw")
}

/// Before the driver's version moves: the failing node gets its fault, and
/// the firmware policy is created. Returns the failing node.
pub(crate) async fn start(
    env: &TestEnv,
    index: usize,
    admin: &std::collections::BTreeSet<String>,
    f: &FirmwareFaults,
) -> String {
    let mut names: Vec<String> = test_nodes(env)
        .await
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| !admin.contains(n))
        .collect();
    names.sort();
    let victim = names[(f.pick % names.len() as u64) as usize].clone();
    env.annotate_node(&victim, FAULT_ANNOTATION, Some(f.fault))
        .await;
    let spec = serde_json::json!({
        "version": format!("19.{index}.0"),
        "nodeAffinity": {
            "matchLabels": env.labels(),
            "matchExpressions": [{ "key": crate::OUT_LABEL, "operator": "NotIn", "values": [crate::OUT_VALUE] }],
        },
        "upgradePolicy": { "maxParallel": MAX_UNAVAILABLE },
    });
    if let Err(e) =
        ttdrv_testkit::policy::create_raw_firmware_policy(env, &policy_name(env), spec).await
    {
        panic!("creating the firmware policy: {e}");
    }
    victim
}

/// The trial's faults while both rollouts run: the kill at a Flashing node,
/// and the failed node's retry once its fault has failed it.
pub(crate) async fn faults(
    env: &TestEnv,
    ctl: &Arc<tokio::sync::Mutex<Controller>>,
    victim: &str,
    f: &FirmwareFaults,
) -> Vec<String> {
    let mut log = vec![];
    let t0 = Instant::now();
    let napi: Api<Node> = Api::all(env.client.clone());
    let lp = ListParams::default().labels(&env.selector());
    let fw_state = |n: &Node| ttdrv_core::claim::firmware_record(n).map(|r| r.state);
    if let Some(down) = f.kill_flashing {
        let until = Instant::now() + Duration::from_secs(20);
        let mut hit = None;
        while Instant::now() < until && hit.is_none() {
            hit = napi.list(&lp).await.ok().and_then(|l| {
                l.items.into_iter().find_map(|n| {
                    (fw_state(&n) == Some(FirmwareNodeState::Flashing))
                        .then(|| n.metadata.name.unwrap_or_default())
                })
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let at = t0.elapsed().as_millis();
        let killed = ctl.lock().await.kill_acting(env).await;
        tokio::time::sleep(Duration::from_millis(down)).await;
        ctl.lock().await.restore(env);
        let when = match hit {
            Some(n) => format!("at {at}ms as {n} was Flashing"),
            None => format!("at {at}ms, no node Flashing"),
        };
        log.push(match killed {
            Some(_) => format!("SIGKILL controller {when} (down {down}ms)"),
            None => format!("no controller to SIGKILL {when}: another fault's restart was pending"),
        });
    }
    // The failing node: Failed (its cordon kept), then fixed and retried.
    let failed = ttdrv_testkit::wait_for_result(
        &format!("{victim}'s flash failing"),
        Duration::from_secs(90),
        || async {
            let n = napi.get(victim).await.map_err(|e| e.to_string())?;
            match ttdrv_core::claim::firmware_record(&n) {
                Some(r) if r.state == FirmwareNodeState::Failed => Ok(r),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    match failed {
        Ok(r) => {
            let at = t0.elapsed().as_millis();
            let cordoned = unschedulable(&retrying("reading the node", || napi.get(victim)).await);
            env.annotate_node(victim, FAULT_ANNOTATION, None).await;
            env.annotate_node(victim, fw::RETRY, Some(&format!("chaos-{at}")))
                .await;
            log.push(format!(
                "{victim}'s flash failed ({:?}, cordon kept: {cordoned}), fixed and retried at {at}ms",
                r.reason
            ));
        }
        Err(e) => {
            env.annotate_node(victim, FAULT_ANNOTATION, None).await;
            log.push(format!("{victim}'s flash never failed: {e}"));
        }
    }
    log
}

/// Once the driver rollout settled: the firmware one too (every node but
/// the admin-cordoned one flashed), nothing left behind; then the policy
/// goes (and with it its records).
pub(crate) async fn finish(
    env: &TestEnv,
    index: usize,
    admin: &std::collections::BTreeSet<String>,
    inv: &Invariants,
) -> Vec<String> {
    let mut log = vec![];
    let want = readback(index);
    let name = policy_name(env);
    let api: Api<TenstorrentFirmwarePolicy> = Api::all(env.client.clone());
    let settled = ttdrv_testkit::wait_for_result(
        "the firmware rollout settled",
        Duration::from_secs(120),
        || async {
            let st = api
                .get(&name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let nodes = test_nodes(env).await;
            let pending: Vec<String> = nodes
                .iter()
                .filter_map(|n| {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    let e = st.nodes.iter().find(|e| e.name == name);
                    let ok = if admin.contains(&name) {
                        e.is_some_and(|e| e.reason.as_deref() == Some("ExternalCordon"))
                    } else {
                        e.is_some_and(|e| e.state == FirmwareNodeState::Done)
                    };
                    (!ok).then(|| format!("{name}: {e:?}"))
                })
                .collect();
            if pending.is_empty() {
                Ok(())
            } else {
                Err(pending.join("; "))
            }
        },
    )
    .await;
    match settled {
        Ok(()) => log.push("the firmware rollout settled".into()),
        Err(e) => inv.violation(format!("the firmware rollout did not settle: {e}")),
    }
    for n in test_nodes(env).await {
        let name = n.metadata.name.clone().unwrap_or_default();
        let ann = |k: &str| ttdrv_core::node::annotation(&n, k).map(String::from);
        if ttdrv_core::claim::firmware_record(&n).is_some_and(|r| r.state.is_in_progress()) {
            inv.violation(format!("at the end, {name} is still in a firmware cycle"));
        }
        let mut marks: Vec<&str> = ttdrv_api::labels::INHERITED_CORDON_MARKS
            .into_iter()
            .filter(|k| ann(k).is_some())
            .collect();
        if ann(fw::CORDONED_BY).is_some() {
            marks.push(fw::CORDONED_BY);
        }
        if !marks.is_empty() {
            inv.violation(format!(
                "at the end, {name} keeps the cordon marks {marks:?}"
            ));
        }
        if !admin.contains(&name) {
            let have = ttdrv_core::node::label(&n, fw::FW_VERSION);
            if have != Some(want.as_str()) {
                inv.violation(format!(
                    "at the end, {name}'s cards read back {have:?}, not {want}"
                ));
            }
        }
    }
    let handed = test_nodes(env)
        .await
        .iter()
        .filter(|n| {
            ttdrv_core::claim::firmware_record(n)
                .is_some_and(|r| r.reason.as_deref() == Some("CordonHandedOver"))
        })
        .count();
    log.push(format!(
        "{handed} flash(es) handed their cordon to the swap"
    ));
    let dp = DeleteParams::default();
    retrying("deleting the firmware policy", || api.delete(&name, &dp)).await;
    let gone = ttdrv_testkit::wait_for_result(
        "the firmware records released",
        Duration::from_secs(60),
        || async {
            let left: Vec<String> = test_nodes(env)
                .await
                .into_iter()
                .filter(|n| ttdrv_core::claim::firmware_record(n).is_some())
                .filter_map(|n| n.metadata.name)
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;
    if let Err(e) = gone {
        inv.violation(format!("the deleted firmware policy left records: {e}"));
    }
    log
}
