//! Fixtures of the controller's unit tests: reflector stores fed by hand and
//! a [`Context`] over them whose client points at `url` (a loopback test
//! server, or a port nothing listens on).

use std::sync::Arc;

use clap::Parser;
use kube::runtime::{reflector, watcher};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::context::{Context, Stores};
use crate::runtime::pod_index::PodCache;

/// A store holding `objs`, as a watch's initial list leaves it.
pub fn fed<K>(objs: Vec<K>) -> reflector::Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objs {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

/// Empty stores (pods of namespace `tt`).
pub fn empty_stores() -> Stores {
    Stores {
        policies: fed(vec![]),
        nodes: fed(vec![]),
        pods: Arc::new(PodCache::new("tt")),
        daemonsets: fed(vec![]),
        all_daemon_sets: Default::default(),
        pdbs: fed(vec![]),
        slices: Arc::new(crate::runtime::slice_index::SliceIndex::new(
            ttdrv_api::labels::DEFAULT_DRA_DRIVER,
        )),
    }
}

/// What a fake API server does with a Node merge patch: `stored` takes it
/// (as the API server would keep it), and the log's words for it: the
/// record's state under annotation `record_key` (parsed by `state_of`) and
/// the cordon or uncordon it carries. Returns the Node after the patch.
pub fn merge_node_patch(
    stored: &mut serde_json::Value,
    patch: &serde_json::Value,
    record_key: &str,
    state_of: impl FnOnce(&str) -> Option<String>,
) -> (crate::Result<k8s_openapi::api::core::v1::Node>, String) {
    if !stored.is_object() {
        *stored = serde_json::json!({});
    }
    json_patch::merge(stored, patch);
    let state = patch["metadata"]["annotations"][record_key]
        .as_str()
        .and_then(state_of)
        .unwrap_or_default();
    let cordon = match patch["spec"]["unschedulable"].as_bool() {
        Some(true) => " cordon",
        Some(false) => " uncordon",
        None => "",
    };
    let node = serde_json::from_value(stored.clone()).map_err(|source| crate::Error::Serialize {
        what: "fake node",
        source,
    });
    (node, format!("patch {state}{cordon}"))
}

/// Nothing listens on port 9: Events fail to publish in the background.
pub const NOWHERE: &str = "http://127.0.0.1:9";

/// The controller's default settings over `stores`, its client at `url`.
pub fn context(url: &str, stores: Stores) -> Arc<Context> {
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
    Arc::new(Context::new(
        client,
        Config::parse_from(["ttdrv-controller"]),
        stores,
        Arc::new(Metrics::new("test")),
    ))
}
