//! Module signature enforcement. On a host that enforces signatures (Secure
//! Boot with lockdown, `module.sig_enforce=1`, a kernel built with
//! `CONFIG_MODULE_SIG_FORCE`), the kernel refuses an unsigned module with
//! "Key was rejected by service". A DKMS host signs its module with its MOK
//! key; the module this agent builds is unsigned. The agent finds that out
//! before the swap, during build-ahead, so the node fails while it still
//! serves on its old driver instead of after the unload.

use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{AgentError, Result};
use crate::host::HostRoot;

/// What a signed module file ends with (`scripts/sign-file`).
pub const SIGNATURE_MAGIC: &[u8] = b"~Module signature appended~\n";

/// Why this host enforces module signatures, or None. `sig_enforce` is
/// `/sys/module/module/parameters/sig_enforce` (`Y` when enforced, also
/// under `CONFIG_MODULE_SIG_FORCE`), `lockdown` is
/// `/sys/kernel/security/lockdown` (the mode in brackets: `[integrity]` and
/// `[confidentiality]` refuse unsigned modules; Secure Boot turns it on in
/// most distribution kernels).
pub fn enforcement(sig_enforce: Option<&str>, lockdown: Option<&str>) -> Option<String> {
    if sig_enforce.is_some_and(|v| v.trim() == "Y") {
        return Some("module signatures are enforced (module.sig_enforce=Y)".into());
    }
    let mode = lockdown.and_then(|l| {
        let start = l.find('[')?;
        let end = l[start..].find(']')?;
        Some(&l[start + 1..start + end])
    });
    match mode {
        Some(m @ ("integrity" | "confidentiality")) => Some(format!(
            "the kernel is locked down ({m}, as under Secure Boot), which refuses unsigned modules"
        )),
        _ => None,
    }
}

/// Does the module file end with an appended signature?
pub fn is_signed(module: &std::fs::File, path: &Path) -> Result<bool> {
    let len = module
        .metadata()
        .map_err(|source| AgentError::io("inspecting", path, source))?
        .len();
    let n = SIGNATURE_MAGIC.len() as u64;
    if len < n {
        return Ok(false);
    }
    let mut tail = vec![0u8; SIGNATURE_MAGIC.len()];
    module
        .read_exact_at(&mut tail, len - n)
        .map_err(|source| AgentError::io("reading", path, source))?;
    Ok(tail == SIGNATURE_MAGIC)
}

/// Fails when the host enforces signatures and `module` carries none.
pub fn check(root: &HostRoot, version: &str, module: &std::fs::File, path: &Path) -> Result<()> {
    let read = |p: &str| root.read_small(p).ok().flatten();
    let Some(why) = enforcement(
        read("/sys/module/module/parameters/sig_enforce").as_deref(),
        read("/sys/kernel/security/lockdown").as_deref(),
    ) else {
        return Ok(());
    };
    if is_signed(module, path)? {
        // Whether its key is trusted only the load can tell.
        return Ok(());
    }
    Err(AgentError::UnsignedModule {
        version: version.to_string(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn enforcement_is_read_from_sig_enforce_and_lockdown() {
        assert!(enforcement(Some("Y\n"), None).is_some_and(|w| w.contains("sig_enforce=Y")));
        assert_eq!(enforcement(Some("N\n"), None), None);
        assert_eq!(enforcement(None, None), None);
        assert_eq!(
            enforcement(Some("N"), Some("[none] integrity confidentiality\n")),
            None
        );
        assert!(
            enforcement(Some("N"), Some("none [integrity] confidentiality\n"))
                .is_some_and(|w| w.contains("locked down (integrity"))
        );
        assert!(
            enforcement(None, Some("none integrity [confidentiality]"))
                .is_some_and(|w| w.contains("confidentiality"))
        );
        assert_eq!(enforcement(None, Some("garbage")), None);
    }

    #[test]
    fn a_signature_is_found_at_the_end_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("m.ko");
        let mut f = std::fs::File::create(&p).expect("create");
        f.write_all(b"\x7fELF....").expect("write");
        drop(f);
        let f = std::fs::File::open(&p).expect("open");
        assert!(!is_signed(&f, &p).expect("read"));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .expect("open");
        f.write_all(b"sigdata").expect("write");
        f.write_all(SIGNATURE_MAGIC).expect("write");
        drop(f);
        let f = std::fs::File::open(&p).expect("open");
        assert!(is_signed(&f, &p).expect("read"));
        let empty = dir.path().join("e.ko");
        std::fs::write(&empty, b"").expect("write");
        let f = std::fs::File::open(&empty).expect("open");
        assert!(!is_signed(&f, &empty).expect("read"));
    }
}
