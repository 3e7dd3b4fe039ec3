//! The pod cache: what the controller keeps of every pod of the cluster, by
//! the node it is bound to.
//!
//! A pod costs the controller what it reads of it, not the Pod object: the
//! drain's [`PodFacts`] (a few hundred bytes) for every bound pod, and the
//! whole (slimmed) Pod only for our installer pods, whose status the
//! installer checks read. Unbound pods are not kept (their binding arrives as
//! another event). docs/benchmarks.md has the measurement behind this design
//! (a cached Pod object cost ~14 KiB).
//!
//! The cache follows the pod watch. During a (re-)list the previous content
//! stays in use and the new one is built aside, then swapped in whole when the
//! list completes: a pass never sees half a list (a drain could otherwise end
//! with a device user still running — the chaos test's apiserver-restart trial
//! caught that once).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use ttdrv_api::labels;
use ttdrv_core::drain::{PodFacts, PodRef};
use ttdrv_core::installer::{self, SandboxBaseline};

/// The pods bound to one node.
#[derive(Clone, Debug, Default)]
pub struct NodePods {
    /// Every pod bound to the node (installer pods included).
    pub facts: Vec<Arc<PodFacts>>,
    /// Our installer pods on the node (label `driver.tenstorrent.com/policy`
    /// in the operator namespace), whole.
    pub installers: Vec<Arc<Pod>>,
    /// The installer pods' restart counts when their current sandbox
    /// appeared, by pod UID: a reboot's restarts are not crashes
    /// ([`installer::baseline`]). Kept only here, in memory: a controller
    /// that starts takes them afresh.
    pub restart_baselines: HashMap<String, SandboxBaseline>,
}

impl NodePods {
    fn is_empty(&self) -> bool {
        self.facts.is_empty() && self.installers.is_empty()
    }

    /// Takes `pod`; true when something the controller reads changed.
    fn apply(&mut self, facts: PodFacts, installer: Option<Pod>) -> bool {
        let mut changed = match self.facts.iter_mut().find(|f| f.pod == facts.pod) {
            Some(old) if **old == facts => false,
            Some(old) => {
                *old = Arc::new(facts.clone());
                true
            }
            None => {
                self.facts.push(Arc::new(facts.clone()));
                true
            }
        };
        if let Some(pod) = installer {
            if let Some(uid) = pod.metadata.uid.clone() {
                let known = self.restart_baselines.get(&uid);
                match installer::baseline(&pod, known) {
                    Some(b) if Some(&b) != known => {
                        self.restart_baselines.insert(uid, b);
                    }
                    Some(_) => {}
                    None => {
                        self.restart_baselines.remove(&uid);
                    }
                }
            }
            match self
                .installers
                .iter_mut()
                .find(|p| PodRef::of(p) == facts.pod)
            {
                Some(old) if **old == pod => {}
                Some(old) => {
                    *old = Arc::new(pod);
                    changed = true;
                }
                None => {
                    self.installers.push(Arc::new(pod));
                    changed = true;
                }
            }
        }
        changed
    }

    fn remove(&mut self, r: &PodRef) {
        self.facts.retain(|f| f.pod != *r);
        self.installers.retain(|p| PodRef::of(p) != *r);
        let uids: Vec<&str> = self
            .installers
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.restart_baselines
            .retain(|uid, _| uids.contains(&uid.as_str()));
    }

    /// Keeps the baselines `old` took of pods whose sandbox is still the
    /// same (a re-list would otherwise take them afresh).
    fn keep_baselines(&mut self, old: &NodePods) {
        for (uid, b) in self.restart_baselines.iter_mut() {
            if let Some(o) = old
                .restart_baselines
                .get(uid)
                .filter(|o| o.since == b.since)
            {
                *b = o.clone();
            }
        }
    }
}

type Index = HashMap<String, NodePods>;

/// Pods by node, fed by the pod watch.
pub struct PodCache {
    /// Namespace of our installer pods.
    namespace: String,
    live: RwLock<Index>,
    /// Built during a (re-)list, swapped in when it completes.
    relist: RwLock<Index>,
    /// Flips to true when the first list is in.
    ready: tokio::sync::watch::Sender<bool>,
}

impl PodCache {
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            live: RwLock::default(),
            relist: RwLock::default(),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }

    /// A cache holding `pods`, as after a list (tests).
    pub fn listed(namespace: &str, pods: impl IntoIterator<Item = Pod>) -> Self {
        let cache = Self::new(namespace);
        cache.apply(watcher::Event::Init);
        for p in pods {
            cache.apply(watcher::Event::InitApply(p));
        }
        cache.apply(watcher::Event::InitDone);
        cache
    }

    /// What is kept of `pod`: its node, its facts, and the whole pod if it is
    /// an installer pod. `None` for an unbound pod.
    fn split(&self, pod: Pod) -> Option<(String, PodFacts, Option<Pod>)> {
        let node = pod.spec.as_ref()?.node_name.clone()?;
        let facts = PodFacts::of(&pod);
        let installer = (facts.installer
            && pod.metadata.namespace.as_deref() == Some(self.namespace.as_str())
            && pod
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(labels::CLAIM)))
        .then(|| slim(pod));
        Some((node, facts, installer))
    }

    /// Follows the pod watch. Returns the node whose pods changed in a way the
    /// controller reads (a kubelet status heartbeat changes nothing here), or
    /// `None`; a completed (re-)list is reported as [`Changed::All`].
    pub fn apply(&self, event: watcher::Event<Pod>) -> Option<Changed> {
        match event {
            watcher::Event::Apply(p) => {
                // A pod's node never changes once set.
                let (node, facts, installer) = self.split(p)?;
                let mut ix = self.live.write().ok()?;
                let changed = ix.entry(node.clone()).or_default().apply(facts, installer);
                changed.then_some(Changed::Node(node))
            }
            watcher::Event::Delete(p) => {
                let node = p.spec.as_ref()?.node_name.clone()?;
                let mut ix = self.live.write().ok()?;
                if let Some(pods) = ix.get_mut(&node) {
                    pods.remove(&PodRef::of(&p));
                    if pods.is_empty() {
                        ix.remove(&node);
                    }
                }
                Some(Changed::Node(node))
            }
            watcher::Event::Init => {
                if let Ok(mut ix) = self.relist.write() {
                    ix.clear();
                }
                None
            }
            watcher::Event::InitApply(p) => {
                let (node, facts, installer) = self.split(p)?;
                if let Ok(mut ix) = self.relist.write() {
                    ix.entry(node).or_default().apply(facts, installer);
                }
                None
            }
            watcher::Event::InitDone => {
                if let (Ok(mut live), Ok(mut relist)) = (self.live.write(), self.relist.write()) {
                    for (node, pods) in relist.iter_mut() {
                        if let Some(old) = live.get(node) {
                            pods.keep_baselines(old);
                        }
                    }
                    *live = std::mem::take(&mut *relist);
                    live.shrink_to_fit();
                    for pods in live.values_mut() {
                        pods.facts.shrink_to_fit();
                    }
                }
                self.ready.send_replace(true);
                Some(Changed::All)
            }
        }
    }

    /// The pods bound to `node`.
    pub fn on_node(&self, node: &str) -> NodePods {
        self.live
            .read()
            .ok()
            .and_then(|ix| ix.get(node).cloned())
            .unwrap_or_default()
    }

    /// Pods and installer pods kept (`ttdriver_cache_objects`).
    pub fn counts(&self) -> (usize, usize) {
        self.live.read().map_or((0, 0), |ix| {
            ix.values().fold((0, 0), |(f, i), p| {
                (f + p.facts.len(), i + p.installers.len())
            })
        })
    }

    /// Resolves once the first list is in.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }
}

/// An installer pod as the installer checks read it: its metadata and
/// status, its node and its containers' names and images. The rest of its
/// spec is never read, and a k8s-openapi `Container` or `Volume` is large
/// even empty (about 15 KiB of an installer pod's spec was kept per node
/// before; docs/benchmarks.md).
fn slim(mut p: Pod) -> Pod {
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    p.metadata.managed_fields = None;
    let named = |cs: Vec<Container>| -> Vec<Container> {
        cs.into_iter()
            .map(|c| Container {
                name: c.name,
                image: c.image,
                ..Default::default()
            })
            .collect()
    };
    p.spec = p.spec.take().map(|s| PodSpec {
        node_name: s.node_name,
        containers: named(s.containers),
        init_containers: s.init_containers.map(named),
        ..Default::default()
    });
    p
}

/// What a pod event changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    Node(String),
    All,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use std::collections::BTreeMap;

    fn pod(name: &str, node: Option<&str>) -> Pod {
        Pod {
            metadata: ttdrv_core::fixtures::meta(name, "ns"),
            spec: Some(PodSpec {
                node_name: node.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn installer(name: &str, node: &str, ns: &str) -> Pod {
        let mut p = pod(name, Some(node));
        p.metadata.namespace = Some(ns.into());
        p.metadata.labels = Some(BTreeMap::from([(labels::CLAIM.into(), "fleet".into())]));
        p
    }

    fn names(pods: &NodePods) -> Vec<String> {
        let mut n: Vec<String> = pods.facts.iter().map(|f| f.pod.name.clone()).collect();
        n.sort();
        n
    }

    #[test]
    fn follows_binding_deletion_and_relist() {
        let cache = PodCache::new("tt");
        let node = |n: &str| Some(Changed::Node(n.into()));
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(pod("a", Some("n1"))));
        cache.apply(watcher::Event::InitApply(pod("b", Some("n2"))));
        assert!(
            names(&cache.on_node("n1")).is_empty(),
            "half a list is not used"
        );
        assert_eq!(cache.apply(watcher::Event::InitDone), Some(Changed::All));
        assert_eq!(names(&cache.on_node("n1")), ["a"]);
        // Created unbound (not kept), then bound.
        assert_eq!(cache.apply(watcher::Event::Apply(pod("c", None))), None);
        assert_eq!(names(&cache.on_node("n1")), ["a"]);
        assert_eq!(
            cache.apply(watcher::Event::Apply(pod("c", Some("n1")))),
            node("n1")
        );
        assert_eq!(names(&cache.on_node("n1")), ["a", "c"]);
        // The same facts again (a status heartbeat): nothing to look at.
        assert_eq!(
            cache.apply(watcher::Event::Apply(pod("c", Some("n1")))),
            None
        );
        let mut done = pod("c", Some("n1"));
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(cache.apply(watcher::Event::Apply(done)), node("n1"));
        assert!(cache.on_node("n1").facts.iter().any(|f| f.finished));
        assert_eq!(
            cache.apply(watcher::Event::Delete(pod("a", Some("n1")))),
            node("n1")
        );
        assert_eq!(names(&cache.on_node("n1")), ["c"]);
        // A re-list replaces everything: b went away while the watch was down;
        // until it completes the old content answers.
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(pod("c", Some("n1"))));
        cache.apply(watcher::Event::InitApply(pod("d", Some("n2"))));
        assert_eq!(names(&cache.on_node("n2")), ["b"]);
        cache.apply(watcher::Event::InitDone);
        assert_eq!(names(&cache.on_node("n1")), ["c"]);
        assert_eq!(names(&cache.on_node("n2")), ["d"]);
        assert!(cache.on_node("n3").facts.is_empty());
        assert_eq!(cache.counts(), (2, 0));
    }

    #[test]
    fn keeps_whole_pods_of_our_installers_only() {
        let cache = PodCache::listed(
            "tt",
            [
                installer("ttdrv-fleet-1", "n1", "tt"),
                // Someone else's namespace: facts only.
                installer("ttdrv-fleet-2", "n1", "other"),
                pod("web", Some("n1")),
            ],
        );
        let on = cache.on_node("n1");
        assert_eq!(on.facts.len(), 3);
        let kept: Vec<_> = on
            .installers
            .iter()
            .map(|p| PodRef::of(p).to_string())
            .collect();
        assert_eq!(kept, ["tt/ttdrv-fleet-1"]);
        // An installer pod's status change is a change, though its facts are not.
        let mut ready = installer("ttdrv-fleet-1", "n1", "tt");
        ready.status = Some(PodStatus {
            pod_ip: Some("10.0.0.1".into()),
            ..Default::default()
        });
        assert_eq!(
            cache.apply(watcher::Event::Apply(ready)),
            Some(Changed::Node("n1".into()))
        );
        assert_eq!(cache.counts(), (3, 1));
        cache.apply(watcher::Event::Delete(installer(
            "ttdrv-fleet-1",
            "n1",
            "tt",
        )));
        assert!(cache.on_node("n1").installers.is_empty());
    }

    /// Installer pod `u1` on n1, started at 10:00, in a sandbox from
    /// `sandbox` (hh:mm), its container `running` or crashed, with `restarts`.
    fn in_sandbox(sandbox: &str, restarts: i32, running: bool) -> Pod {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
            PodCondition,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let t = |hhmm: &str| {
            Time(
                format!("2026-12-05T{hhmm}:00Z")
                    .parse()
                    .expect("a timestamp"),
            )
        };
        let mut p = installer("ttdrv-fleet-1", "n1", "tt");
        p.metadata.uid = Some("u1".into());
        let state = if running {
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(t(sandbox)),
                }),
                ..Default::default()
            }
        } else {
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 101,
                    reason: Some("Error".into()),
                    started_at: Some(t(sandbox)),
                    ..Default::default()
                }),
                ..Default::default()
            }
        };
        p.status = Some(PodStatus {
            start_time: Some(t("10:00")),
            conditions: Some(vec![PodCondition {
                type_: "PodReadyToStartContainers".into(),
                status: "True".into(),
                last_transition_time: Some(t(sandbox)),
                ..Default::default()
            }]),
            container_statuses: Some(vec![ContainerStatus {
                name: "installer".into(),
                restart_count: restarts,
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    #[test]
    fn installer_restart_baselines_follow_the_sandbox() {
        let cache = PodCache::listed("tt", [in_sandbox("10:00", 0, true)]);
        let baseline = |c: &PodCache| {
            c.on_node("n1")
                .restart_baselines
                .get("u1")
                .map(|b| b.restarts.clone())
        };
        // the pod's first sandbox counts from 0
        assert_eq!(baseline(&cache), Some(vec![]));
        // four reboots later, running in a new sandbox: those four are not crashes
        cache.apply(watcher::Event::Apply(in_sandbox("14:00", 4, true)));
        let four = Some(vec![("installer".to_string(), 4)]);
        assert_eq!(baseline(&cache), four);
        // crashes in that sandbox do not move it
        cache.apply(watcher::Event::Apply(in_sandbox("14:00", 6, false)));
        assert_eq!(baseline(&cache), four);
        // nor does a re-list that finds the same sandbox
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(in_sandbox("14:00", 7, false)));
        cache.apply(watcher::Event::InitDone);
        assert_eq!(baseline(&cache), four);
        // the pod's status as the observation reads it: three crashes fail it
        let on = cache.on_node("n1");
        let pod = on.installers.first().expect("the installer");
        let f = installer::failure(pod, on.restart_baselines.get("u1")).expect("a crash loop");
        assert!(
            f.message.contains("3 times since its sandbox started"),
            "{}",
            f.message
        );
        // gone with the pod
        cache.apply(watcher::Event::Delete(in_sandbox("14:00", 7, false)));
        assert_eq!(baseline(&cache), None);
    }

    #[tokio::test]
    async fn ready_after_the_first_list() {
        let cache = PodCache::new("tt");
        assert!(!*cache.ready.borrow());
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitDone);
        cache.wait_until_ready().await;
        assert!(*cache.ready.borrow());
    }
}
