//! The host as the agent sees it: every path, sys/ and proc/ included, is
//! resolved under one root (`/` on a host, `/host` in the DaemonSet pod, a
//! temporary directory in tests).

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::error::{AgentError, Result};

/// Module name of tt-kmd.
pub const MODULE_NAME: &str = "tenstorrent";

#[derive(Debug, Clone)]
pub struct HostRoot {
    root: PathBuf,
}

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostRoot { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Maps an absolute host path (`/sys/module/...`) to the path under the root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut out = self.root.clone();
        for c in host_path.as_ref().components() {
            if let Component::Normal(part) = c {
                out.push(part);
            }
        }
        out
    }

    /// Resolves symlinks of a host path the way the host would: an absolute
    /// link target (e.g. `/lib/modules/<kver>/build -> /usr/src/linux-headers-<kver>`)
    /// is taken relative to the host root, not to the agent's own filesystem.
    pub fn resolve(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut current: PathBuf = PathBuf::from("/");
        let mut pending: Vec<PathBuf> = host_path
            .as_ref()
            .components()
            .rev()
            .filter_map(|c| match c {
                Component::Normal(p) => Some(PathBuf::from(p)),
                Component::ParentDir => Some(PathBuf::from("..")),
                _ => None,
            })
            .collect();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            if part.as_os_str() == ".." {
                current.pop();
                continue;
            }
            current.push(&part);
            let under_root = self.path(&current);
            if let Ok(target) = fs::read_link(&under_root) {
                hops += 1;
                if hops > 40 {
                    return under_root;
                }
                current.pop();
                if target.is_absolute() {
                    current = PathBuf::from("/");
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(p) => pending.push(PathBuf::from(p)),
                        Component::ParentDir => pending.push(PathBuf::from("..")),
                        _ => {}
                    }
                }
            }
        }
        self.path(&current)
    }

    /// Kernel release from `<root>/proc/sys/kernel/osrelease`.
    pub fn kernel_release(&self) -> Result<String> {
        let path = self.path("/proc/sys/kernel/osrelease");
        let raw = fs::read_to_string(&path)
            .map_err(|source| AgentError::KernelRelease { path, source })?;
        let kver = raw.trim().to_string();
        if kver.is_empty() || kver.contains('/') || kver.contains('\0') || kver == ".." {
            return Err(AgentError::InvalidKernelRelease(kver));
        }
        Ok(kver)
    }

    /// The host's boot ID from `<root>/proc/sys/kernel/random/boot_id`,
    /// trimmed; it changes at every boot.
    pub fn boot_id(&self) -> Result<String> {
        let path = self.path("/proc/sys/kernel/random/boot_id");
        fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|e| AgentError::io("reading the boot ID from", path, e))
    }

    /// Signals of a host-managed (DKMS) install that are present.
    pub fn host_install_signals(&self) -> Vec<String> {
        let mut found = Vec::new();
        if self.path("/var/lib/dkms/tenstorrent").is_dir() {
            found.push("/var/lib/dkms/tenstorrent/".to_string());
        }
        if let Ok(entries) = fs::read_dir(self.path("/usr/src")) {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("tenstorrent-"))
                .collect();
            names.sort();
            for n in names {
                let conf = format!("/usr/src/{n}/dkms.conf");
                if self.path(&conf).is_file() {
                    found.push(conf);
                }
            }
        }
        found
    }

    /// The state of the tenstorrent module as sysfs shows it.
    pub fn module_state(&self) -> Result<Option<ModuleState>> {
        let dir = self.path(format!("/sys/module/{MODULE_NAME}"));
        if !dir.is_dir() {
            return Ok(None);
        }
        let version = read_optional(&dir.join("version"))?
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let refcnt = read_optional(&dir.join("refcnt"))?
            .and_then(|r| r.trim().parse::<u32>().ok())
            .unwrap_or(0);
        Ok(Some(ModuleState { version, refcnt }))
    }

    /// The loaded module's version, if a module is loaded and has one.
    pub fn loaded_version(&self) -> Result<Option<String>> {
        Ok(self.module_state()?.and_then(|m| m.version))
    }

    pub fn module_refcnt(&self) -> Result<u32> {
        Ok(self.module_state()?.map(|m| m.refcnt).unwrap_or(0))
    }
}

fn read_optional(path: &Path) -> Result<Option<String>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(AgentError::io("reading", path, e)),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleState {
    /// Contents of sys/module/tenstorrent/version, trimmed; None if absent.
    pub version: Option<String>,
    pub refcnt: u32,
}

/// Whether the loaded version is the target: exact equality after trimming
/// whitespace. `2.10.0-rc1` does not satisfy `2.10.0`.
pub fn version_matches(loaded: Option<&str>, target: &str) -> bool {
    matches!(loaded, Some(v) if v.trim() == target.trim())
}

/// Validates a target version (surrounding whitespace trimmed): `MAJOR.MINOR.PATCH`,
/// 1 to 9 digits per part. The rule is `ttdrv_api::validation::is_valid_version`,
/// from which the CRD's `spec.version` pattern is generated too, so the API
/// server refuses what the agent would refuse after the node is drained.
pub fn validate_version(v: &str) -> Result<String> {
    let v = v.trim();
    if ttdrv_api::validation::is_valid_version(v) {
        Ok(v.to_string())
    } else {
        Err(AgentError::InvalidVersion(v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_match_is_exact() {
        assert!(version_matches(Some("2.10.0"), "2.10.0"));
        assert!(version_matches(Some("2.10.0\n"), "2.10.0"));
        assert!(!version_matches(Some("2.10.0-rc1"), "2.10.0"));
        assert!(!version_matches(Some("2.1.0"), "2.10.0"));
        assert!(!version_matches(None, "2.10.0"));
    }

    #[test]
    fn validates_versions() {
        assert!(validate_version("2.8.0").is_ok());
        assert!(validate_version(" 2.8.0\n").is_ok());
        for bad in [
            "",
            "2.8",
            "2.8.0-rc1",
            "../2.8.0",
            "2.8.0.1",
            "a.b.c",
            "2..0",
            "1234567890.0.0",
            "2.8.0000000000",
        ] {
            assert!(validate_version(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn resolves_absolute_links_under_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        fs::create_dir_all(root.path("/usr/src/linux-headers-6.1.0-1-amd64")).expect("mkdir");
        fs::create_dir_all(root.path("/lib/modules/6.1.0-1-amd64")).expect("mkdir");
        std::os::unix::fs::symlink(
            "/usr/src/linux-headers-6.1.0-1-amd64",
            root.path("/lib/modules/6.1.0-1-amd64/build"),
        )
        .expect("symlink");
        assert_eq!(
            root.resolve("/lib/modules/6.1.0-1-amd64/build"),
            dir.path().join("usr/src/linux-headers-6.1.0-1-amd64")
        );
        std::os::unix::fs::symlink("../src", root.path("/lib/modules/6.1.0-1-amd64/rel"))
            .expect("symlink");
        assert_eq!(
            root.resolve("/lib/modules/6.1.0-1-amd64/rel"),
            dir.path().join("lib/modules/src")
        );
    }
}
