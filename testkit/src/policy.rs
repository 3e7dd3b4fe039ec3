//! TenstorrentDriverPolicy helpers for cluster tests: every policy carries the
//! test's label, so only that test's controller (`--policy-selector`) acts on it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use ttdrv_api::{NodeState, NodeStatus, TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus};

use crate::{TestEnv, wait_for};

/// Creates a policy from its spec (YAML), labelled for this test.
pub async fn create_policy(env: &TestEnv, name: &str, spec_yaml: &str) -> TenstorrentDriverPolicy {
    crate::ensure_crd(&env.client).await;
    let spec: ttdrv_api::TenstorrentDriverPolicySpec = serde_yaml::from_str(spec_yaml)
        .unwrap_or_else(|e| panic!("test spec of {name} does not parse: {e}"));
    let mut p = TenstorrentDriverPolicy::new(name, spec);
    p.metadata.labels = Some(env.labels());
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    api.create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| panic!("creating policy {name}: {e}"))
}

/// The spec (YAML) of a policy installing `version` on exactly this test's
/// nodes, followed by `extra` (more spec lines, e.g. `upgradePolicy: {...}`).
pub fn fleet_spec(env: &TestEnv, version: &str, extra: &str) -> String {
    format!(
        "version: \"{version}\"\nnodeAffinity: {}\n{extra}",
        env.nodes_selector()
    )
}

/// Creates policy `fleet` installing 2.7.0 on this test's nodes, with `extra`
/// spec lines, and waits up to `timeout` until all `nodes` are Done at 2.7.0.
pub async fn installed(env: &TestEnv, nodes: &[String], extra: &str, timeout: Duration) -> String {
    let policy = env.name("fleet");
    create_policy(env, &policy, &fleet_spec(env, "2.7.0", extra)).await;
    wait_nodes(env, &policy, nodes, NodeState::Done, Some("2.7.0"), timeout).await;
    policy
}

/// The policies as untyped objects, so that a test can send what the typed
/// API would refuse to build.
pub fn dynamic_api(env: &TestEnv) -> Api<kube::api::DynamicObject> {
    let gvk = kube::core::GroupVersionKind::gvk(
        "driver.tenstorrent.com",
        "v1alpha1",
        "TenstorrentDriverPolicy",
    );
    Api::all_with(
        env.client.clone(),
        &kube::discovery::ApiResource::from_gvk_with_plural(&gvk, "tenstorrentdriverpolicies"),
    )
}

/// Creates a policy `name` (labelled for this test) with `spec` as written (raw
/// JSON, so malformed values reach the API server); returns its answer.
pub async fn create_raw_policy(
    env: &TestEnv,
    name: &str,
    spec: &serde_json::Value,
) -> Result<kube::api::DynamicObject, kube::Error> {
    let obj: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": { "name": name, "labels": env.labels() },
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("policy object {name}: {e}"));
    dynamic_api(env).create(&PostParams::default(), &obj).await
}

/// Merge-patches the policy's spec.
pub async fn patch_policy(env: &TestEnv, name: &str, spec_patch: serde_json::Value) {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let patch = serde_json::json!({ "spec": spec_patch });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patching policy {name}: {e}"));
}

pub async fn get_policy(env: &TestEnv, name: &str) -> TenstorrentDriverPolicy {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    api.get(name)
        .await
        .unwrap_or_else(|e| panic!("reading policy {name}: {e}"))
}

/// The policy's status (the default when it has none yet).
pub async fn status(env: &TestEnv, name: &str) -> TenstorrentDriverPolicyStatus {
    get_policy(env, name).await.status.unwrap_or_default()
}

/// The node's entry in the policy's status.
pub async fn node_entry(env: &TestEnv, policy: &str, node: &str) -> Option<NodeStatus> {
    status(env, policy)
        .await
        .nodes
        .into_iter()
        .find(|n| n.name == node)
}

/// Polls the policy's status until `check` accepts it (it returns what was
/// wanted, or what it saw instead); `what` names the wait in its timeout.
pub async fn wait_status<T>(
    env: &TestEnv,
    policy: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(TenstorrentDriverPolicyStatus) -> Result<T, String>,
) -> T {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    wait_for(what, timeout, || async {
        let p = api.get(policy).await.map_err(|e| e.to_string())?;
        check(p.status.unwrap_or_default())
    })
    .await
}

/// Waits until the policy's condition `type_` satisfies `ok` (described by
/// `what` in the timeout's message); returns it.
pub async fn wait_condition(
    env: &TestEnv,
    policy: &str,
    type_: &str,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&Condition) -> bool,
) -> Condition {
    let what = format!("{policy}'s condition {type_} {what}");
    wait_status(env, policy, &what, timeout, |st| {
        match st.conditions.into_iter().find(|c| c.type_ == type_) {
            Some(c) if ok(&c) => Ok(c),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Deletes every policy of this test (it lives in [`crate::cluster`], whose
/// [`TestEnv::teardown`] calls it).
pub use crate::cluster::delete_policies;

/// Waits until each listed node is in `state` (at `version`, when given) in the
/// policy's status.
pub async fn wait_nodes(
    env: &TestEnv,
    policy: &str,
    nodes: &[String],
    state: NodeState,
    version: Option<&str>,
    timeout: Duration,
) {
    let what = format!("nodes {nodes:?} {state:?} at {version:?} in {policy}'s status");
    wait_status(env, policy, &what, timeout, |st| {
        let seen: BTreeMap<String, (NodeState, Option<String>)> = st
            .nodes
            .iter()
            .map(|n| (n.name.clone(), (n.state, n.current_version.clone())))
            .collect();
        let ok = nodes.iter().all(|n| {
            seen.get(n).is_some_and(|(s, v)| {
                *s == state && version.is_none_or(|want| v.as_deref() == Some(want))
            })
        });
        if ok { Ok(()) } else { Err(format!("{seen:?}")) }
    })
    .await
}

/// Waits until `node` is in `state` (at `version`, when given) in the policy's
/// status; returns its entry.
pub async fn wait_node_at(
    env: &TestEnv,
    policy: &str,
    node: &str,
    state: NodeState,
    version: Option<&str>,
    timeout: Duration,
) -> NodeStatus {
    let what = format!("node {node} {state:?} at {version:?} in {policy}");
    let wanted = |e: &NodeStatus| {
        e.state == state && version.is_none_or(|v| e.current_version.as_deref() == Some(v))
    };
    wait_status(env, policy, &what, timeout, |st| {
        let entry = st.nodes.into_iter().find(|n| n.name == node);
        match entry {
            Some(e) if wanted(&e) => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// The firmware policies as untyped objects (so a test can send what the
/// typed API would refuse to build).
pub fn firmware_api(env: &TestEnv) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::erase::<ttdrv_api::firmware::TenstorrentFirmwarePolicy>(&());
    Api::all_with(env.client.clone(), &ar)
}

/// Creates firmware policy `name` (labelled for this test) with `spec` as
/// written; returns the API server's answer.
pub async fn create_raw_firmware_policy(
    env: &TestEnv,
    name: &str,
    spec: serde_json::Value,
) -> Result<kube::api::DynamicObject, kube::Error> {
    let obj: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": { "name": name, "labels": env.labels() },
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("firmware policy object {name}: {e}"));
    firmware_api(env).create(&PostParams::default(), &obj).await
}

/// Creates firmware policy `name` at 19.8.0 over this test's nodes, with
/// `extra` spec fields on top.
pub async fn create_firmware_policy(env: &TestEnv, name: &str, extra: serde_json::Value) {
    let mut spec = serde_json::json!({
        "version": "19.8.0",
        "nodeAffinity": { "matchLabels": env.labels() },
    });
    if let (Some(s), serde_json::Value::Object(e)) = (spec.as_object_mut(), extra) {
        s.extend(e);
    }
    if let Err(e) = create_raw_firmware_policy(env, name, spec).await {
        panic!("creating firmware policy {name}: {e}");
    }
}

/// The firmware policy's status (empty while it has none).
pub async fn firmware_status(
    env: &TestEnv,
    name: &str,
) -> ttdrv_api::firmware::TenstorrentFirmwarePolicyStatus {
    let api: Api<ttdrv_api::firmware::TenstorrentFirmwarePolicy> = Api::all(env.client.clone());
    match api.get(name).await {
        Ok(p) => p.status.unwrap_or_default(),
        Err(e) => panic!("reading firmware policy {name}: {e}"),
    }
}
