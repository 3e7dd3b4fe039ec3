//! The agent's one error type. Every message names the path, version, tag,
//! repository or process it is about, so a failed pod's log says what to fix.

use std::fmt;
use std::path::PathBuf;

use crate::holder::Holder;

/// What happened when the agent tried to put the previous module back after
/// the new one failed to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollback {
    /// No module was loaded before, so there was nothing to restore.
    NothingLoadedBefore,
    /// The previous version is not in the cache (e.g. it came from elsewhere).
    NotCached {
        previous: String,
        path: PathBuf,
        /// What sysfs shows afterwards.
        now_loaded: Option<String>,
    },
    /// The previous version was loaded again from the cache.
    Restored { previous: String },
    /// The previous version was loaded again, but it does not serve every
    /// card it served before the swap either (a card that went away, not
    /// the new version's fault).
    RestoredDegraded {
        previous: String,
        problems: Vec<String>,
    },
    /// Not rolled back on purpose (`onValidationFailure: hold`): the new
    /// version stays loaded for a person to look at.
    Held { version: String },
    /// Loading the previous version failed as well.
    Failed {
        previous: String,
        error: String,
        /// What sysfs shows afterwards.
        now_loaded: Option<String>,
    },
}

impl fmt::Display for Rollback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rollback::NothingLoadedBefore => {
                write!(f, "no module was loaded before, nothing to roll back to")
            }
            Rollback::NotCached {
                previous,
                path,
                now_loaded,
            } => write!(
                f,
                "could not roll back to {previous}: it is not in the cache ({} missing); {}",
                path.display(),
                now(now_loaded)
            ),
            Rollback::Restored { previous } => {
                write!(
                    f,
                    "rolled back: the previous version {previous} is loaded again from the cache"
                )
            }
            Rollback::RestoredDegraded { previous, problems } => write!(
                f,
                "rolled back: the previous version {previous} is loaded again from the cache, but it does not serve every card either ({}): look at the cards",
                problems.join("; ")
            ),
            Rollback::Held { version } => write!(
                f,
                "not rolled back (onValidationFailure: hold): {version} stays loaded and the node stays out of service for a person to look at"
            ),
            Rollback::Failed {
                previous,
                error,
                now_loaded,
            } => write!(
                f,
                "rolling back to {previous} failed too ({error}); {}",
                now(now_loaded)
            ),
        }
    }
}

fn now(loaded: &Option<String>) -> String {
    match loaded {
        Some(v) => format!("tenstorrent {v} is loaded now"),
        None => "the node has no tenstorrent module loaded now".to_string(),
    }
}

/// A refcnt for messages: [`crate::holder::REFCNT_UNKNOWN`] is "unreadable".
fn refcnt_text(refcnt: u32) -> String {
    if refcnt == crate::holder::REFCNT_UNKNOWN {
        "unreadable, so counted as in use".to_string()
    } else {
        refcnt.to_string()
    }
}

fn list_holders(holders: &[Holder], refcnt: u32) -> String {
    let explained: u32 = holders.iter().map(|h| h.references).sum();
    let rest = refcnt.saturating_sub(explained);
    let unexplained = if refcnt == crate::holder::REFCNT_UNKNOWN || rest == 0 {
        String::new()
    } else {
        format!(
            "{}{rest} reference(s) held by no open file or mapping of a process: a dma-buf the driver exported (ttkmd 2.10 and later), another module or a kernel user",
            if holders.is_empty() { "" } else { "; " }
        )
    };
    if holders.is_empty() {
        return if unexplained.is_empty() {
            "no process under /proc holds or maps /dev/tenstorrent (another module or a kernel user may hold it)".to_string()
        } else {
            format!("no process under /proc holds or maps /dev/tenstorrent; {unexplained}")
        };
    }
    let list = holders
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    format!("{list}{unexplained}")
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot read the kernel release from {}: {source}", path.display())]
    KernelRelease {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid kernel release {0:?} (from proc/sys/kernel/osrelease)")]
    InvalidKernelRelease(String),

    #[error(
        "invalid target version {0:?}: expected MAJOR.MINOR.PATCH such as 2.8.0 (set TT_KMD_VERSION)"
    )]
    InvalidVersion(String),

    #[error("no target version: set TT_KMD_VERSION or pass --version")]
    NoTargetVersion,

    #[error(
        "kernel headers for {kver} not found: {} does not exist; install the package linux-headers-{kver} on the host (and mount the host's /lib/modules and /usr/src into the agent pod)",
        dir.display()
    )]
    HeadersMissing { kver: String, dir: PathBuf },

    #[error(
        "tag {tag} not found in source repository {repo}: check spec.version, or that the mirror carries the tag"
    )]
    MissingTag { tag: String, repo: String },

    #[error(
        "tag {tag} in {repo} names commit {found}, not the pinned {expected}: the tag moved (or the pin is wrong); refusing to build it. Check the repository, then set the policy's installer.sourceCommit or the chart's driver.sourceCommits"
    )]
    SourceCommitMismatch {
        tag: String,
        repo: String,
        expected: String,
        found: String,
    },

    #[error(
        "tag {tag} in {repo} is not signed by a configured key (TT_KMD_TAG_KEYS), refusing to build it: {output}"
    )]
    TagSignature {
        tag: String,
        repo: String,
        output: String,
    },

    #[error(
        "invalid source commit {0:?}: expected a full git object name (40 or 64 hex digits) in TT_KMD_SOURCE_COMMIT"
    )]
    InvalidSourceCommit(String),

    #[error("git clone of tag {tag} from {repo} failed: {stderr}")]
    GitClone {
        tag: String,
        repo: String,
        stderr: String,
    },

    #[error("cannot run {program}: {source} (is it installed in the agent image?)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{}building tenstorrent {version} against {} failed ({status}): {output}", disk_full_prefix(.output), headers.display())]
    Make {
        version: String,
        headers: PathBuf,
        status: String,
        output: String,
    },

    #[error("the build of tenstorrent {version} produced no module at {}", path.display())]
    BuildOutputMissing { version: String, path: PathBuf },

    #[error("the build of tenstorrent {version} panicked")]
    BuildPanicked { version: String },

    /// The filesystem holding the cache (or the build directory) is full:
    /// nothing partial is left behind, the loaded module is untouched.
    #[error(
        "disk full: {what} ({source}); {space}. Free space there, then retry",
        space = crate::error::space_note(*.free, *.size, .path)
    )]
    DiskFull {
        what: String,
        path: PathBuf,
        /// Bytes free and in all on that filesystem when it failed, if known.
        free: Option<u64>,
        size: Option<u64>,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot write the module cache at {}: {source}", path.display())]
    CacheWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot read the module version from {}: {reason}", path.display())]
    ModInfo { path: PathBuf, reason: String },

    #[error("freshly built module {} reports version {found:?}, expected {expected}", path.display())]
    BuiltWrongVersion {
        path: PathBuf,
        expected: String,
        found: Option<String>,
    },

    #[error(
        "tenstorrent {loaded} is in use (refcnt {}) and force-unload is off, so it was left loaded; holders: {}; drain the node's workloads, or set upgradePolicy.forceUnload=true",
        refcnt_text(*refcnt), list_holders(holders, *refcnt)
    )]
    Busy {
        loaded: String,
        refcnt: u32,
        holders: Vec<Holder>,
    },

    #[error("cannot SIGKILL pid {pid} ({comm}): {source}")]
    Kill {
        pid: u32,
        comm: String,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "tenstorrent still in use {waited_ms} ms after killing its holders (refcnt {refcnt}); remaining holders: {}",
        list_holders(holders, *refcnt)
    )]
    UnloadTimeout {
        refcnt: u32,
        waited_ms: u128,
        holders: Vec<Holder>,
    },

    #[error("unloading tenstorrent {loaded} failed: {source}")]
    Unload {
        loaded: String,
        #[source]
        source: std::io::Error,
    },

    #[error("loading tenstorrent {version} from {} failed: {error}; {rollback}", path.display())]
    LoadFailed {
        version: String,
        path: PathBuf,
        error: String,
        rollback: Box<Rollback>,
    },

    #[error(
        "tenstorrent {version} loaded but failed validation: {}; {rollback}",
        problems.join("; ")
    )]
    ValidationFailed {
        version: String,
        problems: Vec<String>,
        rollback: Box<Rollback>,
    },

    #[error(
        "the module built at {} is for another kernel (vermagic {vermagic:?}), not the running {kver}; check that lib/modules/{kver}/build holds that kernel's headers",
        path.display()
    )]
    BuiltForOtherKernel {
        path: PathBuf,
        kver: String,
        vermagic: String,
    },

    #[error(
        "tenstorrent needs the module {dependency} (its depends: {needed_by}), which is neither loaded, built into {kver}, nor listed in {tree}/modules.dep; install the kernel's modules package for {kver} (on Debian linux-image-{kver}, on RHEL kernel-modules-{kver}) or load {dependency} by hand"
    )]
    DependencyMissing {
        dependency: String,
        needed_by: String,
        kver: String,
        tree: String,
    },

    #[error(
        "tenstorrent {version} is unsigned and {why}: the kernel would refuse it (\"Key was rejected by service\"), so nothing was unloaded; set the policy's installer.signingSecret to a key pair whose certificate the host trusts (enrolled with mokutil, as a DKMS host's MOK key is) or turn enforcement off on this host"
    )]
    UnsignedModule { version: String, why: String },

    #[error(
        "this host does not trust the key tenstorrent {version} is signed with ({error}; {why}), so nothing was unloaded: the key is not enrolled on this host; enrol its certificate as a Machine Owner Key (`mokutil --import cert.der`, confirmed in the MOK manager at the next boot) or sign with a key the host trusts (installer.signingSecret)"
    )]
    KeyNotTrusted {
        version: String,
        why: String,
        error: String,
    },

    #[error(
        "module signing is configured ({origin}) but {problem}; nothing was built or unloaded. The Secret of installer.signingSecret lives in the operator's namespace and holds tls.key (PEM) and tls.crt (PEM or DER), e.g. `kubectl create secret tls <name> --key tls.key --cert tls.crt`"
    )]
    SigningKey { origin: String, problem: String },

    #[error(
        "module signing is configured ({origin}) but the kernel headers for {kver} have no {}: install the package that ships the kernel's build tools with the headers (Debian: linux-kbuild-<major.minor>; Ubuntu and RHEL have it in the headers package); nothing was built or unloaded",
        path.display()
    )]
    SignFileMissing {
        origin: String,
        kver: String,
        path: PathBuf,
    },

    #[error(
        "signing tenstorrent {version} with {origin} ({}) failed: {output}; check that tls.key is the unencrypted private key of tls.crt",
        tool.display()
    )]
    Sign {
        version: String,
        origin: String,
        tool: PathBuf,
        output: String,
    },

    #[error("loading {dependency} from {path}, which tenstorrent needs, failed: {source}")]
    DependencyLoad {
        dependency: String,
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("after loading, sys/module/tenstorrent/version reads {found:?}, expected {expected}")]
    ReadbackMismatch {
        expected: String,
        found: Option<String>,
    },

    #[error(
        "tenstorrent {version} has no module parameter {parameter} (spec.moduleParameters asks for {parameter}={value}; {since}), so nothing was unloaded; set a version that has it or remove it from spec.moduleParameters"
    )]
    ParameterNotDeclared {
        version: String,
        parameter: String,
        value: String,
        /// Since which tt-kmd version the parameter exists, in words.
        since: String,
    },

    #[error(
        "after loading tenstorrent {version} with \"{passed}\", /sys/module/tenstorrent/parameters shows other values: {mismatches}"
    )]
    ParametersNotInEffect {
        version: String,
        passed: String,
        mismatches: String,
    },

    #[error(
        "invalid module parameters {value:?} ({}): {reason}",
        ttdrv_api::labels::env::MODULE_PARAMETERS
    )]
    InvalidParameters { value: String, reason: String },

    #[error("labelling node {node} failed: {reason}")]
    Label { node: String, reason: String },

    /// A host path the agent refused (a planted link, FIFO or device, an
    /// oversized file) or could not use.
    #[error(transparent)]
    HostFs(#[from] crate::hostfs::HostFsError),
}

/// The most the kubelet keeps of a container's termination message, in bytes.
pub const TERMINATION_MESSAGE_MAX: usize = 4096;

impl AgentError {
    /// The reason the agent gives when it gives up with this error (the first
    /// word of its termination message, see [`ttdrv_core::reason`]), or None
    /// for errors that name none (they only exit non-zero). The one place
    /// that maps errors to reasons.
    pub fn reason(&self) -> Option<&'static str> {
        use ttdrv_core::reason::{BUILD_FAILED, DEVICE_BUSY, LOAD_FAILED, VALIDATION_FAILED};
        match self {
            // Something holds the device: the error lists the holders.
            AgentError::Busy { .. } | AgentError::UnloadTimeout { .. } => Some(DEVICE_BUSY),
            AgentError::Unload { source, .. }
                if matches!(
                    source.raw_os_error().map(nix::errno::Errno::from_raw),
                    Some(nix::errno::Errno::EBUSY | nix::errno::Errno::EAGAIN)
                ) =>
            {
                Some(DEVICE_BUSY)
            }
            // The module cannot be built as configured: a retry builds the same.
            AgentError::HeadersMissing { .. }
            | AgentError::MissingTag { .. }
            | AgentError::Spawn { .. }
            | AgentError::Make { .. }
            | AgentError::BuildOutputMissing { .. }
            | AgentError::BuildPanicked { .. }
            | AgentError::BuiltWrongVersion { .. }
            | AgentError::BuiltForOtherKernel { .. }
            | AgentError::SourceCommitMismatch { .. }
            | AgentError::TagSignature { .. }
            | AgentError::InvalidSourceCommit(_)
            // The module cannot be signed as configured: no key, no sign-file.
            | AgentError::SigningKey { .. }
            | AgentError::SignFileMissing { .. }
            | AgentError::Sign { .. }
            // Nothing was stored or loaded; a retry once there is room builds again.
            | AgentError::DiskFull { .. } => Some(BUILD_FAILED),
            // The kernel refused the module, or runs another version after loading it.
            // Or cannot load what it depends on.
            AgentError::LoadFailed { .. }
            | AgentError::ReadbackMismatch { .. }
            | AgentError::DependencyMissing { .. }
            | AgentError::DependencyLoad { .. }
            | AgentError::UnsignedModule { .. }
            | AgentError::KeyNotTrusted { .. }
            | AgentError::ParameterNotDeclared { .. }
            | AgentError::ParametersNotInEffect { .. } => Some(LOAD_FAILED),
            // It loaded but does not serve every card it served before.
            AgentError::ValidationFailed { .. } => Some(VALIDATION_FAILED),
            AgentError::Io { .. }
            | AgentError::KernelRelease { .. }
            | AgentError::InvalidKernelRelease(_)
            | AgentError::InvalidVersion(_)
            | AgentError::NoTargetVersion
            | AgentError::InvalidParameters { .. }
            | AgentError::GitClone { .. }
            | AgentError::CacheWrite { .. }
            | AgentError::ModInfo { .. }
            | AgentError::Kill { .. }
            | AgentError::Unload { .. }
            | AgentError::Label { .. }
            | AgentError::HostFs(_) => None,
        }
    }

    /// `<Reason>: <message>` within [`TERMINATION_MESSAGE_MAX`] bytes for an
    /// error with a [`reason`](Self::reason); a long message loses its middle,
    /// so the summary at its start and the end of a build log both stay.
    pub fn termination_message(&self) -> Option<String> {
        let reason = self.reason()?;
        let budget = TERMINATION_MESSAGE_MAX.saturating_sub(reason.len() + 2);
        Some(ttdrv_core::reason::termination_message(
            reason,
            &cut_middle(&self.to_string(), budget),
        ))
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        AgentError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Whether `e` says the filesystem is full (ENOSPC) or the quota used up (EDQUOT).
pub fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error().map(nix::errno::Errno::from_raw),
        Some(nix::errno::Errno::ENOSPC | nix::errno::Errno::EDQUOT)
    )
}

/// "disk full: " when a build log says the disk filled (make's and gcc's
/// words for ENOSPC), so the termination message leads with the cause.
fn disk_full_prefix(output: &str) -> &'static str {
    if output.contains("No space left on device") || output.contains("Disk quota exceeded") {
        "disk full: "
    } else {
        ""
    }
}

/// "/var/cache/tt-kmd/… has 12 KiB free of 1.0 MiB", or where when the
/// figures are unknown.
pub(crate) fn space_note(free: Option<u64>, size: Option<u64>, path: &std::path::Path) -> String {
    match (free, size) {
        (Some(f), Some(s)) => format!(
            "the filesystem holding {} has {} free of {}, too little for the module and its record",
            path.display(),
            bytes(f),
            bytes(s)
        ),
        _ => format!("the filesystem holding {} is full", path.display()),
    }
}

fn bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = n as f64;
    if f < KIB {
        format!("{n} B")
    } else if f < KIB * KIB {
        format!("{:.0} KiB", f / KIB)
    } else if f < KIB * KIB * KIB {
        format!("{:.1} MiB", f / KIB / KIB)
    } else {
        format!("{:.1} GiB", f / KIB / KIB / KIB)
    }
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;

/// `text` in at most `max` bytes: when longer, its first quarter and its end,
/// with the middle replaced by a marker saying how much was cut.
pub fn cut_middle(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    // The marker is at most this long (the count has at most 20 digits).
    const MARKER_MAX: usize = 40;
    let keep = max.saturating_sub(MARKER_MAX);
    let mut head = keep / 4;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (keep - head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{} [... {} bytes cut ...] {}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_middle_keeps_start_and_end_within_the_bound() {
        assert_eq!(cut_middle("short", 10), "short");
        let text = format!("START{}END", "é".repeat(5000));
        for max in [60, 100, 4000, 4090] {
            let cut = cut_middle(&text, max);
            assert!(cut.len() <= max, "{max}: {} bytes", cut.len());
            assert!(cut.starts_with("START") || max < 100, "{cut}");
            assert!(cut.ends_with("éEND"), "{cut}");
            assert!(cut.contains("bytes cut"), "{cut}");
        }
    }

    #[test]
    fn references_no_process_explains_are_counted() {
        let h = |pid, references| Holder {
            pid,
            comm: "train".into(),
            devices: vec!["/dev/tenstorrent/0".into()],
            mapped: vec![],
            references,
            pod_uid: None,
            pod: None,
            container_id: None,
        };
        let busy = |refcnt, holders| {
            AgentError::Busy {
                loaded: "2.10.0".into(),
                refcnt,
                holders,
            }
            .to_string()
        };
        let m = busy(3, vec![h(7, 1)]);
        assert!(
            m.contains("pid 7 (train); 2 reference(s) held by no open file"),
            "{m}"
        );
        let m = busy(1, vec![h(7, 1)]);
        assert!(!m.contains("reference(s)"), "all explained: {m}");
        let m = busy(2, vec![]);
        assert!(
            m.contains("no process under /proc holds or maps /dev/tenstorrent; 2 reference(s)"),
            "{m}"
        );
        let m = busy(crate::holder::REFCNT_UNKNOWN, vec![]);
        assert!(!m.contains("reference(s)"), "{m}");
    }

    #[test]
    fn only_give_up_errors_name_a_reason() {
        let busy = AgentError::Busy {
            loaded: "2.7.0".into(),
            refcnt: 1,
            holders: vec![],
        };
        assert_eq!(busy.reason(), Some("DeviceBusy"));
        let ebusy = AgentError::Unload {
            loaded: "2.7.0".into(),
            source: std::io::Error::from_raw_os_error(nix::errno::Errno::EAGAIN as i32),
        };
        assert_eq!(ebusy.reason(), Some("DeviceBusy"));
        let enoent = AgentError::Unload {
            loaded: "2.7.0".into(),
            source: std::io::Error::from_raw_os_error(nix::errno::Errno::ENOENT as i32),
        };
        assert_eq!(enoent.reason(), None);
        assert_eq!(enoent.termination_message(), None);
        let make = AgentError::Make {
            version: "2.8.0".into(),
            headers: PathBuf::from("/lib/modules/x/build"),
            status: "exit status: 2".into(),
            output: "x".repeat(10_000) + "\nerror: the last line",
        };
        let m = make.termination_message().expect("BuildFailed");
        assert!(
            m.starts_with("BuildFailed: building tenstorrent 2.8.0"),
            "{m}"
        );
        assert!(m.ends_with("error: the last line"), "{m}");
        assert!(m.len() <= TERMINATION_MESSAGE_MAX, "{}", m.len());
        let git = AgentError::GitClone {
            tag: "ttkmd-2.8.0".into(),
            repo: "r".into(),
            stderr: "network".into(),
        };
        assert_eq!(git.reason(), None, "a network error may pass: no fail-fast");
    }

    #[test]
    fn a_build_that_ran_out_of_disk_says_so_first() {
        let make = |output: &str| AgentError::Make {
            version: "2.8.0".into(),
            headers: PathBuf::from("/lib/modules/x/build"),
            status: "exit status: 2".into(),
            output: output.into(),
        };
        let full = make("foo.o: No space left on device\nmake: *** [foo.o] Error 1");
        let m = full.termination_message().expect("BuildFailed");
        assert!(
            m.starts_with("BuildFailed: disk full: building tenstorrent 2.8.0"),
            "{m}"
        );
        let other = make("error: implicit declaration");
        let m = other.termination_message().expect("BuildFailed");
        assert!(m.starts_with("BuildFailed: building tenstorrent"), "{m}");
        let enospc = std::io::Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32);
        assert!(is_disk_full(&enospc));
        assert!(!is_disk_full(&std::io::Error::from_raw_os_error(
            nix::errno::Errno::EIO as i32
        )));
        let dir = AgentError::DiskFull {
            what: "creating the build directory failed".into(),
            path: PathBuf::from("/tmp"),
            free: None,
            size: None,
            source: enospc,
        };
        assert_eq!(
            dir.termination_message().as_deref(),
            Some(
                "BuildFailed: disk full: creating the build directory failed (No space left on device (os error 28)); \
                 the filesystem holding /tmp is full. Free space there, then retry"
            )
        );
    }
}
