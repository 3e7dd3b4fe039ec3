//! One reconcile pass of a policy, detached from the PolicySupervisor so it
//! runs as a future: claims and releases nodes, ensures the DaemonSet, then in
//! rounds observes the nodes in scope, tells the RolloutActor what changed and
//! steps the NodeActors (those it lets ask for a slot included).

use k8s_openapi::api::apps::v1::DaemonSet;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::NodeState;
use ttdrv_api::{PodSelector, TenstorrentDriverPolicy, labels};
use ttdrv_core::limits::PassLimits;
use ttdrv_core::machine::{Desired, Hold, NodeRecord};
use ttdrv_core::prepare;
use ttdrv_core::rollout::{Candidate, Plan};
use ttdrv_core::window::Window;

use crate::policy_decisions::Refused;
use crate::refusal::{Apply, Refusal, RefusalKind};
use ttdrv_core::selection::Assignment;

use super::ports::{SupervisorPorts, node_label, now_secs, owns};
use crate::driver::node::{NodeActor, Observe};
use crate::driver::rollout::{PlanRollout, RolloutActor};
use crate::observe::{NodeView, ObserveInput, PolicyFacts};
use crate::render::daemonset_name;
use crate::runtime::claims::Budget;
use crate::runtime::context::Context;
use crate::workers::renderer::Ensure;
use crate::{Error, Result};

/// What a pass hands back to its supervisor.
pub(super) struct PassOut {
    /// Records after each NodeActor's step.
    pub(super) updates: Vec<(String, NodeRecord)>,
    /// Nodes stepped in this pass.
    pub(super) stepped: Vec<String>,
    /// Whether each observed node has pods using the device.
    pub(super) device_users: Vec<(String, bool)>,
    pub(super) plan: Plan,
    /// What the cluster refused about the policy in this pass, if anything.
    pub(super) refused: Option<Refused>,
    /// First error of the pass (the other nodes' steps go on past it).
    pub(super) err: Option<Error>,
}

/// One reconcile pass: what it needs, detached from the actor so it can run
/// as a future.
pub(super) struct ReconcilePass {
    pub(super) ctx: Arc<Context>,
    pub(super) policy: Arc<TenstorrentDriverPolicy>,
    pub(super) assignment: Arc<Assignment>,
    pub(super) full: bool,
    pub(super) actors: Arc<HashMap<String, Addr<NodeActor>>>,
    pub(super) records: Arc<HashMap<String, NodeRecord>>,
    pub(super) rollout: Addr<RolloutActor>,
    pub(super) ports: SupervisorPorts,
    /// Apply the DaemonSet in this pass, or keep backing off.
    pub(super) apply: Apply,
    /// The refusal standing from earlier passes (kept while backing off).
    pub(super) refusal: Option<Refusal>,
    /// The hold on new cycles while the canary (`spec.promoteAfter`) is not
    /// promoted yet, if it is not ([`ttdrv_core::promotion::Gate::hold`]).
    pub(super) promotion: Option<ttdrv_core::machine::Hold>,
    /// The supervisor's last check of the validation PodTemplate.
    pub(super) template_check: Arc<std::sync::Mutex<Option<CheckedTemplate>>>,
    /// Build-ahead's view of every owned node, kept between passes.
    pub(super) prepare: Arc<std::sync::Mutex<PrepareBook>>,
}

/// A step sent to a node's actor, its reply to come.
struct SentStep {
    node: String,
    /// The node as observed, for its slot facts after the step.
    facts: NodeView,
    reply: actix::dev::Request<NodeActor, Observe>,
}

/// Build-ahead's candidates ([`ttdrv_core::prepare::Candidate`]) of every
/// owned node, kept between passes so that a targeted pass re-reads only
/// the nodes in its scope instead of every owned node (at 1000 nodes that
/// walk was most of a pass). Every change of a candidate's facts (its
/// installer pod, its labels, its readiness, its record's state) comes with
/// a watch event naming the node, or with a full pass, which rebuilds it.
#[derive(Debug, Default)]
pub(super) struct PrepareBook {
    /// A full walk filled it since the fleet last settled.
    primed: bool,
    /// Candidates in the rollout's order (sort key, then the candidate);
    /// nodes with nothing to build ahead are absent. Ordered as kept, so a
    /// pass does not sort every owned node again.
    candidates: BTreeMap<(bool, String), prepare::Candidate>,
    /// Each node's sort key in `candidates`.
    keys: HashMap<String, (bool, String)>,
}

impl PrepareBook {
    /// Takes the node's candidate (None: nothing to build ahead there).
    fn put(&mut self, node: &str, c: Option<((bool, String), prepare::Candidate)>) {
        if let Some(old) = self.keys.remove(node) {
            self.candidates.remove(&old);
        }
        if let Some((key, c)) = c {
            self.keys.insert(node.to_string(), key.clone());
            self.candidates.insert(key, c);
        }
    }
}

/// A check of the validation PodTemplate, held for
/// [`crate::validation_pod::CHECK_HOLDS`].
#[derive(Clone, Debug)]
pub(super) struct CheckedTemplate {
    name: String,
    at: std::time::Instant,
    outcome: crate::validation_pod::TemplateCheck,
}

/// Rounds of slot hand-over within one pass: a node reaching Done frees a
/// slot, and the next node starts in the same pass instead of waiting for the
/// watch to echo the Done back.
const MAX_ROUNDS: usize = 3;

/// The spec as the controller reads it, and why it refuses it, if it does.
struct ReadSpec {
    /// `podSelectorLabel` parsed; `None` when it does not parse.
    selector: Option<PodSelector>,
    /// The maintenance windows; none when they do not parse.
    windows: Vec<Window>,
    refused: Option<Refused>,
}

/// A refusal of the spec by the controller, before anything is applied.
fn refusal(message: String) -> Refused {
    Refused {
        kind: RefusalKind::Refused,
        message,
        attempted: false,
    }
}

/// What every round of a pass reads.
struct RoundFacts<'a> {
    input: &'a ObserveInput<'a>,
    windows: &'a [Window],
    /// Done records read back from Nodes this controller has not stepped.
    recovered: &'a [(String, NodeRecord)],
    refused: bool,
    template_observed: bool,
}

/// What the rounds of a pass carry from one to the next, and hand back.
#[derive(Default)]
struct Rounds {
    /// Nodes observed for the next step.
    views: Vec<(String, NodeView)>,
    /// Slot facts for the next plan.
    candidates: Vec<Candidate>,
    updates: HashMap<String, NodeRecord>,
    device_users: Vec<(String, bool)>,
    stepped: HashSet<String>,
    hold: Option<Hold>,
    first_err: Option<Error>,
}

impl Rounds {
    /// Nodes the plan lets ask for a slot: observed with their drain plan
    /// (they may cordon and enter Draining within one step). Those not
    /// stepped yet (this pass, or an earlier one whose step failed) join
    /// this round.
    fn offer(&mut self, input: &ObserveInput<'_>, granted: &[String], offered: &HashSet<&str>) {
        let queued: HashSet<&str> = self.views.iter().map(|(n, _)| n.as_str()).collect();
        let fresh: Vec<String> = granted
            .iter()
            .filter(|n| !self.stepped.contains(*n) && !queued.contains(n.as_str()))
            .cloned()
            .collect();
        let replan: Vec<String> = self
            .views
            .iter()
            .filter(|(n, v)| offered.contains(n.as_str()) && v.obs.drain.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        if !replan.is_empty() {
            self.views.retain(|(n, _)| !replan.contains(n));
            self.views.extend(observe(input, &replan, offered));
        }
        if !fresh.is_empty() {
            self.views.extend(observe(input, &fresh, offered));
        }
    }
}

/// Observes `nodes` (those `starting` with their drain plan); nodes not in
/// the caches are left out.
fn observe(
    input: &ObserveInput<'_>,
    nodes: &[String],
    starting: &HashSet<&str>,
) -> Vec<(String, NodeView)> {
    nodes
        .iter()
        .filter_map(|n| Some((n.clone(), input.node(n, starting.contains(n.as_str()))?)))
        .collect()
}

impl ReconcilePass {
    pub(super) fn name(&self) -> &str {
        self.policy.metadata.name.as_deref().unwrap_or_default()
    }

    /// Why the policy's validation pod cannot be made, if it cannot: its
    /// PodTemplate read at most once per [`crate::validation_pod::CHECK_HOLDS`].
    async fn validation_refusal(&self) -> Option<String> {
        use crate::validation_pod::{CHECK_HOLDS, TemplateCheck, check};
        let template = self
            .policy
            .spec
            .upgrade_policy
            .validation
            .pod_template_name
            .as_deref()?;
        let now = std::time::Instant::now();
        let held = self
            .template_check
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|c| c.name == template && now.duration_since(c.at) < CHECK_HOLDS);
        let outcome = match held {
            Some(c) => c.outcome,
            None => {
                let ns = &self.ctx.config.namespace;
                let outcome = check(self.ctx.client.clone(), template, ns, &self.policy).await;
                if !matches!(outcome, TemplateCheck::Unknown(_))
                    && let Ok(mut c) = self.template_check.lock()
                {
                    *c = Some(CheckedTemplate {
                        name: template.to_string(),
                        at: now,
                        outcome: outcome.clone(),
                    });
                }
                outcome
            }
        };
        match outcome {
            TemplateCheck::Usable => None,
            TemplateCheck::Unusable(why) => Some(why),
            TemplateCheck::Unknown(why) => {
                tracing::debug!(
                    policy = self.name(),
                    error = why,
                    "validation template not checked"
                );
                None
            }
        }
    }

    pub(super) fn owned(&self) -> &[String] {
        self.assignment
            .owned
            .get(self.name())
            .map_or(&[], Vec::as_slice)
    }

    /// One pass, in order: the spec read, the DaemonSet ensured, nodes
    /// claimed and released, then rounds of plan and step.
    pub(super) async fn run(&self, targets: Vec<String>, strays: Vec<String>) -> Result<PassOut> {
        let ctx = &self.ctx;
        ctx.metrics
            .set_desired_version(self.name(), &self.policy.spec.version);
        let read = self.read_spec().await;
        let (hash, refused) = match read.refused {
            // The DaemonSet stays as the last accepted spec left it.
            Some(r) => (self.cached_hash(), Some(r)),
            None => self.ensure_daemonset().await?,
        };
        // A stale installer pod is replaced only once the DaemonSet
        // controller has seen the current template: before, its replacement
        // would come back stale (and be replaced again, at API speed).
        let template_observed =
            ttdrv_core::installer::template_observed(self.cached_daemonset().as_deref(), &hash);
        let mut first_err = None;
        let targets = self
            .claim_targets(targets, refused.is_some(), &mut first_err)
            .await?;
        if let Some(e) = self.release(&strays).await? {
            first_err.get_or_insert(e);
        }
        self.clear_stale_labels(&targets).await;
        self.clear_stale_go_marks(&targets).await;
        self.clear_unmanaged_marks(&targets).await;
        let now = now_secs();
        let recovered = self.recovered(&targets);
        let desired = self.desired(&read.windows, &recovered, refused.is_some(), now);
        let (gates, drain_exempt) = (ctx.config.gates(), ctx.config.drain_exempt_namespaces());
        let daemon_sets = ctx.stores.all_daemon_sets.snapshot();
        let surface = ctx.config.surface();
        let input = ObserveInput {
            stores: &ctx.stores,
            policy: PolicyFacts {
                desired: &desired,
                drain: &self.policy.spec.upgrade_policy.drain,
                namespace: &ctx.config.namespace,
                drain_exempt: &drain_exempt,
                template_hash: &hash,
                selector: read.selector.as_ref(),
                gates: &gates,
                daemon_sets: &daemon_sets,
                now,
                prepare_deadline_seconds: ctx.config.upgrade_timeout_seconds,
                surface: &surface,
            },
            records: &self.records,
            pdbs: Default::default(),
            examined: Default::default(),
        };
        let facts = RoundFacts {
            input: &input,
            windows: &read.windows,
            recovered: &recovered,
            refused: refused.is_some(),
            template_observed,
        };
        let mut rounds = Rounds {
            hold: desired.hold.clone(),
            first_err,
            ..Default::default()
        };
        self.first_views(&facts, &targets, &strays, &mut rounds);
        let (mut plan, limits) = self.rounds(&facts, &mut rounds).await?;
        ctx.metrics
            .observe_nodes_examined(self.name(), self.full, input.examined.borrow().len());
        if let Some(h) = &rounds.hold {
            plan.blocked = Some(h.why.clone());
            plan.held = Some(h.reason);
            // Not the 0 that holds new starts: the policy's budget.
            plan.max_unavailable = limits.reported;
        }
        Ok(PassOut {
            updates: rounds.updates.into_iter().collect(),
            stepped: rounds.stepped.into_iter().collect(),
            device_users: rounds.device_users,
            plan,
            refused,
            err: rounds.first_err,
        })
    }

    /// The spec's own errors first, before anything of it is applied: a
    /// refused spec changes nothing the last accepted one set up (its
    /// DaemonSet, hence its installer pods), and nothing new starts.
    async fn read_spec(&self) -> ReadSpec {
        let upgrade = &self.policy.spec.upgrade_policy;
        let mut refused = None;
        // A selector the controller cannot parse: no drain can be planned.
        let selector = match PodSelector::parse(&upgrade.drain.pod_selector_label) {
            Ok(s) => Some(s),
            Err(e) => {
                refused = refused.or(Some(refusal(format!(
                    "spec.upgradePolicy.drain.podSelectorLabel: {e}"
                ))));
                None
            }
        };
        // Windows the controller cannot read (an unknown time zone).
        let windows = match ttdrv_core::window::parse(&upgrade.maintenance_windows) {
            Ok(w) => w,
            Err(e) => {
                refused = refused.or(Some(refusal(format!("spec.{e}"))));
                Vec::new()
            }
        };
        // A validation that cannot run: refused before any node is cordoned
        // for it, not found after each node's swap.
        if refused.is_none()
            && let Some(message) = self.validation_refusal().await
        {
            refused = Some(refusal(message));
        }
        ReadSpec {
            selector,
            windows,
            refused,
        }
    }

    /// The targets, claimed. A paused policy claims nothing new (its
    /// DaemonSet would land there), and neither does one the cluster refuses
    /// (it must not capture nodes from a policy that works).
    async fn claim_targets(
        &self,
        mut targets: Vec<String>,
        refused: bool,
        first_err: &mut Option<Error>,
    ) -> Result<Vec<String>> {
        if self.policy.spec.paused || refused {
            return Ok(targets);
        }
        for (n, e) in self.claim(&targets).await? {
            // Its installer cannot land unclaimed: a node not yet in a
            // cycle is not started; one mid-cycle (its claim label
            // removed by hand) goes on, deadlines included.
            let mid_cycle = self
                .records
                .get(&n)
                .is_some_and(|r| r.state.is_in_progress());
            if !mid_cycle {
                targets.retain(|t| *t != n);
            }
            tracing::warn!(policy = self.name(), node = n, error = %e, mid_cycle, "claim failed; retried by a later pass");
            first_err.get_or_insert(e);
        }
        Ok(targets)
    }

    /// The soak is decided from what survives this controller: a node this
    /// one has not stepped yet (a new leader, a restart) counts with the
    /// record persisted on it, or the next node would start mid-soak. Only
    /// nodes missing from memory are read: after a restart's first pass,
    /// none.
    fn recovered(&self, targets: &[String]) -> Vec<(String, NodeRecord)> {
        let name = self.name();
        targets
            .iter()
            .filter(|n| !self.records.contains_key(*n))
            .filter_map(|n| {
                let node = self.ctx.stores.nodes.get(&ObjectRef::new(n))?;
                crate::observe::persisted_record(&node)
                    .filter(|r| r.policy == name && r.state == NodeState::Done)
                    .map(|r| (n.clone(), r))
            })
            .collect()
    }

    /// What the policy wants of its nodes in this pass.
    fn desired(
        &self,
        windows: &[Window],
        recovered: &[(String, NodeRecord)],
        refused: bool,
        now: i64,
    ) -> Desired {
        let (ctx, policy, spec) = (&self.ctx, &self.policy, &self.policy.spec);
        let desired = Desired {
            // The canary first: a soak or a window only matters once the
            // promotion is open.
            // A hand-back first: it must hold every other start too.
            hold: ttdrv_core::rollout::handback_hold(policy)
                .or_else(|| self.promotion.clone())
                .or_else(|| {
                    ttdrv_core::rollout::hold(
                        windows,
                        self.records
                            .iter()
                            .chain(recovered.iter().map(|(n, r)| (n, r))),
                        &spec.version,
                        spec.upgrade_policy.soak_seconds,
                        now,
                    )
                }),
            refused: false,
            // Only while this controller runs the firmware policies: a flash
            // record left by a firmware controller that is off would hold
            // the swap for ever.
            combine_with_firmware: ctx.config.combine_firmware_and_driver && ctx.config.firmware,
            surface_timeout_seconds: ctx.config.scheduling_surface_timeout_seconds,
            ..Desired::of(policy, ctx.config.upgrade_timeout_seconds)
        };
        if refused {
            let deployed = self.cached_daemonset();
            desired.refused_keeping(ttdrv_core::installer::deployed_target(deployed.as_deref()))
        } else {
            desired
        }
    }

    /// The limits a plan keeps ([`ttdrv_core::limits::of`]).
    fn limits(&self, refused: bool, held: bool) -> PassLimits {
        ttdrv_core::limits::of(&ttdrv_core::limits::Facts {
            policy: &self.policy.spec.upgrade_policy,
            owned: self.owned().len(),
            refused,
            held,
            brake_percent: self.ctx.config.not_ready_brake_percent,
        })
    }

    /// The first round's views and slot facts: the targets, the strays
    /// still held by this policy, and the nodes whose turn it is to build
    /// ahead.
    fn first_views(
        &self,
        f: &RoundFacts<'_>,
        targets: &[String],
        strays: &[String],
        st: &mut Rounds,
    ) {
        st.views = observe(f.input, targets, &HashSet::new());
        st.candidates = st
            .views
            .iter()
            .map(|(n, v)| v.candidate(n, self.records.get(n).or(v.persisted.as_ref())))
            .collect();
        st.candidates.extend(self.held_strays(strays));
        let desired = f.input.policy.desired;
        if desired.prepare && !desired.paused && !desired.refused && f.template_observed {
            let turn = self.plan_prepare(f.input, targets);
            let unseen: Vec<String> = turn
                .iter()
                .filter(|n| !st.views.iter().any(|(v, _)| v == *n))
                .cloned()
                .collect();
            st.views.extend(observe(f.input, &unseen, &HashSet::new()));
            for (n, v) in st.views.iter_mut() {
                v.obs.prepare_turn = turn.contains(n);
            }
        } else if let Ok(mut book) = self.prepare.lock() {
            // Not kept up to date meanwhile: the next plan walks every node.
            *book = PrepareBook::default();
        }
    }

    /// Rounds of plan and step, until no node is left to step or
    /// [`MAX_ROUNDS`]. Returns the last plan and the limits it kept.
    async fn rounds(&self, f: &RoundFacts<'_>, st: &mut Rounds) -> Result<(Plan, PassLimits)> {
        let mut replace = self.full;
        let mut round = 0;
        loop {
            // A node that became Done in the round before starts its soak
            // now: the hold is read again, or the slot it freed would go to
            // the next node at once.
            if round > 0 && st.hold.is_none() {
                st.hold = self.hold_again(f, &st.updates);
            }
            let limits = self.limits(f.refused, st.hold.is_some());
            let planned = self
                .rollout
                .send(PlanRollout {
                    replace,
                    updates: std::mem::take(&mut st.candidates),
                    limits: limits.limits,
                })
                .await?;
            replace = false;
            let offered: HashSet<&str> = planned.plan.granted.iter().map(String::as_str).collect();
            st.offer(f.input, &planned.plan.granted, &offered);
            if st.views.is_empty() || round == MAX_ROUNDS {
                return Ok((planned.plan, limits));
            }
            round += 1;
            self.step(f, st, &offered, &planned.budget).await;
        }
    }

    /// The hold over the records as they are after the last round.
    fn hold_again(
        &self,
        f: &RoundFacts<'_>,
        updates: &HashMap<String, NodeRecord>,
    ) -> Option<Hold> {
        let spec = &self.policy.spec;
        let merged = self
            .records
            .iter()
            .chain(f.recovered.iter().map(|(n, r)| (n, r)))
            .filter(|(n, _)| !updates.contains_key(*n))
            .chain(updates.iter());
        ttdrv_core::rollout::hold(
            f.windows,
            merged,
            &spec.version,
            spec.upgrade_policy.soak_seconds,
            f.input.policy.now,
        )
    }

    /// Steps the NodeActor of every node in view. Nodes out of service
    /// (mid-cycle, or granted a slot) first, all at once, and their records
    /// feed the next round's plan. Then the others (build-ahead's turns,
    /// nodes waiting): a targeted pass does not wait for them, so neither
    /// the next round nor the policy's next pass, which may carry a cycling
    /// node's next step, queues behind their pod replacements and writes.
    /// None of them can take a node out of service (no slot); their records
    /// come back through the NodeActors' [`RecordBoard`]. A full pass waits
    /// for every step, so its memory and status cover every node.
    ///
    /// [`RecordBoard`]: crate::driver::node::RecordBoard
    async fn step(
        &self,
        f: &RoundFacts<'_>,
        st: &mut Rounds,
        offered: &HashSet<&str>,
        budget: &Arc<Budget>,
    ) {
        let desired = Desired {
            hold: st.hold.clone(),
            ..f.input.policy.desired.clone()
        };
        let (first, later): (Vec<_>, Vec<_>) = std::mem::take(&mut st.views)
            .into_iter()
            .partition(|(n, _)| offered.contains(n.as_str()) || self.out_of_service(n, st));
        let sent = self.send_steps(f, st, first, offered, budget, &desired);
        self.take_replies(st, sent).await;
        let sent = self.send_steps(f, st, later, offered, budget, &desired);
        if self.full {
            self.take_replies(st, sent).await;
        } else {
            self.replies_in_background(sent);
        }
    }

    /// Sends each node of `batch` its observation, at once: each NodeActor
    /// steps in the order its observations were sent.
    fn send_steps(
        &self,
        f: &RoundFacts<'_>,
        st: &mut Rounds,
        batch: Vec<(String, NodeView)>,
        offered: &HashSet<&str>,
        budget: &Arc<Budget>,
        desired: &Desired,
    ) -> Vec<SentStep> {
        let mut sent = Vec::new();
        for (n, v) in batch {
            let Some(addr) = self.actors.get(&n) else {
                continue;
            };
            st.stepped.insert(n.clone());
            st.device_users.push((n.clone(), v.has_device_pods));
            let facts = v.clone();
            // The plan reserved a slot for each node it granted: the node
            // steps on it (and gives it back if the step does not use it).
            let mut obs = v.obs;
            obs.slot = offered.contains(n.as_str());
            obs.template_pending = !f.template_observed;
            let msg = Observe {
                policy: self.policy.clone(),
                obs,
                desired: desired.clone(),
                persisted: v.persisted,
                evictions: v.evictions,
                installer_pod: v.installer_pod,
                skipped: v.skipped,
                gates: f.input.policy.gates.to_vec(),
                budget: budget.clone(),
            };
            // Queued in the actor's mailbox now, not when first polled.
            let reply = addr.send(msg);
            sent.push(SentStep {
                node: n,
                facts,
                reply,
            });
        }
        sent
    }

    /// Waits for the steps sent; their records feed the next plan.
    async fn take_replies(&self, st: &mut Rounds, sent: Vec<SentStep>) {
        let replies = sent
            .into_iter()
            .map(|s| async move { (s.node, s.facts, s.reply.await) });
        for (n, facts, res) in futures::future::join_all(replies).await {
            match res.map_err(Error::from).and_then(|r| r) {
                Ok(rec) => {
                    st.candidates.push(facts.candidate(&n, Some(&rec)));
                    st.updates.insert(n, rec);
                }
                Err(e) => {
                    tracing::warn!(policy = self.name(), node = n, error = %e, "node step failed; will retry");
                    st.first_err.get_or_insert(e);
                }
            }
        }
    }

    /// The steps sent, ended after the pass: a failure is logged and
    /// counted, and retried by the next pass that looks at the node, as a
    /// failed step the pass waited for is.
    fn replies_in_background(&self, sent: Vec<SentStep>) {
        if sent.is_empty() {
            return;
        }
        let (policy, metrics) = (self.name().to_string(), self.ctx.metrics.clone());
        actix::spawn(async move {
            let replies = sent
                .into_iter()
                .map(|s| async move { (s.node, s.reply.await) });
            for (n, res) in futures::future::join_all(replies).await {
                if let Err(e) = res.map_err(Error::from).and_then(|r| r) {
                    metrics.inc_error(&policy, e.metric_label());
                    tracing::warn!(policy, node = n, error = %e, "node step failed; will retry");
                }
            }
        });
    }

    /// Node `n` is mid-cycle as this pass last knows it.
    fn out_of_service(&self, n: &str, st: &Rounds) -> bool {
        st.updates
            .get(n)
            .or_else(|| self.records.get(n))
            .is_some_and(|r| r.state.is_in_progress())
    }

    /// Nodes this policy no longer owns (a skip label, a relabel, another
    /// policy's claim) that are still out of service because of it: its
    /// record there holds a slot, or its cordon is still on. Until their
    /// release lands they count against `maxUnavailable` as a cycle of ours
    /// (every node on a full pass, which replaces what the budget knows; the
    /// changed ones otherwise).
    fn held_strays(&self, strays: &[String]) -> Vec<Candidate> {
        let name = self.name();
        let nodes: Vec<Arc<Node>> = if self.full {
            self.ctx.stores.nodes.state_filter(|nd| {
                let n = nd.metadata.name.as_deref().unwrap_or_default();
                !owns(self.owned(), n) && ttdrv_core::observe::held_by(name, nd)
            })
        } else {
            strays
                .iter()
                .filter_map(|n| self.ctx.stores.nodes.get(&ObjectRef::new(n)))
                .collect()
        };
        let stray = |nd: &Arc<Node>| ttdrv_core::observe::stray_candidate(name, nd);
        nodes.iter().map(stray).collect()
    }

    /// Build-ahead: the nodes whose stale installer pod is replaced in this
    /// pass, at most `prepare.maxConcurrent` nodes building at once, in the
    /// rollout's order. Counted over every owned node (a pass may look at a
    /// few only), from the [`PrepareBook`]: a full pass reads every owned
    /// node into it, a targeted one re-reads its `targets` only. A halted
    /// rollout (a node Failed) starts no new build.
    fn plan_prepare(&self, input: &ObserveInput<'_>, targets: &[String]) -> HashSet<String> {
        // Settled (no node Pending, none new): nothing to build; skips the
        // walk over every node on the passes of a fleet at rest.
        let version = &self.policy.spec.version;
        let waiting = self.records.len() < self.owned().len()
            || self
                .records
                .values()
                .any(|r| r.state == NodeState::Pending || r.target != *version);
        let Ok(mut book) = self.prepare.lock() else {
            return HashSet::new();
        };
        if !waiting {
            // Settled: the next rollout starts from a full walk.
            *book = PrepareBook::default();
            return HashSet::new();
        }
        if self.records.values().any(|r| r.state.is_failed()) {
            // Halted: the book is not kept up to date meanwhile.
            book.primed = false;
            return HashSet::new();
        }
        let refresh = if self.full || !book.primed {
            *book = PrepareBook {
                primed: true,
                ..PrepareBook::default()
            };
            self.owned()
        } else {
            targets
        };
        for n in refresh {
            book.put(n, input.prepare_candidate(n));
        }
        let spec = &self.policy.spec;
        let max = usize::try_from(spec.upgrade_policy.prepare.max_concurrent).unwrap_or(1);
        let plan = prepare::plan(book.candidates.values(), max);
        if !plan.replace.is_empty() {
            tracing::info!(
                policy = self.name(),
                nodes = ?plan.replace,
                building = plan.preparing,
                "replacing installer pods to build {} ahead of the cordons",
                spec.version
            );
        }
        plan.replace.into_iter().collect()
    }

    /// The DaemonSet: rendered and applied unless paused (a paused policy leaves
    /// it as is) or backing off from a refusal. Returns the template hash
    /// installer pods must carry, and the refusal if the API server refused
    /// the apply (4xx other than conflict and throttling) or still does.
    async fn ensure_daemonset(&self) -> Result<(String, Option<Refused>)> {
        if self.policy.spec.paused {
            return Ok((self.cached_hash(), None));
        }
        // An image or repository outside the controller's allow-lists is
        // never deployed: refused like an apply the API server refuses.
        let installer = &self.policy.spec.installer;
        if let Err(message) = ttdrv_core::trust::check(
            crate::render::policy_image(&self.policy),
            installer
                .source_repository
                .as_deref()
                .filter(|r| !r.is_empty()),
            &self.ctx.config.allow_list(),
        ) {
            return Ok((
                self.cached_hash(),
                Some(Refused {
                    kind: RefusalKind::Refused,
                    message: crate::refusal::shorten(&message),
                    attempted: false,
                }),
            ));
        }
        if self.apply == Apply::Wait {
            let standing = self.refusal.as_ref().map(|r| Refused {
                kind: r.kind,
                message: r.message.clone(),
                attempted: false,
            });
            return Ok((self.cached_hash(), standing));
        }
        let res = self
            .ports
            .ensure
            .send(Ensure {
                policy: self.policy.clone(),
                retire: self.all_vacated(),
            })
            .await?;
        match res {
            Ok(hash) => Ok((hash, None)),
            Err(e) if !e.is_transient() => Ok((
                self.cached_hash(),
                Some(Refused {
                    kind: if matches!(e, Error::TakingOver { .. }) {
                        RefusalKind::Takeover
                    } else {
                        RefusalKind::Refused
                    },
                    message: e.refusal_message(),
                    attempted: true,
                }),
            )),
            Err(e) => Err(e),
        }
    }

    /// `spec.unmanage` and every owned node carries this policy's
    /// `unmanaged` mark: no node needs the installer DaemonSet any more.
    fn all_vacated(&self) -> bool {
        self.policy.spec.unmanage
            && self.owned().iter().all(|n| {
                self.ctx
                    .stores
                    .nodes
                    .get(&ObjectRef::new(n))
                    .is_some_and(|nd| node_label(&nd, labels::UNMANAGED) == Some(self.name()))
            })
    }

    /// The policy's DaemonSet as the cache holds it.
    fn cached_daemonset(&self) -> Option<Arc<DaemonSet>> {
        let ds_name = daemonset_name(self.name());
        self.ctx
            .stores
            .daemonsets
            .get(&ObjectRef::new(&ds_name).within(&self.ctx.config.namespace))
    }

    /// The template hash of the DaemonSet as the cache has it.
    fn cached_hash(&self) -> String {
        self.cached_daemonset()
            .and_then(|d| {
                d.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(labels::TEMPLATE_HASH).cloned())
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod prepare_book_tests {
    use super::*;

    fn cand(name: &str) -> prepare::Candidate {
        prepare::Candidate {
            name: name.to_string(),
            stale_pod: true,
            prepared: false,
            build_failed: false,
            in_cycle: false,
        }
    }

    fn put(book: &mut PrepareBook, name: &str, first: Option<bool>) {
        book.put(name, first.map(|f| ((f, name.to_string()), cand(name))));
    }

    fn order(book: &PrepareBook) -> Vec<&str> {
        book.candidates.values().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn the_book_keeps_the_rollouts_order_as_nodes_change() {
        let mut book = PrepareBook::default();
        put(&mut book, "c", Some(true));
        put(&mut book, "a", Some(true));
        put(&mut book, "b", Some(false));
        assert_eq!(order(&book), ["b", "a", "c"]);
        // A node whose sort key changes moves; it is not kept twice.
        put(&mut book, "c", Some(false));
        assert_eq!(order(&book), ["b", "c", "a"]);
        // Nothing to build there any more: gone, key and all.
        put(&mut book, "b", None);
        assert_eq!(order(&book), ["c", "a"]);
        assert_eq!(book.keys.len(), 2);
    }
}
