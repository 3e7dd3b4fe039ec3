//! The `promotion-wait` kind: two nodes move out of the policy under test
//! (the follower) into a canary policy created at the new version; the
//! follower's bump names it in `spec.promoteAfter` (with a soak in half the
//! trials). The acting controller is killed during the canary's rollout and
//! the moment the canary is Ready. Invariant: no node of the follower starts
//! its cycle (its record's `started`) before the canary was Ready at the
//! version for the promotion's soak, by the canary's status (its Ready
//! condition's and its nodes' `lastTransitionTime`, as the controller counts
//! it). Then the canary goes and its nodes come back to the follower.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::DeleteParams;
use rand::Rng;
use rand::rngs::StdRng;
use ttdrv_api::{TenstorrentDriverPolicy, labels};
use ttdrv_testkit::TestEnv;

use crate::controller::Controller;
use crate::fleet::test_nodes;
use crate::invariants::Invariants;
use crate::rollout::{retrying, set_spec};
use crate::rules::{Timeline, What};
use crate::{OUT_LABEL, OUT_VALUE};

/// A promotion trial's faults, drawn from its seed.
pub(crate) struct PromotionFaults {
    /// Which nodes go to the canary (an offset into the nodes in name order).
    pick: u64,
    /// `promoteAfter.soakSeconds`: 0, or 2–3.
    soak: i64,
    /// Kill during the canary's rollout, this long in (ms), down 0–1.5 s.
    kill_during: (u64, u64),
    /// Kill the moment the canary is Ready, down this long (ms).
    kill_ready: Option<u64>,
}

impl PromotionFaults {
    pub(crate) fn draw(rng: &mut StdRng) -> Self {
        Self {
            pick: rng.random(),
            soak: if rng.random_bool(0.5) {
                rng.random_range(2..=3)
            } else {
                0
            },
            kill_during: (rng.random_range(300..3_000), rng.random_range(0..1_500)),
            kill_ready: rng.random_bool(0.8).then(|| rng.random_range(0..1_500)),
        }
    }

    /// The follower's `spec.promoteAfter`.
    pub(crate) fn promote_after(&self, env: &TestEnv, index: usize) -> serde_json::Value {
        serde_json::json!({ "policy": canary_name(env, index), "soakSeconds": self.soak })
    }
}

fn canary_name(env: &TestEnv, index: usize) -> String {
    env.name(&format!("canary{index}"))
}

/// The canary's nodes, and how long the follower took to release them.
#[derive(Default)]
pub(crate) struct Canary {
    nodes: Vec<String>,
    released: String,
}

/// Before the bump: two nodes leave the follower (released), and the canary
/// policy is created on them at `target`.
pub(crate) async fn start(
    env: &TestEnv,
    policy: &str,
    index: usize,
    admin: &std::collections::BTreeSet<String>,
    target: &str,
    f: &PromotionFaults,
    inv: &Invariants,
) -> Canary {
    let mut names: Vec<String> = test_nodes(env)
        .await
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| !admin.contains(n))
        .collect();
    names.sort();
    let first = (f.pick % names.len() as u64) as usize;
    let canary: Vec<String> = (0..2)
        .map(|i| names[(first + i) % names.len()].clone())
        .collect();
    for n in &canary {
        env.label_node(n, OUT_LABEL, Some(OUT_VALUE)).await;
    }
    // Released by the follower before the canary may claim them.
    let t0 = Instant::now();
    let released = ttdrv_testkit::wait_for_result(
        "the canary's nodes released by the follower",
        Duration::from_secs(60),
        || async {
            let held: Vec<String> = test_nodes(env)
                .await
                .into_iter()
                .filter(|n| {
                    canary.contains(n.metadata.name.as_ref().unwrap_or(&String::new()))
                        && ttdrv_core::node::label(n, labels::CLAIM) == Some(policy)
                })
                .filter_map(|n| n.metadata.name)
                .collect();
            if held.is_empty() {
                Ok(())
            } else {
                Err(format!("{held:?}"))
            }
        },
    )
    .await;
    let released = match released {
        Ok(()) => format!("released by the follower in {}ms", t0.elapsed().as_millis()),
        Err(e) => {
            inv.violation(format!("the follower kept the canary's nodes: {e}"));
            "not released".into()
        }
    };
    let mut sel = env.labels();
    sel.insert(OUT_LABEL.to_string(), OUT_VALUE.to_string());
    let spec = serde_json::json!({
        "version": target,
        "nodeAffinity": { "matchLabels": sel },
        "upgradePolicy": { "maxUnavailable": 1 },
    });
    if let Err(e) =
        ttdrv_testkit::policy::create_raw_policy(env, &canary_name(env, index), &spec).await
    {
        panic!("creating the canary policy: {e}");
    }
    Canary {
        nodes: canary,
        released,
    }
}

/// When the canary was last Ready at `target` for its current generation
/// (Unix seconds, as the controller counts it), if it is.
async fn canary_ready(env: &TestEnv, name: &str, target: &str) -> Option<i64> {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let p = api.get(name).await.ok()?;
    let st = p.status.clone()?;
    if st.desired_version.as_deref() != Some(target)
        || st.observed_generation != p.metadata.generation
    {
        return None;
    }
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    let nodes = st
        .nodes
        .iter()
        .filter_map(|n| n.last_transition_time.as_ref().map(|t| t.0.as_second()))
        .max()
        .unwrap_or(0);
    Some(ready.last_transition_time.0.as_second().max(nodes))
}

/// The trial's faults while the canary rolls out and the follower waits,
/// the rule's check, then the canary deleted and its nodes given back.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn faults(
    env: &TestEnv,
    policy: &str,
    ctl: &Arc<tokio::sync::Mutex<Controller>>,
    inv: &Invariants,
    tl: &Timeline,
    index: usize,
    target: &str,
    c: &Canary,
    f: &PromotionFaults,
) -> Vec<String> {
    let canary = &c.nodes;
    let t0 = Instant::now();
    let name = canary_name(env, index);
    let mut log = vec![format!(
        "canary {name} on {canary:?} ({}), promoteAfter.soakSeconds {}",
        c.released, f.soak
    )];
    let kill = |why: String, down: u64| async move {
        let at = t0.elapsed().as_millis();
        let who = ctl.lock().await.kill_acting(env).await;
        tokio::time::sleep(Duration::from_millis(down)).await;
        ctl.lock().await.restore(env);
        match who {
            Some(w) => format!("SIGKILL {w} at {at}ms {why} (down {down}ms)"),
            None => format!("no controller to SIGKILL at {at}ms {why}"),
        }
    };
    let (at, down) = f.kill_during;
    tokio::time::sleep(Duration::from_millis(at)).await;
    log.push(kill("during the canary's rollout".into(), down).await);
    let ready =
        ttdrv_testkit::wait_for_result("the canary Ready", Duration::from_secs(90), || async {
            canary_ready(env, &name, target)
                .await
                .ok_or_else(|| "not Ready at the version".to_string())
        })
        .await;
    let ready = match ready {
        Ok(t) => {
            if let Some(down) = f.kill_ready {
                log.push(kill("as the canary was Ready".into(), down).await);
            }
            Some(t)
        }
        Err(e) => {
            inv.violation(format!("the canary {name} never became Ready: {e}"));
            None
        }
    };
    // The follower's own nodes done: every start it will make is seen.
    let papi: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let done =
        ttdrv_testkit::wait_for_result("the follower's nodes Done", crate::SETTLE, || async {
            let p = papi.get(policy).await.map_err(|e| e.to_string())?;
            let st = p.status.unwrap_or_default();
            let pending: Vec<String> = st
                .nodes
                .iter()
                .filter(|n| {
                    let settled = match n.state {
                        ttdrv_api::NodeState::Done => n.current_version.as_deref() == Some(target),
                        ttdrv_api::NodeState::Failed => true,
                        _ => false,
                    };
                    !canary.contains(&n.name) && !settled
                })
                .map(|n| format!("{}={:?}", n.name, n.state))
                .collect();
            if pending.is_empty() {
                Ok(())
            } else {
                Err(pending.join(", "))
            }
        })
        .await;
    if let Err(e) = done {
        inv.violation(format!("the follower did not finish after the canary: {e}"));
    }
    let mut checked = 0;
    for s in tl.events() {
        if let What::Start { target: t, started } = &s.what
            && t == target
            && !canary.contains(&s.node)
        {
            checked += 1;
            match ready {
                Some(r) if *started >= r + f.soak => {}
                _ => inv.violation(format!(
                    "promotion skipped: follower node {} started its cycle to {target} at {started}; the canary was Ready at {ready:?} (promoteAfter.soakSeconds {})",
                    s.node, f.soak
                )),
            }
        }
    }
    log.push(format!(
        "{checked} follower start(s) checked against the canary Ready at {ready:?}"
    ));
    // The canary goes; its nodes come back to the follower.
    let dp = DeleteParams::default();
    retrying("deleting the canary", || papi.delete(&name, &dp)).await;
    let gone =
        ttdrv_testkit::wait_for_result("the canary gone", Duration::from_secs(60), || async {
            match papi.get_opt(&name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    if let Err(e) = gone {
        inv.violation(format!("the canary {name} was not deleted: {e}"));
    }
    for n in canary {
        env.label_node(n, OUT_LABEL, None).await;
    }
    set_spec(env, policy, serde_json::json!({ "promoteAfter": null })).await;
    log.push(format!(
        "canary deleted, its nodes back at {}ms",
        t0.elapsed().as_millis()
    ));
    log
}
