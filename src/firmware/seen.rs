//! One node of a firmware policy as a pass sees it: what the node actor
//! steps, and what the status is written from.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use ttdrv_core::firmware::FwRecord;

/// One node of a policy, as a pass sees it.
pub(crate) struct Seen {
    pub(crate) node: Arc<Node>,
    pub(crate) prev: FwRecord,
    pub(crate) persisted: Option<FwRecord>,
    pub(crate) view: ttdrv_core::firmware::observe::NodeView,
}
