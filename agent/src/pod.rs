//! The agent's own pod: pauses that SIGTERM cuts short, the note that says why
//! the agent waits (read by the readiness probe and `status`), readiness
//! itself, and the container's termination message. Pausing is behind a
//! trait for tests.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::host::{HostRoot, is_loaded, version_matches};
use ttdrv_api::module_params::{self, Values};

/// Default path of the note written while the agent waits for a go-ahead.
pub const DEFAULT_STATUS_FILE: &str = "/tmp/ttdrv-agent.waiting";
/// Default path of the container's termination message (the kubelet's default).
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// Sleeping that ends early when the pod is being stopped.
pub trait Pause {
    /// Sleeps up to `d`; returns true when the pod is being stopped (SIGTERM
    /// or SIGINT), at once if that happened already.
    fn pause(&self, d: Duration) -> bool;
}

/// SIGTERM and SIGINT, watched from the first pause on: until then they keep
/// their default action (the process ends at once, e.g. in the middle of a
/// build, as before). Once watched, a signal ends every pause, present and
/// future, and the process is left to exit on its own.
#[derive(Debug, Default)]
pub struct Signals {
    stopped: Arc<(Mutex<Option<&'static str>>, Condvar)>,
    watching: OnceLock<Result<(), String>>,
}

impl Signals {
    pub fn new() -> Self {
        Signals::default()
    }

    /// Starts watching (once); an error means signals keep their default action.
    pub fn watch(&self) -> Result<(), String> {
        self.watching
            .get_or_init(|| {
                let started = start_watcher(Arc::clone(&self.stopped));
                if let Err(e) = &started {
                    tracing::error!(error = %e, "SIGTERM and SIGINT keep their default action");
                }
                started
            })
            .clone()
    }

    /// The signal that stopped the pod, if one did.
    pub fn received(&self) -> Option<&'static str> {
        self.stopped.0.lock().ok().and_then(|s| *s)
    }
}

fn start_watcher(stopped: Arc<(Mutex<Option<&'static str>>, Condvar)>) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime to watch signals: {e}"))?;
    // Registered here, before returning, so no signal is missed afterwards.
    let (mut term, mut int) = {
        let _in_rt = rt.enter();
        (
            signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?,
            signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch SIGINT: {e}"))?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let name = rt.block_on(async {
                tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                }
            });
            let (lock, cv) = &*stopped;
            if let Ok(mut s) = lock.lock() {
                *s = Some(name);
            }
            cv.notify_all();
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the signal thread: {e}"))
}

impl Pause for Signals {
    fn pause(&self, d: Duration) -> bool {
        // Without the watcher a signal still ends the process (default action).
        let _ = self.watch();
        let (lock, cv) = &*self.stopped;
        let Ok(guard) = lock.lock() else {
            std::thread::sleep(d);
            return false;
        };
        match cv.wait_timeout_while(guard, d, |s| s.is_none()) {
            Ok((s, _)) => s.is_some(),
            Err(_) => false,
        }
    }
}

/// Counts pauses without sleeping; reports a stop after `stop_after` of them
/// (as if the pod were deleted while the agent waits).
#[derive(Debug)]
pub struct FakePause {
    pub stop_after: u32,
    pub pauses: Mutex<Vec<Duration>>,
}

impl FakePause {
    pub fn stopping_after(n: u32) -> Self {
        FakePause {
            stop_after: n,
            pauses: Mutex::new(Vec::new()),
        }
    }
    pub fn pauses(&self) -> Vec<Duration> {
        self.pauses.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

impl Default for FakePause {
    /// Never stops on its own.
    fn default() -> Self {
        FakePause::stopping_after(u32::MAX)
    }
}

impl Pause for FakePause {
    fn pause(&self, d: Duration) -> bool {
        let Ok(mut p) = self.pauses.lock() else {
            return true;
        };
        p.push(d);
        p.len() as u32 >= self.stop_after
    }
}

/// Writes the waiting note (`Some`) or removes it (`None`).
pub fn set_waiting(path: &Path, why: Option<&str>) -> io::Result<()> {
    match why {
        Some(w) => {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::write(path, format!("{w}\n"))
        }
        None => match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    }
}

/// Why the agent is waiting, if its note says so.
pub fn waiting(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The readiness probe's answer: ready only when the loaded module is the
/// target exactly (its version, and `parameters` in effect) and the agent is
/// not waiting for a go-ahead.
pub fn readiness(
    root: &HostRoot,
    target: &str,
    parameters: &Values,
    status_file: Option<&Path>,
) -> Result<String, String> {
    let state = root.module_state().map_err(|e| format!("not ready: {e}"))?;
    let loaded = state.as_ref().and_then(|s| s.version.clone());
    let in_effect = state.as_ref().map(|s| &s.parameters);
    let waiting = status_file.and_then(waiting);
    let want = ttdrv_core::node::Target::new(target, parameters);
    if is_loaded(loaded.as_deref(), in_effect, want) && waiting.is_none() {
        // Loaded, but a card it served has gone (fell off the bus, its
        // probe undone): not Ready, which a soak counts as trouble.
        let lost = crate::validate::lost(root, target.trim());
        if !lost.is_empty() {
            return Err(format!(
                "not ready: tenstorrent {} loaded, but it lost cards: {}",
                target.trim(),
                lost.join("; ")
            ));
        }
        return Ok(format!("ready: tenstorrent {} loaded", target.trim()));
    }
    let mut msg = format!(
        "not ready: loaded {}, want {}",
        loaded.as_deref().unwrap_or("none"),
        target.trim()
    );
    let off = module_params::mismatches(parameters, in_effect);
    if version_matches(loaded.as_deref(), target) && !off.is_empty() {
        msg.push_str(&format!(
            " with module parameters {}",
            module_params::describe(&off)
        ));
    }
    if let Some(w) = waiting {
        msg.push_str("; ");
        msg.push_str(&w);
    }
    Err(msg)
}

/// Writes the container's termination message (what `kubectl describe pod`
/// and the controller read as the reason the container ended).
pub fn write_termination_message(path: &Path, message: &str) -> io::Result<()> {
    fs::write(path, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_pause_stops_after_n() {
        let p = FakePause::stopping_after(2);
        assert!(!p.pause(Duration::from_millis(1)));
        assert!(p.pause(Duration::from_millis(1)));
        assert_eq!(p.pauses().len(), 2);
    }

    #[test]
    fn waiting_note_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("sub/note");
        assert_eq!(waiting(&f), None);
        set_waiting(&f, Some("waiting for the controller's go-ahead")).expect("write");
        assert_eq!(
            waiting(&f).as_deref(),
            Some("waiting for the controller's go-ahead")
        );
        set_waiting(&f, None).expect("remove");
        set_waiting(&f, None).expect("remove again");
        assert_eq!(waiting(&f), None);
    }
}
