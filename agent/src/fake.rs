//! Fakes for tests on a temporary host root: a kernel that keeps
//! `sys/module/tenstorrent/{version,refcnt}` up to date, a killer that makes
//! holder processes disappear from `proc/`, a builder that writes a minimal
//! module file, and helpers to lay out a fake host.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::build::{BuildRequest, Builder};
use crate::error::Result;
use crate::host::{HostRoot, MODULE_NAME};
use crate::kernel::{KernelOps, ProcessKiller};
use crate::modinfo;
use ttdrv_api::module_params::Values;

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from(e)
}

/// A kernel living in `<root>/sys/module`.
#[derive(Debug)]
pub struct FakeKernel {
    root: HostRoot,
    /// Versions whose load fails (ENOEXEC), as a broken module would.
    pub fail_load: Mutex<HashSet<String>>,
    /// If set, sysfs reports this version after any load (readback mismatch).
    pub report_version: Option<String>,
    /// Every load attempted, by module version.
    pub loads: Mutex<Vec<String>>,
    /// The parameter string of every load of tenstorrent attempted, in order.
    pub load_parameters: Mutex<Vec<String>>,
    pub unloads: Mutex<u32>,
    /// Every PID killed.
    pub killed: Mutex<Vec<u32>>,
    /// If true, kill succeeds but the holder survives (for the timeout path).
    pub unkillable: bool,
    /// If true, every load (and probe) of tenstorrent fails with
    /// EKEYREJECTED, as an enforcing kernel refuses a module signed with a
    /// key it does not trust.
    pub reject_key: bool,
    /// How many times a module was probed ([`KernelOps::probe`]).
    pub probes: Mutex<u32>,
    /// If true, a load succeeds but its parameters do not take (sysfs shows
    /// the defaults), as for a parameter the kernel ignored.
    pub drop_parameters: bool,
    /// Versions that load but probe no card (a release that does not know
    /// the cards): nothing bound, no class device, no device node.
    pub probe_none: Mutex<HashSet<String>>,
    /// Versions that serve the cards without any `tt_*` attribute, as
    /// tt-kmd serves a Blackhole whose firmware had no telemetry at probe.
    pub no_telemetry: Mutex<HashSet<String>>,
}

impl FakeKernel {
    pub fn new(root: &Path) -> Self {
        FakeKernel {
            root: HostRoot::new(root),
            fail_load: Mutex::new(HashSet::new()),
            report_version: None,
            loads: Mutex::new(Vec::new()),
            load_parameters: Mutex::new(Vec::new()),
            unloads: Mutex::new(0),
            killed: Mutex::new(Vec::new()),
            unkillable: false,
            reject_key: false,
            probes: Mutex::new(0),
            drop_parameters: false,
            probe_none: Mutex::new(HashSet::new()),
            no_telemetry: Mutex::new(HashSet::new()),
        }
    }

    /// `version` serves the cards without `tt_*` attributes ([`Self::no_telemetry`]).
    pub fn without_telemetry(self, version: &str) -> Self {
        if let Ok(mut p) = self.no_telemetry.lock() {
            p.insert(version.to_string());
        }
        self
    }

    /// `version` loads but probes no card ([`Self::probe_none`]).
    pub fn probing_none(self, version: &str) -> Self {
        if let Ok(mut p) = self.probe_none.lock() {
            p.insert(version.to_string());
        }
        self
    }

    pub fn failing(self, version: &str) -> Self {
        if let Ok(mut f) = self.fail_load.lock() {
            f.insert(version.to_string());
        }
        self
    }

    /// Refuses every load of tenstorrent with EKEYREJECTED ([`Self::reject_key`]).
    pub fn rejecting_keys(mut self) -> Self {
        self.reject_key = true;
        self
    }

    pub fn loads(&self) -> Vec<String> {
        self.loads.lock().map(|l| l.clone()).unwrap_or_default()
    }
    pub fn probes(&self) -> u32 {
        self.probes.lock().map(|p| *p).unwrap_or_default()
    }
    /// The parameter string of every load of tenstorrent, in order.
    pub fn load_parameters(&self) -> Vec<String> {
        self.load_parameters
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }
    pub fn unloads(&self) -> u32 {
        self.unloads.lock().map(|u| *u).unwrap_or_default()
    }
    pub fn killed(&self) -> Vec<u32> {
        self.killed.lock().map(|k| k.clone()).unwrap_or_default()
    }

    fn module_dir(&self) -> PathBuf {
        self.root.path(format!("/sys/module/{MODULE_NAME}"))
    }
}

impl KernelOps for FakeKernel {
    fn load(&self, module: &fs::File, parameters: &str) -> io::Result<()> {
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut &*module, &mut bytes)?;
        let version = modinfo::field_of_bytes(&bytes, "version")
            .map_err(|_| errno(nix::errno::Errno::ENOEXEC))?
            .unwrap_or_default();
        if let Ok(mut l) = self.loads.lock() {
            l.push(version.clone());
        }
        if let Ok(mut l) = self.load_parameters.lock() {
            l.push(parameters.to_string());
        }
        // As the kernel refuses a module with bad symbols or signature.
        if let Ok(Some(_)) = modinfo::field_of_bytes(&bytes, REFUSED_FIELD) {
            return Err(errno(nix::errno::Errno::ENOEXEC));
        }
        if self.reject_key {
            return Err(errno(nix::errno::Errno::EKEYREJECTED));
        }
        // As the kernel does: a module built for another kernel is refused.
        if let Ok(Some(vermagic)) = modinfo::field_of_bytes(&bytes, "vermagic")
            && let Ok(kver) = self.root.kernel_release()
            && modinfo::vermagic_release(&vermagic) != kver
        {
            return Err(errno(nix::errno::Errno::ENOEXEC));
        }
        if self.module_dir().exists() {
            return Err(errno(nix::errno::Errno::EEXIST));
        }
        // As the kernel does: "Unknown symbol" when a dependency is not there.
        let builtin: Vec<String> = self
            .root
            .kernel_release()
            .ok()
            .and_then(|k| {
                let tree = self.root.modules_tree(&k);
                fs::read_to_string(self.root.path(format!("{tree}/modules.builtin"))).ok()
            })
            .map(|t| t.lines().map(crate::deps::module_name).collect())
            .unwrap_or_default();
        if let Ok(Some(depends)) = modinfo::field_of_bytes(&bytes, "depends")
            && crate::deps::parse_depends(Some(&depends)).iter().any(|d| {
                !builtin.contains(d) && !self.root.path(format!("/sys/module/{d}")).is_dir()
            })
        {
            return Err(errno(nix::errno::Errno::ENOENT));
        }
        if self.fail_load.lock().is_ok_and(|f| f.contains(&version)) {
            return Err(errno(nix::errno::Errno::ENOEXEC));
        }
        // As the kernel does: the declared parameters at their defaults,
        // then those given (an unknown name is ignored with a warning, a bad
        // value refuses the load).
        let declared = modinfo::declared_parameters(&bytes).unwrap_or_default();
        let types = modinfo::parameter_types(&bytes).unwrap_or_default();
        let mut values: Values = ttdrv_api::module_params::defaults()
            .into_iter()
            .filter(|(k, _)| declared.contains(k))
            .collect();
        for w in parameters.split_whitespace() {
            let (k, v) = w.split_once('=').unwrap_or((w, "Y"));
            if !declared.contains(k) || self.drop_parameters {
                continue;
            }
            // By the module's own type (an older release's parameter is in
            // no list of ours); only today's are shown in sysfs here.
            let kind = types
                .get(k)
                .and_then(|t| ttdrv_api::module_params::kind_of(t))
                .ok_or_else(|| errno(nix::errno::Errno::EINVAL))?;
            let v = ttdrv_api::module_params::normalize_as(kind, k, v)
                .map_err(|_| errno(nix::errno::Errno::EINVAL))?;
            if ttdrv_api::module_params::parameter(k).is_some() {
                values.insert(k.to_string(), v);
            }
        }
        let probes_none = self.probe_none.lock().is_ok_and(|p| p.contains(&version));
        let no_telemetry = self.no_telemetry.lock().is_ok_and(|p| p.contains(&version));
        let shown = self.report_version.clone().unwrap_or(version);
        set_loaded(self.root.root(), &shown, 0)?;
        set_parameters(self.root.root(), &values)?;
        if !probes_none {
            bind_cards(self.root.root())?;
            if no_telemetry {
                strip_telemetry(self.root.root())?;
            }
        }
        Ok(())
    }

    fn probe(&self, _module: &fs::File) -> io::Result<()> {
        if let Ok(mut p) = self.probes.lock() {
            *p += 1;
        }
        // The kernel checks the signature first, then finds the name taken.
        if self.reject_key {
            return Err(errno(nix::errno::Errno::EKEYREJECTED));
        }
        if self.module_dir().exists() {
            return Err(errno(nix::errno::Errno::EEXIST));
        }
        // The agent probes only while a module is loaded.
        Err(errno(nix::errno::Errno::ENOENT))
    }

    fn load_dependency(&self, name: &str, _module: &fs::File, _compressed: bool) -> io::Result<()> {
        let dir = self.root.path(format!("/sys/module/{name}"));
        if dir.exists() {
            return Err(errno(nix::errno::Errno::EEXIST));
        }
        if let Ok(mut l) = self.loads.lock() {
            l.push(format!("dependency:{name}"));
        }
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("initstate"), "live\n")
    }

    fn unload(&self, name: &str) -> io::Result<()> {
        if name != MODULE_NAME || !self.module_dir().exists() {
            return Err(errno(nix::errno::Errno::ENOENT));
        }
        if self.root.module_refcnt().unwrap_or(0) > 0 {
            return Err(errno(nix::errno::Errno::EWOULDBLOCK));
        }
        if let Ok(mut u) = self.unloads.lock() {
            *u += 1;
        }
        unbind_cards(self.root.root())?;
        fs::remove_dir_all(self.module_dir())
    }
}

impl ProcessKiller for FakeKernel {
    fn kill(&self, pid: u32) -> io::Result<()> {
        if let Ok(mut k) = self.killed.lock() {
            k.push(pid);
        }
        if self.unkillable {
            return Ok(());
        }
        let dir = self.root.path(format!("/proc/{pid}"));
        if !dir.exists() {
            return Ok(());
        }
        let held = fs::read_dir(dir.join("fd"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter_map(|e| fs::read_link(e.path()).ok())
            .filter(|t| t.starts_with("/dev/tenstorrent"))
            .count() as u32;
        fs::remove_dir_all(&dir)?;
        let refcnt_path = self.module_dir().join("refcnt");
        if refcnt_path.exists() {
            let refcnt = self.root.module_refcnt().unwrap_or(0);
            fs::write(refcnt_path, format!("{}\n", refcnt.saturating_sub(held)))?;
        }
        Ok(())
    }
}

/// Writes a fake `tenstorrent.ko` of `version` where the build would be.
#[derive(Debug, Default)]
pub struct FakeBuilder {
    /// Versions built, in order.
    pub builds: Mutex<Vec<String>>,
    /// If set, the built file carries this version instead.
    pub wrong_version: Option<String>,
    /// If set, the built file's vermagic names this kernel instead.
    pub wrong_kernel: Option<String>,
    /// Kernels whose build fails (make error), as an old module does against
    /// a newer kernel's API.
    pub failing_kernels: Vec<String>,
    /// `(kernel release, nice value of the building thread)` of each build.
    pub runs: Mutex<Vec<(String, i32)>>,
}

impl FakeBuilder {
    pub fn builds(&self) -> Vec<String> {
        self.builds.lock().map(|b| b.clone()).unwrap_or_default()
    }
    /// `(kernel release, nice value)` of each build, in order.
    pub fn runs(&self) -> Vec<(String, i32)> {
        self.runs.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

impl Builder for FakeBuilder {
    fn build(&self, req: &BuildRequest<'_>) -> Result<PathBuf> {
        if let Ok(mut b) = self.builds.lock() {
            b.push(req.version.to_string());
        }
        if let Ok(mut r) = self.runs.lock() {
            let nice = rustix::process::getpriority_process(None).unwrap_or(i32::MIN);
            r.push((req.kernel_release.to_string(), nice));
        }
        if self.failing_kernels.iter().any(|k| k == req.kernel_release) {
            return Err(crate::error::AgentError::Make {
                version: req.version.to_string(),
                headers: req.headers.to_path_buf(),
                status: "exit status: 2".to_string(),
                output: "error: implicit declaration of function 'pci_enable_pcie_error_reporting'"
                    .to_string(),
            });
        }
        let ko = req.workdir.join(format!("{MODULE_NAME}.ko"));
        let v = self.wrong_version.as_deref().unwrap_or(req.version);
        let kver = self.wrong_kernel.as_deref().unwrap_or(req.kernel_release);
        write_fake_module_for(&ko, v, kver)
            .map_err(|e| crate::error::AgentError::io("writing", &ko, e))?;
        Ok(ko)
    }
}

/// The boot ID of a fake host.
pub const FAKE_BOOT_ID: &str = "6b1d2f3e-0a4c-4d5e-9f60-718293a4b5c6";

/// Lays out a minimal fake host: kernel release, boot ID and a (empty) header
/// directory.
pub fn fake_host(root: &Path, kver: &str) -> io::Result<()> {
    let r = HostRoot::new(root);
    fs::create_dir_all(r.path("/proc/sys/kernel/random"))?;
    fs::write(r.path("/proc/sys/kernel/osrelease"), format!("{kver}\n"))?;
    fs::write(
        r.path("/proc/sys/kernel/random/boot_id"),
        format!("{FAKE_BOOT_ID}\n"),
    )?;
    fs::create_dir_all(r.path(format!("/lib/modules/{kver}/build")))?;
    Ok(())
}

/// Makes sysfs show the module loaded at `version` with `refcnt`.
pub fn set_loaded(root: &Path, version: &str, refcnt: u32) -> io::Result<()> {
    let dir = HostRoot::new(root).path(format!("/sys/module/{MODULE_NAME}"));
    fs::create_dir_all(&dir)?;
    fs::write(dir.join("version"), format!("{version}\n"))?;
    fs::write(dir.join("refcnt"), format!("{refcnt}\n"))?;
    Ok(())
}

/// Lays out `n` Tenstorrent PCI functions (`0000:0N:00.0`, Wormhole) on the
/// fake host's bus, bound to nothing; [`bind_cards`] (and every load of the
/// fake kernel) binds them.
pub fn add_cards(root: &Path, n: u32) -> io::Result<()> {
    let r = HostRoot::new(root);
    for i in 0..n {
        let dir = r.path(format!("/sys/bus/pci/devices/0000:{:02x}:00.0", i + 1));
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("vendor"), "0x1e52\n")?;
        fs::write(dir.join("device"), "0x401e\n")?;
    }
    Ok(())
}

/// The fake bus's Tenstorrent functions, sorted.
fn tenstorrent_functions(r: &HostRoot) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(r.path("/sys/bus/pci/devices"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| fs::read_to_string(e.path().join("vendor")).is_ok_and(|v| v.trim() == "0x1e52"))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    out.sort();
    out
}

/// Binds every Tenstorrent function of the fake bus to tenstorrent, as a
/// load of tt-kmd does: a link in the PCI driver's directory, a class device
/// `tenstorrent!N` (its `device` link to the function, `tt_asic_id` and
/// `tt_serial`) and a device node `/dev/tenstorrent/N`. Nothing without
/// functions.
pub fn bind_cards(root: &Path) -> io::Result<()> {
    let r = HostRoot::new(root);
    let functions = tenstorrent_functions(&r);
    if functions.is_empty() {
        return Ok(());
    }
    let driver = r.path("/sys/bus/pci/drivers/tenstorrent");
    fs::create_dir_all(&driver)?;
    fs::create_dir_all(r.path("/sys/class/tenstorrent"))?;
    fs::create_dir_all(r.path("/dev/tenstorrent"))?;
    for (i, f) in functions.iter().enumerate() {
        let link = driver.join(f);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("../../devices/{f}"), &link)?;
        }
        let card = r.path(format!("/sys/class/tenstorrent/tenstorrent!{i}"));
        fs::create_dir_all(&card)?;
        let device = card.join("device");
        if fs::symlink_metadata(&device).is_err() {
            std::os::unix::fs::symlink(format!("../../../bus/pci/devices/{f}"), &device)?;
        }
        fs::write(card.join("tt_asic_id"), format!("5A17C0DE000000{i:02X}\n"))?;
        fs::write(card.join("tt_serial"), format!("0x10001{i:02x}\n"))?;
        fs::write(r.path(format!("/dev/tenstorrent/{i}")), "")?;
    }
    Ok(())
}

/// Removes every card's `tt_*` attributes (telemetry the driver never read).
pub fn strip_telemetry(root: &Path) -> io::Result<()> {
    let class = HostRoot::new(root).path("/sys/class/tenstorrent");
    for card in fs::read_dir(&class)?.flatten() {
        for attr in fs::read_dir(card.path())?.flatten() {
            if attr.file_name().to_string_lossy().starts_with("tt_") {
                fs::remove_file(attr.path())?;
            }
        }
    }
    Ok(())
}

/// Undoes [`bind_cards`], as an unload of tt-kmd does.
pub fn unbind_cards(root: &Path) -> io::Result<()> {
    let r = HostRoot::new(root);
    for dir in ["/sys/bus/pci/drivers/tenstorrent", "/sys/class/tenstorrent"] {
        match fs::remove_dir_all(r.path(dir)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    if tenstorrent_functions(&r).is_empty() {
        return Ok(());
    }
    for e in fs::read_dir(r.path("/dev/tenstorrent"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name();
        if name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// Makes sysfs show the loaded module's parameters as `values` (only
/// those; a module loaded by hand or by DKMS in the tests).
pub fn set_parameters(root: &Path, values: &Values) -> io::Result<()> {
    let dir = HostRoot::new(root).path(format!("/sys/module/{MODULE_NAME}/parameters"));
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    for (k, v) in values {
        fs::write(dir.join(k), format!("{v}\n"))?;
    }
    Ok(())
}

/// Adds a process `pid` holding /dev/tenstorrent/0 open, and raises refcnt.
pub fn add_holder(root: &Path, pid: u32, comm: &str, cgroup: &str) -> io::Result<()> {
    let r = HostRoot::new(root);
    let dir = r.path(format!("/proc/{pid}"));
    fs::create_dir_all(dir.join("fd"))?;
    fs::write(dir.join("comm"), format!("{comm}\n"))?;
    fs::write(dir.join("cgroup"), cgroup)?;
    std::os::unix::fs::symlink("/dev/null", dir.join("fd/0"))?;
    std::os::unix::fs::symlink("/dev/tenstorrent/0", dir.join("fd/3"))?;
    let refcnt = r.module_refcnt().unwrap_or(0);
    fs::write(
        r.path(format!("/sys/module/{MODULE_NAME}/refcnt")),
        format!("{}\n", refcnt + 1),
    )?;
    Ok(())
}

/// Writes a minimal module file whose `.modinfo` says `version` and whose
/// vermagic is that of kernel `kver`.
pub fn write_fake_module_for(path: &Path, version: &str, kver: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let v = format!("version={version}");
    let m = format!("vermagic={kver} SMP preempt mod_unload modversions ");
    let mut entries = vec!["license=GPL".to_string(), v, "name=tenstorrent".into(), m];
    entries.extend(parameter_entries(version));
    let entries: Vec<&str> = entries.iter().map(String::as_str).collect();
    fs::write(path, modinfo::fake_module_bytes(&entries))
}

/// The `parmtype=` entries of tt-kmd `version`: the parameters it has
/// ([`ttdrv_api::module_params::Parameter::in_version`]), and for 2.0.0 and
/// 2.1.0 two of their own that later releases dropped (module.c of those
/// tags).
pub fn parameter_entries(version: &str) -> Vec<String> {
    let mut out: Vec<String> = ttdrv_api::module_params::PARAMETERS
        .iter()
        .filter(|p| p.in_version(version).unwrap_or(false))
        .map(|p| {
            let ty = match p.kind {
                ttdrv_api::module_params::Kind::Uint => "uint",
                ttdrv_api::module_params::Kind::Byte => "byte",
                ttdrv_api::module_params::Kind::Bool => "bool",
            };
            format!("parmtype={}:{ty}", p.name)
        })
        .collect();
    if matches!(version, "2.0.0" | "2.1.0") {
        out.push("parmtype=arc_fw_init:bool".into());
        out.push("parmtype=ddr_frequency_override:uint".into());
    }
    out
}

/// A `.modinfo` field that makes [`FakeKernel`] refuse the module (ENOEXEC),
/// as a real kernel refuses one with unresolved symbols or a bad signature.
pub const REFUSED_FIELD: &str = "fake_refused";

/// Plants `bytes` as the cache entry of `version` for `kver`, with a record
/// that matches them (hash, and the vermagic they carry): an entry that
/// passes every check the agent makes before loading.
pub fn plant_cached_bytes(
    root: &Path,
    kver: &str,
    version: &str,
    bytes: &[u8],
) -> io::Result<PathBuf> {
    let r = HostRoot::new(root);
    let ko = r.path(crate::cache::Cache::host_path(kver, version));
    if let Some(dir) = ko.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(&ko, bytes)?;
    let record = crate::cache::Record {
        version: version.to_string(),
        kernel_release: kver.to_string(),
        vermagic: modinfo::field_of_bytes(bytes, "vermagic")
            .ok()
            .flatten()
            .unwrap_or_default(),
        sha256: crate::cache::sha256_hex(bytes),
        size: bytes.len() as u64,
        signer: None,
    };
    let json = serde_json::to_vec(&record).map_err(io::Error::other)?;
    fs::write(ko.with_file_name(crate::cache::RECORD_FILE), json)?;
    Ok(ko)
}

/// Plants a verified cache entry as a build would leave it: the module of
/// `module_version` for `kver` at the path of `version`, with its record
/// (which describes the file as written, so a `module_version` other than
/// `version` is still caught by the version check).
pub fn plant_cached(
    root: &Path,
    kver: &str,
    version: &str,
    module_version: &str,
) -> io::Result<PathBuf> {
    let r = HostRoot::new(root);
    let ko = r.path(crate::cache::Cache::host_path(kver, version));
    write_fake_module_for(&ko, module_version, kver)?;
    let bytes = fs::read(&ko)?;
    let record = crate::cache::Record {
        version: version.to_string(),
        kernel_release: kver.to_string(),
        vermagic: format!("{kver} SMP preempt mod_unload modversions"),
        sha256: crate::cache::sha256_hex(&bytes),
        size: bytes.len() as u64,
        signer: None,
    };
    let json = serde_json::to_vec(&record).map_err(io::Error::other)?;
    fs::write(ko.with_file_name(crate::cache::RECORD_FILE), json)?;
    Ok(ko)
}

/// Writes a minimal module file whose `.modinfo` says `version`.
pub fn write_fake_module(path: &Path, version: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let v = format!("version={version}");
    fs::write(
        path,
        modinfo::fake_module_bytes(&["license=GPL", &v, "name=tenstorrent"]),
    )
}
