//! One chaos trial: a rollout to a new version while the controller is killed
//! on a schedule drawn from the trial's seed, plus the fault of the trial's
//! kind; the run in `chaos_rollouts` cycles through the kinds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ttdrv_api::TenstorrentDriverPolicy;
use ttdrv_testkit::TestEnv;

use crate::SETTLE;
use crate::apiserver::{Component, restart_apiserver};
use crate::controller::Controller;
use crate::fleet::{deployment, test_nodes};
use crate::invariants::{Invariants, back_in_policy, final_checks, record_state};
use crate::rollout::{retrying, set_spec, wait_settled};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Only controller kills.
    Kills,
    /// Kills, plus the kube-apiserver killed and restarted mid-rollout.
    ApiserverRestart,
    /// Kills, plus a node deleted while it is Draining.
    DeleteDraining,
    /// Kills, plus a node added mid-rollout.
    AddNode,
    /// Kills, plus `spec.version` changed again mid-rollout.
    VersionChange,
    /// Kills, plus `spec.paused` toggled repeatedly.
    PauseToggle,
    /// Two controllers with leader election; each kill hits the Lease holder and
    /// a new standby is started, so the other one takes over.
    LeaderHandover,
    /// Kills, plus one node NotReady (Ready=False or Unknown) for a few
    /// seconds, once or twice.
    NotReadyFlap,
    /// Kills, plus every node NotReady for a few seconds, then back.
    FleetNotReady,
    /// Kills, plus the installer pod of a waiting or mid-cycle node deleted,
    /// a few times.
    InstallerPodDeleted,
    /// Kills, plus a node moved out of the policy (out of its selector, or
    /// skip-labelled) and back, once or twice.
    Relabel,
    /// Kills, plus a firmware policy created at the version bump (a combined
    /// wave), one node's flash failing and retried, and a kill as a node is
    /// Flashing ([`crate::firmware`]).
    FirmwareWave,
    /// Kills, plus `upgradePolicy.soakSeconds` set, and the acting controller
    /// (the Lease holder, with leader election in half the trials) killed
    /// while a node soaks ([`crate::rules`]).
    SoakKill,
    /// Kills, plus a maintenance window open at the bump closed mid-rollout,
    /// then reopened ([`crate::rules`]).
    WindowClose,
    /// Kills, plus a refused spec (a new version with a window in an unknown
    /// time zone) applied mid-rollout, then the refusal lifted
    /// ([`crate::rules`]).
    RefusedSpec,
    /// Kills, plus a canary policy on two nodes that the policy under test
    /// must wait for (`spec.promoteAfter`) ([`crate::promotion`]).
    PromotionWait,
}

/// The order a run cycles through (new kinds are appended, so the first
/// trials of a run keep their kinds).
pub(crate) const KINDS: [Kind; 16] = [
    Kind::Kills,
    Kind::DeleteDraining,
    Kind::VersionChange,
    Kind::ApiserverRestart,
    Kind::AddNode,
    Kind::PauseToggle,
    Kind::LeaderHandover,
    Kind::NotReadyFlap,
    Kind::FleetNotReady,
    Kind::InstallerPodDeleted,
    Kind::Relabel,
    Kind::FirmwareWave,
    Kind::SoakKill,
    Kind::WindowClose,
    Kind::RefusedSpec,
    Kind::PromotionWait,
];

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Kills => "kills",
            Kind::ApiserverRestart => "apiserver-restart",
            Kind::DeleteDraining => "delete-draining",
            Kind::AddNode => "add-node",
            Kind::VersionChange => "version-change",
            Kind::PauseToggle => "pause-toggle",
            Kind::LeaderHandover => "leader-handover",
            Kind::NotReadyFlap => "not-ready-flap",
            Kind::FleetNotReady => "fleet-not-ready",
            Kind::InstallerPodDeleted => "installer-pod-deleted",
            Kind::Relabel => "relabel",
            Kind::FirmwareWave => "firmware-wave",
            Kind::SoakKill => "soak-kill",
            Kind::WindowClose => "window-close",
            Kind::RefusedSpec => "refused-spec",
            Kind::PromotionWait => "promotion-wait",
        }
    }

    /// Kinds whose faults are no reason for a node to end Failed: every node
    /// must end Done.
    pub(crate) fn requires_done(self) -> bool {
        matches!(
            self,
            Kind::NotReadyFlap
                | Kind::FleetNotReady
                | Kind::InstallerPodDeleted
                | Kind::Relabel
                | Kind::FirmwareWave
                | Kind::SoakKill
                | Kind::WindowClose
                | Kind::RefusedSpec
                | Kind::PromotionWait
        )
    }
    pub(crate) fn parse(s: &str) -> Option<Kind> {
        KINDS.iter().copied().find(|k| k.name() == s)
    }
}

pub(crate) struct TrialResult {
    pub(crate) index: usize,
    pub(crate) kind: Kind,
    pub(crate) seed: u64,
    pub(crate) kills: usize,
    pub(crate) faults: Vec<String>,
    pub(crate) duration: Duration,
    pub(crate) max_ours: usize,
    pub(crate) max_total: usize,
    pub(crate) max_ready_ours: usize,
    pub(crate) swaps: usize,
    pub(crate) violations: usize,
    pub(crate) ok: bool,
    /// The rollout reached its end state.
    pub(crate) settled: bool,
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn trial(
    env: &TestEnv,
    ns: &str,
    policy: &str,
    ctl: &Arc<tokio::sync::Mutex<Controller>>,
    inv: &Invariants,
    api: Option<&Component>,
    index: usize,
    kind: Kind,
    seed: u64,
    version: &mut String,
) -> TrialResult {
    let mut rng = StdRng::seed_from_u64(seed);
    let before = inv.lock().violations.len();
    {
        let mut s = inv.lock();
        s.trial = index;
        s.max_ours = 0;
        s.max_total = 0;
        s.max_ready_ours = 0;
        s.swaps = 0;
        s.replay = format!(
            "CHAOS_SEED={seed} CHAOS_KIND={} bash hack/chaos.sh chaos_rollouts",
            kind.name()
        );
    }
    let kills_before = ctl.lock().await.kills;
    let target = format!("3.{index}.0");
    let mut final_version = target.clone();
    let mut faults: Vec<String> = vec![];
    eprintln!(
        "=== trial {index} kind={} seed={seed}: {} -> {target} (replay: CHAOS_SEED={seed} CHAOS_KIND={} bash hack/chaos.sh chaos_rollouts)",
        kind.name(),
        version,
        kind.name()
    );
    let start = Instant::now();

    // Preparation that must precede the version bump.
    let mut victim: Option<String> = None;
    let blocker = format!("blocker-{index}");
    if kind == Kind::DeleteDraining {
        let admin = inv.lock().admin.clone();
        let candidates: Vec<String> = test_nodes(env)
            .await
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .filter(|n| !admin.contains(n))
            .collect();
        let v = candidates[rng.random_range(0..candidates.len())].clone();
        // A pod on the victim whose PodDisruptionBudget refuses every eviction:
        // the victim stays in Draining until it is deleted.
        let dapi: Api<Deployment> = Api::namespaced(env.client.clone(), ns);
        dapi.create(
            &PostParams::default(),
            &deployment(ns, &blocker, 1, false, Some(&v)),
        )
        .await
        .unwrap_or_else(|e| panic!("creating {blocker}: {e}"));
        let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": { "name": blocker, "namespace": ns },
            "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": blocker } } }
        }))
        .expect("pdb");
        let papi: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), ns);
        papi.create(&PostParams::default(), &pdb)
            .await
            .unwrap_or_else(|e| panic!("creating PDB {blocker}: {e}"));
        ttdrv_testkit::wait_for(
            &format!("PDB {blocker} protecting a running pod"),
            Duration::from_secs(60),
            || async {
                let p = papi.get(&blocker).await.map_err(|e| e.to_string())?;
                let st = p.status.unwrap_or_default();
                if st.current_healthy >= 1 && st.disruptions_allowed == 0 {
                    Ok(())
                } else {
                    Err(format!("{st:?}"))
                }
            },
        )
        .await;
        victim = Some(v);
    }

    if kind == Kind::LeaderHandover {
        // A leader and a standby sharing one Lease.
        ctl.lock().await.replace_all(env, true, 2);
    }
    // Drawn here for every kind (after the older kinds' draws below would
    // change their seeds' schedules, so it is drawn from its own stream).
    let fw_faults =
        crate::firmware::FirmwareFaults::draw(&mut StdRng::seed_from_u64(seed ^ 0xF1A5));
    let mut fw_victim = None;
    if kind == Kind::FirmwareWave {
        let admin = inv.lock().admin.clone();
        fw_victim = Some(crate::firmware::start(env, index, &admin, &fw_faults).await);
    }
    // The rule kinds' faults, from a stream of their own too.
    let rule_faults = crate::rules::RuleFaults::draw(&mut StdRng::seed_from_u64(seed ^ 0x5E1E));
    if rule_faults.leader_elect(kind) {
        ctl.lock().await.replace_all(env, true, 2);
    }
    let timeline = crate::rules::RULE_KINDS
        .contains(&kind)
        .then(|| crate::rules::Timeline::spawn(env, policy));
    let mut bump = serde_json::json!({ "version": target, "paused": false });
    if let Some(up) = rule_faults.bump(kind) {
        bump["upgradePolicy"] = up;
    }
    let promo = crate::promotion::PromotionFaults::draw(&mut StdRng::seed_from_u64(seed ^ 0x960E));
    let mut canary = crate::promotion::Canary::default();
    if kind == Kind::PromotionWait {
        let admin = inv.lock().admin.clone();
        canary = crate::promotion::start(env, policy, index, &admin, &target, &promo, inv).await;
        bump["promoteAfter"] = promo.promote_after(env, index);
    }
    set_spec(env, policy, bump).await;

    // Fault schedule, drawn from the seed before anything runs.
    let n_kills = rng.random_range(2..=3usize);
    let mut kill_at: Vec<u64> = (0..n_kills)
        .map(|_| rng.random_range(300..20_000))
        .collect();
    kill_at.sort_unstable();
    let kill_downtime: Vec<u64> = (0..n_kills).map(|_| rng.random_range(0..1500)).collect();
    let api_at = rng.random_range(1_000..10_000u64);
    let api_hard = rng.random_bool(0.5);
    let api_down = rng.random_range(200..3_000u64);
    let add_at = rng.random_range(500..10_000u64);
    let change_at = rng.random_range(1_000..12_000u64);
    let toggles: Vec<(u64, u64)> = (0..rng.random_range(3..=6))
        .map(|_| (rng.random_range(300..3_000), rng.random_range(200..2_500)))
        .collect();
    // Half the kills wait for a node to enter a given state and strike at once:
    // the moments between a persisted transition and the next step. The
    // cordon is written with the Draining record and the uncordon with Done
    // (one patch each), so those are the records right after them; the draws
    // are as they were, so an old seed replays the same schedule.
    let kill_when: Vec<Option<&'static str>> = (0..n_kills)
        .map(|_| {
            rng.random_bool(0.5)
                .then(|| ["Draining", "Draining", "Upgrading", "Done"][rng.random_range(0..4)])
        })
        .collect();
    // The newer kinds' schedules, drawn after the older ones' so that an old
    // seed still replays the same schedule for its kind.
    let schedule = crate::faults::Schedule::draw(&mut rng);

    // Controller kills run alongside the kind's own fault.
    let kills_task = {
        let ctl = ctl.clone();
        let env_client_env = TestEnv {
            client: env.client.clone(),
            id: env.id.clone(),
        };
        tokio::spawn(async move {
            let t0 = Instant::now();
            let mut log = vec![];
            let napi: Api<Node> = Api::all(env_client_env.client.clone());
            let lp = ListParams::default().labels(&env_client_env.selector());
            for ((at, down), when) in kill_at.iter().zip(kill_downtime).zip(kill_when) {
                let wait = Duration::from_millis(*at).saturating_sub(t0.elapsed());
                tokio::time::sleep(wait).await;
                let mut trigger = String::new();
                if let Some(state) = when {
                    // Strike as soon as some node's persisted state is `state` (up to 6 s;
                    // the rollout may be over by then).
                    let until = Instant::now() + Duration::from_secs(6);
                    while Instant::now() < until {
                        let hit = napi.list(&lp).await.ok().and_then(|l| {
                            l.items.into_iter().find_map(|n| {
                                (record_state(&n).as_deref() == Some(state))
                                    .then(|| n.metadata.name.unwrap_or_default())
                            })
                        });
                        if let Some(n) = hit {
                            trigger = format!(" as {n} was {state}");
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    if trigger.is_empty() {
                        trigger = format!(" (no node reached {state})");
                    }
                }
                let at_ms = t0.elapsed().as_millis();
                let mut c = ctl.lock().await;
                let who = c.kill_acting(&env_client_env).await;
                let leader_elect = c.leader_elect;
                drop(c);
                tokio::time::sleep(Duration::from_millis(down)).await;
                ctl.lock().await.restore(&env_client_env);
                match who {
                    Some(who) => {
                        if leader_elect {
                            trigger.push_str(&format!(", {who}"));
                        }
                        log.push(format!(
                            "SIGKILL controller at {at_ms}ms{trigger} (down {down}ms)"
                        ));
                    }
                    None => log.push(format!(
                        "no controller to SIGKILL at {at_ms}ms{trigger}: another fault's restart was pending"
                    )),
                }
            }
            log
        })
    };

    match kind {
        Kind::Kills | Kind::LeaderHandover => {}
        Kind::ApiserverRestart => {
            tokio::time::sleep(Duration::from_millis(api_at)).await;
            let Some(api) = api else {
                panic!("an API-server restart needs the chaos cluster");
            };
            match restart_apiserver(env, api, api_hard, Duration::from_millis(api_down)).await {
                Ok(took) => faults.push(format!(
                    "kube-apiserver {} at {api_at}ms, back after {}ms",
                    if api_hard { "SIGKILLed" } else { "SIGTERMed" },
                    took.as_millis()
                )),
                Err(e) => inv.violation(format!("could not restart the API server: {e}")),
            }
            faults.extend(crate::apiserver::refresh_control_plane(api).await);
        }
        Kind::DeleteDraining => {
            let v = victim.clone().unwrap_or_default();
            let napi: Api<Node> = Api::all(env.client.clone());
            let t = Instant::now();
            let mut deleted = false;
            while t.elapsed() < SETTLE {
                if let Ok(n) = napi.get(&v).await
                    && record_state(&n).as_deref() == Some("Draining")
                {
                    let dp = DeleteParams::default();
                    retrying(&format!("deleting node {v}"), || napi.delete(&v, &dp)).await;
                    faults.push(format!(
                        "node {v} deleted while Draining, {}ms into the rollout",
                        start.elapsed().as_millis()
                    ));
                    deleted = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if !deleted {
                inv.violation(format!("node {v} never reached Draining"));
            }
        }
        Kind::AddNode => {
            tokio::time::sleep(Duration::from_millis(add_at)).await;
            let n = env.tt_node(&format!("x{index}"), &[]).await;
            faults.push(format!(
                "node {} added at {add_at}ms",
                n.metadata.name.unwrap_or_default()
            ));
        }
        Kind::VersionChange => {
            tokio::time::sleep(Duration::from_millis(change_at)).await;
            final_version = format!("3.{index}.1");
            set_spec(env, policy, serde_json::json!({ "version": final_version })).await;
            faults.push(format!(
                "version changed {target} -> {final_version} at {change_at}ms"
            ));
        }
        Kind::PauseToggle => {
            for (gap, pause) in &toggles {
                tokio::time::sleep(Duration::from_millis(*gap)).await;
                set_spec(env, policy, serde_json::json!({ "paused": true })).await;
                tokio::time::sleep(Duration::from_millis(*pause)).await;
                set_spec(env, policy, serde_json::json!({ "paused": false })).await;
            }
            faults.push(format!("paused/unpaused {} times", toggles.len()));
        }
        Kind::NotReadyFlap => {
            faults.extend(crate::faults::not_ready_flaps(env, &target, &schedule.flaps).await);
        }
        Kind::FleetNotReady => {
            faults.extend(crate::faults::fleet_not_ready(env, &target, &schedule.fleet).await);
        }
        Kind::InstallerPodDeleted => {
            faults.extend(
                crate::faults::delete_installer_pods(env, ns, &target, &schedule.deletions).await,
            );
        }
        Kind::Relabel => {
            faults.extend(crate::faults::relabel(env, &target, &schedule.relabels).await);
        }
        Kind::FirmwareWave => {
            let victim = fw_victim.clone().unwrap_or_default();
            faults.extend(crate::firmware::faults(env, ctl, &victim, &fw_faults).await);
        }
        Kind::PromotionWait => {
            if let Some(tl) = &timeline {
                faults.extend(
                    crate::promotion::faults(
                        env, policy, ctl, inv, tl, index, &target, &canary, &promo,
                    )
                    .await,
                );
            }
        }
        Kind::SoakKill | Kind::WindowClose | Kind::RefusedSpec => {
            if let Some(tl) = &timeline {
                let out = crate::rules::faults(
                    env,
                    ns,
                    policy,
                    ctl,
                    inv,
                    tl,
                    kind,
                    index,
                    &target,
                    &rule_faults,
                )
                .await;
                faults.extend(out.log);
                if let Some(v) = out.final_version {
                    final_version = v;
                }
            }
        }
    }
    let kill_log = kills_task.await.unwrap_or_default();
    faults.extend(kill_log);
    {
        let mut c = ctl.lock().await;
        let running = c.any_running();
        if !running {
            inv.violation("controller not running at the end of the fault schedule".into());
            // A process that died on its own: gone, not a fault's kill.
            c.procs.clear();
            c.restore(env);
        }
    }

    let outcome = wait_settled(env, policy, &final_version, SETTLE).await;
    if let Ok(took) = &outcome {
        faults.push(format!(
            "settled {}ms after the faults, {}ms into the rollout",
            took.as_millis(),
            start.elapsed().as_millis()
        ));
    }
    let mut ok = true;
    match outcome {
        Ok(_) => {
            let admin = inv.lock().admin.clone();
            let papi: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
            let p = retrying("reading the policy", || papi.get(policy)).await;
            let nodes = test_nodes(env).await;
            final_checks(
                &nodes,
                &admin,
                &final_version,
                inv,
                &p,
                kind.requires_done(),
            );
            if kind == Kind::Relabel {
                back_in_policy(&nodes, policy, inv);
            }
            if kind == Kind::FirmwareWave {
                faults.extend(crate::firmware::finish(env, index, &admin, inv).await);
            }
            if let Some(tl) = &timeline {
                faults.extend(
                    crate::rules::finish(env, policy, inv, tl, kind, &target, &rule_faults).await,
                );
            }
        }
        Err(e) => {
            ok = false;
            inv.violation(format!("rollout to {final_version} did not complete: {e}"));
        }
    }
    if kind == Kind::LeaderHandover || rule_faults.leader_elect(kind) {
        ctl.lock().await.replace_all(env, false, 1);
    }
    if kind == Kind::DeleteDraining {
        let dapi: Api<Deployment> = Api::namespaced(env.client.clone(), ns);
        let _ = dapi.delete(&blocker, &DeleteParams::default()).await;
        let papi: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), ns);
        let _ = papi.delete(&blocker, &DeleteParams::default()).await;
    }
    *version = final_version;
    let kills = ctl.lock().await.kills - kills_before;
    inv.settle().await;
    let (violations, max_ours, max_total, max_ready_ours, swaps) = {
        let s = inv.lock();
        (
            s.violations.len() - before,
            s.max_ours,
            s.max_total,
            s.max_ready_ours,
            s.swaps,
        )
    };
    TrialResult {
        index,
        kind,
        seed,
        kills,
        faults,
        duration: start.elapsed(),
        max_ours,
        max_total,
        max_ready_ours,
        swaps,
        violations,
        ok: ok && violations == 0,
        settled: ok,
    }
}
