//! The firmware NodeActor against a recording fake of the Labeler, Evictor
//! and flash Job writer (the fake API): what it writes, evicts and creates,
//! in which order, and what it does when a write fails.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::firmware::labels as fw;
use ttdrv_core::drain::{DrainPass, DrainProgress, PodRef};
use ttdrv_core::firmware::Observation;
use ttdrv_core::firmware::observe::NodeView;
use ttdrv_core::machine::Cordon;

use super::*;
use crate::Error;
use crate::workers::EvictOutcome;

/// How the fake API answers.
#[derive(Clone, Copy, Default)]
struct Answers {
    /// Node patches fail with this HTTP code.
    patch_fails: Option<u16>,
    /// Job creates fail with this HTTP code.
    job_fails: Option<u16>,
    /// The Job is there already (AlreadyExists).
    job_exists: bool,
}

/// Plays the Labeler, the Evictor and the Job writer; records what it was
/// asked. The Node is kept as the API server would keep it.
struct Fake {
    log: Arc<Mutex<Vec<String>>>,
    node: serde_json::Value,
    answers: Arc<Mutex<Answers>>,
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

    fn answers(&self) -> Answers {
        self.answers.lock().map(|a| *a).unwrap_or_default()
    }
}

fn api_error(code: u16, what: &str) -> Error {
    let status: kube::core::Status = serde_json::from_value(serde_json::json!({
        "status": "Failure", "code": code, "reason": if code == 422 { "Invalid" } else { "InternalError" },
        "message": format!("{what} refused"),
    }))
    .expect("status");
    Error::Kube {
        action: what.into(),
        source: kube::Error::Api(status.into()),
    }
}

impl Handler<PatchNode> for Fake {
    type Result = crate::Result<Node>;
    fn handle(&mut self, msg: PatchNode, _: &mut Self::Context) -> crate::Result<Node> {
        if let Some(code) = self.answers().patch_fails {
            self.note(format!("patch refused {code}"));
            return Err(api_error(code, "patching node"));
        }
        let (node, said) =
            crate::test_support::merge_node_patch(&mut self.node, &msg.patch, fw::RECORD, |r| {
                serde_json::from_str::<FwRecord>(r)
                    .ok()
                    .map(|r| r.state.as_str().to_string())
            });
        self.note(said);
        node
    }
}

impl Handler<Evict> for Fake {
    type Result = MessageResult<Evict>;
    fn handle(&mut self, msg: Evict, _: &mut Self::Context) -> Self::Result {
        let pods: Vec<String> = msg.pods.iter().map(|(p, _)| p.to_string()).collect();
        self.note(format!(
            "evict {} firmware={}",
            pods.join(","),
            msg.firmware
        ));
        MessageResult(EvictOutcome {
            evicted: msg.pods.iter().map(|(p, _)| p.clone()).collect(),
            ..Default::default()
        })
    }
}

impl Handler<CreateFlashJob> for Fake {
    type Result = crate::Result<JobCreate>;
    fn handle(&mut self, msg: CreateFlashJob, _: &mut Self::Context) -> Self::Result {
        let name = msg.job.metadata.name.clone().unwrap_or_default();
        let a = self.answers();
        if let Some(code) = a.job_fails {
            self.note(format!("job refused {code}"));
            return Err(api_error(code, "creating flash Job"));
        }
        self.note(format!("job {name}"));
        Ok(if a.job_exists {
            JobCreate::AlreadyThere
        } else {
            JobCreate::Created
        })
    }
}

const NOW: i64 = 10_000;

fn policy() -> Arc<TenstorrentFirmwarePolicy> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "firmware.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentFirmwarePolicy",
            "metadata": { "name": "fw", "uid": "u1", "generation": 1 },
            "spec": { "version": "19.8.0", "nodeAffinity": {} },
        }))
        .expect("policy"),
    )
}

fn desired() -> Desired {
    Desired::of(&policy())
}

fn obs() -> Observation {
    Observation {
        now: NOW,
        node: "n1".into(),
        ready: true,
        current: Some("19.7.0.0".into()),
        driver_version: Some("2.8.0".into()),
        ..Default::default()
    }
}

/// A record of policy `fw` in `state`, since `NOW - 5`, with our cordon
/// when `cordoned`.
fn record(state: FirmwareNodeState, cordoned: bool) -> FwRecord {
    let mut r = FwRecord::new("fw", "19.8.0", NOW - 5);
    r.state = state;
    if cordoned {
        r.cordon = Cordon::Ours;
    }
    r
}

/// The record of a flash under way, naming its Job.
fn flashing() -> FwRecord {
    let mut r = record(FirmwareNodeState::Flashing, true);
    r.job = Some(ttdrv_api::firmware::job_name_for("fw", "n1", "19.8.0", 0));
    r.policy_uid = Some("u1".into());
    r
}

fn job_name() -> String {
    ttdrv_api::firmware::job_name_for("fw", "n1", "19.8.0", 0)
}

fn seen(prev: FwRecord, obs: Observation, evict: &[&str]) -> Seen {
    let node = ttdrv_core::fixtures::node("n1", "True", obs.unschedulable, &[]);
    Seen {
        node: Arc::new(node),
        persisted: Some(prev.clone()),
        prev,
        view: NodeView {
            obs,
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
            has_device_pods: !evict.is_empty(),
        },
    }
}

/// Room for any start (the budget itself is tested in crate::runtime::claims).
fn room() -> Arc<Budget> {
    Arc::new(Budget {
        cap: usize::MAX,
        ..Default::default()
    })
}

fn step_msg(s: Seen) -> StepNode {
    StepNode {
        policy: policy(),
        desired: desired(),
        seen: s,
        budget: room(),
    }
}

struct Rig {
    actor: Addr<NodeActor>,
    log: Arc<Mutex<Vec<String>>>,
    answers: Arc<Mutex<Answers>>,
    ctx: Arc<Context>,
}

impl Rig {
    fn start() -> Self {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let answers: Arc<Mutex<Answers>> = Arc::default();
        let fake = Fake {
            log: log.clone(),
            node: serde_json::json!({ "metadata": { "name": "n1" } }),
            answers: answers.clone(),
        }
        .start();
        let ctx = crate::test_support::context(
            crate::test_support::NOWHERE,
            crate::test_support::empty_stores(),
        );
        let ports = FwNodePorts {
            patch: fake.clone().recipient(),
            evict: fake.clone().recipient(),
            create_job: fake.recipient(),
        };
        let c = ctx.clone();
        let actor = actix::Supervisor::start(move |_| NodeActor::new(c, ports, "n1", "fw"));
        Self {
            actor,
            log,
            answers,
            ctx,
        }
    }

    fn answer(&self, a: Answers) {
        if let Ok(mut x) = self.answers.lock() {
            *x = a;
        }
    }

    async fn step(&self, msg: StepNode) -> Stepped {
        self.actor.send(msg).await.expect("mailbox")
    }

    /// What the fake was asked since the last call.
    fn take_log(&self) -> Vec<String> {
        self.log
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// Who holds n1's claim, asked by trying to take it for a driver policy.
    fn claim(&self) -> Option<Holder> {
        let probe = Holder::driver("probe".into());
        match self.ctx.claims.take_within("n1", probe.clone(), None) {
            Ok(()) => {
                self.ctx.claims.release("n1", &probe);
                None
            }
            Err(Refused::Held(h)) => Some(h),
            Err(Refused::OverBudget { .. }) => None,
        }
    }

    fn restarts(&self) -> String {
        let text = String::from_utf8(self.ctx.metrics.encode().1).unwrap_or_default();
        text.lines()
            .find(|l| {
                l.starts_with("ttdriver_actor_restarts_total") && l.contains("\"firmware_node\"")
            })
            .unwrap_or_default()
            .to_string()
    }
}

fn with_slot(mut o: Observation) -> Observation {
    o.slot = true;
    o
}

fn cordoned(mut o: Observation) -> Observation {
    o.unschedulable = true;
    o
}

fn drained(mut o: Observation) -> Observation {
    o.drain = Some(DrainProgress::default());
    o
}

#[actix::test]
async fn without_a_slot_nothing_is_cordoned() {
    let rig = Rig::start();
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Pending, false),
            obs(),
            &["w"],
        )))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Pending);
    assert_eq!(out.record.reason.as_deref(), Some(reason::WAITING_FOR_SLOT));
    assert_eq!(rig.take_log(), vec!["patch Pending"]);
    assert_eq!(rig.claim(), None, "no claim without a start");
}

#[actix::test]
async fn a_slot_cordons_with_the_record_in_one_patch_and_takes_the_claim() {
    let rig = Rig::start();
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Pending, false),
            with_slot(obs()),
            &["w"],
        )))
        .await;
    assert_eq!(
        (out.record.state, out.record.cordon),
        (FirmwareNodeState::Cordoning, Cordon::Ours)
    );
    assert_eq!(rig.take_log(), vec!["patch Cordoning cordon"]);
    assert_eq!(rig.claim(), Some(Holder::firmware("fw".into())));
    assert_eq!(out.written.as_ref(), Some(&out.record));
}

#[actix::test]
async fn a_node_a_driver_cycle_holds_is_not_cordoned() {
    let rig = Rig::start();
    let driver = Holder::driver("fleet".into());
    rig.ctx
        .claims
        .take_within("n1", driver.clone(), None)
        .expect("driver claim");
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Pending, false),
            with_slot(obs()),
            &[],
        )))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Pending);
    assert_eq!(
        out.record.reason.as_deref(),
        Some(reason::WAITING_FOR_DRIVER)
    );
    assert!(
        rig.take_log().iter().all(|l| !l.contains("cordon")),
        "no cordon under a driver cycle"
    );
    assert_eq!(rig.claim(), Some(driver));
}

#[actix::test]
async fn a_start_over_the_budget_since_the_plan_is_deferred() {
    let rig = Rig::start();
    // n2 started (another policy's cycle) after the plan gave n1 the last place.
    let budget = Arc::new(Budget {
        fleet: Arc::new(BTreeSet::from(["n1".to_string(), "n2".to_string()])),
        cap: 1,
        out: BTreeSet::new(),
    });
    rig.ctx
        .claims
        .take_within("n2", Holder::driver("other".into()), Some(&budget))
        .expect("n2 starts");
    let out = rig
        .step(StepNode {
            budget,
            ..step_msg(seen(
                record(FirmwareNodeState::Pending, false),
                with_slot(obs()),
                &[],
            ))
        })
        .await;
    assert_eq!(
        (out.record.state, out.record.reason.as_deref()),
        (FirmwareNodeState::Pending, Some(reason::WAITING_FOR_SLOT))
    );
    assert_eq!(rig.take_log(), vec!["patch Pending"]);
    assert_eq!(rig.claim(), None);
}

#[actix::test]
async fn a_cordoned_node_is_drained_through_the_evictor_as_firmware() {
    let rig = Rig::start();
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Cordoning, true),
            cordoned(obs()),
            &["w"],
        )))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Draining);
    assert_eq!(
        rig.take_log(),
        vec!["patch Draining", "evict ml/w firmware=true"]
    );
}

#[actix::test]
async fn the_flash_job_is_named_in_the_record_before_it_is_created() {
    let rig = Rig::start();
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Draining, true),
            drained(cordoned(obs())),
            &[],
        )))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Flashing);
    assert_eq!(out.record.job.as_deref(), Some(job_name().as_str()));
    assert_eq!(out.record.policy_uid.as_deref(), Some("u1"));
    assert_eq!(
        rig.take_log(),
        vec!["patch Flashing".to_string(), format!("job {}", job_name())]
    );
}

#[actix::test]
async fn a_refused_record_write_creates_no_job_and_restarts_the_actor() {
    let rig = Rig::start();
    rig.answer(Answers {
        patch_fails: Some(422),
        ..Default::default()
    });
    let prev = record(FirmwareNodeState::Draining, true);
    let out = rig
        .step(step_msg(seen(prev.clone(), drained(cordoned(obs())), &[])))
        .await;
    assert_eq!(out.record, prev, "the record before the step");
    assert_eq!(out.written, None);
    assert_eq!((out.errors, out.restart), (1, true));
    assert_eq!(rig.take_log(), vec!["patch refused 422"], "no Job");
    // Restarted by its Supervisor: it answers the next step.
    rig.answer(Answers::default());
    let out = rig
        .step(step_msg(seen(prev, drained(cordoned(obs())), &[])))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Flashing);
    assert!(rig.restarts().ends_with(" 1"), "{}", rig.restarts());
}

#[actix::test]
async fn a_transient_write_failure_is_retried_without_a_restart() {
    let rig = Rig::start();
    rig.answer(Answers {
        patch_fails: Some(500),
        ..Default::default()
    });
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Pending, false),
            with_slot(obs()),
            &[],
        )))
        .await;
    assert_eq!((out.errors, out.restart), (1, false));
    assert_eq!(out.record.state, FirmwareNodeState::Pending);
    assert_eq!(
        rig.claim(),
        None,
        "a start whose write failed gives its claim back"
    );
    assert!(rig.restarts().ends_with(" 0"), "{}", rig.restarts());
}

#[actix::test]
async fn a_job_create_that_failed_is_created_again_next_step() {
    let rig = Rig::start();
    rig.answer(Answers {
        job_fails: Some(500),
        ..Default::default()
    });
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Draining, true),
            drained(cordoned(obs())),
            &[],
        )))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Flashing);
    assert_eq!(out.errors, 1);
    assert_eq!(rig.take_log(), vec!["patch Flashing", "job refused 500"]);
    // The cache has no Job, and the actor knows it never created it.
    rig.answer(Answers::default());
    let out = rig
        .step(step_msg(seen(out.record, cordoned(obs()), &[])))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Flashing);
    assert_eq!(
        rig.take_log(),
        vec!["patch Flashing".to_string(), format!("job {}", job_name())]
    );
}

#[actix::test]
async fn a_job_created_but_not_in_the_cache_yet_is_waited_for_not_created_again() {
    let rig = Rig::start();
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Draining, true),
            drained(cordoned(obs())),
            &[],
        )))
        .await;
    rig.take_log();
    let out = rig
        .step(step_msg(seen(out.record, cordoned(obs()), &[])))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Flashing);
    assert!(rig.take_log().is_empty(), "no second create, no write");
}

#[actix::test]
async fn a_job_found_already_there_counts_as_created() {
    let rig = Rig::start();
    rig.answer(Answers {
        job_exists: true,
        ..Default::default()
    });
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Draining, true),
            drained(cordoned(obs())),
            &[],
        )))
        .await;
    assert_eq!(out.errors, 0);
    rig.take_log();
    let out = rig
        .step(step_msg(seen(out.record, cordoned(obs()), &[])))
        .await;
    assert_eq!(
        out.record.state,
        FirmwareNodeState::Flashing,
        "waits for it, not a vanished Job"
    );
    assert!(rig.take_log().is_empty());
}

#[actix::test]
async fn a_job_seen_running_that_is_gone_fails_the_node_with_its_cordon() {
    let rig = Rig::start();
    let mut seen_once = flashing();
    seen_once.job_seen = true;
    let out = rig
        .step(step_msg(seen(seen_once, cordoned(obs()), &[])))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Failed);
    assert_eq!(
        out.record.cordon,
        Cordon::Ours,
        "the cards may be half-written"
    );
    let log = rig.take_log();
    assert_eq!(
        log,
        vec!["patch Failed"],
        "never created blindly, never uncordoned"
    );
}

#[actix::test]
async fn a_job_named_by_a_controller_that_stopped_before_creating_it_is_created() {
    // The record names the Job for this very policy object, no pass saw it,
    // and this (new) actor did not make it: the earlier controller stopped
    // between the record and the create.
    let rig = Rig::start();
    let out = rig
        .step(step_msg(seen(flashing(), cordoned(obs()), &[])))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Flashing);
    assert_eq!(
        rig.take_log(),
        vec!["patch Flashing".to_string(), format!("job {}", job_name())]
    );
}

#[actix::test]
async fn a_job_named_for_a_deleted_policy_object_is_never_created_again() {
    let rig = Rig::start();
    let mut old = flashing();
    old.policy_uid = Some("u0".into());
    let out = rig.step(step_msg(seen(old, cordoned(obs()), &[]))).await;
    assert_eq!(out.record.state, FirmwareNodeState::Failed);
    assert!(rig.take_log().iter().all(|l| !l.starts_with("job")));
}

#[actix::test]
async fn a_restart_keeps_what_the_actor_knows_of_its_own_job() {
    let rig = Rig::start();
    let out = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Draining, true),
            drained(cordoned(obs())),
            &[],
        )))
        .await;
    let created = out.record;
    // A refused write (the record the cache shows is older): restart.
    rig.answer(Answers {
        patch_fails: Some(422),
        ..Default::default()
    });
    let mut s = seen(created.clone(), cordoned(obs()), &[]);
    s.persisted = None;
    let out = rig.step(step_msg(s)).await;
    assert!(out.restart);
    rig.answer(Answers::default());
    rig.take_log();
    // Its Job still not in the cache: waited for, not taken as vanished.
    let out = rig
        .step(step_msg(seen(created, cordoned(obs()), &[])))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Flashing);
    assert!(rig.take_log().is_empty());
}

#[actix::test]
async fn a_successful_flash_uncordons_and_gives_the_claim_back() {
    let rig = Rig::start();
    let mut o = cordoned(obs());
    o.job = FlashJob::Succeeded {
        name: job_name(),
        report: None,
    };
    o.current = Some(desired().readback);
    let out = rig.step(step_msg(seen(flashing(), o.clone(), &[]))).await;
    assert_eq!(out.record.state, FirmwareNodeState::Uncordoning);
    assert_eq!(rig.take_log(), vec!["patch Uncordoning uncordon"]);
    let out = rig
        .step(step_msg(seen(
            out.record,
            Observation {
                unschedulable: false,
                ..o
            },
            &[],
        )))
        .await;
    assert_eq!(out.record.state, FirmwareNodeState::Done);
    assert_eq!(rig.claim(), None);
}

#[actix::test]
async fn a_failed_flash_keeps_the_cordon() {
    let rig = Rig::start();
    let mut o = cordoned(obs());
    o.job = FlashJob::Failed {
        name: job_name(),
        report: None,
        deadline: false,
    };
    let out = rig.step(step_msg(seen(flashing(), o, &[]))).await;
    assert_eq!(out.record.state, FirmwareNodeState::Failed);
    assert_eq!(out.record.cordon, Cordon::Ours);
    assert_eq!(rig.take_log(), vec!["patch Failed"]);
}

#[actix::test]
async fn a_paused_policy_starts_nothing_even_with_a_slot() {
    let rig = Rig::start();
    let mut s = step_msg(seen(
        record(FirmwareNodeState::Pending, false),
        with_slot(obs()),
        &[],
    ));
    s.desired.paused = true;
    let out = rig.step(s).await;
    assert_eq!(
        (out.record.state, out.record.reason.as_deref()),
        (FirmwareNodeState::Pending, Some(reason::PAUSED))
    );
    assert!(rig.take_log().iter().all(|l| !l.contains("cordon")));
    assert_eq!(rig.claim(), None);
}

#[actix::test]
async fn an_unchanged_step_writes_nothing() {
    let rig = Rig::start();
    let first = rig
        .step(step_msg(seen(
            record(FirmwareNodeState::Pending, false),
            obs(),
            &[],
        )))
        .await;
    rig.take_log();
    let again = rig
        .step(step_msg(seen(first.record.clone(), obs(), &[])))
        .await;
    assert_eq!(again.record, first.record);
    assert_eq!(again.written, None);
    assert!(
        rig.take_log().is_empty(),
        "no patch for a record the Node has"
    );
}

#[actix::test]
async fn stopping_the_actor_gives_its_claim_back() {
    let rig = Rig::start();
    rig.step(step_msg(seen(
        record(FirmwareNodeState::Pending, false),
        with_slot(obs()),
        &[],
    )))
    .await;
    assert_eq!(rig.claim(), Some(Holder::firmware("fw".into())));
    let Rig { actor, ctx, .. } = rig;
    drop(actor);
    wait_until(|| {
        ctx.claims
            .take_within("n1", Holder::driver("probe".into()), None)
            .is_ok()
    })
    .await;
}

/// Waits (up to 2 s) for `ok`, yielding to the actors meanwhile.
async fn wait_until(mut ok: impl FnMut() -> bool) {
    for _ in 0..200 {
        if ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("not within 2 s");
}

// What the actor remembers of the Job it created, as a pure rule.

fn flashing_job(job: &str) -> FwRecord {
    let mut r = FwRecord::new("fw", "19.8.0", 0);
    r.state = FirmwareNodeState::Flashing;
    r.job = Some(job.into());
    r
}

fn created(uid: &str, job: &str) -> Option<OwnJobMemory> {
    Some(OwnJobMemory {
        policy_uid: Some(uid.into()),
        job: job.into(),
        what: OwnJob::CreatedUnseen { at: 7 },
    })
}

#[test]
fn the_memory_of_a_created_job_holds_until_the_cache_shows_it() {
    let (rec, missing) = (flashing_job("j"), FlashJob::Missing);
    let mut mem = created("u1", "j");
    let told = OwnJobMemory::observe(&mut mem, Some("u1"), &rec, &missing);
    assert_eq!(told, OwnJob::CreatedUnseen { at: 7 });
    assert!(mem.is_some(), "kept while the cache lacks the Job");
    // Seen: forgotten, so a later disappearance is a vanished Job.
    let running = FlashJob::Running {
        name: "j".into(),
        image_pull_failed: false,
    };
    assert_eq!(
        OwnJobMemory::observe(&mut mem, Some("u1"), &rec, &running),
        OwnJob::NotMine
    );
    assert_eq!(mem, None);
    assert_eq!(
        OwnJobMemory::observe(&mut mem, Some("u1"), &rec, &missing),
        OwnJob::NotMine
    );
}

#[test]
fn the_memory_is_not_for_another_job_or_another_policy_object() {
    let missing = FlashJob::Missing;
    // The record names another Job (a retry, a new version).
    let mut mem = created("u1", "j");
    let told = OwnJobMemory::observe(&mut mem, Some("u1"), &flashing_job("j-r1"), &missing);
    assert_eq!((told, mem), (OwnJob::NotMine, None));
    // The policy deleted and re-created under its name: its Jobs went
    // with the old object.
    let mut mem = created("u1", "j");
    let told = OwnJobMemory::observe(&mut mem, Some("u2"), &flashing_job("j"), &missing);
    assert_eq!((told, mem), (OwnJob::NotMine, None));
}
