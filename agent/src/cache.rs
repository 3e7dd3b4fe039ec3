//! The module cache on the host: `/var/cache/tt-kmd/<kver>/<version>/tenstorrent.ko`
//! with its record `tenstorrent.ko.json` (sha256, vermagic, version) written
//! beside it at build time. A module is loaded from the cache only when the
//! record, the file's hash, its `.modinfo` version and vermagic, its owner
//! (the agent's user) and mode (not group/world-writable) all agree; any
//! mismatch evicts the entry so it is rebuilt. Every path is opened through
//! [`crate::hostfs`]: a planted link in the cache is refused, never followed.
//! Files reach their final path only by rename, so a reader never sees a
//! partial module.

use std::fs;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::error::{AgentError, Result};
use crate::host::HostRoot;
use crate::hostfs::{FsResult, HostDir, HostFsError, SMALL_FILE_MAX, read_capped};
use crate::modinfo;

pub const CACHE_DIR: &str = "/var/cache/tt-kmd";
pub const MODULE_FILE: &str = "tenstorrent.ko";
/// The record written beside the module at build time.
pub const RECORD_FILE: &str = "tenstorrent.ko.json";
/// The largest module file the agent reads (tt-kmd with debug info is a few MB).
pub const MODULE_MAX: u64 = 256 * 1024 * 1024;
/// Versions kept per kernel besides the target and the loaded one.
pub const KEEP_VERSIONS: usize = 3;

/// What the agent recorded about a module it built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub version: String,
    pub kernel_release: String,
    pub vermagic: String,
    pub sha256: String,
    pub size: u64,
    /// The fingerprint of the certificate the module was signed with
    /// ([`crate::signing::Signer::fingerprint`]); absent when unsigned, so
    /// the records of unsigned modules read and write as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

/// Which signature a cached module must carry to be loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedBy<'a> {
    /// Signing is not configured: a module the agent signed is rebuilt.
    Nobody,
    /// Signed with the certificate of this fingerprint: a module signed with
    /// another one, or unsigned, is rebuilt.
    Cert(&'a str),
    /// Whatever signed it (the rollback source: what ran before, put back).
    Anyone,
}

impl<'a> SignedBy<'a> {
    /// What the signing configuration asks of a cached module.
    pub fn of(signer: Option<&'a crate::signing::Signer>) -> Self {
        match signer {
            Some(s) => SignedBy::Cert(&s.fingerprint),
            None => SignedBy::Nobody,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheEntry {
    pub kernel_release: String,
    pub version: String,
    /// Host path (as seen from the host, not under the agent's root).
    pub path: String,
    pub size: u64,
    /// Version in the file's `.modinfo`; differs from `version` if corrupt.
    pub module_version: Option<String>,
    /// The certificate it was signed with (its record's), when signed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// Whether the entry passes the checks made before loading it; why not.
    pub verified: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A cached module that passed every check, held open: the kernel loads
/// this very descriptor, not the path again.
#[derive(Debug)]
pub struct Verified {
    /// Path under the agent's root, for messages.
    pub path: PathBuf,
    pub file: fs::File,
    pub sha256: String,
}

pub struct Cache<'a> {
    root: &'a HostRoot,
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The file's owner and mode, and who the agent runs as.
#[derive(Debug, Clone, Copy)]
pub struct Ownership {
    pub uid: u32,
    pub mode: u32,
    pub euid: u32,
}

impl Ownership {
    fn of(st: &rustix::fs::Stat) -> Self {
        Ownership {
            uid: st.st_uid,
            mode: st.st_mode,
            euid: rustix::process::geteuid().as_raw(),
        }
    }
}

/// Why the module `bytes` (with `record` and `owner`) may not be loaded as
/// `version` on kernel `kver`, signed as `signed_by` asks; None when it may. Pure.
pub fn check(
    bytes: &[u8],
    record: Option<&Record>,
    owner: Ownership,
    kver: &str,
    version: &str,
    signed_by: SignedBy<'_>,
) -> Option<String> {
    let Ownership { uid, mode, euid } = owner;
    if uid != euid {
        return Some(format!("owned by uid {uid}, not the agent's uid {euid}"));
    }
    if mode & 0o022 != 0 {
        return Some(format!("mode {:o} lets others write it", mode & 0o7777));
    }
    let Some(record) = record else {
        return Some(format!("no readable {RECORD_FILE} beside it"));
    };
    let sha = sha256_hex(bytes);
    if sha != record.sha256 {
        return Some(format!(
            "sha256 {sha} differs from the recorded {}",
            record.sha256
        ));
    }
    let field = |f: &str| modinfo::field_of_bytes(bytes, f);
    let found = match field("version") {
        Ok(v) => v,
        Err(e) => return Some(format!("unreadable .modinfo: {e}")),
    };
    if found.as_deref() != Some(version) || record.version != version {
        return Some(format!(
            "module version {} (recorded {}), expected {version}",
            found.as_deref().unwrap_or("none"),
            record.version
        ));
    }
    let vermagic = field("vermagic").ok().flatten().unwrap_or_default();
    if modinfo::vermagic_release(&vermagic) != kver || vermagic != record.vermagic {
        return Some(format!(
            "vermagic {vermagic:?} (recorded {:?}) is not for the running kernel {kver}",
            record.vermagic
        ));
    }
    let signer = record.signer.as_deref();
    match signed_by {
        SignedBy::Anyone => None,
        // Only the record's word: a build that signs on its own (a kernel
        // whose `make modules` signs) is not this agent's signature.
        SignedBy::Nobody => signer
            .map(|s| format!("signed with certificate {s}, but module signing is not configured")),
        SignedBy::Cert(want) if signer != Some(want) => Some(format!(
            "signed with {}, not the configured certificate {want}",
            signer.map_or("no certificate (unsigned)".to_string(), |s| format!(
                "certificate {s}"
            ))
        )),
        SignedBy::Cert(_) if !bytes.ends_with(crate::signing::SIGNATURE_MAGIC) => {
            Some("its record names a signer but the file carries no signature".to_string())
        }
        SignedBy::Cert(_) => None,
    }
}

fn not_found_is_none<T>(r: FsResult<T>) -> FsResult<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

impl<'a> Cache<'a> {
    pub fn new(root: &'a HostRoot) -> Self {
        Cache { root }
    }

    pub fn host_path(kver: &str, version: &str) -> String {
        format!("{CACHE_DIR}/{kver}/{version}/{MODULE_FILE}")
    }

    fn version_dir_path(kver: &str, version: &str) -> String {
        format!("{CACHE_DIR}/{kver}/{version}")
    }

    /// Path under the root of the cached module of `version` for `kver`.
    pub fn path(&self, kver: &str, version: &str) -> PathBuf {
        self.root.path(Self::host_path(kver, version))
    }

    /// The cached module, if present and verified ([`check`], signed as
    /// `signed_by` asks). An entry that fails a check is evicted and None
    /// returned; a planted link, FIFO or device in the cache is an error naming it.
    pub fn lookup(
        &self,
        kver: &str,
        version: &str,
        signed_by: SignedBy<'_>,
    ) -> Result<Option<Verified>> {
        self.lookup_inner(kver, version, signed_by)
            .map_err(|e| match e {
                AgentError::HostFs(e) => self.unusable(kver, version, e),
                other => other,
            })
    }

    /// A cache path that cannot be used, as a cache error naming the entry
    /// (and, in the message, what was refused).
    fn unusable(&self, kver: &str, version: &str, e: HostFsError) -> AgentError {
        AgentError::CacheWrite {
            path: self.path(kver, version),
            source: match e {
                HostFsError::Io { source, .. }
                    if source.kind() != std::io::ErrorKind::NotADirectory =>
                {
                    source
                }
                other => std::io::Error::other(other.to_string()),
            },
        }
    }

    /// A failed write of the `size`-byte module: [`AgentError::DiskFull`]
    /// with the room left when the filesystem is full, else as
    /// [`Self::unusable`].
    fn write_failed(
        &self,
        kver: &str,
        version: &str,
        size: usize,
        dir: Option<&crate::hostfs::HostDir>,
        e: HostFsError,
    ) -> AgentError {
        match e {
            HostFsError::Io { source, .. } if crate::error::is_disk_full(&source) => {
                // The version directory may not exist: ask the cache's root.
                let space = dir
                    .and_then(|d| d.space())
                    .or_else(|| self.root.dir(CACHE_DIR, false).ok()?.space());
                AgentError::DiskFull {
                    what: format!(
                        "storing the {size}-byte module tenstorrent {version} in the cache failed"
                    ),
                    // As the node's admin knows it (not under the pod's /host).
                    path: PathBuf::from(Self::version_dir_path(kver, version)),
                    free: space.map(|s| s.0),
                    size: space.map(|s| s.1),
                    source,
                }
            }
            other => self.unusable(kver, version, other),
        }
    }

    fn lookup_inner(
        &self,
        kver: &str,
        version: &str,
        signed_by: SignedBy<'_>,
    ) -> Result<Option<Verified>> {
        let Some(dir) =
            not_found_is_none(self.root.dir(Self::version_dir_path(kver, version), false))?
        else {
            return Ok(None);
        };
        if dir.stat(MODULE_FILE)?.is_none() {
            return Ok(None);
        }
        let mut file = dir.open_file(MODULE_FILE)?;
        let path = self.path(kver, version);
        let st =
            rustix::fs::fstat(&file).map_err(|e| AgentError::io("inspecting", &path, e.into()))?;
        let bytes = read_capped(
            file.try_clone()
                .map_err(|e| AgentError::io("reading", &path, e))?,
            MODULE_MAX,
            &path,
        )?;
        let record = dir
            .read_optional(RECORD_FILE, SMALL_FILE_MAX)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
        if let Some(why) = check(
            &bytes,
            record.as_ref(),
            Ownership::of(&st),
            kver,
            version,
            signed_by,
        ) {
            tracing::warn!(
                path = %Self::host_path(kver, version),
                problem = %why,
                "cached module fails its checks; evicting it so it is rebuilt"
            );
            self.evict(kver, version)?;
            return Ok(None);
        }
        file.seek(SeekFrom::Start(0))
            .map_err(|e| AgentError::io("reading", &path, e))?;
        Ok(Some(Verified {
            path,
            file,
            sha256: sha256_hex(&bytes),
        }))
    }

    /// Removes the module and its record (and the version directory when
    /// that leaves it empty).
    pub fn evict(&self, kver: &str, version: &str) -> Result<()> {
        let cache_write = |e: HostFsError| self.unusable(kver, version, e);
        let Some(dir) =
            not_found_is_none(self.root.dir(Self::version_dir_path(kver, version), false))
                .map_err(cache_write)?
        else {
            return Ok(());
        };
        dir.remove_file(MODULE_FILE).map_err(cache_write)?;
        dir.remove_file(RECORD_FILE).map_err(cache_write)?;
        if let Ok(parent) = self.root.dir(format!("{CACHE_DIR}/{kver}"), false) {
            // Only succeeds when empty, which is all that is wanted.
            let _ = parent.remove_empty_dir(version);
        }
        Ok(())
    }

    /// Copies `built` (a file in the agent's own filesystem) into the cache
    /// with its record (naming `signer`, the fingerprint of the certificate
    /// it was signed with), atomically, and returns it verified. A module
    /// built for another kernel (vermagic) is refused.
    pub fn store(
        &self,
        kver: &str,
        version: &str,
        built: &Path,
        signer: Option<&str>,
    ) -> Result<Verified> {
        let dest = self.path(kver, version);
        let bytes = fs::read(built).map_err(|e| AgentError::io("reading", built, e))?;
        let vermagic = modinfo::field_of_bytes(&bytes, "vermagic")
            .map_err(|reason| AgentError::ModInfo {
                path: built.to_path_buf(),
                reason,
            })?
            .unwrap_or_default();
        if modinfo::vermagic_release(&vermagic) != kver {
            return Err(AgentError::BuiltForOtherKernel {
                path: built.to_path_buf(),
                kver: kver.to_string(),
                vermagic,
            });
        }
        let record = Record {
            version: version.to_string(),
            kernel_release: kver.to_string(),
            vermagic,
            sha256: sha256_hex(&bytes),
            size: bytes.len() as u64,
            signer: signer.map(str::to_string),
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| {
            AgentError::io("encoding the record of", &dest, std::io::Error::other(e))
        })?;
        let dir = self
            .root
            .dir(Self::version_dir_path(kver, version), true)
            .map_err(|e| self.write_failed(kver, version, bytes.len(), None, e))?;
        // The module first, its record last: a crash in between leaves a
        // module without a record, which is evicted, never loaded. A write
        // that fails (a full disk) takes back what it wrote, so nothing
        // partial stays in the cache.
        let written = dir
            .write_atomic(MODULE_FILE, &mut bytes.as_slice(), 0o644)
            .and_then(|()| dir.write_atomic(RECORD_FILE, &mut json.as_slice(), 0o644));
        if let Err(e) = written {
            let _ = dir.remove_file(MODULE_FILE);
            let err = self.write_failed(kver, version, bytes.len(), Some(&dir), e);
            drop(dir);
            if let Ok(parent) = self.root.dir(format!("{CACHE_DIR}/{kver}"), false) {
                let _ = parent.remove_empty_dir(version);
            }
            return Err(err);
        }
        let signed_by = match signer {
            Some(s) => SignedBy::Cert(s),
            None => SignedBy::Nobody,
        };
        self.lookup(kver, version, signed_by)?
            .ok_or_else(|| AgentError::CacheWrite {
                path: dest.clone(),
                source: std::io::Error::other("the module just stored fails its checks"),
            })
    }

    /// Removes cache directories of kernels no longer installed on the host
    /// (no `/lib/modules/<kver>`, and not `running`), and in every kernel
    /// kept all but the [`KEEP_VERSIONS`] highest versions and those in
    /// `keep`. Returns the host paths removed; a failure is logged and the
    /// rest goes on (pruning never fails an install).
    pub fn prune(&self, running: &str, keep: &[&str]) -> Vec<String> {
        let mut removed = Vec::new();
        let Ok(base) = self.root.dir(CACHE_DIR, false) else {
            return removed;
        };
        let installed = |k: &str| self.root.dir(format!("/lib/modules/{k}"), false).is_ok();
        for (kver, t) in base.entries().unwrap_or_default() {
            if t != rustix::fs::FileType::Directory {
                continue;
            }
            let host = format!("{CACHE_DIR}/{kver}");
            if kver != running && !installed(&kver) {
                match base.remove_tree(&kver) {
                    Ok(()) => removed.push(host),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot prune the cache of a removed kernel")
                    }
                }
                continue;
            }
            let Ok(kdir) = base.open_dir(&kver, false) else {
                continue;
            };
            let mut versions: Vec<(Vec<u64>, String)> = kdir
                .entries()
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, t)| *t == rustix::fs::FileType::Directory)
                .map(|(v, _)| (v.split('.').map(|p| p.parse().unwrap_or(0)).collect(), v))
                .collect();
            versions.sort();
            versions.reverse();
            let mut kept = 0;
            for (_, v) in versions {
                if keep.contains(&v.as_str()) {
                    continue;
                }
                if kept < KEEP_VERSIONS {
                    kept += 1;
                    continue;
                }
                match kdir.remove_tree(&v) {
                    Ok(()) => removed.push(format!("{host}/{v}")),
                    Err(e) => tracing::warn!(error = %e, "cannot prune an old cached version"),
                }
            }
        }
        removed
    }

    /// Every `<kver>/<version>/tenstorrent.ko` in the cache, sorted, with
    /// whether it would pass the checks made before loading it (signed as
    /// `signed_by` asks).
    pub fn entries(&self, signed_by: SignedBy<'_>) -> Vec<CacheEntry> {
        let mut out = Vec::new();
        let Ok(base) = self.root.dir(CACHE_DIR, false) else {
            return out;
        };
        let dirs = |d: &HostDir| -> Vec<String> {
            d.entries()
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, t)| *t == rustix::fs::FileType::Directory)
                .map(|(n, _)| n)
                .collect()
        };
        for kver in dirs(&base) {
            let Ok(kdir) = base.open_dir(&kver, false) else {
                continue;
            };
            for version in dirs(&kdir) {
                let Ok(vdir) = kdir.open_dir(&version, false) else {
                    continue;
                };
                let Ok(file) = vdir.open_file(MODULE_FILE) else {
                    continue;
                };
                let Ok(st) = rustix::fs::fstat(&file) else {
                    continue;
                };
                let bytes = read_capped(
                    file,
                    MODULE_MAX,
                    Path::new(&Self::host_path(&kver, &version)),
                )
                .unwrap_or_default();
                let record = vdir
                    .read_optional(RECORD_FILE, SMALL_FILE_MAX)
                    .ok()
                    .flatten()
                    .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
                let problem = check(
                    &bytes,
                    record.as_ref(),
                    Ownership::of(&st),
                    &kver,
                    &version,
                    signed_by,
                );
                out.push(CacheEntry {
                    signer: record.and_then(|r| r.signer),
                    module_version: modinfo::field_of_bytes(&bytes, "version").ok().flatten(),
                    path: Self::host_path(&kver, &version),
                    size: st.st_size as u64,
                    kernel_release: kver.clone(),
                    verified: problem.is_none(),
                    problem,
                    version,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KVER: &str = "6.1.0-99-amd64";

    fn module(version: &str, kver: &str) -> Vec<u8> {
        let v = format!("version={version}");
        let m = format!("vermagic={kver} SMP mod_unload");
        modinfo::fake_module_bytes(&["name=tenstorrent", &v, &m])
    }

    fn record(bytes: &[u8], version: &str, kver: &str) -> Record {
        Record {
            version: version.into(),
            kernel_release: KVER.into(),
            vermagic: format!("{kver} SMP mod_unload"),
            sha256: sha256_hex(bytes),
            size: bytes.len() as u64,
            signer: None,
        }
    }

    const OK: Ownership = Ownership {
        uid: 0,
        mode: 0o100644,
        euid: 0,
    };

    #[test]
    fn each_check_names_what_failed() {
        let good = module("2.8.0", KVER);
        let rec = record(&good, "2.8.0", KVER);
        assert_eq!(
            check(&good, Some(&rec), OK, KVER, "2.8.0", SignedBy::Nobody),
            None
        );
        let why = |bytes: &[u8], rec: Option<&Record>, owner: Ownership| {
            check(bytes, rec, owner, KVER, "2.8.0", SignedBy::Nobody).unwrap_or_default()
        };
        assert!(why(&good, Some(&rec), Ownership { uid: 1000, ..OK }).contains("uid 1000"));
        assert!(
            why(
                &good,
                Some(&rec),
                Ownership {
                    mode: 0o100664,
                    ..OK
                }
            )
            .contains("664")
        );
        assert!(
            why(
                &good,
                Some(&rec),
                Ownership {
                    mode: 0o100646,
                    ..OK
                }
            )
            .contains("646")
        );
        assert!(why(&good, None, OK).contains(RECORD_FILE));
        let other = module("2.8.0", "5.10.0-1-amd64");
        assert!(
            why(&other, Some(&record(&other, "2.8.0", "5.10.0-1-amd64")), OK).contains("vermagic")
        );
        assert!(
            why(&other, Some(&rec), OK).contains("sha256"),
            "the hash first"
        );
        let old = module("2.7.0", KVER);
        assert!(why(&old, Some(&record(&old, "2.7.0", KVER)), OK).contains("2.7.0"));
        let renamed = record(&good, "2.8.0", "6.1.0-98-amd64");
        assert!(
            why(&good, Some(&renamed), OK).contains("vermagic"),
            "record and file disagree"
        );
        assert!(
            why(
                b"not a module",
                Some(&record(b"not a module", "2.8.0", KVER)),
                OK
            )
            .contains(".modinfo")
        );
    }

    #[test]
    fn the_signature_must_be_the_configured_ones() {
        let unsigned = module("2.8.0", KVER);
        let mut signed = unsigned.clone();
        signed.extend_from_slice(b"PKCS#7 stand-in");
        signed.extend_from_slice(crate::signing::SIGNATURE_MAGIC);
        let by = |bytes: &[u8], signer: Option<&str>| Record {
            signer: signer.map(str::to_string),
            ..record(bytes, "2.8.0", KVER)
        };
        let why = |bytes: &[u8], rec: &Record, want: SignedBy<'_>| {
            check(bytes, Some(rec), OK, KVER, "2.8.0", want)
        };
        let a = "sha256:aa";
        let ours = by(&signed, Some(a));
        assert_eq!(why(&signed, &ours, SignedBy::Cert(a)), None);
        assert_eq!(why(&signed, &ours, SignedBy::Anyone), None);
        let other = why(&signed, &ours, SignedBy::Cert("sha256:bb")).unwrap_or_default();
        assert!(
            other.contains("certificate sha256:aa")
                && other.contains("configured certificate sha256:bb"),
            "{other}"
        );
        let plain = why(&unsigned, &by(&unsigned, None), SignedBy::Cert(a)).unwrap_or_default();
        assert!(plain.contains("unsigned"), "{plain}");
        let off = why(&signed, &ours, SignedBy::Nobody).unwrap_or_default();
        assert!(off.contains("not configured"), "{off}");
        // A record that claims a signer for a file without a signature.
        let liar = by(&unsigned, Some(a));
        assert!(
            why(&unsigned, &liar, SignedBy::Cert(a))
                .is_some_and(|w| w.contains("carries no signature"))
        );
        // A module signed by its build, recorded unsigned, is the build's
        // business: never rebuilt for it (that would loop).
        assert_eq!(why(&signed, &by(&signed, None), SignedBy::Nobody), None);
        // Records from before signing read as unsigned.
        let old: Record = serde_json::from_str(
            r#"{"version":"2.8.0","kernelRelease":"k","vermagic":"v","sha256":"s","size":1}"#,
        )
        .expect("old record");
        assert_eq!(old.signer, None);
        assert!(
            !serde_json::to_string(&old)
                .expect("json")
                .contains("signer"),
            "an unsigned record is written as before"
        );
    }
}
