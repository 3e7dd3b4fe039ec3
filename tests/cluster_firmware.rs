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
use kube::api::{DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use ttdrv_api::NodeState;
use ttdrv_api::firmware::{FirmwareNodeState, labels as fw};
use ttdrv_core::firmware::FwRecord;
use ttdrv_testkit::policy::{installed, patch_policy, status};
use ttdrv_testkit::{TestEnv, ensure_crd, wait_for};

const T: Duration = Duration::from_secs(60);

fn firmware_api(env: &TestEnv) -> Api<DynamicObject> {
    let ar = kube::api::ApiResource::erase::<ttdrv_api::firmware::TenstorrentFirmwarePolicy>(&());
    Api::all_with(env.client.clone(), &ar)
}

async fn create(env: &TestEnv, name: &str, spec: Value) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": { "name": name, "labels": env.labels() },
        "spec": spec,
    }))
    .expect("object");
    firmware_api(env).create(&PostParams::default(), &obj).await
}

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
    let made = create(&env, &name, go)
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
    for (i, (what, spec, field)) in cases.into_iter().enumerate() {
        match create(&env, &env.name(&format!("bad{i}")), spec).await {
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
    wait_for("the firmware record left alone", T, || async {
        let n = env.get_node(&nodes[0]).await;
        match ttdrv_core::claim::firmware_record(&n) {
            Some(r) if r.state == FirmwareNodeState::Done => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.teardown().await;
}
