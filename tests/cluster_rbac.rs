//! Least privilege, proven: the controller runs with its Helm chart
//! ServiceAccount's own token through a rollout (with an eviction and leader
//! election). Any request the chart's RBAC refuses fails the test (read from the
//! API server's audit log); permissions the chart grants but the rollout never
//! used are listed.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::*;
use ttdrv_api::NodeState;
use ttdrv_testkit::{ControllerOptions, SimAgent, TestEnv};

/// Bound of each wait for the rollout.
const T: Duration = Duration::from_secs(90);

/// (apiGroup, resource, verb) triples granted by the chart's controller roles.
fn granted(
    docs: &[serde_yaml::Value],
    role_names: &BTreeSet<String>,
) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for d in docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        if !(kind == "ClusterRole" || kind == "Role") || !role_names.contains(name) {
            continue;
        }
        for rule in d["rules"].as_sequence().cloned().unwrap_or_default() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_sequence()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            };
            for g in list("apiGroups") {
                for r in list("resources") {
                    for v in list("verbs") {
                        out.insert((g.clone(), r.clone(), v.clone()));
                    }
                }
            }
        }
    }
    out
}

/// Creates a firmware policy for the test's nodes and waits until each is Done.
async fn flash(env: &TestEnv, nodes: &[String]) {
    let name = env.name("fw");
    ttdrv_testkit::policy::create_firmware_policy(env, &name, serde_json::json!({})).await;
    ttdrv_testkit::wait_for(&format!("{nodes:?} flashed by {name}"), T, || async {
        let st = ttdrv_testkit::policy::firmware_status(env, &name).await;
        let done = st
            .nodes
            .iter()
            .filter(|n| n.state == ttdrv_api::firmware::FirmwareNodeState::Done)
            .count();
        if done == nodes.len() {
            Ok(())
        } else {
            Err(format!("{:?}", st.nodes))
        }
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn controller_runs_a_rollout_with_the_charts_service_account() {
    let env = TestEnv::new("rbac").await;
    let ns = env.namespace().await;
    let release = format!(
        "r{}",
        env.id
            .replace('-', "")
            .chars()
            .rev()
            .take(8)
            .collect::<String>()
    );
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/chart");
    let kube_version = kube_version(&env).await;
    let rendered = run(
        Command::new("helm").args([
            "template",
            &release,
            chart,
            "-n",
            &ns,
            "--kube-version",
            &kube_version,
        ]),
        None,
    );
    let docs = yaml_docs(&rendered);
    let wanted = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let rbac: Vec<String> = docs
        .iter()
        .filter(|d| wanted.contains(&d["kind"].as_str().unwrap_or_default()))
        .map(|d| serde_yaml::to_string(d).expect("yaml"))
        .collect();
    run(
        Command::new("kubectl").args(["apply", "-f", "-"]),
        Some(&rbac.join("---\n")),
    );
    let sa = docs
        .iter()
        .filter(|d| d["kind"] == "ServiceAccount")
        .filter_map(|d| d["metadata"]["name"].as_str())
        .find(|n| n.ends_with("-controller"))
        .expect("chart renders a controller ServiceAccount")
        .to_string();
    let roles: BTreeSet<String> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRoleBinding") | Some("RoleBinding")
            )
        })
        .filter(|d| {
            d["subjects"]
                .as_sequence()
                .is_some_and(|s| s.iter().any(|x| x["name"].as_str() == Some(sa.as_str())))
        })
        .filter_map(|d| d["roleRef"]["name"].as_str().map(String::from))
        .collect();
    let token = run(
        Command::new("kubectl").args(["create", "token", &sa, "-n", &ns, "--duration", "1h"]),
        None,
    );
    let mut kc: serde_json::Value = serde_json::from_str(&run(
        Command::new("kubectl").args(["config", "view", "--raw", "--minify", "-o", "json"]),
        None,
    ))
    .expect("kubeconfig json");
    kc["users"][0]["user"] = serde_json::json!({ "token": token.trim() });
    let kc_path = std::env::temp_dir().join(format!("ttdrv-rbac-{}.kubeconfig", env.id));
    std::fs::write(&kc_path, serde_json::to_string(&kc).expect("json")).expect("write kubeconfig");

    let nodes = env.tt_node_names(&["a", "b"]).await;
    let _agent = SimAgent::working(env.client.clone(), &ns, Duration::from_millis(200));
    // The controller process gets the ServiceAccount's credentials only.
    let opts = ControllerOptions {
        leader_elect: true,
        extra_args: vec![
            "--agent-service-account".into(),
            sa.replace("-controller", "-agent"),
        ],
        env: vec![("KUBECONFIG".into(), kc_path.display().to_string())],
        ..Default::default()
    };
    let _ctl = controller_with(&env, &ns, opts);
    pinned_deployment(&env, &ns, "workload", &nodes[0]).await;
    // The upgrade runs a validation pod per node (podtemplates get, pods
    // create and delete).
    validation_template(&env, &ns, "burn-in").await;
    let _kubelet = finish_validation_pods(&env, &ns, false);
    let policy = installed(
        &env,
        &nodes,
        "upgradePolicy: {validation: {podTemplateName: burn-in}}",
        T,
    )
    .await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    // A firmware policy flashes the same nodes (flash Jobs, its status).
    flash(&env, &nodes).await;
    // A finished firmware record naming a policy this controller does not
    // serve (--policy-selector): it reads that policy by name and, finding
    // none, releases the record.
    let mut gone = ttdrv_core::firmware::FwRecord::new(&format!("{}-gone", env.id), "19.8.0", 0);
    gone.state = ttdrv_api::firmware::FirmwareNodeState::Done;
    let gone = serde_json::to_string(&gone).expect("record");
    env.annotate_node(&nodes[0], ttdrv_api::firmware::labels::RECORD, Some(&gone))
        .await;
    ttdrv_testkit::wait_for("the stray firmware record released", T, || async {
        let n = env.get_node(&nodes[0]).await;
        match ttdrv_core::claim::firmware_record(&n) {
            Some(r) if r.policy.ends_with("-gone") => Err(format!("{r:?}")),
            _ => Ok(()),
        }
    })
    .await;

    // Let the leader renew its Lease at least once (renewal is every duration/3).
    tokio::time::sleep(Duration::from_secs(3)).await;
    // What the controller actually did, from the audit log.
    let user = format!("system:serviceaccount:{ns}:{sa}");
    let log = std::env::var("KUBECONFIG")
        .ok()
        .and_then(|k| {
            std::path::Path::new(&k)
                .parent()
                .map(|p| p.join("logs/audit.log"))
        })
        .expect("audit log next to the kubeconfig");
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e} (hack/cluster.sh enables auditing)",
            log.display()
        )
    });
    let mut used = BTreeSet::new();
    let mut denied = Vec::new();
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if ev["user"]["username"].as_str() != Some(user.as_str()) {
            continue;
        }
        let o = &ev["objectRef"];
        let mut res = o["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = o["subresource"].as_str() {
            res = format!("{res}/{sub}");
        }
        let verb = ev["verb"].as_str().unwrap_or_default().to_string();
        let group = o["apiGroup"].as_str().unwrap_or_default().to_string();
        if ev["responseStatus"]["code"].as_i64() == Some(403) {
            denied.push(format!(
                "{verb} {group}/{res} in {:?}",
                o["namespace"].as_str()
            ));
        }
        // A server-side apply that creates the object is authorized as create.
        if verb == "patch" && ev["responseStatus"]["code"].as_i64() == Some(201) {
            used.insert((group.clone(), res.clone(), "create".to_string()));
        }
        used.insert((group, res, verb));
    }
    assert!(
        !used.is_empty(),
        "no audited request from {user}: is auditing on?"
    );
    assert!(
        denied.is_empty(),
        "the chart's RBAC refused requests the controller needs: {denied:#?}"
    );
    let granted = granted(&docs, &roles);
    // Needed only when an identical Event repeats (the recorder then patches its
    // series count), which a short rollout may or may not produce.
    // Deleting a DaemonSet is needed only to take over a `ttdrv-<policy>`
    // this controller did not make (tests/cluster_migration.rs).
    let timing_dependent = [
        (
            "events.k8s.io".to_string(),
            "events".to_string(),
            "patch".to_string(),
        ),
        (
            "apps".to_string(),
            "daemonsets".to_string(),
            "delete".to_string(),
        ),
    ];
    let unused: Vec<_> = granted
        .iter()
        .filter(|g| !used.contains(*g) && !timing_dependent.contains(g))
        .collect();
    let show = |v: Vec<&(String, String, String)>| {
        v.iter()
            .map(|(g, r, vb)| format!("{vb} {g}/{r}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "RBAC: used by the rollout ({}): {}",
        used.len(),
        show(used.iter().collect())
    );
    eprintln!(
        "RBAC: granted but unused in this rollout ({}): {}",
        unused.len(),
        show(unused.clone())
    );
    assert!(
        unused.is_empty(),
        "the chart grants permissions the controller never used: {}",
        show(unused)
    );
    env.teardown().await;
}
