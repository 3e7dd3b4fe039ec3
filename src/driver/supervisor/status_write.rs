//! The driver policy's status: when a write is due, what it says, how it
//! is sent (the policy actor writes it in the background, off every node's
//! path).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus, labels};
use ttdrv_core::event::EventReason;
use ttdrv_core::rollout::Plan;

use super::ports::node_label;
use super::{DriverKind, DriverMemory, promotion_blocked};
use crate::policy_decisions::StatusFacts;
use crate::render::daemonset_name;
use crate::runtime::context::Context;
use crate::runtime::policy_actor::{Memory, StatusOut};
use crate::status::{self, Reported, StatusInput};

impl DriverKind {
    /// The status to write, if a write is due, for the actor to write in
    /// the background, off every node's path: condition flips (Ready,
    /// Degraded, Paused, Conflict…) and a new generation at once, per-node
    /// progress at most once per STATUS_INTERVAL (the periodic full pass
    /// flushes the last of it). One write at a time.
    pub(super) fn status_if_due(
        &self,
        name: &str,
        memory: &Memory<DriverKind>,
        policy: &Arc<TenstorrentDriverPolicy>,
        conflicts: &[(String, String)],
        plan: &Plan,
    ) -> Option<StatusOut<DriverKind>> {
        if memory.status_in_flight {
            return None;
        }
        let (prev, unreadable) = previous_status(memory, policy);
        let m = &memory.kind;
        if !self.status_due(m, policy, conflicts, plan, prev, unreadable.is_some()) {
            return None;
        }
        let status = self.build_status(name, m, policy, conflicts, plan, prev);
        if prev == Some(&status) {
            return None;
        }
        let replacing = unreadable
            .as_ref()
            .map(|_| policy.metadata.resource_version.clone());
        if let Some(why) = &unreadable {
            self.announce_replacing(name, policy, why);
        }
        Some(StatusOut {
            status,
            on_object: false,
            note: replacing,
        })
    }
}

/// The status the next one is compared with (borrowed: it lists every
/// node, and this runs on every pass), and why the policy's own is
/// unreadable if it is and not replaced yet. A status we cannot read
/// (another operator's, garbage) is replaced as a whole by ours, at
/// once, with an Event.
fn previous_status<'a>(
    memory: &'a Memory<DriverKind>,
    policy: &'a TenstorrentDriverPolicy,
) -> (Option<&'a TenstorrentDriverPolicyStatus>, Option<String>) {
    let rv = policy.metadata.resource_version.as_deref();
    let unreadable = policy
        .status
        .as_ref()
        .and_then(|s| s.unreadable.clone())
        .filter(|_| memory.kind.memo.replaces_unreadable(true, rv));
    let prev = if unreadable.is_some() {
        None
    } else {
        memory.written.as_ref().or(policy.status.as_ref())
    };
    (prev, unreadable)
}

impl DriverKind {
    /// Whether a write is due ([`crate::policy_decisions::PolicyMemo::status_due`]).
    fn status_due(
        &self,
        m: &DriverMemory,
        policy: &TenstorrentDriverPolicy,
        conflicts: &[(String, String)],
        plan: &Plan,
        prev: Option<&TenstorrentDriverPolicyStatus>,
        replacing: bool,
    ) -> bool {
        let (summary, _) = status::summarize(&m.records);
        let flags = status::condition_flags(
            &summary,
            policy.spec.paused,
            !conflicts.is_empty(),
            plan.braked.is_some(),
            m.memo.refusal.is_some(),
            promotion_blocked(m),
        );
        let previous_flags = prev.map(status::flags_of);
        m.memo.status_due(&StatusFacts {
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
        name: &str,
        m: &DriverMemory,
        policy: &TenstorrentDriverPolicy,
        conflicts: &[(String, String)],
        plan: &Plan,
        prev: Option<&TenstorrentDriverPolicyStatus>,
    ) -> TenstorrentDriverPolicyStatus {
        let ds_name = daemonset_name(name);
        let input = StatusInput {
            policy,
            records: &m.records,
            device_users: &m.device_users,
            conflicts,
            blocked: plan.blocked.as_deref(),
            held: plan.held,
            braked: plan.braked.as_deref(),
            promotion_blocked: promotion_blocked(m),
            refused: m
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
    fn announce_replacing(&self, name: &str, policy: &TenstorrentDriverPolicy, why: &str) {
        tracing::warn!(
            policy = name,
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

/// Writes the policy's status (the actor does it through the write
/// backoff).
pub(super) fn patch_status(
    ctx: Arc<Context>,
    name: String,
    status: &TenstorrentDriverPolicyStatus,
    replacing: bool,
) -> impl Future<Output = crate::Result<()>> + 'static {
    let api: Api<TenstorrentDriverPolicy> = Api::all(ctx.client.clone());
    let status = status.clone();
    async move {
        if replacing {
            // A merge patch would keep the foreign fields: replace the
            // whole status (JSON patch: `add` replaces an existing member).
            let ops: json_patch::Patch = serde_json::from_value(serde_json::json!([
                { "op": "add", "path": "/status", "value": status }
            ]))
            .expect("a JSON patch");
            api.patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(ops))
                .await
        } else {
            let patch = serde_json::json!({ "status": status });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
        .map(|_| ())
        .map_err(crate::Error::kube(format!(
            "writing the status of policy {name}"
        )))
    }
}
