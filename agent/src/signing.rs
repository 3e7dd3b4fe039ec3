//! Module signatures. On a host that enforces signatures (Secure Boot with
//! lockdown, `module.sig_enforce=1`, a kernel built with
//! `CONFIG_MODULE_SIG_FORCE`), the kernel refuses an unsigned module with
//! "Key was rejected by service". A DKMS host signs its module with its MOK
//! key; the agent signs the module it builds with the key pair of
//! `installer.signingSecret` ([`SigningKey`]), using the kernel's own
//! `scripts/sign-file` from the headers it builds against. Without one the
//! module is unsigned, and the agent finds out before the swap, during
//! build-ahead, so the node fails while it still serves on its old driver
//! instead of after the unload.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;

use crate::error::{AgentError, Result};
use crate::host::HostRoot;
use crate::kernel::KernelOps;

/// The most of a key or certificate file read (a certificate chain is a few KiB).
const KEY_FILE_MAX: u64 = 1 << 20;

/// The hash sign-file uses when the headers do not say
/// (`CONFIG_MODULE_SIG_HASH`'s default).
pub const DEFAULT_SIG_HASH: &str = "sha256";

/// The key pair the built module is signed with: `installer.signingSecret`
/// mounted into the installer pod (`--signing-key`, `--signing-cert`).
/// Paths in the agent's own filesystem, not on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningKey {
    /// The private key, PEM (the only form sign-file reads from a file).
    pub key: PathBuf,
    /// Its X.509 certificate, PEM or DER (sign-file reads both).
    pub cert: PathBuf,
    /// Where the pair comes from, for messages: `Secret <namespace>/<name>`,
    /// else the paths.
    pub origin: String,
}

/// A [`SigningKey`] whose files are there and look right, with the
/// certificate's fingerprint, which keys the cache: a module signed with
/// another certificate (or none) is never loaded once signing is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    pub key: PathBuf,
    pub cert: PathBuf,
    pub origin: String,
    /// `sha256:<hex>` of the certificate's DER encoding (what
    /// `openssl x509 -noout -fingerprint -sha256` prints, in lowercase without colons).
    pub fingerprint: String,
}

impl SigningKey {
    pub fn new(key: PathBuf, cert: PathBuf, secret: Option<&str>) -> Self {
        let origin = match secret.map(str::trim).filter(|s| !s.is_empty()) {
            Some(s) => format!("Secret {s}"),
            None => format!("key {}, certificate {}", key.display(), cert.display()),
        };
        SigningKey { key, cert, origin }
    }

    /// Reads the certificate and checks the key; fails (BuildFailed) naming
    /// what is missing or malformed, before anything is built.
    pub fn load(&self) -> Result<Signer> {
        let problem = |problem: String| AgentError::SigningKey {
            origin: self.origin.clone(),
            problem,
        };
        let key = read_key_file(&self.key, "tls.key").map_err(problem)?;
        // sign-file reads the key with PEM_read_bio_PrivateKey (or a PKCS#11
        // URI, which a Secret does not carry).
        if !String::from_utf8_lossy(&key).contains("-----BEGIN") {
            return Err(problem(format!(
                "the private key {} is not PEM (sign-file reads only PEM keys; convert a DER key with `openssl pkey -inform DER -in key.der -out tls.key`)",
                self.key.display()
            )));
        }
        let cert = read_key_file(&self.cert, "tls.crt").map_err(problem)?;
        let der = certificate_der(&cert).ok_or_else(|| {
            problem(format!(
                "{} is neither a PEM nor a DER X.509 certificate",
                self.cert.display()
            ))
        })?;
        Ok(Signer {
            key: self.key.clone(),
            cert: self.cert.clone(),
            origin: self.origin.clone(),
            fingerprint: fingerprint(&der),
        })
    }
}

/// A key or certificate file's bytes, or why there are none.
fn read_key_file(path: &Path, what: &str) -> std::result::Result<Vec<u8>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{} does not exist (no such Secret in the operator's namespace, or it has no {what})",
                path.display()
            ));
        }
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let bytes = crate::hostfs::read_capped(file, KEY_FILE_MAX, path).map_err(|e| e.to_string())?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(bytes)
}

/// The DER of the first certificate in `bytes`: DER as it is (a SEQUENCE
/// with a long-form length, as sign-file tells them apart), or the first
/// `CERTIFICATE` block of PEM decoded.
pub fn certificate_der(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() > 2 && bytes[0] == 0x30 && (0x81..=0x84).contains(&bytes[1]) {
        return Some(bytes.to_vec());
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let begin = "-----BEGIN CERTIFICATE-----";
    let start = text.find(begin)? + begin.len();
    let end = start + text[start..].find("-----END CERTIFICATE-----")?;
    let b64: String = text[start..end]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    (der.first() == Some(&0x30)).then_some(der)
}

/// `sha256:<hex>` of a certificate's DER.
pub fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// The fingerprint of the certificate at `path` (for `status`).
pub fn cert_fingerprint(path: &Path) -> std::result::Result<String, String> {
    let bytes = read_key_file(path, "tls.crt")?;
    certificate_der(&bytes)
        .map(|der| fingerprint(&der))
        .ok_or_else(|| {
            format!(
                "{} is neither a PEM nor a DER X.509 certificate",
                path.display()
            )
        })
}

/// The hash the kernel signs its modules with: `CONFIG_MODULE_SIG_HASH` in
/// the headers' `.config` (else `include/config/auto.conf`), else
/// [`DEFAULT_SIG_HASH`]. The kernel accepts any hash it was built with
/// support for; using its own is what `make modules_install` does.
pub fn sig_hash(headers: &Path) -> String {
    for config in [".config", "include/config/auto.conf"] {
        let Some(text) = read_config(&headers.join(config)) else {
            continue;
        };
        if let Some(hash) = text.lines().find_map(|l| {
            l.strip_prefix("CONFIG_MODULE_SIG_HASH=")
                .map(|v| v.trim().trim_matches('"').to_string())
        }) && !hash.is_empty()
            && hash.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return hash;
        }
    }
    DEFAULT_SIG_HASH.to_string()
}

/// A kernel configuration in the headers tree (followed like make follows
/// it), read without blocking on a FIFO and capped; None when unusable.
fn read_config(path: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    /// A distribution kernel's `.config` is about 300 KiB.
    const CONFIG_MAX: u64 = 8 << 20;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let bytes = crate::hostfs::read_capped(file, CONFIG_MAX, path).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The kernel's `scripts/sign-file` in the headers tree, or why not: a
/// BuildFailed before the build.
pub fn sign_file(signer: &Signer, headers: &Path, kver: &str) -> Result<PathBuf> {
    let tool = headers.join("scripts/sign-file");
    if tool.is_file() {
        Ok(tool)
    } else {
        Err(AgentError::SignFileMissing {
            origin: signer.origin.clone(),
            kver: kver.to_string(),
            path: tool,
        })
    }
}

/// Appends a signature to `module` with the kernel's sign-file (`tool`, from
/// [`sign_file`]) and the headers' hash, then checks that one is there.
pub fn sign(
    signer: &Signer,
    tool: &Path,
    headers: &Path,
    version: &str,
    module: &Path,
) -> Result<()> {
    let hash = sig_hash(headers);
    let out = crate::build::run(
        "sign-file",
        Command::new(tool)
            .arg(&hash)
            .arg(&signer.key)
            .arg(&signer.cert)
            .arg(module),
    )?;
    let failed = |output: String| AgentError::Sign {
        version: version.to_string(),
        origin: signer.origin.clone(),
        tool: tool.to_path_buf(),
        output,
    };
    if !out.status.success() {
        return Err(failed(format!(
            "{}: {}",
            out.status,
            crate::build::tail(&out, 5)
        )));
    }
    let file = std::fs::File::open(module).map_err(|e| AgentError::io("opening", module, e))?;
    if !is_signed(&file, module)? {
        return Err(failed("it exited 0 but appended no signature".into()));
    }
    tracing::info!(
        hash = %hash,
        certificate = %signer.fingerprint,
        origin = %signer.origin,
        "module signed"
    );
    Ok(())
}

/// On a host that enforces signatures, with tenstorrent loaded: asks the
/// kernel whether it trusts `module`'s signature ([`KernelOps::probe`]),
/// so that a key the host has not enrolled fails the node before the
/// unload, not after it (when the old module may be nowhere to roll back
/// to, as after a DKMS hand-over). Only a refusal of the key fails; any
/// other answer is left to the real load.
pub fn check_key(
    root: &HostRoot,
    kernel: &dyn KernelOps,
    version: &str,
    module: &std::fs::File,
    path: &Path,
) -> Result<()> {
    let Some(why) = host_enforcement(root) else {
        return Ok(());
    };
    // An unsigned one was refused already by [`check`].
    if !is_signed(module, path)? {
        return Ok(());
    }
    match kernel.probe(module) {
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EEXIST as i32) => {
            tracing::info!("the kernel accepts the module's signature");
            Ok(())
        }
        Err(e) if key_rejected(&e) || e.raw_os_error() == Some(nix::errno::Errno::EPERM as i32) => {
            Err(AgentError::KeyNotTrusted {
                version: version.to_string(),
                why,
                error: e.to_string(),
            })
        }
        Err(e) => {
            tracing::warn!(error = %e, "probing the module's signature gave no answer; the load will tell");
            Ok(())
        }
        // The old module went away meanwhile: the new one is loaded now,
        // which the wait for the go-ahead reads back (a first install).
        Ok(()) => {
            tracing::warn!(
                "tenstorrent was unloaded by someone else: the probe loaded the new module"
            );
            Ok(())
        }
    }
}

/// Whether the kernel refused a module for its signature's key
/// (EKEYREJECTED: an enforcing kernel that does not trust the signer).
pub fn key_rejected(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(nix::errno::Errno::EKEYREJECTED as i32)
}

/// The kernel's refusal of a module, with what it means when it is about
/// the signature: `signed` says whether the module carries one.
pub fn explain_load_error(e: &std::io::Error, signed: bool) -> String {
    if !key_rejected(e) {
        return e.to_string();
    }
    if signed {
        format!(
            "{e}: the key the module is signed with is not enrolled on this host; enrol its certificate as a Machine Owner Key (`mokutil --import cert.der`, confirmed in the MOK manager at the next boot) or sign with a key the host trusts (installer.signingSecret)"
        )
    } else {
        format!(
            "{e}: the module is unsigned and the host enforces module signatures; set installer.signingSecret to a key pair the host trusts"
        )
    }
}

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

/// Why this host enforces module signatures ([`enforcement`] of its sysfs),
/// or None.
fn host_enforcement(root: &HostRoot) -> Option<String> {
    let read = |p: &str| root.read_small(p).ok().flatten();
    enforcement(
        read("/sys/module/module/parameters/sig_enforce").as_deref(),
        read("/sys/kernel/security/lockdown").as_deref(),
    )
}

/// Fails when the host enforces signatures and `module` carries none.
pub fn check(root: &HostRoot, version: &str, module: &std::fs::File, path: &Path) -> Result<()> {
    let Some(why) = host_enforcement(root) else {
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

    #[test]
    fn certificates_are_read_as_der_or_pem_with_one_fingerprint() {
        let der = [0x30, 0x82, 0x00, 0x03, 1, 2, 3];
        assert_eq!(certificate_der(&der), Some(der.to_vec()));
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let pem = format!(
            "subject=CN = x\n-----BEGIN CERTIFICATE-----\n{}\n{}\n-----END CERTIFICATE-----\n",
            &b64[..4],
            &b64[4..]
        );
        assert_eq!(certificate_der(pem.as_bytes()), Some(der.to_vec()));
        // `sha256sum` of those bytes.
        assert_eq!(
            fingerprint(&der),
            "sha256:a2bcbe1b5f02972adcad45f74488e1214e655a76120276eecb7a000724e5e9dd"
        );
        for bad in [
            &b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"[..],
            b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
            b"not a certificate",
            b"",
        ] {
            assert_eq!(
                certificate_der(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_hash_is_the_kernels_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(sig_hash(dir.path()), DEFAULT_SIG_HASH, "no config");
        std::fs::create_dir_all(dir.path().join("include/config")).expect("mkdir");
        std::fs::write(
            dir.path().join("include/config/auto.conf"),
            "CONFIG_MODULE_SIG=y\nCONFIG_MODULE_SIG_HASH=\"sha384\"\n",
        )
        .expect("auto.conf");
        assert_eq!(sig_hash(dir.path()), "sha384");
        std::fs::write(
            dir.path().join(".config"),
            "# CONFIG_MODULE_SIG_SHA256 is not set\nCONFIG_MODULE_SIG_HASH=\"sha3-512\"\n",
        )
        .expect(".config");
        assert_eq!(sig_hash(dir.path()), "sha3-512", ".config first");
        std::fs::write(
            dir.path().join(".config"),
            "CONFIG_MODULE_SIG_HASH=\"sha256; rm -rf /\"\n",
        )
        .expect(".config");
        assert_eq!(sig_hash(dir.path()), "sha384", "not a hash name: ignored");
        std::fs::remove_file(dir.path().join(".config")).expect("rm");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            dir.path().join(".config"),
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .expect("mkfifo");
        assert_eq!(
            sig_hash(dir.path()),
            "sha384",
            "a FIFO is skipped, not read"
        );
    }

    #[test]
    fn a_rejected_key_is_explained() {
        let rejected = std::io::Error::from_raw_os_error(nix::errno::Errno::EKEYREJECTED as i32);
        let signed = explain_load_error(&rejected, true);
        assert!(
            signed.contains("Key was rejected by service")
                && signed.contains("not enrolled on this host")
                && signed.contains("mokutil"),
            "{signed}"
        );
        assert!(explain_load_error(&rejected, false).contains("installer.signingSecret"));
        let other = std::io::Error::from_raw_os_error(nix::errno::Errno::ENOEXEC as i32);
        assert_eq!(explain_load_error(&other, true), other.to_string());
    }
}
