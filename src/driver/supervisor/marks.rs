//! The node marks a reconcile pass writes besides the NodeActors' cycles:
//! claims and releases, and the clean-up of labels and annotations that no
//! longer mean anything.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::labels;

use super::pass::ReconcilePass;
use super::ports::{node_label, owns};
use crate::node_patch::{claim_patch, release_patch};
use crate::workers::labeler::PatchNode;
use crate::{Error, Result};

impl ReconcilePass {
    /// Claims the owned nodes so the DaemonSet (which requires the claim) lands
    /// there. Returns the nodes whose claim failed, with the error: the pass
    /// leaves them out and goes on with the others (one node's failing write
    /// must not stall the fleet); the node's write backoff paces the retries.
    pub(super) async fn claim(&self, targets: &[String]) -> Result<Vec<(String, Error)>> {
        let name = self.name();
        let calls = targets.iter().filter_map(|n| {
            let node = self.stored(n);
            if node.as_deref().and_then(|nd| node_label(nd, labels::CLAIM)) == Some(name) {
                return None;
            }
            let send = self.ports.patch.send(PatchNode {
                node: n.clone(),
                patch: claim_patch(name),
                action: "claiming node",
            });
            Some(async move { (n.clone(), send.await) })
        });
        let mut failed = Vec::new();
        for (n, res) in futures::future::join_all(calls).await {
            if let Err(e) = res? {
                failed.push((n, e));
            }
        }
        Ok(failed)
    }

    /// Removes driver labels that describe an earlier boot (the host rebooted
    /// since the agent reported), so workloads selecting on `kmd-version` do
    /// not land before the agent has loaded the module again.
    pub(super) async fn clear_stale_labels(&self, targets: &[String]) {
        for n in targets {
            let stale = self
                .stored(n)
                .is_some_and(|nd| ttdrv_core::node::has_stale_labels(&nd));
            if !stale {
                continue;
            }
            let patch = ttdrv_core::node::stale_labels_patch();
            match self
                .mark(n, patch, "removing driver labels of an earlier boot")
                .await
            {
                Ok(()) => tracing::info!(
                    node = n,
                    "node rebooted: kmd-version removed until the agent reports again"
                ),
                Err(e) => {
                    tracing::warn!(node = n, error = %e, "could not remove stale driver labels; will retry")
                }
            }
        }
    }

    /// Removes the Go operator's cordon marks (`cordoned-by` this policy,
    /// `cordoned-at`) from a node that is not cordoned any more (someone
    /// uncordoned it): they mean nothing then. A cordoned node keeps them
    /// until our cycle undoes the cordon, which removes them with it. The
    /// patch carries the Node's `resourceVersion`: a node cordoned meanwhile
    /// is decided again on the next pass.
    pub(super) async fn clear_stale_go_marks(&self, targets: &[String]) {
        for n in targets {
            let Some(node) = self.stored(n) else {
                continue;
            };
            let ours =
                ttdrv_core::node::annotation(&node, labels::GO_CORDONED_BY) == Some(self.name());
            if !ours || ttdrv_core::node::unschedulable(&node) {
                continue;
            }
            let patch = serde_json::json!({ "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": labels::INHERITED_CORDON_MARKS
                    .iter()
                    .map(|k| (k.to_string(), serde_json::Value::Null))
                    .collect::<serde_json::Map<_, _>>(),
            } });
            let action = "removing the Go operator's marks of a cordon that is gone";
            if self.mark(n, patch, action).await.is_err() {
                tracing::debug!(
                    node = n,
                    "could not remove stale Go cordon marks; next pass retries"
                );
            }
        }
    }

    /// Releases nodes that carry our claim but are no longer ours (all such
    /// nodes on a full pass, else the changed ones); never strands a cordon.
    /// A failed release is retried by a later pass (after the node's write
    /// backoff); the first such error is returned, after every node was tried.
    pub(super) async fn release(&self, strays: &[String]) -> Result<Option<Error>> {
        let name = self.name();
        let ours = |nd: &Node| node_label(nd, labels::CLAIM) == Some(name);
        let nodes: Vec<Arc<Node>> = if self.full {
            self.ctx.stores.nodes.state_filter(|nd| {
                ours(nd)
                    && !owns(
                        self.owned(),
                        nd.metadata.name.as_deref().unwrap_or_default(),
                    )
            })
        } else {
            strays
                .iter()
                .filter_map(|n| self.stored(n))
                .filter(|nd| ours(nd))
                .collect()
        };
        let gates = self.ctx.config.gates();
        let mut first = None;
        for node in nodes {
            let res = self
                .ports
                .patch
                .send(PatchNode {
                    node: node.metadata.name.clone().unwrap_or_default(),
                    patch: release_patch(&node, name, &gates),
                    action: "releasing node",
                })
                .await?;
            match res {
                Ok(_) => {}
                // The node changed since the release was decided (another
                // policy may have claimed it): decided again next pass.
                Err(e) if e.is_conflict() => {
                    tracing::debug!(
                        policy = name,
                        node = node.metadata.name.as_deref().unwrap_or(""),
                        "release deferred: the node changed"
                    );
                }
                Err(e) => first = first.or(Some(e)),
            }
        }
        Ok(first)
    }

    /// A policy that manages its nodes again (`unmanage` set back to false)
    /// removes its `unmanaged` mark from them; they start from Pending.
    pub(super) async fn clear_unmanaged_marks(&self, targets: &[String]) {
        if self.policy.spec.unmanage {
            return;
        }
        for n in targets {
            let marked = self
                .stored(n)
                .is_some_and(|nd| node_label(&nd, labels::UNMANAGED) == Some(self.name()));
            if !marked {
                continue;
            }
            let patch = crate::node_patch::unmark_patch();
            let action = "removing the unmanaged mark of a policy that manages the node again";
            if self.mark(n, patch, action).await.is_err() {
                tracing::debug!(
                    node = n,
                    "could not remove the unmanaged mark; next pass retries"
                );
            }
        }
    }

    /// Node `n` as the cache has it.
    fn stored(&self, n: &str) -> Option<Arc<Node>> {
        self.ctx.stores.nodes.get(&ObjectRef::new(n))
    }

    /// Writes one housekeeping mark through the Labeler; the error (the
    /// write's or the Labeler's mailbox's) as text for the log.
    async fn mark(
        &self,
        n: &str,
        patch: serde_json::Value,
        action: &'static str,
    ) -> std::result::Result<(), String> {
        let msg = PatchNode {
            node: n.to_string(),
            patch,
            action,
        };
        match self.ports.patch.send(msg).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}
