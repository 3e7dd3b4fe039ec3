//! One watch per resource kind, each feeding a reflector cache and poking the
//! PolicyManager. Watches restart with backoff after errors or disconnects; the
//! caches then re-list, so no change that matters is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix::Addr;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use ttdrv_api::TenstorrentDriverPolicy;

use crate::driver::{Kick, PolicyManager, Scope};
use crate::metrics::Metrics;
use crate::runtime::context::Stores;
use crate::runtime::daemon_set_index::DaemonSetIndex;
use crate::runtime::pod_index::{Changed, PodCache};
use crate::runtime::slice_index::SliceIndex;

/// Objects per page of the nodes' and pods' (re-)lists. A page is parsed
/// whole, managed fields and all, before the caches slim it: at kube's
/// default of 500 the first list of 1000 nodes and their pods made most of
/// the controller's peak memory (docs/benchmarks.md), and the allocator
/// keeps what a peak took. More, smaller lists cost a few requests at start.
const LIST_PAGE: u32 = 100;

/// Starts the watches; returns the caches and a future that resolves once all
/// of them have completed their first list (readiness).
pub fn start(
    client: &Client,
    namespace: &str,
    policy_selector: Option<&str>,
    dra_driver: &str,
    manager: Addr<PolicyManager>,
    metrics: Arc<Metrics>,
) -> (Stores, impl std::future::Future<Output = ()>) {
    let mut pcfg = watcher::Config::default();
    if let Some(sel) = policy_selector {
        pcfg = pcfg.labels(sel);
    }
    let (policies, w1) = spawn_watch::<TenstorrentDriverPolicy>(
        Api::all(client.clone()),
        pcfg,
        policy_key,
        whole_fleet,
        keep_all,
        manager.clone(),
        metrics.clone(),
    );
    let (nodes, w2) = spawn_watch::<Node>(
        Api::all(client.clone()),
        watcher::Config::default().page_size(LIST_PAGE),
        node_key,
        node_scope,
        slim_node,
        manager.clone(),
        metrics.clone(),
    );
    let metrics_gauge = metrics.clone();
    let pods = Arc::new(PodCache::new(namespace));
    // Every pod of the cluster: kept as what the controller reads, a poke
    // for the pod's node only when that changed.
    let pod_index = pods.clone();
    spawn_facts_watch(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().page_size(LIST_PAGE),
        "Pod",
        move |ev| pod_index.apply(ev),
        manager.clone(),
        metrics.clone(),
    );
    let (daemonsets, w4) = spawn_watch::<DaemonSet>(
        Api::namespaced(client.clone(), namespace),
        watcher::Config::default().labels(ttdrv_api::labels::CLAIM),
        daemonset_key,
        whole_fleet,
        keep_all,
        manager.clone(),
        metrics.clone(),
    );
    let all_daemon_sets = Arc::new(DaemonSetIndex::default());
    // Every DaemonSet of the cluster, as its gate and device facts; a change
    // pokes a full pass (DaemonSets are few, their templates change rarely).
    let ds_index = all_daemon_sets.clone();
    spawn_facts_watch(
        Api::<DaemonSet>::all(client.clone()),
        watcher::Config::default(),
        "DaemonSetFacts",
        move |ev| ds_index.apply(ev),
        manager.clone(),
        metrics.clone(),
    );
    // The DRA driver's slices, a poke for the slice's node. Not part of
    // readiness, and not watched where resource.k8s.io/v1 is not served
    // (Kubernetes before 1.34): a watch there would only fail and retry.
    let slices = Arc::new(SliceIndex::new(dra_driver));
    {
        let (client, slice_index, manager, metrics) = (
            client.clone(),
            slices.clone(),
            manager.clone(),
            metrics.clone(),
        );
        tokio::spawn(async move {
            let served = client
                .list_api_group_resources("resource.k8s.io/v1")
                .await
                .map(|l| l.resources.iter().any(|r| r.name == "resourceslices"));
            if let Ok(false) | Err(kube::Error::Api(_)) = served {
                tracing::info!(
                    "resource.k8s.io/v1 ResourceSlices are not served: swapped nodes are checked for their DRA plugin and extended resources only"
                );
                return;
            }
            let cfg = watcher::Config::default().fields(&slice_index.field_selector());
            spawn_facts_watch(
                Api::<ResourceSlice>::all(client),
                cfg,
                "ResourceSlice",
                move |ev| slice_index.apply(ev),
                manager,
                metrics,
            );
        });
    }
    let (pdbs, w5) = spawn_watch::<PodDisruptionBudget>(
        Api::all(client.clone()),
        watcher::Config::default(),
        any_change,
        whole_fleet,
        keep_all,
        manager,
        metrics,
    );
    spawn_cache_gauge(
        [
            CacheCount::of("TenstorrentDriverPolicy", policies.clone()),
            CacheCount::of("Node", nodes.clone()),
            CacheCount::of("DaemonSet", daemonsets.clone()),
            CacheCount::of("PodDisruptionBudget", pdbs.clone()),
        ],
        pods.clone(),
        all_daemon_sets.clone(),
        metrics_gauge,
    );
    let pods_ready = pods.clone();
    let ds_ready = all_daemon_sets.clone();
    let ready = async move {
        let _ = futures::join!(
            w1.wait_until_ready(),
            w2.wait_until_ready(),
            pods_ready.wait_until_ready(),
            ds_ready.wait_until_ready(),
            w4.wait_until_ready(),
            w5.wait_until_ready()
        );
    };
    (
        Stores {
            policies,
            nodes,
            pods,
            daemonsets,
            all_daemon_sets,
            pdbs,
            slices,
        },
        ready,
    )
}

fn spawn_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    key: fn(&K) -> Option<u64>,
    route: fn(&K) -> Option<Scope>,
    slim: fn(&mut K),
    manager: Addr<PolicyManager>,
    metrics: Arc<Metrics>,
) -> (Store<K>, Store<K>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&()).to_string();
    let dropped = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        let stream = watcher(api, cfg)
            .default_backoff()
            // Managed fields (and what `slim` drops) are never read; dropping
            // them keeps the caches small.
            .modify(move |o| {
                o.meta_mut().managed_fields = None;
                slim(o);
            })
            .reflect(writer);
        futures::pin_mut!(stream);
        // The caches take every change; only changes the controller reads poke
        // it (node heartbeats and our own status writes do not). Like kube's
        // `predicate_filter`, but deletions always poke: a deleted object
        // looks the same as its last update.
        let mut seen: HashMap<ObjectRef<K>, u64> = HashMap::new();
        let mut relisted: HashMap<ObjectRef<K>, u64> = HashMap::new();
        while let Some(ev) = stream.next().await {
            let scope = match ev {
                Ok(watcher::Event::Apply(o)) => {
                    let (r, k) = (ObjectRef::from_obj(&o), key(&o));
                    if k.is_some() && seen.get(&r) == k.as_ref() {
                        continue;
                    }
                    k.map(|k| seen.insert(r, k));
                    route(&o)
                }
                Ok(watcher::Event::Delete(o)) => {
                    seen.remove(&ObjectRef::from_obj(&o));
                    route(&o)
                }
                Ok(watcher::Event::Init) => {
                    relisted.clear();
                    continue;
                }
                Ok(watcher::Event::InitApply(o)) => {
                    if let Some(k) = key(&o) {
                        relisted.insert(ObjectRef::from_obj(&o), k);
                    }
                    continue;
                }
                // A (re-)list is complete: objects may have changed or gone
                // while the watch was down. One full pass covers them all.
                Ok(watcher::Event::InitDone) => {
                    seen = std::mem::take(&mut relisted);
                    Some(Scope::All)
                }
                Err(e) => {
                    tracing::warn!(kind, error = %e, "watch error; restarting with backoff");
                    metrics.inc_watch_restart(&kind);
                    continue;
                }
            };
            let Some(scope) = scope else { continue };
            if manager.try_send(Kick(scope)).is_err() {
                // Mailbox full: the node this poke named would wait for the
                // next full pass, so ask for one now (`do_send` enqueues past
                // the capacity).
                dropped.fetch_add(1, Ordering::Relaxed);
                metrics.inc_mailbox_full("policy_manager");
                manager.do_send(Kick(Scope::All));
            }
        }
    });
    (reader.clone(), reader)
}

/// A watch kept as facts, not objects: every event goes to `apply` (the
/// index's own), and what it says changed pokes the PolicyManager — the
/// pod's node, or a full pass. The pod index ([`PodCache`]) and the
/// DaemonSet index ([`DaemonSetIndex`]) are fed this way.
fn spawn_facts_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    kind: &'static str,
    apply: impl Fn(watcher::Event<K>) -> Option<Changed> + Send + 'static,
    manager: Addr<PolicyManager>,
    metrics: Arc<Metrics>,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let stream = watcher(api, cfg).default_backoff();
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let changed = match ev {
                Ok(ev) => apply(ev),
                Err(e) => {
                    tracing::warn!(kind, error = %e, "watch error; restarting with backoff");
                    metrics.inc_watch_restart(kind);
                    continue;
                }
            };
            let scope = match changed {
                Some(Changed::Node(n)) => Scope::Node(n),
                Some(Changed::All) => Scope::All,
                None => continue,
            };
            if manager.try_send(Kick(scope)).is_err() {
                // As in `spawn_watch`: a dropped poke becomes a full pass.
                metrics.inc_mailbox_full("policy_manager");
                manager.do_send(Kick(Scope::All));
            }
        }
    });
}

/// One reflector cache's size, for `ttdriver_cache_objects`.
struct CacheCount {
    kind: &'static str,
    len: Box<dyn Fn() -> usize + Send>,
}

impl CacheCount {
    fn of<K>(kind: &'static str, store: Store<K>) -> Self
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        Self {
            kind,
            len: Box::new(move || store.len()),
        }
    }
}

/// Exports `ttdriver_cache_objects{kind}` every 10 s: cheap (counts, no
/// copies), and what an operator sizing the controller's memory looks at.
fn spawn_cache_gauge(
    caches: [CacheCount; 4],
    pods: Arc<PodCache>,
    daemon_sets: Arc<DaemonSetIndex>,
    metrics: Arc<Metrics>,
) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            every.tick().await;
            for c in &caches {
                metrics.set_cache_objects(c.kind, (c.len)());
            }
            let (facts, installers) = pods.counts();
            metrics.set_cache_objects("Pod", facts);
            metrics.set_cache_objects("InstallerPod", installers);
            metrics.set_cache_objects("DaemonSetFacts", daemon_sets.len());
        }
    });
}

fn hash_of(parts: impl std::hash::Hash) -> Option<u64> {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    Some(h.finish())
}

/// Policies, DaemonSets and PDBs concern every node of a policy.
fn whole_fleet<K>(_: &K) -> Option<Scope> {
    Some(Scope::All)
}

/// A Node change concerns that node only (a label change that moves it between
/// policies is caught by the PolicyManager comparing assignments).
fn node_scope(n: &Node) -> Option<Scope> {
    n.metadata.name.clone().map(Scope::Node)
}

/// What the controller reads of its DaemonSets: the template hash annotation,
/// the spec and the generation the DaemonSet controller has observed (stale
/// installer pods are replaced only then), not the rest of the status it
/// rewrites on every installer pod change (each would otherwise start a pass
/// over all nodes).
fn daemonset_key(d: &DaemonSet) -> Option<u64> {
    let m = &d.metadata;
    hash_of((
        m.generation,
        &m.annotations,
        &m.labels,
        m.deletion_timestamp.is_some(),
        d.status.as_ref().and_then(|s| s.observed_generation),
    ))
}

fn keep_all<K>(_: &mut K) {}

/// What the controller reads of a Node: its labels, our annotations
/// (`*.tenstorrent.com/`), the cordon, the Ready condition and the boot ID.
/// The rest (image list, addresses, capacity, other conditions, other
/// components' annotations) is a few KiB on a real node, read by no one here.
fn slim_node(n: &mut Node) {
    if let Some(a) = n.metadata.annotations.as_mut() {
        a.retain(|k, _| k.contains("tenstorrent.com/"));
    }
    if let Some(spec) = n.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: spec.unschedulable,
            ..Default::default()
        };
    }
    if let Some(s) = n.status.as_mut() {
        let mut conditions = s.conditions.take().unwrap_or_default();
        conditions.retain(|c| c.type_ == "Ready");
        let boot_id = s.node_info.take().map(|i| i.boot_id);
        *s = k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(conditions),
            node_info: boot_id.map(|boot_id| k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id,
                ..Default::default()
            }),
            ..Default::default()
        };
        for c in s.conditions.iter_mut().flatten() {
            // Rewritten on every heartbeat; the controller reads the status.
            c.last_heartbeat_time = None;
            c.message = None;
        }
    }
}

/// Every change counts.
fn any_change<K: Resource>(obj: &K) -> Option<u64> {
    hash_of(&obj.meta().resource_version)
}

/// Spec changes (generation), labels, deletion and the hand-back's hold
/// (an annotation: no generation of its own); not our own status writes.
fn policy_key(p: &TenstorrentDriverPolicy) -> Option<u64> {
    let m = &p.metadata;
    let handback = m
        .annotations
        .as_ref()
        .and_then(|a| a.get(ttdrv_api::labels::HANDBACK));
    hash_of((
        m.generation,
        &m.labels,
        m.deletion_timestamp.is_some(),
        handback,
    ))
}

/// What the controller reads of a Node: labels, annotations, cordon,
/// readiness, and the boot ID (a reboot makes the driver labels stale).
fn node_key(n: &Node) -> Option<u64> {
    let m = &n.metadata;
    let ready = ttdrv_core::node::ready_status(n).map(String::from);
    let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable);
    let boot_id = n
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.as_str());
    hash_of((
        &m.labels,
        &m.annotations,
        unschedulable,
        ready,
        boot_id,
        m.deletion_timestamp.is_some(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Setting the hand-back's hold pokes a pass (it is an annotation, with
    /// no generation of its own); other annotations do not.
    #[test]
    fn the_handback_hold_pokes_the_policy() {
        let mut p: TenstorrentDriverPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": { "name": "fleet" },
            "spec": { "version": "2.8.0" }
        }))
        .expect("a policy");
        let before = policy_key(&p);
        p.metadata.annotations = Some([("note".to_string(), "x".to_string())].into());
        assert_eq!(policy_key(&p), before);
        p.metadata.annotations.get_or_insert_default().insert(
            ttdrv_api::labels::HANDBACK.into(),
            "2026-12-06T14:00:00Z".into(),
        );
        assert_ne!(policy_key(&p), before);
    }
}
