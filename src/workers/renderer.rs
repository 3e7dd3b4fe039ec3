//! DaemonSetRenderer: keeps `ttdrv-<policy>` equal to its rendering (server-side
//! apply, only when the template hash differs, so a restarted controller never
//! touches an unchanged DaemonSet), and replaces a node's installer pod with
//! one from that template when the node's turn comes (`ReplaceInstallerPod`).

use std::sync::Arc;

use actix::prelude::*;
use backon::Retryable;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{TenstorrentDriverPolicy, labels};
use ttdrv_core::event::EventReason;

use crate::render::{daemonset_name, pod_labels, render_daemonset};
use crate::runtime::context::Context;
use crate::status::TAKEOVER;
use crate::{Error, Result};

pub struct DaemonSetRenderer {
    ctx: Arc<Context>,
}

impl DaemonSetRenderer {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

impl Actor for DaemonSetRenderer {
    type Context = actix::Context<Self>;
}

/// Make the policy's DaemonSet match its rendering; returns the template hash.
#[derive(Message, Clone)]
#[rtype(result = "Result<String>")]
pub struct Ensure {
    pub policy: Arc<TenstorrentDriverPolicy>,
    /// `spec.unmanage` with every node vacated: delete the DaemonSet (ours
    /// only) instead; the hash returned is empty.
    pub retire: bool,
}

impl Handler<Ensure> for DaemonSetRenderer {
    type Result = ResponseFuture<Result<String>>;

    fn handle(&mut self, msg: Ensure, _: &mut Self::Context) -> Self::Result {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            if msg.retire {
                retire(&ctx, &msg.policy).await?;
                return Ok(String::new());
            }
            let (ds, hash) = render_daemonset(&msg.policy, &ctx.render_context());
            let name = daemonset_name(msg.policy.metadata.name.as_deref().unwrap_or_default());
            let existing = ctx
                .stores
                .daemonsets
                .get(&ObjectRef::new(&name).within(&ctx.config.namespace));
            let current = existing
                .as_ref()
                .and_then(|d| d.metadata.annotations.as_ref())
                .and_then(|a| a.get(labels::TEMPLATE_HASH))
                .cloned();
            if current.as_deref() == Some(hash.as_str()) {
                return Ok(hash);
            }
            let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
            let pp = PatchParams::apply("tt-driver-manager").force();
            let apply = || async {
                api.patch(&name, &pp, &Patch::Apply(&ds))
                    .await
                    .map_err(Error::kube(format!("applying DaemonSet {name}")))
            };
            let applied = apply
                .retry(crate::error::backoff())
                .when(Error::is_transient)
                .adjust(crate::error::honor_retry_after)
                .await;
            // ttdriver_daemonset_operations_total, as the Go operator counted.
            let cr = msg.policy.metadata.name.as_deref().unwrap_or_default();
            let op = if existing.is_some() {
                "update"
            } else {
                "create"
            };
            ctx.metrics.inc_daemonset_operation(cr, op, applied.is_ok());
            if let Err(e) = applied {
                if e.is_transient() {
                    return Err(e);
                }
                // Refused: a DaemonSet of this name that we did not make
                // (the Go operator's, with its immutable selector) is taken
                // over; any other refusal stands.
                return Err(take_over(&ctx, &api, &msg.policy, &name)
                    .await?
                    .unwrap_or(e));
            }
            let (reason, verb) = if existing.is_some() {
                (EventReason::DaemonSetUpdated, "updated")
            } else {
                (EventReason::DaemonSetCreated, "created")
            };
            tracing::info!(daemonset = name, hash, verb, "installer DaemonSet applied");
            ctx.event(
                msg.policy.as_ref(),
                false,
                reason,
                "Render",
                format!(
                    "installer DaemonSet {name} {verb} (template {})",
                    &hash[..12]
                ),
            );
            Ok(hash)
        })
    }
}

/// Deletes the DaemonSet of an unmanaged policy whose nodes are all vacated
/// (it has no pod left: its affinity excludes them). Only one we made.
async fn retire(ctx: &Context, policy: &TenstorrentDriverPolicy) -> Result<()> {
    let cr = policy.metadata.name.as_deref().unwrap_or_default();
    let name = daemonset_name(cr);
    let existing = ctx
        .stores
        .daemonsets
        .get(&ObjectRef::new(&name).within(&ctx.config.namespace));
    let Some(ds) = existing.filter(|d| made_by_us(d, cr)) else {
        return Ok(());
    };
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let dp = DeleteParams {
        preconditions: ds.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let deleted = api.delete(&name, &dp).await;
    ctx.metrics
        .inc_daemonset_operation(cr, "delete", deleted.is_ok());
    match deleted {
        Ok(_) => {
            tracing::info!(
                daemonset = name,
                "every node vacated: installer DaemonSet deleted"
            );
            ctx.event(
                policy,
                false,
                EventReason::DaemonSetDeleted,
                "Unmanage",
                format!("every node vacated: installer DaemonSet {name} deleted"),
            );
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting DaemonSet {name}"))(e)),
    }
}

/// Whether `ds` is a DaemonSet this controller made for `policy`: our claim
/// label and our selector (a selector is immutable, so any other one can only
/// be replaced, never patched).
pub fn made_by_us(ds: &DaemonSet, policy: &str) -> bool {
    let claimed = ds
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::CLAIM))
        .is_some_and(|p| p == policy);
    let selector = ds.spec.as_ref().map(|s| &s.selector);
    claimed
        && selector.is_some_and(|s| {
            s.match_expressions.as_ref().is_none_or(Vec::is_empty)
                && s.match_labels.as_ref() == Some(&pod_labels(policy))
        })
}

/// Whether `ds` says it belongs to `policy`: an owner reference to it (the
/// Go operator sets one) or the Go operator's label naming it
/// (`driver.tenstorrent.com/cr`). Only such a DaemonSet is taken over; any
/// other one of the same name is somebody else's, and the policy stays refused.
pub fn belongs_to(ds: &DaemonSet, policy: &TenstorrentDriverPolicy) -> bool {
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    let owned = policy.metadata.uid.as_deref().is_some_and(|uid| {
        ds.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid)
    });
    let labelled = ds
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::GO_CR))
        .is_some_and(|cr| cr == name);
    owned || labelled
}

/// After a refused apply: if `ttdrv-<policy>` exists, belongs to the policy
/// (see [`belongs_to`]) and is not ours, delete it (foreground cascade: its pods go first) so the next pass creates ours,
/// and say so; `Some(error)` explains the takeover in progress, `None` means
/// the refusal has another cause.
///
/// Why a cascading delete and not an orphaning one: an orphaned installer pod
/// keeps running the other operator's installer, which may swap a module on
/// its own whenever it restarts; deleting a pod never unloads the module, and
/// the agent pods of our DaemonSet never swap a loaded module without the
/// go-ahead of a cordoned and drained cycle. Until ours exists the policy is
/// held like a refused one: nothing new starts.
async fn take_over(
    ctx: &Context,
    api: &Api<DaemonSet>,
    policy: &TenstorrentDriverPolicy,
    name: &str,
) -> Result<Option<Error>> {
    let policy_name = policy.metadata.name.as_deref().unwrap_or_default();
    let found = api
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(Error::kube(format!("looking up DaemonSet {name}")))?;
    let Some(ds) = found.items.into_iter().next() else {
        return Ok(None);
    };
    if made_by_us(&ds, policy_name) || !belongs_to(&ds, policy) {
        return Ok(None);
    }
    let foreign = describe_selector(&ds);
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Some(Error::TakingOver {
            daemonset: name.to_string(),
            message: format!(
                "{TAKEOVER}{name} (selector {foreign}, not made by this controller): waiting for it and its pods to be deleted"
            ),
        }));
    }
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: ds.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let deleted = api.delete(name, &dp).await;
    let cr = policy.metadata.name.as_deref().unwrap_or_default();
    ctx.metrics
        .inc_daemonset_operation(cr, "delete", deleted.is_ok());
    match deleted {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => {
            return Err(Error::Kube {
                action: format!("deleting DaemonSet {name} to take it over"),
                source: e,
            });
        }
    }
    let note = format!(
        "DaemonSet {name} was not made by this controller (selector {foreign}): deleting it with its pods (loaded modules stay) to re-create it as ours; no node starts a cycle meanwhile"
    );
    tracing::warn!(
        daemonset = name,
        selector = foreign,
        "taking over a foreign installer DaemonSet"
    );
    ctx.event(
        policy,
        true,
        EventReason::DaemonSetTakeover,
        "Render",
        note.clone(),
    );
    Ok(Some(Error::TakingOver {
        daemonset: name.to_string(),
        message: format!("{TAKEOVER}{name}: {note}"),
    }))
}

fn describe_selector(ds: &DaemonSet) -> String {
    ds.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_else(|| "-".into())
}

/// Replace a node's installer pod with one from the current template: the pod
/// is deleted and the DaemonSet (OnDelete) creates the new one.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<()>")]
pub struct ReplaceInstallerPod {
    pub namespace: String,
    pub name: String,
}

impl Handler<ReplaceInstallerPod> for DaemonSetRenderer {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, msg: ReplaceInstallerPod, _: &mut Self::Context) -> Self::Result {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &msg.namespace);
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let delete = async {
                match api.delete(&msg.name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(Error::Kube {
                        action: format!("deleting installer pod {}/{}", msg.namespace, msg.name),
                        source: e,
                    }),
                }
            };
            let target = crate::runtime::write_backoff::WriteTarget::Pod {
                namespace: msg.namespace.clone(),
                name: msg.name.clone(),
            };
            ctx.guarded_write(target, |_| true, delete).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::RenderContext;

    fn policy() -> TenstorrentDriverPolicy {
        let mut p = TenstorrentDriverPolicy::new(
            "fleet",
            serde_yaml::from_str("version: \"2.8.0\"").expect("spec"),
        );
        p.metadata.uid = Some("uid-1".into());
        p
    }

    /// The Go operator's DaemonSet: its labels and selector, an owner
    /// reference to the policy.
    fn go_daemonset(owner_uid: Option<&str>, cr_label: Option<&str>) -> DaemonSet {
        let mut labels = serde_json::json!({
            "app.kubernetes.io/name": "tt-kmd-installer",
            "app.kubernetes.io/component": "driver",
        });
        if let Some(cr) = cr_label {
            labels[labels::GO_CR] = cr.into();
        }
        let owners: Vec<_> = owner_uid
            .map(|uid| serde_json::json!({
                "apiVersion": "driver.tenstorrent.com/v1alpha1",
                "kind": "TenstorrentDriverPolicy", "name": "fleet", "uid": uid, "controller": true,
            }))
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "ttdrv-fleet", "labels": labels, "ownerReferences": owners },
            "spec": {
                "selector": { "matchLabels": labels },
                "template": { "metadata": { "labels": labels }, "spec": { "containers": [] } }
            }
        }))
        .expect("daemonset")
    }

    #[test]
    fn the_go_daemonset_is_taken_over_a_stranger_is_not() {
        let p = policy();
        let go = go_daemonset(Some("uid-1"), Some("fleet"));
        assert!(!made_by_us(&go, "fleet"));
        assert!(belongs_to(&go, &p));
        assert!(belongs_to(&go_daemonset(Some("uid-1"), None), &p));
        assert!(belongs_to(&go_daemonset(None, Some("fleet")), &p));
        // Somebody else's DaemonSet of the same name is left alone.
        assert!(!belongs_to(&go_daemonset(None, None), &p));
        assert!(!belongs_to(&go_daemonset(Some("uid-2"), Some("other")), &p));
        // Ours, as rendered, is ours.
        let rctx = RenderContext::defaults("ns");
        let (ours, _) = render_daemonset(&p, &rctx);
        assert!(made_by_us(&ours, "fleet"));
        assert!(!made_by_us(&ours, "other"));
    }
}
