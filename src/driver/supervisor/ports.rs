//! What a PolicySupervisor talks to (its ports) and the small helpers its
//! pass, marks and status write share: a leaf, so none of them imports the
//! supervisor back.

use actix::prelude::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use crate::driver::messages::RefusalChanged;
use crate::workers::evictor::{Evict, Evictor};
use crate::workers::labeler::{Labeler, PatchNode};
use crate::workers::renderer::{DaemonSetRenderer, Ensure, ReplaceInstallerPod};

/// Where a PolicySupervisor (and the NodeActors it starts) send their work:
/// the shared Labeler, Evictor and DaemonSetRenderer. Recipients, so tests
/// put recording fakes in their place.
#[derive(Clone)]
pub struct SupervisorPorts {
    pub patch: Recipient<PatchNode>,
    pub evict: Recipient<Evict>,
    pub ensure: Recipient<Ensure>,
    pub replace_pod: Recipient<ReplaceInstallerPod>,
    /// The PolicyManager, told when the cluster starts or stops refusing
    /// the policy (ownership of nodes depends on it).
    pub refusals: Recipient<RefusalChanged>,
}

impl SupervisorPorts {
    pub fn of(
        labeler: &Addr<Labeler>,
        evictor: &Addr<Evictor>,
        renderer: &Addr<DaemonSetRenderer>,
        refusals: Recipient<RefusalChanged>,
    ) -> Self {
        Self {
            patch: labeler.clone().recipient(),
            evict: evictor.clone().recipient(),
            ensure: renderer.clone().recipient(),
            replace_pod: renderer.clone().recipient(),
            refusals,
        }
    }
}

pub(super) fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

pub(super) fn node_label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    ttdrv_core::node::label(node, key)
}

pub(super) fn owns(owned: &[String], node: &str) -> bool {
    owned.binary_search_by(|n| n.as_str().cmp(node)).is_ok()
}
