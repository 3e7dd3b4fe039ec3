//! TenstorrentDriverPolicy helpers for cluster tests: every policy carries the
//! test's label, so only that test's controller (`--policy-selector`) acts on it.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use ttdrv_api::{NodeState, TenstorrentDriverPolicy};

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

/// Deletes every policy of this test.
pub async fn delete_policies(env: &TestEnv) {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let _ = api
        .delete_collection(
            &Default::default(),
            &ListParams::default().labels(&env.selector()),
        )
        .await;
}

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
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    wait_for(
        &format!("nodes {nodes:?} {state:?} at {version:?} in {policy}'s status"),
        timeout,
        || async {
            let p = api.get(policy).await.map_err(|e| e.to_string())?;
            let st = p.status.unwrap_or_default();
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
        },
    )
    .await
}
