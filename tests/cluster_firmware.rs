//! The firmware policy against the real control plane: the Go operator's
//! TenstorrentFirmwarePolicy objects apply unchanged and bad ones are refused
//! naming the field; and one disruption at a time: a node a firmware cycle
//! holds (our firmware record mid-cycle, or the Go firmware controller's
//! cordon) starts no driver cycle while the rest of the fleet upgrades, and is
//! upgraded once the flash is over.

mod common;

use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use ttdrv_api::NodeState;
use ttdrv_api::firmware::{FirmwareNodeState, labels as fw};
use ttdrv_core::firmware::FwRecord;
use ttdrv_testkit::policy::{
    create_firmware_policy, create_raw_firmware_policy, firmware_api, firmware_status, installed,
    patch_policy, status,
};
use ttdrv_testkit::{TestEnv, ensure_crd, wait_for};

const T: Duration = Duration::from_secs(60);

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn go_firmware_policies_apply_and_bad_ones_are_refused_naming_the_field() {
    let env = TestEnv::new("fw-crd").await;
    ensure_crd(&env.client).await;
    // The Go operator's sample, as its docs write it.
    let go = json!({
        "version": "19.8.0",
        "nodeSelector": { "matchLabels": { "tenstorrent.com/pool": "a" } },
        "upgradePolicy": { "autoUpgrade": true, "maxParallel": 2, "flashTimeoutSeconds": 900,
                           "drain": { "enable": true, "force": false, "deleteEmptyDir": true,
                                      "timeoutSeconds": 600 },
                           "haltOnFailure": true },
        "flasher": { "image": "ghcr.io/tenstorrent/tt-k8s-driver-manager/tools:v0.9.0",
                     "imagePullPolicy": "IfNotPresent", "forceWrite": false,
                     "continueOnReadbackFailure": false, "homogenizeFirmwareVersions": true },
    });
    let name = env.name("go");
    let made = create_raw_firmware_policy(&env, &name, go)
        .await
        .expect("the Go sample applies");
    let back: ttdrv_api::firmware::TenstorrentFirmwarePolicy =
        serde_json::from_value(serde_json::to_value(&made).expect("json")).expect("reads back");
    assert_eq!(back.spec.upgrade_policy.max_parallel, 2);
    assert_eq!(back.spec.readback(), "19.8.0.0");

    let base = || json!({ "version": "19.8.0", "nodeAffinity": {} });
    let with = |k: &str, v: Value| {
        let mut s = base();
        s[k] = v;
        s
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "no selector",
            json!({ "version": "19.8.0" }),
            "exactly one of spec.nodeAffinity or spec.nodeSelector",
        ),
        (
            "both selectors",
            with("nodeSelector", json!({})),
            "exactly one of spec.nodeAffinity or spec.nodeSelector",
        ),
        (
            "short version",
            with("version", json!("19.8")),
            "spec.version",
        ),
        (
            "readback",
            with("readbackVersion", json!("v19")),
            "readbackVersion",
        ),
        (
            "ftp bundle",
            with("bundleURL", json!("ftp://example.com/b")),
            "bundleURL",
        ),
        (
            "unclosed IPv6 bracket",
            with("bundleURL", json!("https://[")),
            "bundleURL must be an http or https URL with a host",
        ),
        (
            "port out of range",
            with("bundleURL", json!("http://a:99999999/x")),
            "bundleURL must be an http or https URL with a host",
        ),
        (
            "port 0",
            with("bundleURL", json!("http://mirror:0/fw.tar")),
            "bundleURL must be an http or https URL with a host",
        ),
        (
            "maxParallel 0",
            with("upgradePolicy", json!({ "maxParallel": 0 })),
            "spec.upgradePolicy.maxParallel",
        ),
        (
            "flash timeout 30",
            with("upgradePolicy", json!({ "flashTimeoutSeconds": 30 })),
            "spec.upgradePolicy.flashTimeoutSeconds",
        ),
        (
            "image",
            with("flasher", json!({ "image": "Bad Image" })),
            "image must be an image reference",
        ),
    ];
    // URLs curl takes are accepted: a port, an IPv6 literal, a query.
    for (i, url) in [
        "https://mirror.example.com:8443/fw/fw_pack-19.8.0.fwbundle",
        "http://[fd00::1]:8080/fw_pack.fwbundle",
        "https://10.0.0.5/b?token=x",
    ]
    .into_iter()
    .enumerate()
    {
        let name = env.name(&format!("url{i}"));
        create_raw_firmware_policy(&env, &name, with("bundleURL", json!(url)))
            .await
            .unwrap_or_else(|e| panic!("{url} refused: {e}"));
        let _ = firmware_api(&env)
            .delete(&name, &DeleteParams::default())
            .await;
    }
    for (i, (what, spec, field)) in cases.into_iter().enumerate() {
        match create_raw_firmware_policy(&env, &env.name(&format!("bad{i}")), spec).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{what}: {e:?}");
                assert!(
                    e.message.contains(field),
                    "{what}: {field} not named in: {}",
                    e.message
                );
            }
            other => panic!("{what}: expected a 422, got {other:?}"),
        }
    }
    let _ = firmware_api(&env)
        .delete(&name, &DeleteParams::default())
        .await;
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_node_a_firmware_cycle_holds_starts_no_driver_cycle() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-hold", 3).await;
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &nodes, "upgradePolicy: {maxUnavailable: 3}", T).await;
    // nodes[0]: our firmware record mid-flash (drain disabled: not cordoned).
    let mut rec = FwRecord::new("fw-ours", "19.8.0", 0);
    rec.state = FirmwareNodeState::Flashing;
    let rec = serde_json::to_string(&rec).expect("json");
    env.annotate_node(&nodes[0], fw::RECORD, Some(&rec)).await;
    // nodes[1]: the Go firmware controller's cordon.
    env.set_unschedulable(&nodes[1], true).await;
    env.annotate_node(&nodes[1], fw::CORDONED_BY, Some("go-fw"))
        .await;
    let safety = SafetyWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;

    patch_policy(&env, &policy, json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes[2..], NodeState::Done, "2.8.0", T).await;
    // The held nodes wait, say why, and keep their module; give the
    // controller a few passes to do it wrong.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = status(&env, &policy).await;
    for (n, holder) in [(&nodes[0], "fw-ours"), (&nodes[1], "go-fw")] {
        let e = st.nodes.iter().find(|e| &e.name == n).expect("entry");
        assert_eq!(
            (e.state, e.reason.as_deref()),
            (NodeState::Pending, Some("WaitingForFirmware")),
            "{n}: {e:?}"
        );
        assert!(
            e.message.as_deref().is_some_and(|m| m.contains(holder)),
            "{n} names the firmware policy {holder}: {e:?}"
        );
        assert_eq!(
            kmd(&env.get_node(n).await).as_deref(),
            Some("2.7.0"),
            "{n} swapped"
        );
    }
    assert!(
        !cordons.ever().contains(&nodes[0]),
        "{} was cordoned",
        nodes[0]
    );
    let go_cordoned = env.get_node(&nodes[1]).await;
    assert!(
        ttdrv_core::node::record(&go_cordoned)
            .expect("record")
            .is_none_or(|r| !r.state.is_in_progress()),
        "no driver cycle on {}",
        nodes[1]
    );

    // The flashes end: both go through their driver cycle.
    let mut done = FwRecord::new("fw-ours", "19.8.0", 0);
    done.state = FirmwareNodeState::Done;
    let done = serde_json::to_string(&done).expect("json");
    env.annotate_node(&nodes[0], fw::RECORD, Some(&done)).await;
    env.annotate_node(&nodes[1], fw::CORDONED_BY, None).await;
    env.set_unschedulable(&nodes[1], false).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    safety.assert_safe(3, Some(3), "at the end");
    // The planted records name a firmware policy that does not exist: kept
    // while Flashing (above), released once Done.
    wait_for("the stray firmware record released", T, || async {
        let n = env.get_node(&nodes[0]).await;
        match ttdrv_core::claim::firmware_record(&n) {
            None => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.teardown().await;
}

/// Watches the test's nodes and records, at every event, how many are in a
/// firmware cycle (our record mid-cycle) and whether any is in a driver
/// cycle and a firmware cycle at once: independent of the controller.
struct FirmwareWatcher {
    seen: std::sync::Arc<std::sync::Mutex<(usize, Vec<String>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl FirmwareWatcher {
    fn start(env: &TestEnv) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let seen: std::sync::Arc<std::sync::Mutex<(usize, Vec<String>)>> = Default::default();
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut in_fw: std::collections::BTreeSet<String> = Default::default();
            let mut stream = ttdrv_testkit::watch_applied(api, cfg);
            while let Some(n) = stream.next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let fw = ttdrv_core::claim::firmware_record(&n)
                    .is_some_and(|r| r.state.is_in_progress());
                let driver = ttdrv_core::claim::driver_cycle(&n).is_some();
                if fw {
                    in_fw.insert(name.clone());
                } else {
                    in_fw.remove(&name);
                }
                let Ok(mut s) = out.lock() else { return };
                s.0 = s.0.max(in_fw.len());
                if fw && driver {
                    s.1.push(format!("{name}: firmware and driver cycles at once"));
                }
            }
        });
        Self { seen, task }
    }

    /// (most nodes in a firmware cycle at once, violations).
    fn seen(&self) -> (usize, Vec<String>) {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for FirmwareWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the Go firmware controller leaves on a node it cordoned for
/// `policy`: the cordon, its annotation, its state label and the owner.
async fn go_cordon(env: &TestEnv, node: &str, policy: &str, state: &str) {
    env.set_unschedulable(node, true).await;
    env.annotate_node(node, fw::CORDONED_BY, Some(policy)).await;
    env.label_node(node, fw::UPGRADE_STATE, Some(state)).await;
    env.label_node(node, fw::OWNED_BY, Some(policy)).await;
}

/// The Go firmware controller's flash Job for `policy` (19.8.0) on `node`,
/// with Go's name and labels and Go's flasher image; returns its uid.
async fn go_flash_job(env: &TestEnv, ns: &str, policy: &str, node: &str) -> Option<String> {
    let go_policy: ttdrv_api::firmware::TenstorrentFirmwarePolicy = serde_json::from_value(json!({
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": { "name": policy },
        "spec": { "version": "19.8.0", "nodeAffinity": {} },
    }))
    .expect("policy");
    let go_job = ttdrv_core::firmware::job::flash_job(
        &go_policy,
        node,
        0,
        &ttdrv_core::firmware::job::JobDefaults {
            namespace: ns.to_string(),
            image: "ghcr.io/tenstorrent/tt-k8s-driver-manager-flasher:v0.4.2".into(),
            pull_policy: "IfNotPresent".into(),
            simulate_dir: None,
        },
    );
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(env.client.clone(), ns);
    jobs.create(&Default::default(), &go_job)
        .await
        .expect("Go's flash Job")
        .metadata
        .uid
}

/// Watches the namespace's flash Jobs and records, at every event, how many
/// run at once (created, neither complete nor failed), whoever created them:
/// the API server's own order of events, independent of the controller.
struct FlashJobWatcher {
    seen: std::sync::Arc<std::sync::Mutex<(usize, std::collections::BTreeSet<String>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl FlashJobWatcher {
    fn start(env: &TestEnv, ns: &str) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let api: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(env.client.clone(), ns);
        let seen: std::sync::Arc<std::sync::Mutex<(usize, std::collections::BTreeSet<String>)>> =
            Default::default();
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut running: std::collections::BTreeSet<String> = Default::default();
            let mut stream = ttdrv_testkit::watch_applied(api, watcher::Config::default());
            while let Some(j) = stream.next().await {
                let name = j.metadata.name.clone().unwrap_or_default();
                let runs = matches!(
                    ttdrv_core::firmware::job::state(Some(&j), &[]),
                    ttdrv_core::firmware::FlashJob::Running { .. }
                );
                if runs {
                    running.insert(name.clone());
                } else {
                    running.remove(&name);
                }
                let Ok(mut s) = out.lock() else { return };
                s.0 = s.0.max(running.len());
                s.1.insert(name);
            }
        });
        Self { seen, task }
    }

    /// (most flash Jobs running at once, every Job seen).
    fn seen(&self) -> (usize, std::collections::BTreeSet<String>) {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for FlashJobWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn brief(st: &ttdrv_api::firmware::TenstorrentFirmwarePolicyStatus) -> String {
    st.nodes
        .iter()
        .map(|n| {
            format!(
                "{} {:?} {}",
                n.name,
                n.state,
                n.reason.as_deref().unwrap_or("-")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until every node in `nodes` is in `state` (with `reason`, if given).
async fn wait_fw(
    env: &TestEnv,
    name: &str,
    nodes: &[String],
    state: FirmwareNodeState,
    reason: Option<&str>,
) {
    wait_for(
        &format!("{nodes:?} {state:?} {reason:?} in {name}"),
        T,
        || async {
            let st = firmware_status(env, name).await;
            let ok = nodes.iter().all(|n| {
                st.nodes.iter().any(|e| {
                    &e.name == n
                        && e.state == state
                        && reason.is_none_or(|r| e.reason.as_deref() == Some(r))
                })
            });
            if ok { Ok(st) } else { Err(brief(&st)) }
        },
    )
    .await;
}

/// Both rollouts over: every node swapped to 2.8.0 and flashed, in service.
async fn both_done(env: &TestEnv, driver: &str, fwp: &str, nodes: &[String]) {
    let long = Duration::from_secs(90);
    wait_nodes_state(env, driver, nodes, NodeState::Done, "2.8.0", long).await;
    wait_fw(env, fwp, nodes, FirmwareNodeState::Done, None).await;
    assert_done_uncordoned(env, nodes, "2.8.0").await;
    assert_flashed(env, nodes, fwp).await;
}

async fn assert_flashed(env: &TestEnv, nodes: &[String], policy: &str) {
    for n in nodes {
        let node = env.get_node(n).await;
        assert!(!unschedulable(&node), "{n} left cordoned");
        let l = |k: &str| ttdrv_core::node::label(&node, k).map(String::from);
        let a = |k: &str| ttdrv_core::node::annotation(&node, k).map(String::from);
        assert_eq!(l(fw::FW_VERSION).as_deref(), Some("19.8.0.0"), "{n}");
        assert_eq!(l(fw::UPGRADE_STATE).as_deref(), Some("Done"), "{n}");
        assert_eq!(l(fw::OWNED_BY).as_deref(), Some(policy), "{n}");
        assert_eq!(a(fw::CURRENT_VERSION).as_deref(), Some("19.8.0.0"), "{n}");
        assert_eq!(a(fw::CORDONED_BY), None, "{n}: cordon mark left");
        assert_eq!(
            a(ttdrv_testkit::sim_flasher::CARDS_ANNOTATION).as_deref(),
            Some("19.8.0.0,19.8.0.0"),
            "{n}: the simulated cards"
        );
    }
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_firmware_rollout_flashes_every_node_within_max_parallel() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-roll", 4).await;
    ensure_crd(&env.client).await;
    let ctl = controller(&env, &ns);
    let watcher = FirmwareWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    let policy = env.name("fw");
    // A device user on one node: drained (pass 1) before its flash.
    env.pinned_deployment(&ns, "trainer", &nodes[1], true).await;
    create_firmware_policy(
        &env,
        &policy,
        json!({ "upgradePolicy": { "maxParallel": 2 } }),
    )
    .await;
    wait_fw(
        &env,
        &policy,
        &nodes,
        FirmwareNodeState::Done,
        Some("FlashSucceeded"),
    )
    .await;
    assert_flashed(&env, &nodes, &policy).await;
    let st = firmware_status(&env, &policy).await;
    assert_eq!(
        (st.summary.matched, st.summary.up_to_date),
        (4, 4),
        "{st:?}"
    );
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{:?}",
        st.conditions
    );
    let (max, violations) = watcher.seen();
    assert!(
        max <= 2,
        "{max} nodes in a firmware cycle at once, maxParallel is 2"
    );
    assert!(max >= 1, "the watcher saw no cycle");
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(
        cordons.ever().len(),
        4,
        "every node cordoned once: {:?}",
        cordons.ever()
    );
    // One Job per node, for this version.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(env.client.clone(), &ns);
    let list = jobs
        .list(&kube::api::ListParams::default().labels(&format!("{}={policy}", fw::JOB_POLICY)))
        .await
        .expect("jobs");
    assert_eq!(list.items.len(), 4);
    // The Go operator's ttfw_* families say the same.
    let (_, _, body) = ctl.admin_get("/metrics").await.expect("metrics");
    for line in [
        format!("ttfw_flash_jobs_total{{cr=\"{policy}\",result=\"success\"}} 4"),
        format!("ttfw_flash_jobs_created_total{{cr=\"{policy}\",result=\"success\"}} 4"),
        format!("ttfw_policy_nodes{{cr=\"{policy}\",state=\"Done\"}} 4"),
        format!("ttfw_pods_evicted_total{{cr=\"{policy}\"}} 1"),
        format!("ttfw_flash_jobs_in_flight{{cr=\"{policy}\"}} 0"),
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing `{line}` in:\n{}",
            body.lines()
                .filter(|l| l.starts_with("ttfw_"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("ttdriver_pods_evicted_total") && l.contains(&policy)),
        "firmware evictions counted as the driver's"
    );
    env.teardown().await;
}

/// A bundle that cannot be downloaded fails the flash Job before any card
/// is touched: the node is Failed (the rollout halts) but goes back into
/// service, and a policy deleted then leaves nothing cordoned.
#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_download_failure_touches_no_card_and_keeps_no_cordon() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-fetch", 2).await;
    ensure_crd(&env.client).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fw");
    let bad = &nodes[0];
    env.annotate_node(
        bad,
        ttdrv_testkit::sim_flasher::FAULT_ANNOTATION,
        Some("fetch"),
    )
    .await;
    let cordons = CordonWatcher::start(&env);
    create_firmware_policy(&env, &policy, json!({})).await;
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(bad),
        FirmwareNodeState::Failed,
        Some("BundleDownloadFailed"),
    )
    .await;
    ttdrv_testkit::wait_for("the node back in service", T, || async {
        if unschedulable(&env.get_node(bad).await) {
            Err("still cordoned".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(
        cordons.ever(),
        std::slice::from_ref(bad),
        "it was cordoned for the flash"
    );
    let st = firmware_status(&env, &policy).await;
    let entry = st.nodes.iter().find(|n| &n.name == bad).cloned();
    let msg = entry.and_then(|n| n.message).unwrap_or_default();
    assert!(
        msg.contains("before any card was touched") && msg.contains("spec.bundleURL"),
        "{msg}"
    );
    // Halted all the same: the other node waits.
    wait_fw(
        &env,
        &policy,
        &nodes[1..],
        FirmwareNodeState::Pending,
        Some("RolloutHalted"),
    )
    .await;
    // Deleted: its record goes, and nothing stays cordoned.
    firmware_api(&env)
        .delete(&policy, &DeleteParams::default())
        .await
        .expect("delete");
    ttdrv_testkit::wait_for("the record released", T, || async {
        match ttdrv_core::claim::firmware_record(&env.get_node(bad).await) {
            Some(r) => Err(format!("{r:?}")),
            None => Ok(()),
        }
    })
    .await;
    for n in &nodes {
        assert!(!unschedulable(&env.get_node(n).await), "{n} left cordoned");
    }
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_failed_flash_halts_keeps_its_cordon_and_retry_finishes() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-halt", 3).await;
    ensure_crd(&env.client).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fw");
    let bad = &nodes[0];
    env.annotate_node(
        bad,
        ttdrv_testkit::sim_flasher::FAULT_ANNOTATION,
        Some("readback"),
    )
    .await;
    create_firmware_policy(&env, &policy, json!({})).await;
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(bad),
        FirmwareNodeState::Failed,
        Some("ReadbackMismatch"),
    )
    .await;
    // Halted: the others wait; the failed node keeps its cordon.
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_fw(
        &env,
        &policy,
        &nodes[1..],
        FirmwareNodeState::Pending,
        Some("RolloutHalted"),
    )
    .await;
    assert!(
        unschedulable(&env.get_node(bad).await),
        "half-written cards back in service"
    );
    let st = firmware_status(&env, &policy).await;
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Progressing" && c.reason == "Halted"),
        "{:?}",
        st.conditions
    );
    // Fixed, retried: the node goes on from its cordon and the rollout finishes.
    env.annotate_node(bad, ttdrv_testkit::sim_flasher::FAULT_ANNOTATION, None)
        .await;
    env.annotate_node(bad, fw::RETRY, Some("1")).await;
    wait_fw(&env, &policy, &nodes, FirmwareNodeState::Done, None).await;
    assert_flashed(&env, &nodes, &policy).await;
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_go_cordoned_mid_flash_node_is_taken_over_safely() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-take", 4).await;
    ensure_crd(&env.client).await;
    let policy = env.name("fw");
    // What the Go firmware controller left: nodes[0] cordoned for this
    // policy while draining; nodes[1] cordoned and Flashing, its Job gone
    // (TTL); nodes[2] flashed to the target by Go; nodes[3] cordoned and
    // Flashing with Go's flash Job (its name and labels) still there.
    for (n, state) in [
        (&nodes[0], "Draining"),
        (&nodes[1], "Flashing"),
        (&nodes[3], "Flashing"),
    ] {
        go_cordon(&env, n, &policy, state).await;
    }
    env.annotate_node(&nodes[1], fw::LAST_FLASH_JOB, Some("ttfwp-gone"))
        .await;
    env.label_node(&nodes[2], fw::FW_VERSION, Some("19.8.0.0"))
        .await;
    env.label_node(&nodes[2], fw::UPGRADE_STATE, Some("Done"))
        .await;
    let go_uid = go_flash_job(&env, &ns, &policy, &nodes[3]).await;
    let _ctl = controller(&env, &ns);
    create_firmware_policy(
        &env,
        &policy,
        json!({ "upgradePolicy": { "haltOnFailure": false } }),
    )
    .await;
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(&nodes[3]),
        FirmwareNodeState::Done,
        None,
    )
    .await;
    assert!(
        !unschedulable(&env.get_node(&nodes[3]).await),
        "Go's mid-flash node finished and uncordoned"
    );
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(&nodes[0]),
        FirmwareNodeState::Done,
        None,
    )
    .await;
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(&nodes[1]),
        FirmwareNodeState::Failed,
        Some("TakenOver"),
    )
    .await;
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(&nodes[2]),
        FirmwareNodeState::Done,
        Some("FlashSucceeded"),
    )
    .await;
    assert!(
        !unschedulable(&env.get_node(&nodes[0]).await),
        "the Go cordon finished and undone"
    );
    assert!(
        unschedulable(&env.get_node(&nodes[1]).await),
        "an unknown flash keeps its cordon"
    );
    // Never flashed blindly: no Job for nodes[1], none for the Go-flashed nodes[2].
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(env.client.clone(), &ns);
    let list = jobs.list(&Default::default()).await.expect("jobs");
    let on: Vec<String> = list
        .items
        .iter()
        .filter_map(|j| j.metadata.labels.as_ref()?.get(fw::JOB_NODE).cloned())
        .collect();
    assert_eq!(on, vec![nodes[0].clone(), nodes[3].clone()], "flash Jobs");
    assert!(
        list.items.iter().any(|j| j.metadata.uid == go_uid),
        "Go's Job followed, not replaced"
    );
    env.teardown().await;
}

/// The Go firmware controller cordons every matched node at once and flashes
/// `maxParallel` of them; stopped with one flash Job running, what it leaves
/// is taken over within the same budget: the inherited Job counts, and no
/// other node flashes until it has ended.
#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_go_rollout_taken_over_never_flashes_more_than_max_parallel() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-gotake", 4).await;
    ensure_crd(&env.client).await;
    let policy = env.name("fw");
    for (i, n) in nodes.iter().enumerate() {
        let state = if i == 3 { "Flashing" } else { "Draining" };
        go_cordon(&env, n, &policy, state).await;
    }
    // Go's flash on nodes[3] goes on until the test lets it end.
    env.annotate_node(
        &nodes[3],
        ttdrv_testkit::sim_flasher::HOLD_ANNOTATION,
        Some("1"),
    )
    .await;
    go_flash_job(&env, &ns, &policy, &nodes[3]).await;
    let flashes = FlashJobWatcher::start(&env, &ns);
    let _ctl = controller(&env, &ns);
    create_firmware_policy(
        &env,
        &policy,
        json!({ "upgradePolicy": { "maxParallel": 1, "haltOnFailure": false } }),
    )
    .await;
    wait_for("Go's flash on the node taken over", T, || async {
        let st = firmware_status(&env, &policy).await;
        let flashing = st
            .nodes
            .iter()
            .any(|n| n.name == nodes[3] && n.state == FirmwareNodeState::Flashing);
        if flashing && st.nodes.len() == 4 {
            Ok(())
        } else {
            Err(brief(&st))
        }
    })
    .await;
    // A few passes more with Go's flash still running: nothing else starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (running, all) = flashes.seen();
    assert_eq!(
        (running, all.len()),
        (1, 1),
        "only Go's flash Job while it runs: {all:?}"
    );
    // The three other nodes wait, cordoned, for the slot Go's flash holds.
    let st = firmware_status(&env, &policy).await;
    let waiting = st
        .nodes
        .iter()
        .filter(|n| {
            nodes[..3].contains(&n.name)
                && n.state == FirmwareNodeState::Pending
                && n.reason.as_deref() == Some(ttdrv_api::firmware::reason::WAITING_FOR_SLOT)
        })
        .count();
    assert_eq!(waiting, 3, "{}", brief(&st));
    for n in &nodes {
        assert!(
            unschedulable(&env.get_node(n).await),
            "{n} keeps Go's cordon"
        );
    }
    env.annotate_node(&nodes[3], ttdrv_testkit::sim_flasher::HOLD_ANNOTATION, None)
        .await;
    wait_fw(
        &env,
        &policy,
        &nodes,
        FirmwareNodeState::Done,
        Some("FlashSucceeded"),
    )
    .await;
    let (running, all) = flashes.seen();
    assert_eq!(
        running, 1,
        "{running} flash Jobs ran at once with maxParallel 1: {all:?}"
    );
    assert_eq!(all.len(), 4, "one flash Job per node: {all:?}");
    for n in &nodes {
        assert!(!unschedulable(&env.get_node(n).await), "{n} uncordoned");
    }
    env.teardown().await;
}

/// Two firmware policies select the same nodes (the docs' fleet-wide policy
/// beside a second one): the nodes stay with the policy that owns them, and
/// the other settles, saying so in a Conflict condition, instead of waiting.
#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn overlapping_firmware_policies_settle_with_a_conflict_condition() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-overlap", 3).await;
    ensure_crd(&env.client).await;
    let _ctl = controller(&env, &ns);
    let fleet = env.name("fleet-fw");
    let prod = env.name("prod-fw");
    create_firmware_policy(
        &env,
        &fleet,
        json!({ "upgradePolicy": { "maxParallel": 3 } }),
    )
    .await;
    wait_for("the fleet policy owns every node", T, || async {
        let st = firmware_status(&env, &fleet).await;
        if st.summary.matched == 3 {
            Ok(())
        } else {
            Err(brief(&st))
        }
    })
    .await;
    create_firmware_policy(&env, &prod, json!({})).await;
    wait_fw(
        &env,
        &fleet,
        &nodes,
        FirmwareNodeState::Done,
        Some("FlashSucceeded"),
    )
    .await;
    let cond = |st: &ttdrv_api::firmware::TenstorrentFirmwarePolicyStatus, t: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let st = wait_for("the second policy settles", T, || async {
        let st = firmware_status(&env, &prod).await;
        let settled = cond(&st, "Progressing").is_some_and(|c| c.0 == "False")
            && cond(&st, "Conflict").is_some_and(|c| c.0 == "True");
        if settled { Ok(st) } else { Err(brief(&st)) }
    })
    .await;
    assert_eq!(
        (
            st.summary.matched,
            st.summary.pending,
            st.summary.in_progress
        ),
        (0, 0, 0),
        "another policy's nodes are not this one's work: {}",
        brief(&st)
    );
    let conflict = cond(&st, "Conflict").unwrap_or_default();
    assert_eq!(conflict.1, "SelectorOverlap");
    for n in &nodes {
        assert!(
            conflict.2.contains(&format!("{n} (owned by {fleet})")),
            "{n} named with its owner: {}",
            conflict.2
        );
    }
    assert_eq!(cond(&st, "Ready").map(|c| c.0).as_deref(), Some("True"));
    assert!(
        st.nodes
            .iter()
            .all(|n| n.reason.as_deref() == Some("NodeConflict")),
        "each node listed as the Go operator lists it: {}",
        brief(&st)
    );
    // The owner's status says nothing of a conflict.
    let owner = firmware_status(&env, &fleet).await;
    assert_eq!(
        cond(&owner, "Conflict").map(|c| c.0).as_deref(),
        Some("False"),
        "{}",
        brief(&owner)
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn driver_and_firmware_rollouts_at_once_never_share_a_node() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-both", 4).await;
    ensure_crd(&env.client).await;
    let _ctl = controller(&env, &ns);
    let driver = installed(&env, &nodes, "upgradePolicy: {maxUnavailable: 2}", T).await;
    let watcher = FirmwareWatcher::start(&env);
    let safety = SafetyWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fwp = env.name("fw");
    patch_policy(&env, &driver, json!({ "version": "2.8.0" })).await;
    create_firmware_policy(&env, &fwp, json!({ "upgradePolicy": { "maxParallel": 2 } })).await;
    both_done(&env, &driver, &fwp, &nodes).await;
    let (max, violations) = watcher.seen();
    assert!(violations.is_empty(), "{violations:?}");
    assert!((1..=2).contains(&max), "{max} in a firmware cycle at once");
    safety.assert_safe(4, Some(2), "driver and firmware at once");
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn deleting_a_firmware_policy_mid_cycle_gives_back_only_untouched_nodes() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-del", 2).await;
    ensure_crd(&env.client).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fw");
    // nodes[0] flashes forever; nodes[1]'s drain is held by a PDB.
    env.annotate_node(
        &nodes[0],
        ttdrv_testkit::sim_flasher::FAULT_ANNOTATION,
        Some("hang"),
    )
    .await;
    env.pinned_deployment(&ns, "guarded", &nodes[1], true).await;
    pdb(&env, &ns, "guarded").await;
    create_firmware_policy(
        &env,
        &policy,
        json!({ "upgradePolicy": { "maxParallel": 2 } }),
    )
    .await;
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(&nodes[0]),
        FirmwareNodeState::Flashing,
        None,
    )
    .await;
    wait_fw(
        &env,
        &policy,
        std::slice::from_ref(&nodes[1]),
        FirmwareNodeState::Draining,
        None,
    )
    .await;
    firmware_api(&env)
        .delete(&policy, &DeleteParams::default())
        .await
        .expect("deleted");
    wait_for("the drained node given back", T, || async {
        let n = env.get_node(&nodes[1]).await;
        let rec = ttdrv_core::claim::firmware_record(&n);
        if !unschedulable(&n) && rec.is_none() {
            Ok(())
        } else {
            Err(format!("cordoned {}, record {rec:?}", unschedulable(&n)))
        }
    })
    .await;
    let n = env.get_node(&nodes[1]).await;
    assert_eq!(ttdrv_core::node::annotation(&n, fw::CORDONED_BY), None);
    assert_eq!(ttdrv_core::node::label(&n, fw::OWNED_BY), None);
    // The one mid-flash keeps its cordon and record: its cards may be half-written.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = env.get_node(&nodes[0]).await;
    assert!(unschedulable(&n), "a node mid-flash was uncordoned");
    // Flashing, or Failed if a pass saw its Job go with the policy (garbage
    // collection) first: either way the record and the cordon stay.
    let state = ttdrv_core::claim::firmware_record(&n).map(|r| r.state);
    assert!(
        matches!(
            state,
            Some(FirmwareNodeState::Flashing | FirmwareNodeState::Failed)
        ),
        "{state:?}"
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_version_that_needs_the_other_policy_waits_for_it_then_goes_on() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-needs", 2).await;
    ensure_crd(&env.client).await;
    let _ctl = controller(&env, &ns);
    let driver = installed(&env, &nodes, "upgradePolicy: {maxUnavailable: 2}", T).await;
    // Firmware 19.8.0 needs tt-kmd 2.8.0; the nodes run 2.7.0.
    let fwp = env.name("fw");
    create_firmware_policy(
        &env,
        &fwp,
        json!({ "minDriverVersion": "2.8.0", "upgradePolicy": { "maxParallel": 2 } }),
    )
    .await;
    wait_fw(
        &env,
        &fwp,
        &nodes,
        FirmwareNodeState::Pending,
        Some("WaitingForDriverVersion"),
    )
    .await;
    let st = firmware_status(&env, &fwp).await;
    assert!(
        st.nodes
            .iter()
            .all(|n| n.message.as_deref().is_some_and(|m| m.contains("2.7.0"))),
        "{st:?}"
    );
    // tt-kmd 2.9.0 needs firmware 19.9.0: the driver waits in turn once at 2.8.0.
    patch_policy(&env, &driver, json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &driver, &nodes, NodeState::Done, "2.8.0", T).await;
    wait_fw(&env, &fwp, &nodes, FirmwareNodeState::Done, None).await;
    patch_policy(
        &env,
        &driver,
        json!({ "version": "2.9.0", "minFirmwareVersion": "19.9.0" }),
    )
    .await;
    wait_for("the driver waiting for the firmware", T, || async {
        let st = status(&env, &driver).await;
        let waiting = st
            .nodes
            .iter()
            .filter(|n| n.reason.as_deref() == Some("WaitingForFirmwareVersion"))
            .count();
        if waiting == nodes.len() {
            Ok(())
        } else {
            Err(format!("{:?}", st.nodes))
        }
    })
    .await;
    for n in &nodes {
        assert_eq!(
            kmd(&env.get_node(n).await).as_deref(),
            Some("2.8.0"),
            "{n} swapped early"
        );
    }
    let api: Api<ttdrv_api::firmware::TenstorrentFirmwarePolicy> = Api::all(env.client.clone());
    api.patch(
        &fwp,
        &Default::default(),
        &kube::api::Patch::Merge(&json!({ "spec": { "version": "19.9.0" } })),
    )
    .await
    .expect("firmware bumped");
    wait_nodes_state(
        &env,
        &driver,
        &nodes,
        NodeState::Done,
        "2.9.0",
        Duration::from_secs(90),
    )
    .await;
    env.teardown().await;
}

/// Per node: how many times it was cordoned (uncordoned → cordoned), and
/// per app: how many pods it had (one more per eviction): independent of
/// the controller.
struct DisruptionCounter {
    seen: std::sync::Arc<std::sync::Mutex<DisruptionCounts>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Default, Clone, Debug)]
struct DisruptionCounts {
    cordons: std::collections::BTreeMap<String, usize>,
    pods: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
}

impl DisruptionCounter {
    fn start(env: &TestEnv, ns: &str) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let seen: std::sync::Arc<std::sync::Mutex<DisruptionCounts>> = Default::default();
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let out = seen.clone();
        let node_task = tokio::spawn(async move {
            let mut was: std::collections::BTreeMap<String, bool> = Default::default();
            let mut stream = ttdrv_testkit::watch_applied(nodes, cfg);
            while let Some(n) = stream.next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let now = unschedulable(&n);
                if now && !was.get(&name).copied().unwrap_or(false) {
                    let Ok(mut s) = out.lock() else { return };
                    *s.cordons.entry(name.clone()).or_default() += 1;
                }
                was.insert(name, now);
            }
        });
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), ns);
        let out = seen.clone();
        let pod_task = tokio::spawn(async move {
            let mut stream =
                ttdrv_testkit::watch_applied(pods, watcher::Config::default().labels("app"));
            while let Some(p) = stream.next().await {
                let app = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app").cloned())
                    .unwrap_or_default();
                let Ok(mut s) = out.lock() else { return };
                s.pods
                    .entry(app)
                    .or_default()
                    .insert(p.metadata.uid.clone().unwrap_or_default());
            }
        });
        Self {
            seen,
            tasks: vec![node_task, pod_task],
        }
    }

    fn counts(&self) -> DisruptionCounts {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for DisruptionCounter {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// A wave with work from both policies on every node: the driver's swap
/// lined up behind a flash in progress (held) and one waiting for its slot.
/// Returns, per node, (cordons, pods of its device user) and the metric of
/// hand-overs.
async fn combined_wave(name: &str, combine: bool) -> Vec<(usize, usize)> {
    let (env, ns, nodes, _agent) = sim_fleet(name, 2).await;
    ensure_crd(&env.client).await;
    let ctl = controller_with(
        &env,
        &ns,
        ttdrv_testkit::controller::ControllerOptions {
            extra_args: vec![format!("--combine-firmware-and-driver={combine}")],
            ..Default::default()
        },
    );
    let driver = installed(&env, &nodes, "upgradePolicy: {maxUnavailable: 2}", T).await;
    for (i, n) in nodes.iter().enumerate() {
        env.pinned_deployment(&ns, &format!("user{i}"), n, true)
            .await;
        env.annotate_node(n, ttdrv_testkit::sim_flasher::HOLD_ANNOTATION, Some("1"))
            .await;
    }
    // Each device user runs on its node before any cycle starts (under load
    // the scheduler may bind one after its node's drain: then no cycle
    // evicts it, and the count below would say so).
    for (i, n) in nodes.iter().enumerate() {
        let app = format!("user{i}");
        wait_for(&format!("{app} running on {n}"), T, || async {
            let on = env.pods_on(&ns, n).await;
            let running = on.iter().any(|p| {
                p.metadata.labels.as_ref().and_then(|l| l.get("app")) == Some(&app)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            if running {
                Ok(())
            } else {
                Err(format!("{} pod(s) on the node", on.len()))
            }
        })
        .await;
    }
    let counter = DisruptionCounter::start(&env, &ns);
    let fw_watch = FirmwareWatcher::start(&env);
    let safety = SafetyWatcher::start(&env);
    let fwp = env.name("fw");
    create_firmware_policy(&env, &fwp, json!({ "upgradePolicy": { "maxParallel": 1 } })).await;
    // nodes[0] flashes (held there), nodes[1] waits for the slot.
    wait_for("one node flashing, the other waiting", T, || async {
        let st = firmware_status(&env, &fwp).await;
        let states: Vec<_> = st.nodes.iter().map(|n| n.state).collect();
        let flashing = states.iter().filter(|s| **s == FirmwareNodeState::Flashing);
        let pending = st.nodes.iter().filter(|n| {
            n.state == FirmwareNodeState::Pending && n.reason.as_deref() == Some("WaitingForSlot")
        });
        if flashing.count() == 1 && pending.count() == 1 {
            Ok(())
        } else {
            Err(brief(&st))
        }
    })
    .await;
    patch_policy(&env, &driver, json!({ "version": "2.8.0" })).await;
    if combine {
        // Both swaps wait for the firmware: the held flash, and the flash due.
        wait_for("both swaps waiting for the firmware", T, || async {
            let st = status(&env, &driver).await;
            let waiting = st
                .nodes
                .iter()
                .filter(|n| n.reason.as_deref() == Some("WaitingForFirmware"))
                .count();
            if waiting == 2 {
                Ok(())
            } else {
                Err(format!("{:?}", st.nodes))
            }
        })
        .await;
    } else {
        wait_for("the free node's swap going ahead", T, || async {
            let st = status(&env, &driver).await;
            let e = st.nodes.iter().find(|e| e.name == nodes[1]);
            match e {
                Some(e) if e.state != NodeState::Pending => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    for n in &nodes {
        env.annotate_node(n, ttdrv_testkit::sim_flasher::HOLD_ANNOTATION, None)
            .await;
    }
    both_done(&env, &driver, &fwp, &nodes).await;
    for n in &nodes {
        let node = env.get_node(n).await;
        for k in ttdrv_api::labels::INHERITED_CORDON_MARKS {
            assert_eq!(
                ttdrv_core::node::annotation(&node, k),
                None,
                "{n}: {k} left"
            );
        }
    }
    let (_, violations) = fw_watch.seen();
    assert!(violations.is_empty(), "{violations:?}");
    safety.assert_safe(2, Some(2), "a combined wave");
    let (_, _, body) = ctl.admin_get("/metrics").await.expect("metrics");
    let handed = format!(
        "ttfw_cordons_handed_over_total{{cr=\"{fwp}\"}} {}",
        if combine { 2 } else { 0 }
    );
    assert!(body.lines().any(|l| l == handed), "missing `{handed}`");
    let c = counter.counts();
    let out = (0..nodes.len())
        .map(|i| {
            (
                c.cordons.get(&nodes[i]).copied().unwrap_or(0),
                c.pods.get(&format!("user{i}")).map_or(0, |s| s.len()),
            )
        })
        .collect();
    env.teardown().await;
    out
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn work_from_both_policies_costs_each_node_one_cordon_and_drain() {
    // Each node: cordoned once, its device user evicted once (a second pod).
    let combined = combined_wave("fw-one", true).await;
    assert_eq!(combined, vec![(1, 2), (1, 2)], "(cordons, pods) per node");
}

#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn with_combining_off_each_policy_cordons_and_drains_on_its_own() {
    // The measure above can fail: apart, each node is cordoned twice. (Its
    // device user is evicted twice when its second pod was bound before the
    // second cordon, a race with the scheduler: two or three pods.)
    let apart = combined_wave("fw-two", false).await;
    assert!(
        apart.iter().all(|(c, p)| *c == 2 && (2..=3).contains(p)),
        "(cordons, pods) per node: {apart:?}"
    );
}

/// A policy deleted mid-flash takes its flash Jobs with it (garbage
/// collection); re-created under the same name, its controller finds the
/// nodes Flashing and their Jobs gone. Whether the cards were written is
/// unknown: Failed with the cordon kept, and no Job until a person retries.
///
/// Deterministic about the window that made this flaky: an earlier
/// controller named the Job in the record only once a pass saw it run, and
/// read a record Flashing without a Job as "created by this very step, not
/// in the cache yet", creating it again. Whether a pass saw the Job before
/// the deletion was a race (about 1 run in 4 it had not). Here both records
/// are put back to that window: `n0`'s as this controller writes it when the
/// flash starts (the Job named, not seen yet, for the deleted policy
/// object), `n1`'s as the earlier controller had persisted it (Flashing, no
/// Job named): neither may be flashed again.
#[tokio::test]
#[ignore = "needs the test cluster: make cluster-up"]
async fn a_policy_recreated_mid_flash_never_flashes_the_node_blindly_again() {
    let (env, ns, nodes, _agent) = sim_fleet("fw-again", 2).await;
    ensure_crd(&env.client).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fw");
    for n in &nodes {
        env.annotate_node(
            n,
            ttdrv_testkit::sim_flasher::FAULT_ANNOTATION,
            Some("hang"),
        )
        .await;
    }
    let spec = json!({ "upgradePolicy": { "maxParallel": 2 } });
    create_firmware_policy(&env, &policy, spec.clone()).await;
    wait_fw(&env, &policy, &nodes, FirmwareNodeState::Flashing, None).await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(env.client.clone(), &ns);
    let lp = kube::api::ListParams::default().labels(&format!("{}={policy}", fw::JOB_POLICY));
    let job_names = || async {
        let mut names: Vec<String> = jobs
            .list(&lp)
            .await
            .expect("jobs")
            .items
            .into_iter()
            .filter_map(|j| j.metadata.name)
            .collect();
        names.sort();
        names
    };
    let record = |n: &str| {
        let env = &env;
        let n = n.to_string();
        async move {
            ttdrv_core::claim::firmware_record(&env.get_node(&n).await)
                .unwrap_or_else(|| panic!("{n}: no firmware record"))
        }
    };
    // Each node's record names its Job (named before the Job existed).
    let mut flashing = vec![];
    for n in &nodes {
        let r = record(n).await;
        assert_eq!(r.state, FirmwareNodeState::Flashing, "{n}: {r:?}");
        assert!(r.job.is_some(), "{n}: no Job named: {r:?}");
        flashing.push(r);
    }
    let mut first: Vec<String> = flashing.iter().filter_map(|r| r.job.clone()).collect();
    first.sort();
    let listed = wait_for("both flash Jobs", T, || async {
        let names = job_names().await;
        if names.len() == 2 {
            Ok(names)
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    assert_eq!(listed, first, "the records name the Jobs created");
    // The policy goes mid-flash (its Jobs with it, garbage-collected), and
    // comes back under the same name. The flasher keeps hanging until the
    // retry: a first Job's pod still in the simulated flasher's hands then
    // writes nothing late, and a Job created by itself is caught below.
    firmware_api(&env)
        .delete(&policy, &DeleteParams::default())
        .await
        .expect("deleted");
    wait_for("the flash Jobs garbage-collected", T, || async {
        let left = job_names().await;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?} left"))
        }
    })
    .await;
    // The records are kept for a person meanwhile (the cards may be
    // half-written); Flashing, or Failed when the policy's last pass saw the
    // Jobs go before the policy. Each is put back as the flash left it
    // before any pass saw its Job (the window): n0's as this controller
    // wrote it when the flash started (the Job named, for the deleted policy
    // object), n1's as the earlier controller had persisted it then (no Job
    // named).
    let mut named = flashing[0].clone();
    named.job_seen = false;
    let mut old = flashing[1].clone();
    old.job = None;
    old.job_seen = false;
    old.policy_uid = None;
    for (n, r) in nodes.iter().zip([&named, &old]) {
        let text = serde_json::to_string(r).expect("record");
        env.annotate_node(n, fw::RECORD, Some(&text)).await;
    }
    // Then a canary: a node the policy would select, already at its version,
    // with a Done record of it. The controller releases that record once
    // its cache holds it, so also the writes before it (one watch, in
    // order), and once it knows the policy gone (so no pass of the old
    // policy's actor writes over them).
    let canary = env
        .tt_node_name("canary", &[(fw::FW_VERSION, "19.8.0.0")])
        .await;
    let mut done = FwRecord::new(&policy, "19.8.0", 0);
    done.state = FirmwareNodeState::Done;
    let done = serde_json::to_string(&done).expect("record");
    env.annotate_node(&canary, fw::RECORD, Some(&done)).await;
    wait_for("the canary's stray record released", T, || async {
        match ttdrv_core::claim::firmware_record(&env.get_node(&canary).await) {
            None => Ok(()),
            Some(r) => Err(format!("{r:?}")),
        }
    })
    .await;
    create_firmware_policy(&env, &policy, spec).await;
    // Whether the cards were written is unknown: Failed, cordon kept, and
    // no Job created by itself (checked at every poll: a Job is the bug).
    let st = wait_for("both nodes Failed, no Job", T, || async {
        let names = job_names().await;
        assert!(
            names.is_empty(),
            "a flash Job was created without a retry: {names:?}"
        );
        let st = firmware_status(&env, &policy).await;
        let failed = nodes.iter().all(|n| {
            st.nodes.iter().any(|e| {
                &e.name == n
                    && e.state == FirmwareNodeState::Failed
                    && e.reason.as_deref() == Some("FlashJobFailed")
            })
        });
        if failed { Ok(st) } else { Err(brief(&st)) }
    })
    .await;
    let msg = |n: &str| {
        st.nodes
            .iter()
            .find(|e| e.name == n)
            .and_then(|e| e.message.clone())
            .unwrap_or_default()
    };
    for n in &nodes {
        assert!(msg(n).contains("vanished"), "{n}: {st:?}");
    }
    assert!(
        msg(&nodes[0]).contains(&first[0]) || msg(&nodes[0]).contains(&first[1]),
        "n0 names its Job: {st:?}"
    );
    assert!(
        msg(&nodes[1]).contains("earlier controller version"),
        "n1 says why it names no Job: {st:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = firmware_status(&env, &policy).await;
    assert!(
        st.nodes
            .iter()
            .filter(|e| nodes.contains(&e.name))
            .all(|e| e.state == FirmwareNodeState::Failed),
        "{st:?}"
    );
    for n in &nodes {
        assert!(
            unschedulable(&env.get_node(n).await),
            "{n}: the cordon was lifted"
        );
    }
    assert!(
        job_names().await.is_empty(),
        "a flash Job was created without a retry"
    );
    // A person retries: a Job of its own each, and the nodes are flashed.
    for n in &nodes {
        env.annotate_node(n, ttdrv_testkit::sim_flasher::FAULT_ANNOTATION, None)
            .await;
        env.annotate_node(n, fw::RETRY, Some("1")).await;
    }
    wait_fw(&env, &policy, &nodes, FirmwareNodeState::Done, None).await;
    assert_flashed(&env, &nodes, &policy).await;
    let names = job_names().await;
    assert!(
        names.len() == 2 && names.iter().all(|n| !first.contains(n)),
        "the retries' Jobs are new ones: {names:?} (first {first:?})"
    );
    env.teardown().await;
}
