//! The firmware policy controller (TenstorrentFirmwarePolicy, `ttfwp`), on
//! the driver policy's machinery: a supervisor ([`FirmwareManager`]) keeps
//! one [`crate::runtime::policy_actor::PolicyActor`] per policy; each pass of a policy actor
//! observes the nodes it selects, plans its `maxParallel` budget under the
//! driver rollout's rules ([`ttdrv_core::rollout`]: the hard cap,
//! availability, the NotReady brake, the failure halt), and has each node's
//! [`node::NodeActor`] step that node's firmware cycle
//! ([`ttdrv_core::firmware`], the pure machine) and carry out its commands
//! through the same Labeler (every Node write, record and cordon in one
//! patch) and Evictor (the Eviction API, PDBs honoured) as the driver policy.
//! A node's cycle starts only with its claim ([`crate::runtime::claims`]): never while
//! a driver cycle has it, and within its budget counting the other policy's
//! starts.
//!
//! Passes run every `--resync-ms` and on every change of a firmware policy or
//! a flash Job; a policy's pass waits for the one before.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use actix::prelude::*;
use kube::Api;
use ttdrv_api::firmware::{TenstorrentFirmwarePolicy, labels as fw};
use ttdrv_core::firmware::observe::{Selected, selects};

use crate::runtime::claims::Holder;
use crate::runtime::context::Context;
use crate::runtime::policy_actor::{PolicyActor, RunPass, Stop};
use crate::workers::{Evictor, Labeler, PatchNode};

mod clock;
mod jobs;
mod node;
mod patch;
mod policy;
mod seen;
mod shared;
mod status;
mod watches;

use shared::Shared;
pub use status::{conditions, summary};
pub use watches::{FirmwareStores, start_watches};

/// The supervisor: one policy actor per firmware policy served,
/// started when it appears and stopped when it goes; between them, the
/// fleet-wide work (firmware versions metric, stray records).
pub struct FirmwareManager {
    shared: Arc<Shared>,
    policies: HashMap<String, Addr<policy::FwPolicyActor>>,
    /// Nodes whose stray record is kept for a person (logged once); taken
    /// while a pass runs.
    kept: Option<BTreeSet<String>>,
    kicks: Option<tokio::sync::mpsc::Receiver<()>>,
    again: bool,
}

impl FirmwareManager {
    pub fn new(
        ctx: Arc<Context>,
        stores: FirmwareStores,
        kicks: tokio::sync::mpsc::Receiver<()>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                labeler: Labeler::new(ctx.clone()).start(),
                evictor: Evictor::new(ctx.clone()).start(),
                jobs: jobs::FlashJobWriter::new(ctx.clone()).start(),
                ctx,
                stores,
            }),
            policies: HashMap::new(),
            kept: Some(BTreeSet::new()),
            kicks: Some(kicks),
            again: false,
        }
    }

    fn run_pass(&mut self, actx: &mut actix::Context<Self>) {
        let Some(mut kept) = self.kept.take() else {
            // A pass is running: one more after it.
            self.again = true;
            return;
        };
        let shared = self.shared.clone();
        let policies = shared.stores.policies.state();
        self.supervise(&policies);
        actx.spawn(
            async move {
                fleet_metrics(&shared);
                release_strays(&shared, &policies, &mut kept).await;
                kept
            }
            .into_actor(self)
            .map(|kept, act, actx| {
                act.kept = Some(kept);
                for a in act.policies.values() {
                    a.do_send(RunPass(()));
                }
                if std::mem::take(&mut act.again) {
                    act.run_pass(actx);
                }
            }),
        );
    }

    /// A policy actor for every policy served and not being deleted; the
    /// actors of the others stop (their node actors with them).
    fn supervise(&mut self, policies: &[Arc<TenstorrentFirmwarePolicy>]) {
        let live: BTreeSet<String> = policies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let ctx = &self.shared.ctx;
        self.policies.retain(|name, addr| {
            let keep = live.contains(name);
            if !keep {
                ctx.metrics.forget_firmware_policy(name);
                addr.do_send(Stop);
            }
            keep
        });
        for name in live {
            let shared = self.shared.clone();
            self.policies.entry(name.clone()).or_insert_with(|| {
                PolicyActor::new(Arc::new(policy::FirmwareKind { shared }), name).start()
            });
        }
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Kick;

impl Handler<Kick> for FirmwareManager {
    type Result = ();
    fn handle(&mut self, _: Kick, actx: &mut Self::Context) {
        self.run_pass(actx);
    }
}

impl Actor for FirmwareManager {
    type Context = actix::Context<Self>;

    fn started(&mut self, actx: &mut Self::Context) {
        let every = std::time::Duration::from_millis(self.shared.ctx.config.resync_ms.max(200));
        actx.run_interval(every, |act, actx| act.run_pass(actx));
        if let Some(mut kicks) = self.kicks.take() {
            let me = actx.address();
            tokio::spawn(async move {
                while kicks.recv().await.is_some() {
                    me.do_send(Kick);
                }
            });
        }
    }
}

/// `ttfw_nodes_by_fw_version`: the fleet's nodes by the firmware they read back.
fn fleet_metrics(shared: &Shared) {
    let mut by_version: BTreeMap<String, i64> = BTreeMap::new();
    for n in shared.ctx.stores.nodes.state() {
        if let Some(v) = ttdrv_core::node::label(&n, fw::FW_VERSION) {
            *by_version.entry(v.to_string()).or_default() += 1;
        }
    }
    shared.ctx.metrics.set_nodes_by_fw_version(&by_version);
}

/// Firmware records whose policy is gone (deleted), or no longer selects
/// the node: released where nothing was written to the cards (cordon,
/// record and our marks removed), kept with a log line where the cards
/// may be half-written ([`ttdrv_core::firmware::stray`]). A policy this
/// controller does not serve (`--policy-selector`) is looked up first:
/// only a 404 makes its records strays.
async fn release_strays(
    shared: &Shared,
    served: &[Arc<TenstorrentFirmwarePolicy>],
    kept: &mut BTreeSet<String>,
) {
    let ctx = &shared.ctx;
    let api: Api<TenstorrentFirmwarePolicy> = Api::all(ctx.client.clone());
    let mut exists: HashMap<String, bool> = HashMap::new();
    for node in ctx.stores.nodes.state() {
        let Some(rec) = ttdrv_core::claim::firmware_record(&node) else {
            continue;
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        let gone = match served
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&rec.policy))
        {
            Some(p) => selects(p, &node, ctx.eligibility()) == Selected::No,
            None if ctx.config.policy_selector.is_none() => true,
            None => {
                if !exists.contains_key(&rec.policy) {
                    let found = match api.get_opt(&rec.policy).await {
                        Ok(p) => p.is_some(),
                        // Unknown: not a stray yet.
                        Err(_) => true,
                    };
                    exists.insert(rec.policy.clone(), found);
                }
                !exists[&rec.policy]
            }
        };
        if !gone {
            kept.remove(&name);
            continue;
        }
        match ttdrv_core::firmware::stray(&rec, ttdrv_core::node::unschedulable(&node)) {
            ttdrv_core::firmware::Stray::Keep(why) => {
                if kept.insert(name.clone()) {
                    tracing::warn!(node = name, policy = rec.policy, "{why}");
                }
            }
            ttdrv_core::firmware::Stray::Release { uncordon } => {
                let patch = patch::release_patch(&node, &rec.policy, uncordon, &ctx.config.gates());
                let sent = shared
                    .labeler
                    .send(PatchNode {
                        node: name.clone(),
                        patch,
                        action: "releasing a firmware record whose policy is gone",
                    })
                    .await;
                match sent {
                    Ok(Ok(_)) => {
                        ctx.claims
                            .release(&name, &Holder::firmware(rec.policy.clone()));
                        tracing::info!(
                            node = name,
                            policy = rec.policy,
                            uncordon,
                            "firmware record released: its policy is gone or no longer selects the node"
                        );
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(node = name, error = %e, "releasing a stray firmware record")
                    }
                    Err(e) => tracing::warn!(node = name, error = %e, "labeler unavailable"),
                }
            }
        }
    }
}
