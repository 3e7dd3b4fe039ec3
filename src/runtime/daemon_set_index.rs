//! What the controller keeps of every DaemonSet of the cluster: the deploy
//! gates its pod template follows and whether its pods hold the device
//! ([`DaemonSetFacts`], a few dozen bytes), by `namespace/name`. A DaemonSet
//! pod's own node affinity cannot say it: the DaemonSet controller replaces
//! its required node selector with a single `matchFields metadata.name`
//! term, so the gate clause lives only in the DaemonSet's template.
//!
//! Fed by a cluster-wide DaemonSet watch (DaemonSets are few). A pass takes
//! the current index whole (an `Arc`, no copy); a (re-)list is built aside
//! and swapped in when it completes, as the pod cache does.

use std::sync::{Arc, RwLock};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::watcher;
use ttdrv_core::drain::{DaemonSetFacts, DaemonSets};

use crate::runtime::pod_index::Changed;

/// The DaemonSet facts, fed by the DaemonSet watch.
pub struct DaemonSetIndex {
    live: RwLock<Arc<DaemonSets>>,
    /// Built during a (re-)list, swapped in when it completes.
    relist: RwLock<DaemonSets>,
    /// Flips to true when the first list is in.
    ready: tokio::sync::watch::Sender<bool>,
}

impl Default for DaemonSetIndex {
    fn default() -> Self {
        Self {
            live: RwLock::default(),
            relist: RwLock::default(),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }
}

fn key(ds: &DaemonSet) -> ttdrv_core::drain::PodRef {
    ttdrv_core::drain::PodRef::of_daemon_set(ds)
}

impl DaemonSetIndex {
    /// An index holding `daemon_sets`, as after a list (tests).
    pub fn listed(daemon_sets: impl IntoIterator<Item = DaemonSet>) -> Self {
        let ix = Self::default();
        ix.apply(watcher::Event::Init);
        for d in daemon_sets {
            ix.apply(watcher::Event::InitApply(d));
        }
        ix.apply(watcher::Event::InitDone);
        ix
    }

    /// Follows the watch. [`Changed::All`] when a DaemonSet's facts changed
    /// (its status, rewritten on every pod change, is not read) or a
    /// (re-)list completed; `None` otherwise.
    pub fn apply(&self, event: watcher::Event<DaemonSet>) -> Option<Changed> {
        match event {
            watcher::Event::Apply(d) => {
                let (k, f) = (key(&d), DaemonSetFacts::of(&d));
                let mut live = self.live.write().ok()?;
                if live.get(&k) == Some(&f) {
                    return None;
                }
                Arc::make_mut(&mut live).insert(k, f);
                Some(Changed::All)
            }
            watcher::Event::Delete(d) => {
                let mut live = self.live.write().ok()?;
                Arc::make_mut(&mut live).remove(&key(&d))?;
                Some(Changed::All)
            }
            watcher::Event::Init => {
                if let Ok(mut r) = self.relist.write() {
                    r.clear();
                }
                None
            }
            watcher::Event::InitApply(d) => {
                if let Ok(mut r) = self.relist.write() {
                    r.insert(key(&d), DaemonSetFacts::of(&d));
                }
                None
            }
            watcher::Event::InitDone => {
                let (mut live, mut relist) = (self.live.write().ok()?, self.relist.write().ok()?);
                let mut fresh = std::mem::take(&mut *relist);
                fresh.shrink_to_fit();
                let changed = **live != fresh;
                *live = Arc::new(fresh);
                self.ready.send_replace(true);
                changed.then_some(Changed::All)
            }
        }
    }

    /// Resolves once the first list is in.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// The current index.
    pub fn snapshot(&self) -> Arc<DaemonSets> {
        self.live.read().map(|l| l.clone()).unwrap_or_default()
    }

    /// DaemonSets known (`ttdriver_cache_objects{kind="DaemonSetFacts"}`).
    pub fn len(&self) -> usize {
        self.live.read().map_or(0, |l| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, SecurityContext};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ds(name: &str, privileged: bool, ready: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                namespace: Some("tt".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(DaemonSetSpec {
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        node_selector: Some(
                            [(
                                ttdrv_api::labels::TT_PCI_PRESENT.to_string(),
                                "true".to_string(),
                            )]
                            .into(),
                        ),
                        containers: vec![Container {
                            name: "c".into(),
                            security_context: Some(SecurityContext {
                                privileged: Some(privileged),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::apps::v1::DaemonSetStatus {
                number_ready: ready,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn keeps_facts_and_pokes_only_when_they_change() {
        let ix = DaemonSetIndex::listed([ds("telemetry", true, 0)]);
        let r = ttdrv_core::drain::PodRef {
            namespace: "tt".into(),
            name: "telemetry".into(),
        };
        assert!(ix.snapshot().get(&r).is_some_and(|f| f.holds_device));
        // A status change (a pod became ready) is not read.
        assert_eq!(
            ix.apply(watcher::Event::Apply(ds("telemetry", true, 1))),
            None
        );
        let before = ix.snapshot();
        assert!(
            ix.apply(watcher::Event::Apply(ds("telemetry", false, 1)))
                .is_some()
        );
        assert!(
            before.get(&r).is_some_and(|f| f.holds_device),
            "a taken snapshot stays"
        );
        assert!(ix.snapshot().get(&r).is_some_and(|f| !f.holds_device));
        assert!(
            ix.apply(watcher::Event::Delete(ds("telemetry", false, 1)))
                .is_some()
        );
        assert!(ix.is_empty());
        // A re-list that finds the same facts pokes nothing.
        let ix = DaemonSetIndex::listed([ds("a", true, 0)]);
        ix.apply(watcher::Event::Init);
        ix.apply(watcher::Event::InitApply(ds("a", true, 3)));
        assert_eq!(ix.apply(watcher::Event::InitDone), None);
        assert_eq!(ix.len(), 1);
    }
}
