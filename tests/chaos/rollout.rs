//! Driving the policy and waiting for its rollout to settle, with API calls
//! that retry through API-server restarts.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy};
use ttdrv_testkit::TestEnv;

use crate::invariants::record_state;

/// Retries a call through API-server restarts.
pub(crate) async fn retrying<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if start.elapsed() < Duration::from_secs(120) => {
                eprintln!("  ({what}: {e}; retrying)");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

pub(crate) async fn set_spec(env: &TestEnv, policy: &str, spec: serde_json::Value) {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let patch = serde_json::json!({ "spec": spec });
    let pp = kube::api::PatchParams::default();
    let mp = kube::api::Patch::Merge(&patch);
    retrying(&format!("patching policy {policy}"), || {
        api.patch(policy, &pp, &mp)
    })
    .await;
}

/// Ok when every present node is settled (Done at `version`, or Failed with a
/// reason) in the policy's up-to-date status; Err describes what is not.
async fn settled(env: &TestEnv, policy: &str, version: &str) -> Result<(), String> {
    let papi: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let napi: Api<Node> = Api::all(env.client.clone());
    let p = papi.get(policy).await.map_err(|e| e.to_string())?;
    let nodes = napi
        .list(&ListParams::default().labels(&env.selector()))
        .await
        .map_err(|e| e.to_string())?
        .items;
    let st = p.status.clone().unwrap_or_default();
    if st.observed_generation != p.metadata.generation {
        return Err(format!(
            "status is of generation {:?}, spec is {:?}",
            st.observed_generation, p.metadata.generation
        ));
    }
    let names: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let in_status: BTreeSet<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
    if names != in_status {
        return Err(format!("status lists {in_status:?}, nodes are {names:?}"));
    }
    let mut pending = vec![];
    for n in &st.nodes {
        let ok = match n.state {
            NodeState::Done => n.current_version.as_deref() == Some(version),
            NodeState::Failed => n.reason.is_some(),
            _ => false,
        };
        if !ok {
            pending.push(format!("{}={:?}@{:?}", n.name, n.state, n.current_version));
        }
    }
    for n in &nodes {
        let s = record_state(n);
        if !matches!(s.as_deref(), Some("Done") | Some("Failed")) {
            pending.push(format!(
                "{} record {:?}",
                n.metadata.name.as_deref().unwrap_or(""),
                s
            ));
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(pending.join(", "))
    }
}

pub(crate) async fn wait_settled(
    env: &TestEnv,
    policy: &str,
    version: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < timeout {
        match settled(env, policy, version).await {
            Ok(()) => return Ok(start.elapsed()),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("not settled after {timeout:?}: {last}"))
}
