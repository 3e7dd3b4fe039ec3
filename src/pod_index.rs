//! Pods by the node they are bound to, kept by the pod watch next to its
//! cache, so a pass finds the pods of a few nodes without scanning every pod
//! in the cluster.
//!
//! The index follows the cache one event behind, and is rebuilt on every
//! (re-)list. Until a list has been taken in completely it is not used: a pass
//! then scans the cache itself. Otherwise a controller's first pass (the cache
//! is ready a moment before the index) could see no pods on a node and let a
//! drain end with a device user still running — the chaos test's
//! apiserver-restart trial caught exactly that.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

type Index = HashMap<String, HashSet<ObjectRef<Pod>>>;

#[derive(Default)]
pub struct PodsByNode {
    live: RwLock<Index>,
    /// Built during a (re-)list, swapped in when it completes.
    relist: RwLock<Index>,
    /// `live` holds a complete list (false from a list's start to its end).
    synced: AtomicBool,
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn insert(index: &mut Index, pod: &Pod) {
    // A pod's node never changes once set; an unbound pod is indexed when
    // its binding arrives.
    if let Some(n) = node_of(pod) {
        index
            .entry(n.to_string())
            .or_default()
            .insert(ObjectRef::from_obj(pod));
    }
}

impl PodsByNode {
    /// Follows the pod watch: call with every event, after the cache took it.
    pub fn apply(&self, event: &watcher::Event<Pod>) {
        match event {
            watcher::Event::Apply(p) => {
                if let Ok(mut ix) = self.live.write() {
                    insert(&mut ix, p);
                }
            }
            watcher::Event::Delete(p) => {
                if let (Some(n), Ok(mut ix)) = (node_of(p), self.live.write()) {
                    let r = ObjectRef::from_obj(p);
                    if let Some(set) = ix.get_mut(n) {
                        set.remove(&r);
                        if set.is_empty() {
                            ix.remove(n);
                        }
                    }
                }
            }
            watcher::Event::Init => {
                self.synced.store(false, Ordering::SeqCst);
                if let Ok(mut ix) = self.relist.write() {
                    ix.clear();
                }
            }
            watcher::Event::InitApply(p) => {
                if let Ok(mut ix) = self.relist.write() {
                    insert(&mut ix, p);
                }
            }
            watcher::Event::InitDone => {
                if let (Ok(mut live), Ok(mut relist)) = (self.live.write(), self.relist.write()) {
                    *live = std::mem::take(&mut *relist);
                    self.synced.store(true, Ordering::SeqCst);
                }
            }
        }
    }

    /// The pods bound to `node`, as the cache has them.
    pub fn on_node(&self, store: &Store<Pod>, node: &str) -> Vec<Arc<Pod>> {
        let ix = match self.live.read() {
            Ok(ix) if self.synced.load(Ordering::SeqCst) => ix,
            // Not in step with the cache (yet): ask the cache itself.
            _ => return store.state_filter(|p| node_of(p) == Some(node)),
        };
        ix.get(node)
            .map(|refs| refs.iter().filter_map(|r| store.get(r)).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::reflector;

    fn pod(name: &str, node: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn names(pods: Vec<Arc<Pod>>) -> Vec<String> {
        let mut n: Vec<String> = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn the_cache_answers_until_the_index_has_a_whole_list() {
        let (store, mut writer) = reflector::store::<Pod>();
        let index = PodsByNode::default();
        // The cache took a whole list; the index has not seen its end yet.
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a", Some("n1"))),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&ev);
        }
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod("a", Some("n1"))));
        assert_eq!(names(index.on_node(&store, "n1")), ["a"]);
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(index.on_node(&store, "n1")), ["a"]);
        // A fresh index that saw nothing at all.
        assert_eq!(names(PodsByNode::default().on_node(&store, "n1")), ["a"]);
    }

    #[test]
    fn follows_binding_deletion_and_relist() {
        let (store, mut writer) = reflector::store::<Pod>();
        let index = PodsByNode::default();
        let mut feed = |ev: watcher::Event<Pod>| {
            writer.apply_watcher_event(&ev);
            index.apply(&ev);
        };
        feed(watcher::Event::Init);
        feed(watcher::Event::InitApply(pod("a", Some("n1"))));
        feed(watcher::Event::InitApply(pod("b", Some("n2"))));
        feed(watcher::Event::InitDone);
        assert_eq!(names(index.on_node(&store, "n1")), ["a"]);
        // Created unbound, then bound.
        feed(watcher::Event::Apply(pod("c", None)));
        assert_eq!(names(index.on_node(&store, "n1")), ["a"]);
        feed(watcher::Event::Apply(pod("c", Some("n1"))));
        assert_eq!(names(index.on_node(&store, "n1")), ["a", "c"]);
        feed(watcher::Event::Delete(pod("a", Some("n1"))));
        assert_eq!(names(index.on_node(&store, "n1")), ["c"]);
        // A re-list replaces everything: b went away while the watch was down.
        feed(watcher::Event::Init);
        feed(watcher::Event::InitApply(pod("c", Some("n1"))));
        feed(watcher::Event::InitApply(pod("d", Some("n2"))));
        feed(watcher::Event::InitDone);
        assert_eq!(names(index.on_node(&store, "n1")), ["c"]);
        assert_eq!(names(index.on_node(&store, "n2")), ["d"]);
        assert!(index.on_node(&store, "n3").is_empty());
    }
}
