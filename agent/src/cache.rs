//! The module cache on the host: `/var/cache/tt-kmd/<kver>/<version>/tenstorrent.ko`.
//! Files reach their final path only by rename, so a reader never sees a
//! partial module; an entry whose `.modinfo` version is wrong is discarded.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{AgentError, Result};
use crate::host::HostRoot;
use crate::modinfo;

pub const CACHE_DIR: &str = "/var/cache/tt-kmd";
pub const MODULE_FILE: &str = "tenstorrent.ko";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheEntry {
    pub kernel_release: String,
    pub version: String,
    /// Host path (as seen from the host, not under the agent's root).
    pub path: String,
    pub size: u64,
    /// Version in the file's `.modinfo`; differs from `version` if corrupt.
    pub module_version: Option<String>,
}

pub struct Cache<'a> {
    root: &'a HostRoot,
}

impl<'a> Cache<'a> {
    pub fn new(root: &'a HostRoot) -> Self {
        Cache { root }
    }

    pub fn host_path(kver: &str, version: &str) -> String {
        format!("{CACHE_DIR}/{kver}/{version}/{MODULE_FILE}")
    }

    /// Path under the root of the cached module of `version` for `kver`.
    pub fn path(&self, kver: &str, version: &str) -> PathBuf {
        self.root.path(Self::host_path(kver, version))
    }

    /// The cached module, if present and its `.modinfo` version is `version`.
    /// A file of another (or unreadable) version is removed and `None` returned.
    pub fn lookup(&self, kver: &str, version: &str) -> Result<Option<PathBuf>> {
        let path = self.path(kver, version);
        if !path.is_file() {
            return Ok(None);
        }
        let found = match modinfo::module_version(&path) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cached module unreadable");
                None
            }
        };
        if found.as_deref() == Some(version) {
            return Ok(Some(path));
        }
        tracing::warn!(
            path = %path.display(),
            expected = version,
            found = found.as_deref().unwrap_or("none"),
            "cached module has the wrong version; discarding it and rebuilding"
        );
        fs::remove_file(&path).map_err(|source| AgentError::CacheWrite {
            path: path.clone(),
            source,
        })?;
        Ok(None)
    }

    /// Copies `built` into the cache atomically and returns the final path.
    pub fn store(&self, kver: &str, version: &str, built: &Path) -> Result<PathBuf> {
        let dest = self.path(kver, version);
        atomic_copy(built, &dest, 0o644)
            .map_err(|(path, source)| AgentError::CacheWrite { path, source })?;
        Ok(dest)
    }

    /// Every `<kver>/<version>/tenstorrent.ko` in the cache, sorted.
    pub fn entries(&self) -> Vec<CacheEntry> {
        let mut out = Vec::new();
        let base = self.root.path(CACHE_DIR);
        for kver in sorted_dir_names(&base) {
            for version in sorted_dir_names(&base.join(&kver)) {
                let file = base.join(&kver).join(&version).join(MODULE_FILE);
                let Ok(meta) = fs::metadata(&file) else {
                    continue;
                };
                out.push(CacheEntry {
                    module_version: modinfo::module_version(&file).ok().flatten(),
                    path: Self::host_path(&kver, &version),
                    size: meta.len(),
                    kernel_release: kver.clone(),
                    version,
                });
            }
        }
        out
    }
}

fn sorted_dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// Writes a copy of `src` at `dest` with `mode`: a temporary file in the same
/// directory, fsync, rename over `dest`, fsync of the directory. On error the
/// temporary file is removed and `dest` is untouched. The error carries the
/// path that failed.
pub fn atomic_copy(
    src: &Path,
    dest: &Path,
    mode: u32,
) -> std::result::Result<(), (PathBuf, io::Error)> {
    let dir = dest.parent().ok_or_else(|| {
        (
            dest.to_path_buf(),
            io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"),
        )
    })?;
    fs::create_dir_all(dir).map_err(|e| (dir.to_path_buf(), e))?;
    let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| (dir.to_path_buf(), e))?;
    let mut input = fs::File::open(src).map_err(|e| (src.to_path_buf(), e))?;
    io::copy(&mut input, tmp.as_file_mut()).map_err(|e| (tmp.path().to_path_buf(), e))?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| (tmp.path().to_path_buf(), e))?;
    tmp.as_file()
        .sync_all()
        .map_err(|e| (tmp.path().to_path_buf(), e))?;
    tmp.persist(dest)
        .map_err(|e| (dest.to_path_buf(), e.error))?;
    if let Ok(d) = fs::File::open(dir) {
        // Make the rename itself durable; best effort on filesystems that refuse.
        let _ = d.sync_all();
    }
    Ok(())
}
