//! The operator's API, with no I/O: the `TenstorrentDriverPolicy` custom resource
//! (`driver.tenstorrent.com/v1alpha1`), the grammar of `podSelectorLabel`, the
//! labels shared with the node agent, and the validation rules (one definition
//! for the CRD's schema and the Rust side). Controller, agent and kubectl plugin
//! all depend on this crate, so it stays free of runtime concerns.
//!
//! | module | what it defines |
//! |---|---|
//! | [`v1alpha1`] | `TenstorrentDriverPolicy`, its spec, status and conditions |
//! | [`firmware`] | `TenstorrentFirmwarePolicy`, its reasons, labels and the flasher's contract |
//! | [`validation`] | what a policy may contain, once for the CRD schema and the Rust side |
//! | [`labels`] | Node labels, annotations and well-known names shared with the agent |
//! | [`module_params`] | `spec.moduleParameters`: the tt-kmd parameters and their bounds |
//! | [`podselector`] | the `podSelectorLabel` grammar |
//! | [`images`] | installer images: ours and the Go operator's builder |
//! | [`vfio`] | the contract between the VFIO binder and the controller |

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
