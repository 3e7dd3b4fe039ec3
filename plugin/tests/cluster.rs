//! Every subcommand of the plugin against the local simulated cluster (real
//! kube-apiserver, kwok nodes), with the real controller and the simulated agent.
//! Ignored by plain `cargo test` (no cluster there); `make test` runs them through
//! `hack/run-cluster-tests.sh`, which sets KUBECONFIG. By hand: `bash hack/cluster.sh up`,
//! `export KUBECONFIG=$(bash hack/cluster.sh kubeconfig)`, then
//! `cargo test -p kubectl-tt-driver --test cluster -- --ignored`.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use ttdrv_api::{NodeState, labels};
use ttdrv_testkit::sim_agent::HOST_MANAGED_ANNOTATION;
use ttdrv_testkit::{TestEnv, wait_for};

const T: Duration = Duration::from_secs(120);

/// `plan` predicts order, evictions, pods left and skipped nodes; the rollout
/// then cordons the nodes in that order and evicts exactly those pods. `watch`
/// follows it to the end; `status` and `nodes` report the result.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn plan_predicts_what_the_rollout_does() {
    let env = TestEnv::new("plugin-plan").await;
    let _guard = CleanupOnPanic { id: env.id.clone() };
    let ns = env.namespace().await;
    let tt = env.tt_node_names(&["n0", "n1", "n2", "n3"]).await;
    // A DKMS host, as the agent labelled it on an earlier visit.
    let host_labels = [
        (labels::INSTALL_MODE, labels::INSTALL_MODE_HOST),
        (labels::KMD_VERSION, "2.6.0"),
    ];
    let host = env.tt_node_name("dkms", &host_labels).await;
    env.annotate_node(&host, HOST_MANAGED_ANNOTATION, Some("2.6.0"))
        .await;
    let skip = env.tt_node_name("skip", &[(labels::SKIP, "true")]).await;
    let cpu = env.node("cpu", &[]).await.metadata.name.unwrap_or_default();
    let _agent = agent(&env, &ns);
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(&env, &policy, &fleet_spec(&env, "2.7.0", "")).await;
    wait_nodes(&env, &policy, &tt, NodeState::Done, Some("2.7.0"), T).await;
    wait_node_at(&env, &policy, &host, NodeState::Done, Some("2.6.0"), T).await;

    // Workloads: a device user on n1 (so n1 goes last), a Deployment on n2, a
    // bare pod on n0 (left in place), nothing on n3.
    deployment(&env, &ns, "dev-user", &tt[1], true).await;
    deployment(&env, &ns, "web", &tt[2], false).await;
    bare_pod(&env, &ns, "scratch", &tt[0]).await;
    let pods = wait_pods_ready(&env, &ns, 3).await;

    let run = plugin(&["plan", &policy, "--version", "2.8.0", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let plan = run.json();
    let predicted = names(&plan["nodes"]);
    assert_eq!(
        predicted,
        [tt[0].clone(), tt[2].clone(), tt[3].clone(), tt[1].clone()],
        "nodes without device users first, by name"
    );
    let by_node = |n: &str| {
        plan["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        strings(&by_node(&tt[1])["evictDevice"]),
        [pods["dev-user"].clone()]
    );
    assert_eq!(
        strings(&by_node(&tt[2])["evictOther"]),
        [pods["web"].clone()]
    );
    assert_eq!(names(&by_node(&tt[0])["left"]), [pods["scratch"].clone()]);
    for n in &tt {
        assert!(
            strings(&by_node(n)["blockers"]).is_empty(),
            "no blockers on {n}"
        );
    }
    let skipped: Vec<(String, String)> = plan["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_string(),
                s["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    for (n, kind) in [
        (&host, "HostManaged"),
        (&skip, "SkipLabel"),
        (&cpu, "NotTenstorrent"),
    ] {
        assert!(
            skipped.contains(&(n.clone(), kind.to_string())),
            "{n} skipped as {kind}: {skipped:?}"
        );
    }
    assert_eq!(plan["estimate"]["waves"], 4);
    assert_eq!(
        plan["estimate"]["perNode"]["basis"], "observed",
        "the first install's cycles are observed"
    );

    // The text form, and proof that the dry run changed nothing.
    let text = plugin(&["plan", &policy, "--version", "2.8.0"]).await;
    assert_eq!(text.code, 0);
    assert!(text.stdout.contains("dry run") && text.stdout.contains("Estimated duration"));
    assert!(
        !text.stdout.contains('\u{1b}'),
        "no color when not on a terminal"
    );
    assert_eq!(get_policy(&env, &policy).await.spec.version, "2.7.0");
    for n in &tt {
        let node = env.get_node(n).await;
        assert!(
            node.spec.and_then(|s| s.unschedulable) != Some(true),
            "{n} cordoned by plan"
        );
    }

    // The rollout, watched by the plugin and, independently, by a node watch.
    let cordons = NodeOrder::cordons(&env).await;
    // Bump first, then watch (on a settled policy watch would end at once); the
    // watch waits for the controller to observe the new generation.
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let watched = plugin(&["watch", &policy, "--interval", "0.5", "--timeout", "150"]).await;
    assert_eq!(
        watched.code, 0,
        "watch ends with the rollout: {}",
        watched.stderr
    );
    assert!(
        watched.stdout.contains("Rollout complete."),
        "{}",
        watched.stdout
    );
    assert!(watched.stdout.contains("5/5 done"), "{}", watched.stdout);
    assert!(watched.stdout.contains("ETA"), "{}", watched.stdout);
    // Every record written shows as a transition line; Cordoning and
    // Uncordoning are written with the next state (one patch), so a cycle
    // reads Pending → Draining → Upgrading → Done. The first node may have
    // left Pending before the watch started.
    for (i, n) in predicted.iter().enumerate() {
        let mut want = vec!["Draining → Upgrading", "Upgrading → Done"];
        if i > 0 {
            want.push("Pending → Draining");
        }
        for t in want {
            assert!(
                watched.stdout.contains(&format!("{n}  {t}")),
                "{n}  {t}: {}",
                watched.stdout
            );
        }
    }
    wait_nodes(&env, &policy, &tt, NodeState::Done, Some("2.8.0"), T).await;
    assert_eq!(cordons.order(), predicted, "cordon order = plan order");

    // Evicted as predicted: the Deployments' pods were replaced, the bare pod stayed.
    let api: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let pod_name = |k: &str| pods[k].split('/').nth(1).unwrap_or("").to_string();
    for app in ["dev-user", "web"] {
        assert!(
            api.get_opt(&pod_name(app)).await.ok().flatten().is_none(),
            "{app}'s pod was evicted"
        );
    }
    assert!(
        api.get_opt(&pod_name("scratch"))
            .await
            .ok()
            .flatten()
            .is_some(),
        "the bare pod was left in place"
    );

    let st = plugin(&["status", &policy]).await;
    assert_eq!(st.code, 0);
    assert!(st.stdout.contains("Complete"), "{}", st.stdout);
    assert!(st.stdout.contains("1 host-managed"), "{}", st.stdout);
    let nodes = plugin(&["nodes", &policy, "-o", "json"]).await;
    assert_eq!(nodes.code, 0);
    let rows = nodes.json();
    for n in &tt {
        let row = rows
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["name"] == n.as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(row["state"], "Done", "{row}");
        assert_eq!(row["currentVersion"], "2.8.0");
        assert_eq!(row["targetVersion"], "2.8.0");
        assert_eq!(row["reason"], "Upgraded");
    }
    let table = plugin(&["nodes", &policy]).await;
    assert!(table.stdout.starts_with("NODE"), "{}", table.stdout);
    assert!(table.stdout.contains("Done (host)"), "{}", table.stdout);
    let all = plugin(&["-o", "yaml"]).await;
    assert_eq!(all.code, 0);
    let parsed: serde_yaml::Value = serde_yaml::from_str(&all.stdout).expect("status yaml");
    assert!(parsed.as_sequence().is_some_and(|s| !s.is_empty()));

    env.teardown().await;
}

/// A PDB that `plan` names as a blocker does block the rollout: the node fails
/// its drain, `watch` exits non-zero naming it; `retry` is refused on a node that
/// is not Failed and accepted on the Failed one, after which the rollout ends.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn plan_blocker_fails_the_node_and_retry_recovers_it() {
    let drain = "upgradePolicy: {drain: {timeoutSeconds: 3}}";
    let (env, ns, both, policy, _running) = fleet("plugin-block", &["a", "b"], drain).await;
    let (a, b) = (both[0].clone(), both[1].clone());
    deployment(&env, &ns, "guarded", &a, false).await;
    let pdb = guard(&env, &ns, 1).await;

    let plan = plugin(&["plan", &policy, "--version", "2.8.0", "-o", "json"])
        .await
        .json();
    assert_eq!(names(&plan["nodes"]), [a.clone(), b.clone()]);
    let blockers = strings(&plan["nodes"][0]["blockers"]);
    assert!(
        blockers.len() == 1 && blockers[0].contains(&pdb),
        "plan names the PDB on {a}: {blockers:?}"
    );
    assert!(strings(&plan["nodes"][1]["blockers"]).is_empty());

    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let watched = plugin(&["watch", &policy, "--interval", "0.5", "--timeout", "90"]).await;
    assert_eq!(watched.code, 2, "watch exits 2 on a Failed node");
    assert!(
        watched.stderr.contains(&a)
            && watched.stderr.contains("DrainTimeout")
            && watched.stderr.contains(&pdb),
        "the failure names the node and the PDB the plan predicted: {}",
        watched.stderr
    );
    wait_node_at(&env, &policy, &a, NodeState::Failed, None, T).await;

    // retry: refused for the waiting node, unknown nodes and unknown policies.
    let refused = plugin(&["retry", &policy, &b]).await;
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains("not Failed"), "{}", refused.stderr);
    let ghost = plugin(&["retry", &policy, "no-such-node-xyz"]).await;
    assert!(
        ghost.stderr.contains("node \"no-such-node-xyz\" not found"),
        "{}",
        ghost.stderr
    );
    let nobody = plugin(&["retry", "no-such-policy-xyz", &a]).await;
    assert!(
        nobody
            .stderr
            .contains("policy \"no-such-policy-xyz\" not found"),
        "{}",
        nobody.stderr
    );
    let b_ann = env
        .get_node(&b)
        .await
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(!b_ann.contains_key("driver.tenstorrent.com/retry"));

    // Remove the cause, retry the Failed node: the rollout completes.
    env.delete_pdb(&ns, "guard").await;
    let ok = plugin(&["retry", &policy, &a, "-o", "json"]).await;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let token = ok.json()["token"].as_str().unwrap_or_default().to_string();
    let ann = env
        .get_node(&a)
        .await
        .metadata
        .annotations
        .unwrap_or_default();
    assert_eq!(ann.get("driver.tenstorrent.com/retry"), Some(&token));
    let watched = plugin(&["watch", &policy, "--interval", "0.5", "--timeout", "90"]).await;
    assert_eq!(watched.code, 0, "{}", watched.stderr);
    wait_nodes(&env, &policy, &both, NodeState::Done, Some("2.8.0"), T).await;

    env.teardown().await;
}

/// pause/resume flip spec.paused; a missing policy or node is named in the error.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pause_resume_and_clear_errors() {
    let env = TestEnv::new("plugin-pause").await;
    let _guard = CleanupOnPanic { id: env.id.clone() };
    let node = env.tt_node_name("n", &[]).await;
    let policy = env.name("fleet");
    create_policy(&env, &policy, &fleet_spec(&env, "2.7.0", "")).await;

    let r = plugin(&["pause", &policy]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(get_policy(&env, &policy).await.spec.paused);
    assert!(r.stdout.contains("paused"));
    let again = plugin(&["pause", &policy, "-o", "json"]).await;
    assert_eq!(again.json()["changed"], false);
    let r = plugin(&["resume", &policy]).await;
    assert_eq!(r.code, 0);
    assert!(!get_policy(&env, &policy).await.spec.paused);

    // Color: never off a terminal by default, on request, and never with NO_COLOR.
    let plain = plugin(&["status", &policy]).await;
    assert!(plain.code == 0 && !plain.stdout.contains('\u{1b}'));
    let forced = plugin(&["status", &policy, "--color", "always"]).await;
    assert!(forced.stdout.contains("\u{1b}["), "{}", forced.stdout);
    let no_color = plugin_env(
        &["status", &policy, "--color", "always"],
        &[("NO_COLOR", "1")],
    )
    .await;
    assert!(!no_color.stdout.contains('\u{1b}'), "{}", no_color.stdout);

    let missing = "no-such-policy-xyz";
    for args in [
        vec!["status", missing],
        vec!["nodes", missing],
        vec!["watch", missing, "--timeout", "5"],
        vec!["plan", missing],
        vec!["pause", missing],
        vec!["resume", missing],
        vec!["retry", missing, &node],
        vec!["logs", missing],
    ] {
        let r = plugin(&args).await;
        assert_eq!(r.code, 1, "{args:?}");
        assert!(
            r.stderr
                .contains(&format!("policy \"{missing}\" not found")),
            "{args:?}: {}",
            r.stderr
        );
        assert!(r.stdout.is_empty(), "{args:?} printed {}", r.stdout);
    }
    // No controller runs here, so the node is in no status.
    let r = plugin(&["retry", &policy, &node]).await;
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("not managed by policy"), "{}", r.stderr);
    let r = plugin(&["plan", &policy, "--version", "latest"]).await;
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("not a tt-kmd version"), "{}", r.stderr);

    env.teardown().await;
}

/// `logs` finds the installer pod of a node (container "installer") and names
/// what it cannot find.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn logs_of_installer_pods() {
    let (env, ns, nodes, policy, _running) = fleet("plugin-logs", &["n"], "").await;
    let n = nodes[0].clone();
    let pod = installer_pod(&env, &ns, &n, &policy)
        .await
        .expect("installer pod on the node");

    // kwok's simulated kubelet may or may not serve logs; either way the plugin
    // asked the API for this pod's installer log.
    let r = plugin(&["logs", &policy, &n, "--namespace", &ns, "--tail", "20"]).await;
    if r.code != 0 {
        assert!(
            r.stderr.contains(&pod)
                && r.stderr.contains("could not read installer logs")
                && r.stderr.contains("\"installer\""),
            "{}",
            r.stderr
        );
    }
    let r = plugin(&["logs", &policy, "no-such-node-xyz", "-n", &ns]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("node \"no-such-node-xyz\" not found"),
        "{}",
        r.stderr
    );
    let r = plugin(&["logs", &policy]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .contains("has no installer pods in namespace \"tt-k8s-driver-manager-system\""),
        "{}",
        r.stderr
    );

    env.teardown().await;
}

/// `restart <cr>` deletes the policy's installer pods and the DaemonSet makes
/// new ones; the node stays Done at its version (a new pod never swaps a loaded
/// module on its own). The namespace comes from TT_OPERATOR_NAMESPACE.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn restart_replaces_installer_pods() {
    let (env, ns, nodes, policy, _running) = fleet("plugin-restart", &["n"], "").await;
    let n = nodes[0].clone();
    let before = installer_pod(&env, &ns, &n, &policy)
        .await
        .expect("installer pod on the node");

    let r = plugin_env(
        &["restart", &policy],
        &[("TT_OPERATOR_NAMESPACE", ns.as_str())],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains(&before), "{}", r.stdout);
    wait_for("a new installer pod", T, || async {
        match installer_pod(&env, &ns, &n, &policy).await {
            Some(p) if p != before => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_node_at(&env, &policy, &n, NodeState::Done, Some("2.7.0"), T).await;
    let r = plugin(&["restart", &policy, "no-such-node-xyz", "-n", &ns]).await;
    assert_eq!(r.code, 1);

    env.teardown().await;
}
