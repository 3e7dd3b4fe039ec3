//! What the machine sees of a node at one step: its installer pod, its
//! drain, what the agent reported. A leaf (no module of the machine), so
//! that [`crate::soak`], which the machine asks, can read it too.

use ttdrv_api::module_params::Values;
use ttdrv_api::vfio::Passthrough;

use crate::drain::{BlockedEviction, DrainProgress};
use crate::installer::Failure;
use crate::slots::Holder;

/// The node's installer pod as seen in the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum InstallerPod {
    #[default]
    Missing,
    /// Rendered from an older template; `deleting` once deletion has begun.
    Stale {
        deleting: bool,
    },
    Current {
        ready: bool,
    },
}

/// `Default`: nothing seen (not Ready, nothing loaded, no installer pod, no
/// slot), for callers that know only part of it, such as the plugin's plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    pub now: i64,
    /// The node's name, for the commands its messages give a person.
    pub node: String,
    /// The node's Ready condition is True.
    pub ready: bool,
    pub unschedulable: bool,
    /// `driver.tenstorrent.com/kmd-version` as the agent reported it.
    pub loaded: Option<String>,
    /// The module parameters in effect as the agent reported them
    /// ([`crate::node::loaded_parameters`]); None when not reported.
    pub parameters: Option<Values>,
    /// The agent found a DKMS install (`install-mode=host`).
    pub host_managed: bool,
    /// How the node's Tenstorrent functions are split between tt-kmd and
    /// vfio-pci, as the VFIO binder reported at this boot.
    pub passthrough: Passthrough,
    pub installer: InstallerPod,
    /// Every configured deploy gate is "false".
    pub gates_closed: bool,
    /// Any configured deploy gate label is present.
    pub gates_present: bool,
    /// The drain's progress: `None` when no drain plan was computed for this
    /// observation, and a node never leaves Draining on `None`.
    pub drain: Option<DrainProgress>,
    /// The remaining pods a PodDisruptionBudget refuses to let go, each
    /// with that budget: what a blocked drain's message names.
    pub drain_blocked: Vec<BlockedEviction>,
    /// Value of the node's retry annotation, if any.
    pub retry_token: Option<String>,
    /// The node holds a rollout slot: the RolloutActor's plan granted (and
    /// reserved) it, so this step may start a disruptive cycle.
    pub slot: bool,
    /// Why the installer pod is unhealthy, for failure messages.
    pub installer_problem: Option<String>,
    /// The installer pod has failed for good (image, crash loop, the agent's
    /// own refusal), with its cause.
    pub installer_failure: Option<Failure>,
    /// The node is cordoned by this controller for another policy's cycle
    /// that was cut short (the node moved to this policy): the cordon is ours
    /// to undo, not an admin's.
    pub inherited_cordon: bool,
    /// The gated DaemonSets a flash stood down before it handed this
    /// policy the node's cordon ([`crate::node::handed_over_to`]): their pods
    /// left with the flash, so the cycle that takes the cordon over must
    /// wait for them too before it restarts the DRA plugin.
    pub handed_over_stood_down: Vec<String>,
    /// The cycle the node's [`ttdrv_api::labels::ROLLBACK_VERDICT`] names,
    /// if it carries one (as the cache shows it).
    pub rollback_verdict: Option<i64>,
    /// When the node's installer pod was created (Unix seconds).
    pub installer_created: Option<i64>,
    /// The agent reported no module loaded at this boot
    /// ([`crate::node::reported_nothing_loaded`]).
    pub nothing_loaded: bool,
    /// The node rebooted and its agent has not reported since: the driver
    /// labels describe the last boot ([`crate::node::driver_labels_stale`]).
    pub rebooted_unreported: bool,
    /// The node carries this policy's `unmanaged` label: vacated earlier
    /// (`spec.unmanage`), left alone.
    pub vacated: bool,
    /// The node may start its disruptive cycle as far as build-ahead goes
    /// ([`crate::prepare::gate`]): the target is in its cache or loaded, or
    /// nothing is loaded, or its current installer pod outlived the upgrade
    /// timeout without preparing (an agent that does not prepare: the cycle
    /// then builds inside the window, as without build-ahead).
    pub prepared: bool,
    /// The prepare plan chose this node: replace its stale installer pod now
    /// so the new agent builds ahead ([`crate::prepare::plan`]).
    pub prepare_turn: bool,
    /// The DaemonSet controller has not yet observed the installer template
    /// ([`crate::installer::template_observed`]): a stale pod is kept, since
    /// its replacement would come back on the old template.
    pub template_pending: bool,
    /// Another kind's cycle has the node ([`crate::claim::firmware_cycle`],
    /// or the slot book refused the start): who, for the message. No driver
    /// cycle starts on it meanwhile.
    pub held_by: Option<Holder>,
    /// The firmware every card read back last (label `fw-version`).
    pub firmware_version: Option<String>,
    /// A firmware policy's flash of this node waits only for its slot
    /// ([`crate::claim::firmware_first`]): a swap goes after it, under the
    /// cordon it hands over.
    pub firmware_first: Option<String>,
    /// Pods using the node's devices whose containers crash-loop
    /// (`namespace/name`): trouble during a soak.
    pub device_pods_crash_looping: Vec<String>,
    /// What the scheduler sees of the node's cards ([`crate::surface`]).
    pub surface: crate::surface::Surface,
    /// This cycle's validation pod, once created
    /// (`upgradePolicy.validation.podTemplateName`).
    pub validation_pod: Option<ValidationPod>,
    /// What will still hold the device once the gates close and the drain
    /// runs ([`crate::device_holders::summary`]), observed while the node
    /// waits for its cycle: said in its Pending and Cordoning messages.
    pub ungated_holders: Option<String>,
}

/// A validation pod of the node's cycle, as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationPod {
    /// `namespace/name`.
    pub pod: String,
    /// Unix seconds.
    pub created: i64,
    pub outcome: crate::drain::RunOutcome,
}
