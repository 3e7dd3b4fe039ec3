//! The host as the agent sees it: every path, sys/ and proc/ included, is
//! resolved under one root (`/` on a host, `/host` in the DaemonSet pod, a
//! temporary directory in tests).

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::error::{AgentError, Result};
use crate::hostfs::{self, FsResult, HostDir, SMALL_FILE_MAX};
use ttdrv_api::module_params::{self, Values};

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

    /// The host directory `host_dir`, opened from the root without following
    /// a link ([`crate::hostfs`]); missing directories are created (0755)
    /// when `create`.
    pub fn dir(&self, host_dir: impl AsRef<Path>, create: bool) -> FsResult<HostDir> {
        HostDir::open_root(&self.root)?.open_dir(host_dir, create)
    }

    /// A small host file (sysfs/procfs attribute), read without following a
    /// link or blocking and capped at [`SMALL_FILE_MAX`]; None when it or its
    /// directory does not exist.
    pub fn read_small(&self, host_path: impl AsRef<Path>) -> FsResult<Option<String>> {
        Ok(self
            .read_small_bytes(host_path)?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// [`read_small`](Self::read_small) without decoding.
    pub fn read_small_bytes(&self, host_path: impl AsRef<Path>) -> FsResult<Option<Vec<u8>>> {
        let (dir, name) = hostfs::split(host_path.as_ref())?;
        let dir = match self.dir(dir, false) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        dir.read_optional(name, SMALL_FILE_MAX)
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
        const OSRELEASE: &str = "/proc/sys/kernel/osrelease";
        let err = |kind| AgentError::KernelRelease {
            path: self.path(OSRELEASE),
            source: io::Error::from(kind),
        };
        let raw = self
            .read_small_bytes(OSRELEASE)?
            .ok_or_else(|| err(io::ErrorKind::NotFound))?;
        let raw = String::from_utf8(raw).map_err(|_| err(io::ErrorKind::InvalidData))?;
        let kver = raw.trim().to_string();
        if kver.is_empty() || kver.contains('/') || kver.contains('\0') || kver == ".." {
            return Err(AgentError::InvalidKernelRelease(kver));
        }
        Ok(kver)
    }

    /// The host's boot ID from `<root>/proc/sys/kernel/random/boot_id`,
    /// trimmed; it changes at every boot.
    pub fn boot_id(&self) -> Result<String> {
        const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
        match self.read_small(BOOT_ID)? {
            Some(s) => Ok(s.trim().to_string()),
            None => Err(AgentError::io(
                "reading the boot ID from",
                self.path(BOOT_ID),
                io::Error::from(io::ErrorKind::NotFound),
            )),
        }
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
        found.extend(self.modules_tree_install());
        found
    }

    /// The host path of `/lib/modules/<kver>`, its links resolved inside the
    /// root: on a merged-/usr host `/lib` is a link to `usr/lib`, which the
    /// link-refusing walk of [`dir`](Self::dir) would not pass.
    pub fn modules_tree(&self, kver: &str) -> String {
        let resolved = self.resolve(format!("/lib/modules/{kver}"));
        match resolved.strip_prefix(&self.root) {
            Ok(rel) => format!("/{}", rel.display()),
            Err(_) => format!("/lib/modules/{kver}"),
        }
    }

    /// A `tenstorrent.ko` in the running kernel's module tree
    /// (`make modules_install`, a DKMS `.ko` left after its state was
    /// removed, akms, NixOS): tt-kmd has PCI aliases, so the kernel loads it
    /// at boot before this agent runs, and a swap would not survive a reboot.
    /// This agent never installs there (it loads from its cache). Found in
    /// `modules.dep`, else at the places installs put it.
    pub fn modules_tree_install(&self) -> Vec<String> {
        let Ok(kver) = self.kernel_release() else {
            return vec![];
        };
        let tree = self.modules_tree(&kver);
        let is_ours = |file: &str| {
            let name = file.rsplit('/').next().unwrap_or(file);
            [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
                .iter()
                .any(|ext| name == format!("{MODULE_NAME}{ext}"))
        };
        let dep = self
            .dir(&tree, false)
            .and_then(|d| d.read_optional("modules.dep", MODULES_DEP_MAX));
        let mut found: Vec<String> = match dep {
            Ok(Some(text)) => String::from_utf8_lossy(&text)
                .lines()
                .filter_map(|l| l.split_once(':').map(|(m, _)| m.trim()))
                .filter(|m| is_ours(m))
                .map(|m| {
                    if m.starts_with('/') {
                        m.to_string()
                    } else {
                        format!("{tree}/{m}")
                    }
                })
                .collect(),
            _ => vec![],
        };
        if found.is_empty() {
            for sub in [
                "extra",
                // tt-kmd's own dkms.conf (DEST_MODULE_LOCATION), where the
                // distribution's DKMS does not override it (Debian's puts
                // it in updates/dkms).
                "kernel/extra",
                "updates",
                "updates/dkms",
                "kernel/drivers/misc",
                "misc",
            ] {
                for ext in [".ko", ".ko.xz", ".ko.zst", ".ko.gz"] {
                    let p = format!("{tree}/{sub}/{MODULE_NAME}{ext}");
                    if self.path(&p).is_file() {
                        found.push(p);
                    }
                }
            }
        }
        found.sort();
        found.dedup();
        found
            .into_iter()
            .map(|p| format!("{p} (in the running kernel's module tree: autoloaded at boot)"))
            .collect()
    }

    /// The state of the tenstorrent module as sysfs shows it.
    pub fn module_state(&self) -> Result<Option<ModuleState>> {
        let dir = match self.dir(format!("/sys/module/{MODULE_NAME}"), false) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let version = dir
            .read_optional("version", SMALL_FILE_MAX)?
            .map(|v| String::from_utf8_lossy(&v).trim().to_string())
            .filter(|v| !v.is_empty());
        // Fail closed: a refcnt that is absent (a kernel without module
        // unloading) or unreadable counts as in use, never as 0.
        let raw = dir.read_optional("refcnt", SMALL_FILE_MAX)?;
        let refcnt = raw
            .as_deref()
            .map(|r| String::from_utf8_lossy(r))
            .and_then(|r| r.trim().parse::<u32>().ok())
            .unwrap_or(REFCNT_UNKNOWN);
        if refcnt == REFCNT_UNKNOWN {
            tracing::warn!(
                refcnt = ?raw.as_deref().map(String::from_utf8_lossy),
                "sys/module/{MODULE_NAME}/refcnt is missing or unparsable: treating the module as in use"
            );
        }
        let parameters = self.module_parameters(&dir);
        Ok(Some(ModuleState {
            version,
            refcnt,
            parameters,
        }))
    }

    /// The values of tt-kmd's known parameters the loaded module shows in
    /// `parameters/` (normalized; one it does not have, or unreadable, is
    /// left out).
    fn module_parameters(&self, module: &HostDir) -> Values {
        let Ok(dir) = module.open_dir("parameters", false) else {
            return Values::new();
        };
        module_params::PARAMETERS
            .iter()
            .filter_map(|p| {
                let raw = dir.read_optional(p.name, SMALL_FILE_MAX).ok()??;
                let v = module_params::normalize(p.name, &String::from_utf8_lossy(&raw)).ok()?;
                Some((p.name.to_string(), v))
            })
            .collect()
    }

    /// The loaded module's version, if a module is loaded and has one.
    pub fn loaded_version(&self) -> Result<Option<String>> {
        Ok(self.module_state()?.and_then(|m| m.version))
    }

    pub fn module_refcnt(&self) -> Result<u32> {
        Ok(self.module_state()?.map(|m| m.refcnt).unwrap_or(0))
    }
}

pub use crate::holder::REFCNT_UNKNOWN;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleState {
    /// Contents of sys/module/tenstorrent/version, trimmed; None if absent.
    pub version: Option<String>,
    /// [`REFCNT_UNKNOWN`] when sysfs gives no number (fail closed: busy).
    pub refcnt: u32,
    /// tt-kmd's parameters as `parameters/<name>` shows them (canonical).
    pub parameters: Values,
}

/// Whether the loaded version and parameters are the target's: the one
/// definition, [`ttdrv_core::node::is_loaded`].
pub use ttdrv_core::node::is_loaded;
/// Whether the loaded version is the target's (trimmed, exact): its version
/// part, [`ttdrv_core::node::same_version`].
pub use ttdrv_core::node::same_version as version_matches;

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

/// The most of a `modules.dep` read (a distribution kernel's is under 1 MiB).
const MODULES_DEP_MAX: u64 = 32 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_in_the_kernels_tree_makes_the_host_managed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let kver = "6.1.0-1-amd64";
        fs::create_dir_all(root.path("/proc/sys/kernel")).expect("mkdir");
        fs::write(root.path("/proc/sys/kernel/osrelease"), format!("{kver}\n")).expect("osrelease");
        let tree = format!("/lib/modules/{kver}");
        fs::create_dir_all(root.path(format!("{tree}/extra"))).expect("mkdir");
        assert!(
            root.host_install_signals().is_empty(),
            "nothing installed yet"
        );
        // No modules.dep (depmod not run): the usual places are looked at.
        fs::write(root.path(format!("{tree}/extra/tenstorrent.ko")), "").expect("ko");
        let s = root.host_install_signals();
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(
            s[0].starts_with(&format!("{tree}/extra/tenstorrent.ko")),
            "{s:?}"
        );
        // tt-kmd's dkms.conf installs to kernel/extra where DKMS keeps it.
        fs::remove_file(root.path(format!("{tree}/extra/tenstorrent.ko"))).expect("rm");
        fs::create_dir_all(root.path(format!("{tree}/kernel/extra"))).expect("mkdir");
        fs::write(
            root.path(format!("{tree}/kernel/extra/tenstorrent.ko.xz")),
            "",
        )
        .expect("ko");
        let s = root.host_install_signals();
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(
            s[0].starts_with(&format!("{tree}/kernel/extra/tenstorrent.ko.xz")),
            "{s:?}"
        );
        // modules.dep names it wherever it is (and only modules named tenstorrent).
        fs::write(
            root.path(format!("{tree}/modules.dep")),
            "kernel/drivers/hwmon/hwmon.ko.xz:\nupdates/dkms/tenstorrent.ko.xz: kernel/drivers/hwmon/hwmon.ko.xz\nkernel/x/tenstorrent_other.ko:\n",
        )
        .expect("modules.dep");
        let s = root.modules_tree_install();
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(
            s[0].starts_with(&format!("{tree}/updates/dkms/tenstorrent.ko.xz (")),
            "{s:?}"
        );
        assert!(s[0].contains("autoloaded at boot"), "{s:?}");
    }

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
