//! `ttdrv-agent status`: what the agent sees on this host, as JSON.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::agent::TT_SMI_HOST_PATH;
use crate::cache::{Cache, CacheEntry, SignedBy};
use crate::holder::Holder;
use crate::holders::find_holders;
use crate::host::{HostRoot, ModuleState, version_matches};

#[derive(Debug, Serialize)]
pub struct Status {
    pub host_root: PathBuf,
    /// From proc/sys/kernel/osrelease; null if unreadable.
    pub kernel_release: Option<String>,
    /// `host` when a DKMS install is detected, else `container`.
    pub install_mode: &'static str,
    pub host_install_signals: Vec<String>,
    /// sys/module/tenstorrent; null when the module is not loaded.
    pub module: Option<ModuleState>,
    /// TT_KMD_VERSION, when set.
    pub target_version: Option<String>,
    /// What `ttdrv-agent ready` would answer; null without a target.
    pub ready: Option<bool>,
    /// Why `run` is waiting for the controller's go-ahead (from its note);
    /// null when it is not waiting.
    pub waiting: Option<String>,
    pub holders: Vec<Holder>,
    pub cache: Vec<CacheEntry>,
    pub tt_smi: TtSmi,
    /// Problems met while looking (the rest of the report is still valid).
    pub errors: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct TtSmi {
    pub path: &'static str,
    pub installed: bool,
}

/// `signing_cert`: the certificate `run` signs with (TT_KMD_SIGNING_CERT),
/// so that `verified` says what `run` would load.
pub fn collect(
    root: &HostRoot,
    target: Option<&str>,
    waiting: Option<String>,
    signing_cert: Option<&Path>,
) -> Status {
    let mut errors = Vec::new();
    let fingerprint = signing_cert.and_then(|c| {
        crate::signing::cert_fingerprint(c)
            .map_err(|e| errors.push(format!("signing certificate: {e}")))
            .ok()
    });
    let signed_by = match (signing_cert, &fingerprint) {
        (None, _) => SignedBy::Nobody,
        (Some(_), Some(f)) => SignedBy::Cert(f),
        // Configured but unreadable: `run` would fail before the cache.
        (Some(_), None) => SignedBy::Anyone,
    };
    let kernel_release = root
        .kernel_release()
        .map_err(|e| errors.push(e.to_string()))
        .ok();
    let module = root
        .module_state()
        .map_err(|e| errors.push(e.to_string()))
        .ok()
        .flatten();
    let signals = root.host_install_signals();
    let ready = target.map(|t| {
        version_matches(module.as_ref().and_then(|m| m.version.as_deref()), t) && waiting.is_none()
    });
    Status {
        host_root: root.root().to_path_buf(),
        kernel_release,
        install_mode: if signals.is_empty() {
            ttdrv_api::labels::INSTALL_MODE_CONTAINER
        } else {
            ttdrv_api::labels::INSTALL_MODE_HOST
        },
        host_install_signals: signals,
        module,
        target_version: target.map(str::to_string),
        ready,
        waiting,
        holders: find_holders(root),
        cache: Cache::new(root).entries(signed_by),
        tt_smi: TtSmi {
            path: TT_SMI_HOST_PATH,
            installed: root.path(TT_SMI_HOST_PATH).is_file(),
        },
        errors,
    }
}
