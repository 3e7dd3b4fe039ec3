//! What the controller keeps of the DRA driver's ResourceSlices: per node,
//! each slice's pool, generation and device count ([`SliceFacts`]), for the
//! scheduling-surface check before a swapped node's uncordon
//! ([`ttdrv_core::surface`]).
//!
//! Fed by a ResourceSlice watch with the field selector `spec.driver=<the
//! --dra-driver>`. A change pokes its node. On a cluster that does not serve
//! `resource.k8s.io/v1` the watch retries with backoff and the index stays
//! empty: nodes then count no slice (a DRA plugin pod on the node still makes
//! the check wait for one), and readiness never waits for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::watcher;
use ttdrv_core::surface::{SliceFacts, slice_devices};

use crate::runtime::pod_index::Changed;

type Slices = HashMap<String, BTreeMap<String, SliceFacts>>;

/// The driver's slices by node, then by slice name.
pub struct SliceIndex {
    driver: String,
    live: RwLock<Slices>,
    /// Built during a (re-)list, swapped in when it completes.
    relist: RwLock<Slices>,
}

impl SliceIndex {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            live: RwLock::default(),
            relist: RwLock::default(),
        }
    }

    /// The field selector of the watch that feeds it.
    pub fn field_selector(&self) -> String {
        format!("spec.driver={}", self.driver)
    }

    /// Devices the node's slices list now; None without any slice.
    pub fn devices_on(&self, node: &str) -> Option<u32> {
        let live = self.live.read().ok()?;
        slice_devices(live.get(node)?.values())
    }

    /// Slices known (`ttdriver_cache_objects{kind="ResourceSlice"}`).
    pub fn len(&self) -> usize {
        self.live
            .read()
            .map_or(0, |l| l.values().map(BTreeMap::len).sum())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Follows the watch: the node whose count may have changed.
    pub fn apply(&self, event: watcher::Event<ResourceSlice>) -> Option<Changed> {
        let name = |s: &ResourceSlice| s.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Apply(s) => {
                let mut live = self.live.write().ok()?;
                let gone = remove(&mut live, &name(&s));
                let facts = SliceFacts::of(&s, &self.driver);
                let node = facts.as_ref().map(|f| f.node.clone());
                if let Some(f) = facts {
                    live.entry(f.node.clone()).or_default().insert(name(&s), f);
                }
                node.or(gone).map(Changed::Node)
            }
            watcher::Event::Delete(s) => {
                let mut live = self.live.write().ok()?;
                remove(&mut live, &name(&s)).map(Changed::Node)
            }
            watcher::Event::Init => {
                if let Ok(mut r) = self.relist.write() {
                    r.clear();
                }
                None
            }
            watcher::Event::InitApply(s) => {
                if let (Some(f), Ok(mut r)) =
                    (SliceFacts::of(&s, &self.driver), self.relist.write())
                {
                    r.entry(f.node.clone()).or_default().insert(name(&s), f);
                }
                None
            }
            watcher::Event::InitDone => {
                let (mut live, mut relist) = (self.live.write().ok()?, self.relist.write().ok()?);
                let fresh = std::mem::take(&mut *relist);
                let changed = *live != fresh;
                *live = fresh;
                changed.then_some(Changed::All)
            }
        }
    }
}

/// Removes the slice `name` wherever it is; the node it was on.
fn remove(live: &mut Slices, name: &str) -> Option<String> {
    let node = live
        .iter()
        .find(|(_, s)| s.contains_key(name))
        .map(|(n, _)| n.clone())?;
    if let Some(s) = live.get_mut(&node) {
        s.remove(name);
        if s.is_empty() {
            live.remove(&node);
        }
    }
    Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, node: &str, generation: i64, devices: u32) -> ResourceSlice {
        let mut s =
            ttdrv_core::fixtures::resource_slice(node, "tenstorrent.com", generation, devices);
        s.metadata.name = Some(name.into());
        s
    }

    #[test]
    fn follows_the_watch_and_pokes_the_slices_node() {
        let ix = SliceIndex::new("tenstorrent.com");
        assert_eq!(ix.field_selector(), "spec.driver=tenstorrent.com");
        ix.apply(watcher::Event::Init);
        ix.apply(watcher::Event::InitApply(slice("s1", "n1", 1, 2)));
        assert_eq!(ix.devices_on("n1"), None, "not before the list completes");
        assert_eq!(ix.apply(watcher::Event::InitDone), Some(Changed::All));
        assert_eq!(ix.devices_on("n1"), Some(2));
        // Republished one short, in a new generation.
        assert_eq!(
            ix.apply(watcher::Event::Apply(slice("s1", "n1", 2, 1))),
            Some(Changed::Node("n1".into()))
        );
        assert_eq!(ix.devices_on("n1"), Some(1));
        assert_eq!(
            ix.apply(watcher::Event::Delete(slice("s1", "n1", 2, 1))),
            Some(Changed::Node("n1".into()))
        );
        assert_eq!(ix.devices_on("n1"), None);
        assert!(ix.is_empty());
        // Another driver's slice is not kept.
        let mut other = slice("g1", "n1", 1, 8);
        other.spec.driver = "gpu.example.com".into();
        assert_eq!(ix.apply(watcher::Event::Apply(other)), None);
        assert_eq!(ix.devices_on("n1"), None);
    }
}
