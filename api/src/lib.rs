//! The operator's API, with no I/O: the `TenstorrentDriverPolicy` custom resource
//! (`driver.tenstorrent.com/v1alpha1`), the grammar of `podSelectorLabel`, the
//! labels shared with the node agent, and the validation rules (one definition
//! for the CRD's schema and the Rust side). Controller, agent and kubectl plugin
//! all depend on this crate, so it stays free of runtime concerns.

// First: its macros build the patterns of the modules below.
#[macro_use]
pub mod validation;

pub mod firmware;
pub mod images;
pub mod labels;
pub mod module_params;
pub mod podselector;
pub mod v1alpha1;
pub mod vfio;

#[cfg(test)]
mod test_support;

pub use module_params::ModuleParameters;
pub use podselector::{PodSelector, PodSelectorError};
pub use v1alpha1::*;
