//! `spec.unmanage` (the Go operator's): the installer of an unmanaged policy
//! (env `TTDRV_UNMANAGE=true`) installs nothing and writes nothing before the
//! controller's unload go-ahead ([`go_ahead::decide_unload`]: written once the
//! node is cordoned and drained for this cycle). A report at start could land
//! after the controller vacated the node (from labels it already had) and
//! leave driver labels on a node that is never written to again. With the
//! go-ahead: a DKMS host is reported as such and left alone; otherwise the
//! module is unloaded under the same holder rules as a swap (`forceUnload`),
//! the driver labels are removed and the pod becomes Ready (the readiness
//! probe: nothing loaded, not waiting). The controller then vacates the node.
//! Kept apart from the install sequence ([`crate::agent`]) so the two never
//! mix.

use std::path::Path;
use std::time::Instant;

use ttdrv_api::labels;
use ttdrv_core::go_ahead::{self, Unload};

use crate::agent::{Agent, step};
use crate::error::{AgentError, Result};
use crate::holder::Holder;
use crate::host::{HostRoot, MODULE_NAME};
use crate::node::LabelChanges;
use crate::pod;

/// How an unload run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unloaded {
    /// DKMS manages the module: reported, nothing touched.
    HostManaged,
    /// Unloaded (or nothing was loaded); the driver labels are gone.
    Done {
        previous: Option<String>,
        killed: Vec<Holder>,
    },
    /// The pod was stopped while waiting for the go-ahead.
    Stopped { waiting: String },
}

impl Unloaded {
    pub fn summary(&self) -> String {
        match self {
            Unloaded::HostManaged => "result=host-managed (unmanage: nothing touched)".into(),
            Unloaded::Done { previous, killed } => format!(
                "result=unloaded previous={} killed_pids={}",
                previous.as_deref().unwrap_or("none"),
                killed.len()
            ),
            Unloaded::Stopped { waiting } => format!("result=stopped-waiting waiting={waiting:?}"),
        }
    }
}

/// The termination message of an unload that gave up: the error's own
/// reason (DeviceBusy), else `UnloadError`.
pub fn termination_message(e: &AgentError) -> String {
    e.termination_message().unwrap_or_else(|| {
        ttdrv_core::reason::termination_message(ttdrv_core::reason::UNLOAD_ERROR, &e.to_string())
    })
}

/// Readiness of an unload-only installer: nothing loaded and not waiting.
pub fn readiness(
    root: &HostRoot,
    status_file: Option<&Path>,
) -> std::result::Result<String, String> {
    let loaded = root
        .loaded_version()
        .map_err(|e| format!("not ready: {e}"))?;
    let waiting = status_file.and_then(pod::waiting);
    match (root.module_state(), waiting) {
        (Ok(None), None) => Ok("ready: tenstorrent unloaded (unmanage)".into()),
        (_, Some(w)) => Err(format!("not ready: {w}")),
        _ => Err(format!(
            "not ready: tenstorrent {} still loaded (unmanage)",
            loaded.as_deref().unwrap_or("(unversioned)")
        )),
    }
}

impl Agent<'_> {
    /// The whole unload sequence; idling afterwards is the caller's business.
    pub fn run_unload(&self) -> Result<Unloaded> {
        let root = self.root();
        if let Some(waiting) = self.await_unload_go_ahead()? {
            return Ok(Unloaded::Stopped { waiting });
        }
        let signals = root.host_install_signals();
        let state = root.module_state()?;
        let previous = state.as_ref().and_then(|s| s.version.clone());
        if !signals.is_empty() {
            tracing::info!(?signals, "host-managed tt-kmd install: nothing to unload");
            step("report-host", || {
                self.report_host(&root, true, state.as_ref())
            })?;
            return Ok(Unloaded::HostManaged);
        }
        let mut killed = vec![];
        if let Some(s) = &state {
            killed = step("make-unloadable", || self.make_unloadable(&root))?;
            step("unload", || {
                self.kernel
                    .unload(MODULE_NAME)
                    .map_err(|source| AgentError::Unload {
                        loaded: s.version.clone().unwrap_or_else(|| "(unversioned)".into()),
                        source,
                    })
            })?;
        }
        // What this operator wrote goes; the boot ID stays with "nothing
        // loaded" as this boot's report.
        let mut changes = LabelChanges::new();
        for l in [
            labels::KMD_VERSION,
            labels::INSTALL_MODE,
            labels::TT_SMI_VERSION,
        ] {
            changes.insert(l.to_string(), None);
        }
        changes.insert(labels::KMD_BOOT_ID.to_string(), self.boot_id(&root));
        step("unlabel-node", || {
            self.apply_labels(&changes)?;
            // Nothing loaded: no parameters in effect.
            self.report_parameters(None)
        })?;
        self.note_waiting(None);
        Ok(Unloaded::Done { previous, killed })
    }

    /// Waits for the unload go-ahead of this node's current cycle; `Some`
    /// (why it was waiting) when the pod is stopped first.
    fn await_unload_go_ahead(&self) -> Result<Option<String>> {
        let start = Instant::now();
        let mut said: Option<String> = None;
        loop {
            let decision = match self.config.policy.as_deref() {
                None => Unload::Wait(format!(
                    "{} is not set on this pod, so no go-ahead can match",
                    ttdrv_api::labels::env::POLICY
                )),
                Some(policy) => match self.node.get() {
                    Ok(n) => go_ahead::decide_unload(&n, policy),
                    Err(e) => Unload::Wait(e),
                },
            };
            let why = match decision {
                Unload::GoAhead(go) => {
                    tracing::info!(policy = %go.policy, node = %go.node, cycle = go.cycle,
                        waited_ms = start.elapsed().as_millis() as u64,
                        "the controller's unload go-ahead is on the node");
                    return Ok(None);
                }
                Unload::Wait(why) => why,
            };
            if said.as_deref() != Some(why.as_str()) {
                tracing::info!("{why}; the module is left alone and the pod is not Ready");
                self.note_waiting(Some(&why));
                said = Some(why.clone());
            }
            if self.pause.pause(self.config.go_ahead_poll) {
                return Ok(Some(why));
            }
        }
    }
}
