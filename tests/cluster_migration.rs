//! Taking over a cluster the Go tt-k8s-driver-manager ran, with no manual step:
//! policies with a status the Go operator wrote (or garbage), its installer
//! DaemonSet `ttdrv-<cr>` (another, immutable selector), nodes it cordoned
//! mid-upgrade (`cordoned-by`, gates at "false"), a node without `kmd-version`
//! whose module is loaded all the same, and a policy with `unmanage: true`
//! whose nodes the Go operator was vacating. Real control plane, the
//! controller binary, the simulated agent.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use ttdrv_api::{NodeState, TenstorrentDriverPolicy, labels};
use ttdrv_testkit::sim_agent::{HOST_MANAGED_ANNOTATION, LOADED_ANNOTATION};
use ttdrv_testkit::{SimAgent, TestEnv, wait_for};

const T: Duration = Duration::from_secs(120);
const GATE: &str = labels::DEFAULT_DEPLOY_GATE;

/// Tests of this binary run in parallel and share the CRD: one of them at a
/// time loosens it to write a status as the Go operator's CRD allowed.
static CRD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the Go operator writes: `phase`, a summary without `done` (its own
/// fields), node states this controller does not have.
fn go_status(nodes: &[String]) -> serde_json::Value {
    serde_json::json!({
        "observedGeneration": 1,
        "phase": "Rolling",
        "desiredVersion": "2.8.0",
        "conditions": [{
            "type": "Progressing", "status": "True", "reason": "Rolling",
            "message": "upgrading", "lastTransitionTime": "2026-01-01T00:00:00Z"
        }],
        "summary": { "matched": nodes.len(), "desired": nodes.len(), "ready": 1,
                     "available": 1, "failed": 0, "upToDate": 1, "inProgress": 1 },
        "daemonSet": "ttdrv-whatever",
        "nodes": nodes.iter().enumerate().map(|(i, n)| serde_json::json!({
            "name": n,
            "state": if i == 0 { "HostManaged" } else { "Upgrading" },
            "reason": "HostManagedKMD",
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        })).collect::<Vec<_>>(),
    })
}

/// Writes `status` on each policy through the status subresource as the Go
/// operator's CRD let it (the status schema loosened for the write), then
/// puts this project's CRD back: what a cluster looks like after the switch.
async fn write_foreign_statuses(env: &TestEnv, statuses: &[(&str, serde_json::Value)]) {
    let _one = CRD.lock().await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/tenstorrentdriverpolicies.yaml"
    );
    let text = std::fs::read_to_string(path).expect("CRD file");
    let mut crd: serde_json::Value = serde_yaml::from_str(&text).expect("CRD parses");
    for v in crd["spec"]["versions"].as_array_mut().expect("versions") {
        v["schema"]["openAPIV3Schema"]["properties"]["status"] =
            serde_json::json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
    }
    let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let pp = PatchParams::apply("ttdrv-tests").force();
    crds.patch(
        "tenstorrentdriverpolicies.driver.tenstorrent.com",
        &pp,
        &Patch::Apply(&crd),
    )
    .await
    .expect("loosening the CRD");
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let mut failed = vec![];
    for (name, status) in statuses {
        let patch = serde_json::json!({ "status": status });
        // The loosened schema may take a moment to be served.
        let mut last = Err(String::new());
        for _ in 0..60 {
            last = api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            if last.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if let Err(e) = last {
            failed.push(format!("{name}: {e}"));
        }
    }
    // Our CRD back before anything can fail: later tests rely on its schema.
    ttdrv_testkit::ensure_crd(&env.client).await;
    assert!(failed.is_empty(), "writing foreign statuses: {failed:?}");
}

async fn create(env: &TestEnv, name: &str, spec: &str) -> TenstorrentDriverPolicy {
    let _one = CRD.lock().await;
    create_policy(env, name, spec).await
}

fn spec(env: &TestEnv, pool: &str, version: &str) -> String {
    format!(
        "version: \"{version}\"\nnodeAffinity: {{matchLabels: {{ttdrv-test: {}, pool: {pool}}}}}\nupgradePolicy: {{maxUnavailable: 1}}",
        env.id
    )
}

/// A status that parses as ours, or fails the test.
async fn readable_status(env: &TestEnv, policy: &str) -> Result<(), String> {
    let p = get_policy(env, policy).await;
    match p.status {
        Some(s) if !s.is_unreadable() && s.observed_generation.is_some() => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// One policy's status is the Go operator's, another's is garbage; a third
/// policy rolls out meanwhile, and the two get ours, with an Event each.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn foreign_statuses_never_stop_the_controller() {
    let env = TestEnv::new("foreign-status").await;
    let ns = env.namespace().await;
    let mut by_pool: Vec<Vec<String>> = vec![];
    for pool in ["go", "junk", "live"] {
        let mut names = vec![];
        for i in 0..2 {
            let labels = [("pool", pool), (labels::KMD_VERSION, "2.7.0")];
            names.push(env.tt_node_name(&format!("{pool}{i}"), &labels).await);
        }
        by_pool.push(names);
    }
    let go = env.name("go");
    let junk = env.name("junk");
    let live = env.name("live");
    create(&env, &go, &spec(&env, "go", "2.8.0")).await;
    create(&env, &junk, &spec(&env, "junk", "2.8.0")).await;
    write_foreign_statuses(
        &env,
        &[
            (go.as_str(), go_status(&by_pool[0])),
            (
                junk.as_str(),
                serde_json::json!({ "summary": "many", "nodes": 7, "what": ["ever"] }),
            ),
        ],
    )
    .await;
    let _agent = SimAgent::working(env.client.clone(), &ns, Duration::from_millis(300));
    let safety = SafetyWatcher::start(&env);
    let _ctl = controller(&env, &ns);
    create(&env, &live, &spec(&env, "live", "2.8.0")).await;
    let started = std::time::Instant::now();
    wait_nodes_state(&env, &live, &by_pool[2], NodeState::Done, "2.8.0", T).await;
    eprintln!("the third policy rolled out in {:?}", started.elapsed());
    for (policy, nodes) in [(&go, &by_pool[0]), (&junk, &by_pool[1])] {
        wait_nodes_state(&env, policy, nodes, NodeState::Done, "2.8.0", T).await;
        wait_for(&format!("{policy}'s status is ours"), T, || {
            readable_status(&env, policy)
        })
        .await;
        let events = policy_events(&env, policy).await;
        assert!(
            events.iter().any(|(r, _)| r == "UnreadableStatusReplaced"),
            "{policy}: no UnreadableStatusReplaced Event: {events:?}"
        );
    }
    // No Go field is left in the replaced status.
    let raw: serde_json::Value = {
        let api: Api<kube::core::DynamicObject> = Api::all_with(
            env.client.clone(),
            &kube::discovery::ApiResource::erase::<TenstorrentDriverPolicy>(&()),
        );
        serde_json::to_value(api.get(&go).await.expect("policy")).expect("json")
    };
    // The Go operator's fields we keep (phase, the Go summary counts) are now
    // ours: the phase is ours, and no node keeps the Go-only state.
    assert_ne!(raw["status"]["phase"], "Rolling", "{}", raw["status"]);
    assert!(
        raw["status"]["summary"].get("done").is_some(),
        "{}",
        raw["status"]
    );
    assert!(
        raw["status"]["nodes"]
            .as_array()
            .is_some_and(|ns| ns.iter().all(|n| n["state"] != "HostManaged")),
        "{}",
        raw["status"]
    );
    let seen = safety.seen();
    assert!(
        seen.swaps_without_go_ahead.is_empty(),
        "{:?}",
        seen.swaps_without_go_ahead
    );
    env.cleanup().await;
}

/// The Go operator's installer DaemonSet for `cr`: its labels and immutable
/// selector, an owner reference to the policy, pods on the test's nodes.
async fn go_daemonset(env: &TestEnv, ns: &str, policy: &TenstorrentDriverPolicy) {
    let cr = policy.metadata.name.clone().unwrap_or_default();
    let labels = serde_json::json!({
        "app.kubernetes.io/name": "tt-kmd-installer",
        "app.kubernetes.io/component": "driver",
        "driver.tenstorrent.com/cr": cr,
    });
    let ds: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("ttdrv-{cr}"),
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "driver.tenstorrent.com/v1alpha1",
                "kind": "TenstorrentDriverPolicy",
                "name": cr,
                "uid": policy.metadata.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "selector": { "matchLabels": labels },
            "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "nodeSelector": { "ttdrv-test": env.id },
                    "tolerations": [{ "operator": "Exists" }],
                    "containers": [{
                        "name": "builder",
                        "image": "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:go",
                        "env": [{ "name": "TT_KMD_VERSION", "value": "2.7.0" }],
                    }]
                }
            }
        }
    }))
    .expect("daemonset");
    Api::<DaemonSet>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &ds)
        .await
        .expect("creating the Go DaemonSet");
}

/// Marks a node as the Go operator leaves one it cordoned mid-upgrade.
async fn go_cordon(env: &TestEnv, node: &str, cr: &str) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    let patch = serde_json::json!({
        "metadata": {
            "annotations": {
                labels::GO_CORDONED_BY: cr,
                labels::GO_CORDONED_AT: "2026-01-01T00:00:00Z",
            },
            "labels": { GATE: "false" },
        },
        "spec": { "unschedulable": true },
    });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("Go cordon");
}

/// The whole switch: Go-written status, the Go DaemonSet, Go cordons with
/// gates, a node without `kmd-version`; then our controller, and nothing else.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn go_era_cluster_is_taken_over_with_no_manual_step() {
    let env = TestEnv::new("migration").await;
    let ns = env.namespace().await;
    let pool = [("pool", "fleet")];
    let node = |suffix: &'static str, kmd: Option<&'static str>| {
        let env = &env;
        async move {
            let mut l = pool.to_vec();
            if let Some(v) = kmd {
                l.push((labels::KMD_VERSION, v));
            }
            env.tt_node_name(suffix, &l).await
        }
    };
    // Cordoned by Go after its install finished: only the cordon is left.
    let landed = node("landed", Some("2.8.0")).await;
    // Cordoned by Go before its install: still the old module.
    let old = node("old", Some("2.7.0")).await;
    // Cordoned by Go, its pod NotReady: no kmd-version, 2.7.0 loaded.
    let unlabelled_cordoned = node("unlabelled-cordoned", None).await;
    // Not cordoned, no kmd-version, 2.7.0 loaded: not assumed empty.
    let unlabelled = node("unlabelled", None).await;
    // Untouched by Go yet.
    let plain = node("plain", Some("2.7.0")).await;
    // Cordoned by Go, uncordoned by an admin since: only the marks are left.
    let marked = node("marked", Some("2.8.0")).await;
    let all = vec![
        marked.clone(),
        landed.clone(),
        old.clone(),
        unlabelled_cordoned.clone(),
        unlabelled.clone(),
        plain.clone(),
    ];
    // A policy with `unmanage: true` the Go operator was vacating for DKMS:
    // one node cordoned by Go for it (gates closed), one on DKMS already, one
    // not reached yet.
    let vacate_node = |suffix: &'static str, extra: &'static [(&'static str, &'static str)]| {
        let env = &env;
        async move {
            let mut l = vec![("pool", "vacate")];
            l.extend_from_slice(extra);
            env.tt_node_name(suffix, &l).await
        }
    };
    let v_cordoned = vacate_node("v-cordoned", &[(labels::KMD_VERSION, "2.8.0")]).await;
    let v_dkms = vacate_node(
        "v-dkms",
        &[
            (labels::KMD_VERSION, "2.6.0"),
            (labels::INSTALL_MODE, labels::INSTALL_MODE_HOST),
        ],
    )
    .await;
    let v_plain = vacate_node("v-plain", &[(labels::KMD_VERSION, "2.8.0")]).await;
    let vacate_nodes = vec![v_cordoned.clone(), v_dkms.clone(), v_plain.clone()];
    let cr = env.name("fleet");
    let policy = create(&env, &cr, &spec(&env, "fleet", "2.8.0")).await;
    let vacate_cr = env.name("vacate");
    let vacate_spec = format!("{}\nunmanage: true", spec(&env, "vacate", "2.8.0"));
    create(&env, &vacate_cr, &vacate_spec).await;
    go_cordon(&env, &v_cordoned, &vacate_cr).await;
    env.annotate_node(&v_dkms, HOST_MANAGED_ANNOTATION, Some("2.6.0"))
        .await;
    write_foreign_statuses(&env, &[(cr.as_str(), go_status(&all))]).await;
    for n in [&landed, &old, &unlabelled_cordoned, &marked] {
        go_cordon(&env, n, &cr).await;
    }
    env.set_unschedulable(&marked, false).await;
    env.label_node(&marked, GATE, None).await;
    for n in [&unlabelled_cordoned, &unlabelled] {
        env.annotate_node(n, LOADED_ANNOTATION, Some("2.7.0")).await;
    }
    go_daemonset(&env, &ns, &policy).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let go_pods = ListParams::default().labels("app.kubernetes.io/name=tt-kmd-installer");
    wait_for("the Go installer pods", T, || async {
        let n = pods
            .list(&go_pods)
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        // The Go DaemonSet selects every node of the test.
        if n == all.len() + vacate_nodes.len() {
            Ok(())
        } else {
            Err(format!("{n} pods"))
        }
    })
    .await;

    let safety = SafetyWatcher::start(&env);
    let _agent = SimAgent::working(env.client.clone(), &ns, Duration::from_millis(300));
    // The Degraded reasons the policy shows on the way (polled).
    let reasons = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let poll = {
        let (api, cr, reasons) = (
            Api::<TenstorrentDriverPolicy>::all(env.client.clone()),
            cr.clone(),
            reasons.clone(),
        );
        tokio::spawn(async move {
            loop {
                if let Ok(p) = api.get(&cr).await {
                    for c in p.status.iter().flat_map(|s| s.conditions.iter()) {
                        if c.type_ == "Degraded"
                            && let Ok(mut r) = reasons.lock()
                        {
                            r.insert(c.reason.clone());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let started = std::time::Instant::now();
    let _ctl = controller(&env, &ns);

    wait_nodes_state(
        &env,
        &cr,
        &all,
        NodeState::Done,
        "2.8.0",
        Duration::from_secs(240),
    )
    .await;
    eprintln!("taken over in {:?}", started.elapsed());
    for n in &all {
        wait_for(&format!("{n} left as a Done node should be"), T, || async {
            let node = env.get_node(n).await;
            let ann = node.metadata.annotations.clone().unwrap_or_default();
            let left: Vec<_> = [labels::GO_CORDONED_BY, labels::GO_CORDONED_AT]
                .into_iter()
                .filter(|k| ann.contains_key(*k))
                .collect();
            let (kmd, cordoned, gates) = (kmd(&node), unschedulable(&node), gate_labels(&node));
            if kmd.as_deref() == Some("2.8.0") && !cordoned && gates.is_empty() && left.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "kmd {kmd:?}, unschedulable {cordoned}, gates {gates:?}, Go annotations {left:?}"
                ))
            }
        })
        .await;
    }
    // The DaemonSet is ours now, and the Go pods are gone with the Go one.
    let ds = Api::<DaemonSet>::namespaced(env.client.clone(), &ns)
        .get(&format!("ttdrv-{cr}"))
        .await
        .expect("DaemonSet");
    assert_eq!(
        ds.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLAIM)),
        Some(&cr)
    );
    let left = pods.list(&go_pods).await.expect("pods").items.len();
    assert_eq!(left, 0, "Go installer pods left");
    let events = policy_events(&env, &cr).await;
    assert!(
        !events.iter().any(|(r, _)| r == "PolicyRefused"),
        "a takeover is not a refusal: {events:?}"
    );
    for reason in [
        "DaemonSetTakeover",
        "DaemonSetTakenOver",
        "UnreadableStatusReplaced",
    ] {
        assert!(
            events.iter().any(|(r, _)| r == reason),
            "no {reason} Event: {events:?}"
        );
    }
    readable_status(&env, &cr).await.expect("our status");
    // The unmanaged policy's nodes are vacated and left alone; its DaemonSet goes.
    for n in &vacate_nodes {
        wait_node(&env, &vacate_cr, n, NodeState::Unmanaged, T).await;
        wait_for(&format!("{n} vacated"), T, || async {
            let node = env.get_node(n).await;
            let ann = node.metadata.annotations.clone().unwrap_or_default();
            if ann.contains_key(labels::GO_CORDONED_BY) {
                return Err("the Go cordon mark is left".into());
            }
            vacated(&node, &vacate_cr)
        })
        .await;
    }
    env.wait_daemonset_gone(&ns, &format!("ttdrv-{vacate_cr}"), T)
        .await;
    poll.abort();
    let reasons = reasons.lock().map(|r| r.clone()).unwrap_or_default();
    assert!(
        reasons.contains("DaemonSetTakeover"),
        "the takeover never showed as a Degraded condition: {reasons:?}"
    );
    let seen = safety.seen();
    eprintln!("swaps: {:?}", seen.swaps);
    assert!(
        seen.swaps_without_go_ahead.is_empty(),
        "swapped outside a cycle: {:?}",
        seen.swaps_without_go_ahead
    );
    // The modules of the unlabelled nodes were swapped too, each in a cycle.
    for n in [&unlabelled_cordoned, &unlabelled, &old] {
        assert!(
            seen.swaps
                .iter()
                .any(|s| s.starts_with(&format!("{n}: 2.7.0 -> 2.8.0"))),
            "{n}: no swap seen: {:?}",
            seen.swaps
        );
    }
    env.cleanup().await;
}

/// A `helm upgrade` from the Go chart starts our controller pod while the Go
/// one still runs. A stand-in for it (the Go Deployment's labels, its
/// `manager` container) holds ours back: ready, but it claims, renders and
/// cordons nothing, and its log names the pod; once the pod is gone it acts.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_running_go_controller_pod_holds_ours_back() {
    let env = TestEnv::new("go-handover").await;
    let ns = env.namespace().await;
    let node = env.tt_node_name("a", &[("pool", "fleet")]).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let stand_in: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "tt-k8s-driver-manager-controller-5f6d7c9b8-go",
            "labels": {
                "app.kubernetes.io/name": "tt-k8s-driver-manager",
                "app.kubernetes.io/instance": "tt",
                "app.kubernetes.io/component": "controller",
            },
        },
        "spec": {
            // Never scheduled: it only has to exist, as a running pod would.
            "nodeSelector": { "ttdrv-test/nowhere": "true" },
            "containers": [{ "name": "manager", "image": "ghcr.io/tenstorrent/tt-k8s-driver-manager:v0.4.2" }],
        },
    }))
    .unwrap_or_else(|e| panic!("stand-in pod: {e}"));
    pods.create(&PostParams::default(), &stand_in)
        .await
        .unwrap_or_else(|e| panic!("creating the stand-in Go controller pod: {e}"));
    let _agent = SimAgent::working(env.client.clone(), &ns, Duration::from_millis(300));
    let ctl = controller(&env, &ns);
    let log = std::env::temp_dir().join(format!("ttdrv-controller-{}.log", ctl.identity));
    let policy = env.name("fleet");
    create(&env, &policy, &spec(&env, "fleet", "2.7.0")).await;

    wait_for(
        "the controller names the Go pod it waits for",
        T,
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(&format!(
                "{ns}/tt-k8s-driver-manager-controller-5f6d7c9b8-go"
            )) && text.contains("not acting while the Go operator's controller runs")
            {
                Ok(())
            } else {
                Err(text.lines().last().unwrap_or("").to_string())
            }
        },
    )
    .await;
    // Ready all the while (a rolling upgrade waits for that to stop the Go pod).
    assert!(
        ready(ctl.admin_port).await,
        "/readyz answers 200 while waiting"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let n = env.get_node(&node).await;
    assert!(
        n.metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(labels::CLAIM)),
        "the node claimed while the Go controller runs"
    );
    let ds: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    assert!(
        ds.get_opt(&format!("ttdrv-{policy}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none(),
        "a DaemonSet rendered while the Go controller runs"
    );
    assert!(
        get_policy(&env, &policy).await.status.is_none(),
        "a status written while the Go controller runs"
    );

    pods.delete(
        &stand_in.metadata.name.clone().unwrap_or_default(),
        &Default::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("deleting the stand-in: {e}"));
    wait_node(&env, &policy, &node, NodeState::Done, T).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("the Go operator's controller has stopped"),
        "the hand-over is logged"
    );
    env.teardown().await;
}

/// GET /readyz on the controller's admin port: whether it answers 200.
async fn ready(port: u16) -> bool {
    ttdrv_testkit::real_node::http_get(&format!("127.0.0.1:{port}"), "/readyz")
        .await
        .is_ok()
}

/// A policy naming the Go operator's builder image (the Go spec's own canary
/// example does) runs the controller's installer image instead, and says so
/// in a Warning Event.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn the_go_builder_image_is_replaced_with_a_warning() {
    let env = TestEnv::new("go-builder").await;
    let ns = env.namespace().await;
    let node = env.tt_node_name("a", &[("pool", "fleet")]).await;
    let _agent = SimAgent::working(env.client.clone(), &ns, Duration::from_millis(300));
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    let go = "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:sha-abc1234";
    let spec = format!(
        "{}\ninstaller: {{image: \"{go}\"}}",
        spec(&env, "fleet", "2.7.0")
    );
    create(&env, &policy, &spec).await;
    wait_node(&env, &policy, &node, NodeState::Done, T).await;
    let ds: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    let d = ds
        .get(&format!("ttdrv-{policy}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let image = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.first().and_then(|c| c.image.clone()));
    // The test controller's --installer-image (testkit::controller).
    assert_eq!(
        image.as_deref(),
        Some("example.invalid/tt-driver-agent:test")
    );
    wait_event(&env, &policy, "GoBuilderImageReplaced", T, |n| {
        n.contains(go) && n.contains("example.invalid/tt-driver-agent:test")
    })
    .await;
    env.teardown().await;
}

/// The drain leaves the operator's namespace alone, as the Go drain did: a
/// pod there (the controller's stand-in) stays through a full-node drain of
/// its node, while the same pod in another namespace is evicted.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn the_operator_namespace_is_never_drained() {
    use k8s_openapi::api::core::v1::Namespace;
    let env = TestEnv::new("drain-exempt").await;
    let ns = env.namespace().await;
    let other = format!("{}-work", env.id);
    let nss: Api<Namespace> = Api::all(env.client.clone());
    let work: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": other, "labels": env.labels() }
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    nss.create(&PostParams::default(), &work)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {other}: {e}"));
    let node = env.tt_node_name("a", &[("pool", "fleet")]).await;
    let _agent = SimAgent::working(env.client.clone(), &ns, Duration::from_millis(300));
    let _ctl = controller_with(
        &env,
        &ns,
        ttdrv_testkit::ControllerOptions {
            exempt_own_namespace: true,
            ..Default::default()
        },
    );
    let policy = env.name("fleet");
    create(&env, &policy, &spec(&env, "fleet", "2.7.0")).await;
    wait_node(&env, &policy, &node, NodeState::Done, T).await;
    env.pinned_deployment(&ns, "operator-side", &node, false)
        .await;
    env.pinned_deployment(&other, "workload", &node, false)
        .await;
    let pod_of = |namespace: String, app: &'static str| {
        let env = &env;
        async move {
            wait_for(&format!("{namespace}/{app} Running"), T, || async {
                let pods: Api<Pod> = Api::namespaced(env.client.clone(), &namespace);
                let l = pods
                    .list(&ListParams::default().labels(&format!("app={app}")))
                    .await
                    .map_err(|e| e.to_string())?;
                l.items
                    .iter()
                    .find(|p| {
                        ttdrv_testkit::pod_ready(p) && p.metadata.deletion_timestamp.is_none()
                    })
                    .and_then(|p| p.metadata.uid.clone())
                    .ok_or_else(|| format!("{} pods, none Ready", l.items.len()))
            })
            .await
        }
    };
    let kept = pod_of(ns.clone(), "operator-side").await;
    let evicted = pod_of(other.clone(), "workload").await;

    // Full-node drain (the default): pass 2 takes every pod not exempt.
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node_at(&env, &policy, &node, NodeState::Done, Some("2.8.0"), T).await;
    assert_eq!(
        pod_of(ns.clone(), "operator-side").await,
        kept,
        "the pod in the operator's namespace was evicted"
    );
    assert_ne!(
        pod_of(other.clone(), "workload").await,
        evicted,
        "the pod in {other} was not drained"
    );
    let _ = nss.delete(&other, &Default::default()).await;
    env.teardown().await;
}
