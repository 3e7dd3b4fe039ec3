//! What every actor of the firmware controller shares: the context, the
//! caches and the writers (the same Labeler and Evictor code as the driver
//! policy's, and the flash Job writer).

use std::sync::Arc;

use actix::prelude::*;

use super::jobs::FlashJobWriter;
use super::node::FwNodePorts;
use super::watches::FirmwareStores;
use crate::runtime::context::Context;
use crate::workers::{Evictor, Labeler};

/// What every actor of the firmware controller shares.
pub(crate) struct Shared {
    pub(crate) ctx: Arc<Context>,
    pub(crate) stores: FirmwareStores,
    pub(crate) labeler: Addr<Labeler>,
    pub(crate) evictor: Addr<Evictor>,
    pub(crate) jobs: Addr<FlashJobWriter>,
}

impl Shared {
    /// The ports of a node actor: the shared writers.
    pub(crate) fn node_ports(&self) -> FwNodePorts {
        FwNodePorts {
            patch: self.labeler.clone().recipient(),
            evict: self.evictor.clone().recipient(),
            create_job: self.jobs.clone().recipient(),
        }
    }
}
