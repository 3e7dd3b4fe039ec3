//! What the flasher does to the host, behind [`Host`]: tt-smi, tt-flash,
//! the PCI devices in sysfs, the wait after a reset. [`RealHost`] runs the
//! real tools; [`crate::sim::SimHost`] answers from a directory; the unit
//! tests fake it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a tool run ended and what it printed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Exited 0.
    pub ok: bool,
    /// How it ended, for people (`exit status: 1`, or why it did not run).
    pub status: String,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// A tool that could not be started.
    pub fn not_run(what: &str, e: &std::io::Error) -> Self {
        Output {
            ok: false,
            status: format!("could not run {what}: {e}"),
            ..Default::default()
        }
    }
}

/// The host the flasher acts on.
pub trait Host {
    /// `tt-smi <args>`, its output captured.
    fn tt_smi(&mut self, args: &[&str]) -> Output;
    /// `tt-flash <args>`, its output streamed to the log as it comes and
    /// captured (stdout and stderr interleaved, in `stdout`).
    fn tt_flash(&mut self, args: &[String]) -> Output;
    /// `(vendor, subsystem_device)` of every PCI device, as sysfs spells them.
    fn pci_devices(&self) -> Vec<(String, String)>;
    fn sleep(&mut self, d: Duration);
}

/// `(vendor, subsystem_device)` of the PCI devices under
/// `<root>/sys/bus/pci/devices`; devices whose files cannot be read are
/// left out (the listing is only used to pick a reset).
pub fn pci_devices(root: &Path) -> Vec<(String, String)> {
    let dir = root.join("sys/bus/pci/devices");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        tracing::debug!(dir = %dir.display(), "no PCI devices listed");
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            let vendor = std::fs::read_to_string(p.join("vendor")).ok()?;
            let sub = std::fs::read_to_string(p.join("subsystem_device")).ok()?;
            Some((vendor.trim().to_string(), sub.trim().to_string()))
        })
        .collect();
    out.sort();
    out
}

/// The node itself: tt-smi and tt-flash from PATH (or where told), sysfs at `/`.
#[derive(Clone, Debug)]
pub struct RealHost {
    pub tt_smi: PathBuf,
    pub tt_flash: PathBuf,
    pub root: PathBuf,
}

impl Host for RealHost {
    fn tt_smi(&mut self, args: &[&str]) -> Output {
        match Command::new(&self.tt_smi)
            .args(args)
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) => Output {
                ok: o.status.success(),
                status: o.status.to_string(),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            },
            Err(e) => Output::not_run(&self.tt_smi.display().to_string(), &e),
        }
    }

    fn tt_flash(&mut self, args: &[String]) -> Output {
        let what = self.tt_flash.display().to_string();
        let mut child = match Command::new(&self.tt_flash)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => return Output::not_run(&what, &e),
        };
        let seen = Arc::new(Mutex::new(String::new()));
        let pumps: Vec<_> = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        .map(|stream| {
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || pump(stream, &seen))
        })
        .collect();
        for p in pumps {
            if p.join().is_err() {
                tracing::warn!("a tt-flash output reader panicked");
            }
        }
        let stdout = seen.lock().map(|s| s.clone()).unwrap_or_default();
        match child.wait() {
            Ok(st) => Output {
                ok: st.success(),
                status: st.to_string(),
                stdout,
                stderr: String::new(),
            },
            Err(e) => Output {
                stdout,
                ..Output::not_run(&what, &e)
            },
        }
    }

    fn pci_devices(&self) -> Vec<(String, String)> {
        pci_devices(&self.root)
    }

    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// Copies a stream line by line to our stdout (the Job's log) and to `seen`.
fn pump(stream: Box<dyn Read + Send>, seen: &Mutex<String>) {
    let mut r = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let mut out = std::io::stdout().lock();
                // The log is best effort: a closed stdout must not stop the flash.
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
                if let Ok(mut s) = seen.lock() {
                    s.push_str(&text);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading tt-flash's output");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_pci_devices_under_a_root() {
        let d = tempfile::tempdir().expect("tempdir");
        for (bdf, v, s) in [
            ("0000:01:00.0", "0x1e52\n", "0x0035\n"),
            ("0000:02:00.0", "0x8086\n", "0x0000\n"),
        ] {
            let p = d.path().join("sys/bus/pci/devices").join(bdf);
            std::fs::create_dir_all(&p).expect("mkdir");
            std::fs::write(p.join("vendor"), v).expect("write");
            std::fs::write(p.join("subsystem_device"), s).expect("write");
        }
        // A device without readable ids is left out.
        std::fs::create_dir_all(d.path().join("sys/bus/pci/devices/0000:03:00.0")).expect("mkdir");
        assert_eq!(
            pci_devices(d.path()),
            vec![
                ("0x1e52".to_string(), "0x0035".to_string()),
                ("0x8086".to_string(), "0x0000".to_string())
            ]
        );
        assert!(pci_devices(&d.path().join("nothing")).is_empty());
    }

    #[test]
    fn real_host_streams_and_captures_both_streams() {
        let mut h = RealHost {
            tt_smi: "/bin/sh".into(),
            tt_flash: "/bin/sh".into(),
            root: "/".into(),
        };
        let o = h.tt_flash(&["-c".into(), "echo out; echo err >&2; exit 3".into()]);
        assert!(!o.ok);
        assert!(o.status.contains('3'), "{}", o.status);
        assert!(
            o.stdout.contains("out\n") && o.stdout.contains("err\n"),
            "{o:?}"
        );
        let o = h.tt_smi(&["-c", "echo snapshot; echo oops >&2"]);
        assert!(
            o.ok && o.stdout == "snapshot\n" && o.stderr == "oops\n",
            "{o:?}"
        );
        let mut missing = RealHost {
            tt_smi: "/nonexistent/tt-smi".into(),
            ..h
        };
        let o = missing.tt_smi(&["-s"]);
        assert!(
            !o.ok && o.status.contains("could not run /nonexistent/tt-smi"),
            "{o:?}"
        );
    }
}
