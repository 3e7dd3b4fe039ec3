//! The Tenstorrent stack's device holders on the real kubelet node and the
//! emulated card (issue 50, item 4): privileged DaemonSets that hold
//! /dev/tenstorrent/0 for their pod's life, as the telemetry collector and
//! the fabric-manager agent do (tests/fixtures/vm_node/stack.yaml). No drain
//! evicts them; the controller's deploy gates stand them down before the
//! swap, and the real agent's holder walk (fds, mappings, tt-kmd's pids list)
//! is what proves them gone. One without a gate (fabric manager 0.2.28) is
//! named before the cordon and in the refusal, and the node recovers once it
//! is removed.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::events::v1::Event;

use super::*;

const NS: &str = "tt-stack";
const TELEMETRY: &str = "app.kubernetes.io/name=tt-telemetry";
const FABRIC: &str = "app.kubernetes.io/name=tt-fabric-manager";
const LEGACY: &str = "fabric-manager-legacy";
const TELEMETRY_GATE: &str = "tenstorrent.com/deploy.tt-telemetry";
const FABRIC_GATE: &str = "tenstorrent.com/deploy.tt-fabric-manager";

/// The loaded module's reference count, from the guest's last module report.
fn refcnt(vm: &Vm) -> Option<u32> {
    let m = vm.con().module_now()?;
    m.split_whitespace()
        .find_map(|w| w.strip_prefix("refcnt="))
        .and_then(|n| n.parse().ok())
}

/// The one Running pod of `sel` on the VM node.
async fn running(vm: &Vm, sel: &str) -> Result<String, String> {
    let p = vm
        .pods(
            NS,
            sel,
            &format!("status.phase=Running,spec.nodeName={}", vm.node),
        )
        .await?;
    match p.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!("{sel} Running: {p:?}")),
    }
}

/// Both gated holders Running, and the module's count at `refs`.
async fn wait_holding(vm: &Vm, what: &str, version: &str, refs: u32) -> (String, String) {
    let pods = wait_for_result(what, vm.t, || async {
        Ok((running(vm, TELEMETRY).await?, running(vm, FABRIC).await?))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    vm.wait_module(
        &format!("{what}: module {version} at refcnt {refs}"),
        &format!("module={version} refcnt={refs} "),
    )
    .await;
    pods
}

/// The node's entry in the policy status: state, reason, message.
async fn node_status(vm: &Vm) -> Result<(String, String, String), String> {
    let api: Api<TenstorrentDriverPolicy> = Api::all(vm.c.clone());
    let p = api.get_opt(POLICY).await.map_err(|e| e.to_string())?;
    let st = p.and_then(|p| p.status).unwrap_or_default();
    st.nodes
        .iter()
        .find(|n| n.name == vm.node)
        .map(|n| {
            (
                n.state.as_str().to_string(),
                n.reason.clone().unwrap_or_default(),
                n.message.clone().unwrap_or_default(),
            )
        })
        .ok_or_else(|| "the node is not in the policy status".to_string())
}

/// The notes of the Events about the policy with `reason`.
async fn events(vm: &Vm, reason: &str) -> Vec<String> {
    let api: Api<Event> = Api::all(vm.c.clone());
    let l = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    l.into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(POLICY))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The stack's holders through two cycles from `cur` (loaded; `other` in the
/// agent's cache): gated, the upgrade passes; ungated, the node fails
/// naming the DaemonSet, and passes once it is gone. Ends as it began: `cur`
/// loaded, the stack removed.
pub(super) async fn privileged_holders(
    t: &Run,
    ph: &mut Phases,
    watch: &Watcher,
    cur: &str,
    other: &str,
) {
    let vm = &t.vm;
    let vars = [
        ("NODE", vm.node.as_str()),
        ("AGENT_IMAGE", t.agent_ref.as_str()),
    ];
    let base = wait_for_result("the module's reference count", vm.t, || async {
        refcnt(vm).ok_or_else(|| format!("module report {:?}", vm.con().module_now()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    apply_fixture(&vm.c, &fixture("stack.yaml"), &vars).await;
    let before = wait_holding(
        vm,
        "the telemetry collector (an open fd) and the fabric-manager agent (a mapping) holding the device",
        cur,
        base + 2,
    )
    .await;
    ph.phase(&format!(
        "the stack on the node: {} and {} hold /dev/tenstorrent/0, privileged, no hostPath of it (refcnt {base} -> {})",
        before.0,
        before.1,
        base + 2
    ));

    // --- gated: stood down before the swap, back after it
    let t0 = now();
    vm.patch_policy(serde_json::json!({"version": other})).await;
    vm.wait_done(&format!("the node Done at {other} under the stack"), other)
        .await;
    let states = states_since(&watch.timeline(), t0);
    assert!(
        !states.iter().any(|s| s.starts_with("Failed")),
        "the gated stack failed the cycle: {states:?}"
    );
    let after = wait_holding(
        vm,
        "the stack back on the node, holding the new module's device",
        other,
        base + 2,
    )
    .await;
    assert!(
        after.0 != before.0 && after.1 != before.1,
        "the gated pods were not stood down: {before:?} then {after:?}"
    );
    let n = vm.node_obj().await.unwrap_or_else(|e| panic!("node: {e}"));
    for g in [TELEMETRY_GATE, FABRIC_GATE] {
        let v = n.metadata.labels.as_ref().and_then(|l| l.get(g));
        assert!(
            v.map(String::as_str) != Some("false"),
            "gate {g} left closed after success: {v:?}"
        );
    }
    ph.phase(&format!(
        "upgrade {cur} -> {other} under the gated stack: both gates closed, {} and {} gone before the swap (the real agent found no holder), back after it: {} and {}",
        before.0, before.1, after.0, after.1
    ));

    // --- ungated: named before the cordon and in the refusal; the node
    // stays cordoned with the module it had
    apply_fixture(&vm.c, &fixture("stack-ungated.yaml"), &vars).await;
    let legacy = wait_for_result("the ungated fabric-manager agent Running", vm.t, || async {
        running(vm, &format!("app.kubernetes.io/name={LEGACY}")).await
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    vm.wait_module(
        "the ungated agent holding the device too",
        &format!("module={other} refcnt={} ", base + 3),
    )
    .await;
    vm.patch_policy(serde_json::json!({"version": cur})).await;
    let ds = format!("DaemonSet {NS}/{LEGACY}");
    let failed = wait_for_result(
        "the node Failed (DeviceBusy) naming the ungated DaemonSet",
        vm.t,
        || async {
            let (s, r, m) = node_status(vm).await?;
            if s == "Failed" {
                Ok((r, m))
            } else {
                Err(format!("{s} ({r}): {m}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(failed.0, "DeviceBusy", "{failed:?}");
    assert!(
        failed.1.contains(&format!("pod {NS}/{legacy} is of {ds}"))
            && failed.1.contains("has no deploy gate"),
        "the refusal does not name the DaemonSet and the gate it lacks: {}",
        failed.1
    );
    let warned = events(vm, "UngatedDeviceHolder").await;
    assert!(
        warned
            .iter()
            .any(|n| n.contains(&ds) && n.contains(&vm.node)),
        "no UngatedDeviceHolder Event named {ds} before the cordon: {warned:?}"
    );
    assert!(
        vm.cordoned().await.unwrap_or(false),
        "a Failed node stays cordoned"
    );
    assert!(
        vm.con()
            .module_now()
            .is_some_and(|m| m.starts_with(&format!("module={other} "))),
        "the refused swap changed the module: {:?}",
        vm.con().module_now()
    );
    ph.phase(&format!(
        "an ungated privileged holder ({ds}): named in an UngatedDeviceHolder Event before the cordon; the real agent refused the swap (DeviceBusy), the node Failed naming the DaemonSet and what to add; {other} stays loaded"
    ));

    // --- the DaemonSet removed, the node retried: Done, the gated stack back
    let api: Api<DaemonSet> = Api::namespaced(vm.c.clone(), NS);
    api.delete(LEGACY, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {ds}: {e}"));
    vm.wait_gone("the ungated agent's pod gone", NS, &legacy)
        .await;
    let nodes: Api<Node> = Api::all(vm.c.clone());
    let token = format!("stack-{}", now() as u64);
    nodes
        .patch(
            &vm.node,
            &PatchParams::default(),
            &Patch::Merge(&ttdrv_core::node::retry_patch(&token)),
        )
        .await
        .unwrap_or_else(|e| panic!("retrying {}: {e}", vm.node));
    vm.wait_done(&format!("the node Done at {cur} after the retry"), cur)
        .await;
    wait_holding(vm, "the gated stack back after the retry", cur, base + 2).await;
    ph.phase(&format!(
        "{ds} removed and the node retried: Done at {cur}, the gated stack back on the new device"
    ));

    // --- the stack removed: the module's count back where it was
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(vm.c.clone());
    ns.delete(NS, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting namespace {NS}: {e}"));
    vm.wait_module(
        "the stack gone, the module's count back",
        &format!("module={cur} refcnt={base} "),
    )
    .await;
}
