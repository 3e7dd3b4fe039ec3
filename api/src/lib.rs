//! The operator's API, with no I/O: the `TenstorrentDriverPolicy` custom resource
//! (`driver.tenstorrent.com/v1alpha1`), the grammar of `podSelectorLabel`, and the
//! labels shared with the node agent. Controller, agent and kubectl plugin all
//! depend on this crate, so it stays free of runtime concerns.

pub mod labels;
pub mod podselector;
pub mod v1alpha1;

pub use podselector::{PodSelector, PodSelectorError};
pub use v1alpha1::*;
