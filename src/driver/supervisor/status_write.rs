//! The policy's status, written in the background off every node's path.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus, labels};
use ttdrv_core::event::EventReason;
use ttdrv_core::rollout::Plan;

use super::PolicySupervisor;
use super::ports::node_label;
use crate::policy_decisions::{Facts, StatusFacts, decide};
use crate::render::daemonset_name;
use crate::runtime::context::Context;
use crate::status::{self, Reported, StatusInput};

impl PolicySupervisor {
    /// Writes the status in the background, off every node's path: condition
    /// flips (Ready, Degraded, Paused, Conflict…) and a new generation at once,
    /// per-node progress at most once per STATUS_INTERVAL (the periodic full
    /// pass flushes the last of it). One write at a time.
    pub(super) fn write_status_if_due(
        &mut self,
        policy: &Arc<TenstorrentDriverPolicy>,
        conflicts: &[(String, String)],
        plan: &Plan,
        actx: &mut actix::Context<Self>,
    ) {
        if self.status_in_flight {
            return;
        }
        let (prev, unreadable) = self.previous_status(policy);
        if !self.status_due(policy, conflicts, plan, prev.as_ref(), unreadable.is_some()) {
            return;
        }
        let status = self.build_status(policy, conflicts, plan, prev.as_ref());
        if prev.as_ref() == Some(&status) {
            return;
        }
        self.status_in_flight = true;
        let replacing = unreadable
            .as_ref()
            .map(|_| policy.metadata.resource_version.clone());
        if let Some(why) = &unreadable {
            self.announce_replacing(policy, why);
        }
        let (ctx, name) = (self.ctx.clone(), self.name.clone());
        let fut = async move {
            let res = patch_status(&ctx, &name, &status, replacing.is_some()).await;
            (res, status, replacing)
        };
        actx.spawn(
            fut.into_actor(self)
                .map(|(res, status, replacing), act, _| act.status_written(res, status, replacing)),
        );
    }

    /// The status the next one is compared with, and why the policy's own
    /// is unreadable if it is and not replaced yet. A status we cannot read
    /// (another operator's, garbage) is replaced as a whole by ours, at
    /// once, with an Event.
    fn previous_status(
        &self,
        policy: &TenstorrentDriverPolicy,
    ) -> (Option<TenstorrentDriverPolicyStatus>, Option<String>) {
        let rv = policy.metadata.resource_version.as_deref();
        let unreadable = policy
            .status
            .as_ref()
            .and_then(|s| s.unreadable.clone())
            .filter(|_| self.memo.replaces_unreadable(true, rv));
        let prev = if unreadable.is_some() {
            None
        } else {
            self.last_status.clone().or_else(|| policy.status.clone())
        };
        (prev, unreadable)
    }

    /// Whether a write is due ([`crate::policy_decisions::PolicyMemo::status_due`]).
    fn status_due(
        &self,
        policy: &TenstorrentDriverPolicy,
        conflicts: &[(String, String)],
        plan: &Plan,
        prev: Option<&TenstorrentDriverPolicyStatus>,
        replacing: bool,
    ) -> bool {
        let (summary, _) = status::summarize(&self.records);
        let flags = status::condition_flags(
            &summary,
            policy.spec.paused,
            !conflicts.is_empty(),
            plan.braked.is_some(),
            self.memo.refusal.is_some(),
            self.promotion_blocked(),
        );
        let previous_flags = prev.map(status::flags_of);
        self.memo.status_due(&StatusFacts {
            previous_flags: previous_flags.as_deref(),
            flags: &flags,
            previous_generation: prev.map(|p| p.observed_generation),
            generation: policy.metadata.generation,
            replacing,
            now: Instant::now(),
        })
    }

    /// The status to write, from the records, the plan and what each node
    /// reports in its labels.
    fn build_status(
        &self,
        policy: &TenstorrentDriverPolicy,
        conflicts: &[(String, String)],
        plan: &Plan,
        prev: Option<&TenstorrentDriverPolicyStatus>,
    ) -> TenstorrentDriverPolicyStatus {
        let ds_name = daemonset_name(&self.name);
        let input = StatusInput {
            policy,
            records: &self.records,
            device_users: &self.device_users,
            conflicts,
            blocked: plan.blocked.as_deref(),
            held: plan.held,
            braked: plan.braked.as_deref(),
            promotion_blocked: self.promotion_blocked(),
            refused: self
                .memo
                .refusal
                .as_ref()
                .map(|r| (r.kind, r.message.as_str())),
            daemonset: &ds_name,
            previous: prev,
            now: Timestamp::now(),
        };
        let nodes = &self.ctx.stores.nodes;
        status::build(&input, |n| {
            reported(nodes.get(&ObjectRef::new(n)).as_deref())
        })
    }

    /// The log line and Event of a status replaced because it is unreadable.
    fn announce_replacing(&self, policy: &TenstorrentDriverPolicy, why: &str) {
        tracing::warn!(
            policy = self.name,
            why,
            "replacing a status this controller cannot read"
        );
        self.ctx.event(
            policy,
            true,
            EventReason::UnreadableStatusReplaced,
            "Status",
            format!(
                "the policy's status was not written by this controller and does not parse ({}): replaced by ours",
                crate::refusal::shorten(why)
            ),
        );
    }

    /// The write's outcome, back on the actor.
    fn status_written(
        &mut self,
        res: crate::Result<TenstorrentDriverPolicy>,
        status: TenstorrentDriverPolicyStatus,
        replacing: Option<Option<String>>,
    ) {
        self.status_in_flight = false;
        match res {
            Ok(_) => {
                let facts = Facts::StatusWritten {
                    replaced: replacing,
                    now: Instant::now(),
                };
                self.memo = decide(&self.memo, &facts).0;
                self.last_status = Some(status);
            }
            Err(e @ crate::Error::WriteHeld { .. }) => {
                tracing::debug!(policy = self.name, error = %e, "status write held back");
            }
            Err(e) => {
                // Retried by the next pass (at the latest the periodic one)
                // once its backoff has passed.
                self.ctx.metrics.inc_error(&self.name, "kube_api");
                tracing::warn!(policy = self.name, error = %e, "writing status failed; will retry");
            }
        }
    }
}

/// What a node reports of itself (its labels and annotations), for its
/// entry in the status.
fn reported(node: Option<&Node>) -> Reported {
    let l = |k: &str| node.and_then(|nd| node_label(nd, k)).map(String::from);
    Reported {
        version: node
            .and_then(ttdrv_core::node::loaded_version)
            .map(String::from),
        install_mode: l(labels::INSTALL_MODE),
        prepared_version: node
            .and_then(ttdrv_core::prepare::prepared_version)
            .map(String::from),
        next_kernel_build_failed: node
            .and_then(ttdrv_core::prepare::next_kernel_failed)
            .map(String::from),
        parameters: node.and_then(ttdrv_core::node::loaded_parameters),
    }
}

/// Writes the policy's status, through the write backoff.
async fn patch_status(
    ctx: &Context,
    name: &str,
    status: &TenstorrentDriverPolicyStatus,
    replacing: bool,
) -> crate::Result<TenstorrentDriverPolicy> {
    let api: Api<TenstorrentDriverPolicy> = Api::all(ctx.client.clone());
    let write = async {
        if replacing {
            // A merge patch would keep the foreign fields: replace the
            // whole status (JSON patch: `add` replaces an existing member).
            let ops: json_patch::Patch = serde_json::from_value(serde_json::json!([
                { "op": "add", "path": "/status", "value": status }
            ]))
            .expect("a JSON patch");
            api.patch_status(name, &PatchParams::default(), &Patch::Json::<()>(ops))
                .await
        } else {
            let patch = serde_json::json!({ "status": status });
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
        .map_err(crate::Error::kube(format!(
            "writing the status of policy {name}"
        )))
    };
    // A conflict is a write to retry with the next pass's view, not a
    // refusal to back off from (write_backoff's rule): counted, a few in a
    // row held the status back for minutes.
    let target = crate::runtime::write_backoff::WriteTarget::PolicyStatus(name.to_string());
    ctx.guarded_write(target, |e| !e.is_conflict(), write).await
}
