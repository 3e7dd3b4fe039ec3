//! `spec.moduleParameters` against the real control plane: a change on a
//! Done fleet is a drained cycle per node within maxUnavailable (the real
//! controller, the simulated agent), ending with every node's
//! `kmd-parameters` annotation at the desired set; a parameter tt-kmd takes
//! at run time (idle_power_down_grace_ms) cordons no node; bad values and
//! unknown names are refused by the API server.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Patch, PatchParams, ValidationDirective};
use serde_json::json;
use ttdrv_api::module_params::{self, Values};
use ttdrv_api::{NodeState, TenstorrentDriverPolicy, labels};
use ttdrv_testkit::policy::{create_raw_policy, delete_policies, wait_nodes};
use ttdrv_testkit::{TestEnv, ensure_crd, wait_for};

const T: Duration = Duration::from_secs(120);

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_parameter_change_on_a_done_fleet_is_a_drained_cycle_within_max_unavailable() {
    let (env, _ns, nodes, policy, _running) =
        installed_fleet("params", 4, "upgradePolicy: {maxUnavailable: 2}", T).await;
    let watcher = CordonWatcher::start(&env);
    let safety = SafetyWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_policy(
        &env,
        &policy,
        json!({ "moduleParameters": { "maxDevices": 4, "powerPolicy": false } }),
    )
    .await;
    let wanted: Values = module_params::parse("max_devices=4 power_policy=N").expect("values");
    let all_nodes = nodes.clone();
    wait_for(
        "every node reloaded with the parameters and Done",
        T,
        || {
            let env = &env;
            let nodes = &all_nodes;
            let policy = &policy;
            let wanted = &wanted;
            async move {
                let st = status(env, policy).await;
                for n in nodes {
                    let node = env.get_node(n).await;
                    let reported = ttdrv_core::node::loaded_parameters(&node);
                    let off = module_params::mismatches(wanted, reported.as_ref());
                    if !off.is_empty() {
                        return Err(format!("{n}: {}", module_params::describe(&off)));
                    }
                    let entry = st.nodes.iter().find(|e| &e.name == n);
                    let state = entry.map(|e| e.state);
                    if state != Some(NodeState::Done) {
                        return Err(format!("{n}: {state:?}"));
                    }
                    // The status shows what is in effect too.
                    let shown = entry
                        .and_then(|e| e.module_parameters.as_deref())
                        .and_then(|s| module_params::parse(s).ok());
                    if !module_params::mismatches(wanted, shown.as_ref()).is_empty() {
                        return Err(format!("{n}: status.nodes[].moduleParameters {shown:?}"));
                    }
                }
                Ok(())
            }
        },
    )
    .await;
    // Each node went through cordon and drain for it, never more than
    // maxUnavailable at once, and ended uncordoned at the same version.
    assert_eq!(
        watcher.ever(),
        nodes,
        "every node was cordoned for its reload"
    );
    assert!(
        (1..=2).contains(&watcher.max()),
        "at most maxUnavailable (2) cordoned at once, saw {}",
        watcher.max()
    );
    assert_done_uncordoned(&env, &nodes, "2.7.0").await;
    // Every reload happened under the controller's go-ahead for its cycle.
    safety.assert_safe(2, Some(2), "after the parameter change");
    let reloads = safety.seen().swaps;
    assert_eq!(
        reloads.len(),
        nodes.len(),
        "one reload per node: {reloads:?}"
    );
    assert!(
        reloads.iter().all(|r| r.contains("reloaded")
            && r.ends_with("max_devices=4 power_policy=N reset_limit=10")),
        "{reloads:?}"
    );
    for n in &nodes {
        let node = env.get_node(n).await;
        let a = ttdrv_core::node::annotation(&node, labels::KMD_PARAMETERS).unwrap_or_default();
        assert!(
            a.contains("max_devices=4") && a.contains("power_policy=N"),
            "{n}: {a}"
        );
    }
    let st = status(&env, &policy).await;
    assert_eq!(st.summary.done, 4);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_parameter_taken_at_run_time_replaces_pods_in_place_and_cordons_nothing() {
    let (env, ns, nodes, _agent) = sim_fleet("params-runtime", 3).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(
        &env,
        &policy,
        &fleet_spec(&env, "2.10.0", "upgradePolicy: {maxUnavailable: 1}"),
    )
    .await;
    wait_nodes(&env, &policy, &nodes, NodeState::Done, Some("2.10.0"), T).await;
    let watcher = CordonWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_policy(
        &env,
        &policy,
        json!({ "moduleParameters": { "idlePowerDownGraceMs": 50 } }),
    )
    .await;
    let wanted: Values = module_params::parse("idle_power_down_grace_ms=50").expect("values");
    let all_nodes = nodes.clone();
    wait_for(
        "every node with the parameter in effect and Done",
        T,
        || {
            let env = &env;
            let nodes = &all_nodes;
            let policy = &policy;
            let wanted = &wanted;
            async move {
                let st = status(env, policy).await;
                for n in nodes {
                    let node = env.get_node(n).await;
                    let reported = ttdrv_core::node::loaded_parameters(&node);
                    let off = module_params::mismatches(wanted, reported.as_ref());
                    if !off.is_empty() {
                        return Err(format!("{n}: {}", module_params::describe(&off)));
                    }
                    let state = st.nodes.iter().find(|e| &e.name == n).map(|e| e.state);
                    if state != Some(NodeState::Done) {
                        return Err(format!("{n}: {state:?}"));
                    }
                }
                Ok(())
            }
        },
    )
    .await;
    assert!(
        watcher.ever().is_empty(),
        "a run-time parameter cordoned {:?}",
        watcher.ever()
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn bad_module_parameters_are_refused_by_the_api_server() {
    let env = TestEnv::new("params-refused").await;
    ensure_crd(&env.client).await;
    let spec = |mp: serde_json::Value| json!({ "version": "2.8.0", "nodeAffinity": {}, "moduleParameters": mp });
    let rows = [
        (
            "maxDevices -1",
            json!({ "maxDevices": -1 }),
            "spec.moduleParameters.maxDevices",
        ),
        (
            "maxDevices 2^32",
            json!({ "maxDevices": 4_294_967_296_i64 }),
            "spec.moduleParameters.maxDevices",
        ),
        (
            "maxDevices 0 (the driver would serve no card)",
            json!({ "maxDevices": 0 }),
            "spec.moduleParameters.maxDevices",
        ),
        (
            "maxDevices 2^20 + 1 (more than the kernel's minors)",
            json!({ "maxDevices": 1_048_577 }),
            "spec.moduleParameters.maxDevices",
        ),
        (
            "dmaAddressBits 128 (DMA_BIT_MASK stops at 64)",
            json!({ "dmaAddressBits": 128 }),
            "spec.moduleParameters.dmaAddressBits",
        ),
        (
            "autoResetTimeout 256 (a byte)",
            json!({ "autoResetTimeout": 256 }),
            "spec.moduleParameters.autoResetTimeout",
        ),
        (
            "powerPolicy as a string",
            json!({ "powerPolicy": "yes" }),
            "spec.moduleParameters.powerPolicy",
        ),
        (
            "idlePowerDownGraceMs as a string",
            json!({ "idlePowerDownGraceMs": "5000" }),
            "spec.moduleParameters.idlePowerDownGraceMs",
        ),
    ];
    let mut failures = vec![];
    for (i, (what, mp, field)) in rows.iter().enumerate() {
        match create_raw_policy(&env, &env.name(&format!("r{i}")), &spec(mp.clone())).await {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains(field) => {
                println!("refused {what}: {}", s.message)
            }
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    // Every parameter at its bound is accepted.
    let edge = env.name("edge");
    create_raw_policy(
        &env,
        &edge,
        &spec(json!({
            "maxDevices": 1_048_576, "dmaAddressBits": 64, "resetLimit": 4_294_967_295_i64,
            "autoResetTimeout": 255, "powerPolicy": true, "idlePowerDownGraceMs": 0
        })),
    )
    .await
    .expect("every parameter at its bound is accepted");
    // An unknown name: refused under strict field validation (kubectl
    // apply's default), dropped otherwise.
    let api: kube::Api<TenstorrentDriverPolicy> = kube::Api::all(env.client.clone());
    let typo = json!({ "spec": { "moduleParameters": { "maxDevice": 4 } } });
    let strict = PatchParams::default().validation(ValidationDirective::Strict);
    match api.patch(&edge, &strict, &Patch::Merge(&typo)).await {
        Ok(_) => failures.push("unknown maxDevice under strict validation: accepted".into()),
        Err(kube::Error::Api(s))
            if s.message.contains("unknown field") && s.message.contains("maxDevice") =>
        {
            println!("refused unknown name: {}", s.message)
        }
        Err(e) => failures.push(format!("unknown maxDevice: {e}")),
    }
    delete_policies(&env).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
