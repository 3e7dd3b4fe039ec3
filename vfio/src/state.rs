//! What the binder moved, kept in `--state-dir` on the host so a restarted
//! binder still knows which driver to give a function back to and which
//! board it is (tt-kmd's telemetry is gone once vfio-pci drives it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use ttdrv_agent::HostRoot;
use ttdrv_agent::hostfs::SMALL_FILE_MAX;

use crate::error::{Result, VfioError};

pub const STATE_FILE: &str = "state.json";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// By BDF.
    pub functions: BTreeMap<String, Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The driver it was on before the binder moved it; None when unbound.
    pub original_driver: Option<String>,
    pub board_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
}

/// The state file in a host directory.
#[derive(Clone, Debug)]
pub struct StateStore {
    root: HostRoot,
    dir: PathBuf,
}

impl StateStore {
    pub fn new(root: HostRoot, dir: impl Into<PathBuf>) -> Self {
        StateStore {
            root,
            dir: dir.into(),
        }
    }

    fn err(&self, reason: String) -> VfioError {
        VfioError::State {
            path: self.dir.join(STATE_FILE).display().to_string(),
            reason,
        }
    }

    /// The saved state; empty when there is none yet.
    pub fn load(&self) -> Result<State> {
        let dir = match self.root.dir(&self.dir, false) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(State::default()),
            Err(e) => return Err(e.into()),
        };
        match dir.read_optional(STATE_FILE, SMALL_FILE_MAX)? {
            None => Ok(State::default()),
            Some(b) => {
                serde_json::from_slice(&b).map_err(|e| self.err(format!("not a binder state: {e}")))
            }
        }
    }

    pub fn save(&self, state: &State) -> Result<()> {
        let json = serde_json::to_vec_pretty(state).map_err(|e| self.err(e.to_string()))?;
        let dir = self.root.dir(&self.dir, true)?;
        dir.write_atomic(STATE_FILE, &mut json.as_slice(), 0o644)?;
        Ok(())
    }
}
