//! The NodeActor against recording fakes of the Labeler, Evictor, renderer,
//! RolloutActor and ValidationPods: what it asks for and writes, in which
//! order.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::{TenstorrentDriverPolicySpec, labels};
use ttdrv_core::drain::{DrainProgress, RunOutcome};
use ttdrv_core::machine::{Cordon, InstallerPod, ValidationPod};
use ttdrv_core::reason;

use super::*;

const GATE: &str = "tenstorrent.com/deploy.tt-telemetry";

/// Plays every actor a NodeActor talks to; records what it was asked.
struct Fake {
    log: Arc<Mutex<Vec<String>>>,
    /// The Node as the fake API server stores it (merge patches applied).
    node: serde_json::Value,
    /// Creating a validation pod fails (as when its PodTemplate is gone).
    refuse_validation_pod: bool,
}

impl Actor for Fake {
    type Context = actix::Context<Self>;
}

impl Fake {
    fn note(&self, s: String) {
        if let Ok(mut l) = self.log.lock() {
            l.push(s);
        }
    }
}

impl Handler<PatchNode> for Fake {
    type Result = Result<Node>;
    fn handle(&mut self, msg: PatchNode, _: &mut Self::Context) -> Result<Node> {
        let (node, said) = crate::test_support::merge_node_patch(
            &mut self.node,
            &msg.patch,
            labels::UPGRADE_STATE,
            |r| {
                serde_json::from_str::<NodeRecord>(r)
                    .ok()
                    .map(|r| r.state.as_str().to_string())
            },
        );
        self.note(said);
        node
    }
}

impl Handler<Evict> for Fake {
    type Result = MessageResult<Evict>;
    fn handle(&mut self, msg: Evict, _: &mut Self::Context) -> Self::Result {
        let pods: Vec<String> = msg.pods.iter().map(|(p, _)| p.to_string()).collect();
        self.note(format!("evict {}", pods.join(",")));
        MessageResult(Default::default())
    }
}

impl Handler<ReplaceInstallerPod> for Fake {
    type Result = Result<()>;
    fn handle(&mut self, msg: ReplaceInstallerPod, _: &mut Self::Context) -> Result<()> {
        self.note(format!("replace {}", msg.name));
        Ok(())
    }
}

impl Handler<ReleaseSlot> for Fake {
    type Result = ();
    fn handle(&mut self, _: ReleaseSlot, _: &mut Self::Context) {
        self.note("release".into());
    }
}

impl Handler<RunValidationPod> for Fake {
    type Result = Result<String>;
    fn handle(&mut self, msg: RunValidationPod, _: &mut Self::Context) -> Result<String> {
        self.note(format!(
            "run validation pod {} {} cycle {}",
            msg.template, msg.node, msg.cycle
        ));
        if self.refuse_validation_pod {
            return Err(Error::InvalidPolicy {
                policy: "fleet".into(),
                message: "no PodTemplate".into(),
            });
        }
        Ok("ttdrv-validate-1".into())
    }
}

impl Handler<DeleteValidationPod> for Fake {
    type Result = Result<()>;
    fn handle(&mut self, msg: DeleteValidationPod, _: &mut Self::Context) -> Result<()> {
        self.note(format!(
            "delete validation pod {}/{}",
            msg.namespace, msg.name
        ));
        Ok(())
    }
}

fn context() -> Arc<Context> {
    crate::test_support::context(
        crate::test_support::NOWHERE,
        crate::test_support::empty_stores(),
    )
}

fn policy() -> Arc<TenstorrentDriverPolicy> {
    Arc::new(TenstorrentDriverPolicy::new(
        "fleet",
        serde_json::from_value::<TenstorrentDriverPolicySpec>(serde_json::json!({
            "version": "2.8.0",
            "nodeAffinity": { "nodeSelectorTerms": [ { "matchLabels": { "pool": "a" } } ] }
        }))
        .expect("spec"),
    ))
}

fn desired() -> Desired {
    Desired {
        prepare: false,
        ..Desired::of(&policy(), 900)
    }
}

fn obs(loaded: &str) -> Observation {
    Observation {
        loaded: Some(loaded.into()),
        drain: None,
        slot: false,
        ..ttdrv_core::fixtures::observation()
    }
}

/// The record of a cycle of policy `fleet` to 2.8.0 started at 900, in
/// `state`, with `cordon`.
fn in_cycle(state: NodeState, cordon: Cordon) -> NodeRecord {
    let mut r = NodeRecord::new("fleet", "2.8.0", 900);
    r.state = state;
    r.cordon = cordon;
    r.started = Some(900);
    r
}

/// [`obs`] of a node cordoned with its gates closed.
fn cordoned_obs(loaded: &str) -> Observation {
    let mut o = obs(loaded);
    o.unschedulable = true;
    o.gates_closed = true;
    o.gates_present = true;
    o
}

fn observe(obs: Observation, persisted: Option<NodeRecord>, evict: &[&str]) -> Observe {
    Observe {
        // Room for any start: the budget itself is tested in crate::runtime::claims.
        budget: std::sync::Arc::new(crate::runtime::claims::Budget {
            cap: usize::MAX,
            ..Default::default()
        }),
        policy: policy(),
        obs,
        desired: desired(),
        persisted,
        evictions: evict
            .iter()
            .map(|p| {
                (
                    PodRef {
                        namespace: "ml".into(),
                        name: p.to_string(),
                    },
                    DrainPass::Device,
                )
            })
            .collect(),
        installer_pod: Some(PodRef {
            namespace: "tt".into(),
            name: "ttdrv-fleet-abc".into(),
        }),
        skipped: vec![],
        gates: vec![GATE.to_string()],
    }
}

/// A NodeActor wired to one fake; returns it and the fake's log.
fn start(node: serde_json::Value) -> (Addr<NodeActor>, Arc<Mutex<Vec<String>>>) {
    start_with(node, false)
}

/// [`start`], with a fake that fails to create validation pods if
/// `refuse_validation_pod`.
fn start_with(
    node: serde_json::Value,
    refuse_validation_pod: bool,
) -> (Addr<NodeActor>, Arc<Mutex<Vec<String>>>) {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let fake = Fake {
        log: log.clone(),
        node,
        refuse_validation_pod,
    }
    .start();
    let ports = NodePorts {
        patch: fake.clone().recipient(),
        evict: fake.clone().recipient(),
        replace_pod: fake.clone().recipient(),
        release: fake.clone().recipient(),
        run_validation: fake.clone().recipient(),
        delete_validation: fake.recipient(),
        board: Default::default(),
    };
    let actor = NodeActor::new(context(), "n1".into(), "fleet".into(), ports).start();
    (actor, log)
}

fn entries(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

#[actix::test]
async fn no_slot_means_no_cordon() {
    let (actor, log) = start(serde_json::json!({}));
    let rec = actor
        .send(observe(obs("2.7.0"), None, &["w"]))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Pending);
    assert_eq!(rec.reason.as_deref(), Some(reason::WAITING));
    assert_eq!(
        entries(&log),
        ["patch Pending"],
        "only the waiting record written, no slot given back (none held)"
    );
}

#[actix::test]
async fn a_granted_slot_the_step_does_not_use_goes_back() {
    // Granted a slot, but the target is loaded already: Done without a cycle.
    let node = serde_json::json!({
        "metadata": { "labels": { labels::KMD_VERSION: "2.8.0" } }
    });
    let (actor, log) = start(node);
    let mut o = obs("2.8.0");
    o.slot = true;
    o.installer = InstallerPod::Current { ready: true };
    let rec = actor
        .send(observe(o, None, &[]))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Done, "{rec:?}");
    actix::clock::sleep(std::time::Duration::from_millis(20)).await;
    let log = entries(&log);
    assert!(log.iter().all(|l| !l.contains("cordon")), "{log:?}");
    assert_eq!(log.last().map(String::as_str), Some("release"), "{log:?}");
}

#[actix::test]
async fn granted_slot_cordons_and_drains_in_one_patch_then_evicts() {
    let (actor, log) = start(serde_json::json!({}));
    let mut o = obs("2.7.0");
    o.slot = true;
    o.drain = Some(DrainProgress {
        remaining: vec!["ml/w".into()],
        blocking_pdbs: vec![],
    });
    let rec = actor
        .send(observe(o, None, &["w"]))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Draining);
    assert_eq!(rec.cordon, Cordon::Ours);
    assert_eq!(
        entries(&log),
        ["patch Draining cordon", "evict ml/w"],
        "the cordon and the Draining record in one patch, the evictions after it"
    );
}

#[actix::test]
async fn a_stale_installer_pod_is_kept_until_the_daemonset_controller_saw_the_template() {
    let r = in_cycle(NodeState::Upgrading, Cordon::Ours);
    let mut o = cordoned_obs("2.7.0");
    o.installer = ttdrv_core::machine::InstallerPod::Stale { deleting: false };
    let step = |observed: bool| {
        let (o, r) = (o.clone(), r.clone());
        async move {
            let (actor, log) = start(serde_json::json!({}));
            let mut m = observe(o, Some(r), &[]);
            m.obs.template_pending = !observed;
            let rec = actor.send(m).await.expect("mailbox").expect("step");
            assert_eq!(rec.state, NodeState::Upgrading);
            entries(&log)
        }
    };
    assert!(
        !step(false).await.iter().any(|e| e.starts_with("replace")),
        "a replacement now would come back on the old template"
    );
    assert!(
        step(true)
            .await
            .contains(&"replace ttdrv-fleet-abc".to_string())
    );
}

#[actix::test]
async fn a_node_without_drain_plan_never_leaves_draining() {
    let r = in_cycle(NodeState::Draining, Cordon::Ours);
    let (actor, log) = start(serde_json::json!({}));
    let o = cordoned_obs("2.7.0");
    let rec = actor
        .send(observe(o, Some(r.clone()), &[]))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec, r);
    assert!(entries(&log).is_empty(), "{:?}", entries(&log));
}

#[actix::test]
async fn done_gives_the_slot_back_after_uncordon() {
    let r = in_cycle(NodeState::Upgrading, Cordon::Ours);
    let node = serde_json::json!({
        "metadata": { "labels": { GATE: "false", labels::KMD_VERSION: "2.8.0" } },
        "spec": { "unschedulable": true }
    });
    let (actor, log) = start(node);
    let mut o = cordoned_obs("2.8.0");
    o.installer = InstallerPod::Current { ready: true };
    let rec = actor
        .send(observe(o, Some(r), &[]))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Done);
    assert_eq!(rec.cordon, Cordon::None);
    // Release is sent without waiting for a reply; let the fake take it.
    actix::clock::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(
        entries(&log),
        ["patch Done uncordon", "release"],
        "the uncordon and the Done record in one patch"
    );
}

#[actix::test]
async fn admins_cordon_is_never_lifted() {
    let r = in_cycle(NodeState::Upgrading, Cordon::Theirs);
    let node = serde_json::json!({
        "metadata": { "labels": { GATE: "false" } },
        "spec": { "unschedulable": true }
    });
    let (actor, log) = start(node);
    let mut o = cordoned_obs("2.8.0");
    o.installer = InstallerPod::Current { ready: true };
    let rec = actor
        .send(observe(o, Some(r), &[]))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Done);
    let log = entries(&log);
    assert!(
        log.iter().all(|l| !l.contains("uncordon")),
        "someone else's cordon stays: {log:?}"
    );
}

/// The node swapped to 2.8.0 under our cordon, its module validated, in a
/// policy with validation PodTemplate `check`; `run`: its validation pod.
fn validating(run: Option<RunOutcome>) -> Observe {
    let mut o = cordoned_obs("2.8.0");
    o.installer = InstallerPod::Current { ready: true };
    o.validation_pod = run.map(|outcome| ValidationPod {
        pod: "tt/ttdrv-validate-1".into(),
        created: o.now,
        outcome,
    });
    let mut m = observe(o, Some(in_cycle(NodeState::Upgrading, Cordon::Ours)), &[]);
    m.desired.validation_pod = Some("check".into());
    m
}

#[actix::test]
async fn a_validated_swap_creates_the_cycles_validation_pod_through_its_port() {
    let (actor, log) = start(serde_json::json!({}));
    let rec = actor
        .send(validating(None))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Upgrading);
    assert_eq!(rec.reason.as_deref(), Some(reason::VALIDATING));
    assert_eq!(
        entries(&log),
        ["patch Upgrading", "run validation pod check n1 cycle 900"],
        "still cordoned: no uncordon before the pod succeeded"
    );
}

#[actix::test]
async fn a_validation_pod_that_cannot_be_created_is_asked_for_again_not_failed() {
    let (actor, log) = start_with(serde_json::json!({}), true);
    for _ in 0..2 {
        let rec = actor
            .send(validating(None))
            .await
            .expect("mailbox")
            .expect("a refused creation is not a failed observation");
        assert_eq!(rec.state, NodeState::Upgrading);
        assert_eq!(rec.reason.as_deref(), Some(reason::VALIDATING));
    }
    assert_eq!(
        entries(&log),
        [
            "patch Upgrading",
            "run validation pod check n1 cycle 900",
            "run validation pod check n1 cycle 900"
        ],
        "retried on the next observation; the record is written once"
    );
}

#[actix::test]
async fn a_validation_pod_that_succeeded_returns_the_node_to_service_and_is_deleted() {
    let node = serde_json::json!({
        "metadata": { "labels": { GATE: "false", labels::KMD_VERSION: "2.8.0" } },
        "spec": { "unschedulable": true }
    });
    let (actor, log) = start(node);
    let rec = actor
        .send(validating(Some(RunOutcome::Succeeded)))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Done, "{rec:?}");
    assert_eq!(rec.cordon, Cordon::None);
    actix::clock::sleep(std::time::Duration::from_millis(20)).await;
    let log = entries(&log);
    assert_eq!(
        log.first().map(String::as_str),
        Some("patch Uncordoning uncordon"),
        "{log:?}"
    );
    assert_eq!(
        log.get(1).map(String::as_str),
        Some("delete validation pod tt/ttdrv-validate-1"),
        "{log:?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("release"), "{log:?}");
}

#[actix::test]
async fn a_failed_validation_pod_fails_the_node_kept_cordoned() {
    let (actor, log) = start(serde_json::json!({}));
    let rec = actor
        .send(validating(Some(RunOutcome::Failed("exit code 3".into()))))
        .await
        .expect("mailbox")
        .expect("step");
    assert_eq!(rec.state, NodeState::Failed);
    assert_eq!(rec.reason.as_deref(), Some(reason::VALIDATION_FAILED));
    assert_eq!(rec.cordon, Cordon::Ours, "kept cordoned for a person");
    actix::clock::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(
        entries(&log),
        ["patch Failed", "release"],
        "no uncordon, and the failed pod stays for its log"
    );
}
