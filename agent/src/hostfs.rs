//! Host files opened without trusting the host's tree: every host path is
//! walked from a descriptor of the host root one component at a time with
//! `O_NOFOLLOW`, so a symbolic link anywhere on the path (absolute, `..`, or
//! into `/dev`) is refused with an error naming it instead of being followed
//! out of the root or into another file. Reads never block (`O_NONBLOCK`),
//! take regular files only and are capped; writes go through a temporary file
//! and `renameat` in a directory opened the same way.
//!
//! The walk needs no `openat2` (kernels before 5.6 lack it) and leaves no
//! window between check and use: every step is relative to a descriptor
//! already held.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Cap for small host files (sysfs and procfs attributes, the udev rule).
pub const SMALL_FILE_MAX: u64 = 64 * 1024;

/// Why a host path was not used.
#[derive(Debug, thiserror::Error)]
pub enum HostFsError {
    #[error(
        "refusing host path {path}: {link} is a symbolic link (to {target}); the agent does not follow links on the host"
    )]
    Link {
        path: String,
        link: String,
        target: String,
    },
    #[error("refusing host path {path}: it is a {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("refusing host path {path}: {reason}")]
    Invalid { path: String, reason: &'static str },
    #[error("refusing host path {path}: larger than {max} bytes")]
    TooLarge { path: String, max: u64 },
    #[error("{op} host path {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl HostFsError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, HostFsError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
    /// The OS error, for errors that came from a system call.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            HostFsError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub type FsResult<T> = std::result::Result<T, HostFsError>;

fn io_err(op: &'static str, path: &Path, e: Errno) -> HostFsError {
    HostFsError::Io {
        op,
        path: path.display().to_string(),
        source: io::Error::from(e),
    }
}

fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "file of unknown type",
    }
}

/// The normal components of an absolute host path; `..` is refused (the
/// agent never builds one, so one in a path is an error, not something to
/// resolve).
fn components(host_path: &Path) -> FsResult<Vec<&std::ffi::OsStr>> {
    let mut out = Vec::new();
    for c in host_path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(p) => out.push(p),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(HostFsError::Invalid {
                    path: host_path.display().to_string(),
                    reason: "it contains ..",
                });
            }
        }
    }
    Ok(out)
}

/// A directory on the host, held open; `path` is its host path (for errors).
#[derive(Debug)]
pub struct HostDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Distinguishes temporary names of concurrent writers in one process.
static TMP_SEQ: AtomicU32 = AtomicU32::new(0);

impl HostDir {
    /// The host root itself (`root` is a path in the agent's own filesystem,
    /// trusted: it is the pod's mount point).
    pub fn open_root(root: &Path) -> FsResult<HostDir> {
        let fd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("opening the host root", root, e))?;
        Ok(HostDir {
            fd,
            path: PathBuf::from("/"),
        })
    }

    /// Host path of this directory.
    pub fn host_path(&self) -> &Path {
        &self.path
    }

    fn child(&self, name: &std::ffi::OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// The error for a component that could not be opened: a link is named
    /// with its target, anything else passes the OS error on.
    fn refusal(
        &self,
        name: &std::ffi::OsStr,
        whole: &Path,
        op: &'static str,
        e: Errno,
    ) -> HostFsError {
        if matches!(e, Errno::LOOP | Errno::NOTDIR)
            && let Ok(st) = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
        {
            let t = FileType::from_raw_mode(st.st_mode);
            if t == FileType::Symlink {
                let target = rustix::fs::readlinkat(&self.fd, name, Vec::new())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "?".to_string());
                return HostFsError::Link {
                    path: whole.display().to_string(),
                    link: self.child(name).display().to_string(),
                    target,
                };
            }
            if e == Errno::NOTDIR {
                return HostFsError::Invalid {
                    path: whole.display().to_string(),
                    reason: "a component is not a directory",
                };
            }
        }
        io_err(op, whole, e)
    }

    /// Opens the directory at `rel` (relative to this one, normal components
    /// only), creating missing ones with mode 0755 when `create`.
    pub fn open_dir(&self, rel: impl AsRef<Path>, create: bool) -> FsResult<HostDir> {
        let rel = rel.as_ref();
        let whole = self.path.join(rel.strip_prefix("/").unwrap_or(rel));
        let mut cur = HostDir {
            fd: self.fd.try_clone().map_err(|e| HostFsError::Io {
                op: "duplicating the descriptor of",
                path: self.path.display().to_string(),
                source: e,
            })?,
            path: self.path.clone(),
        };
        for name in components(rel)? {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let fd = match rustix::fs::openat(&cur.fd, name, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&cur.fd, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_err("creating", &cur.child(name), e)),
                    }
                    rustix::fs::openat(&cur.fd, name, flags, Mode::empty())
                        .map_err(|e| cur.refusal(name, &whole, "opening", e))?
                }
                Err(e) => return Err(cur.refusal(name, &whole, "opening", e)),
            };
            cur = HostDir {
                fd,
                path: cur.child(name),
            };
        }
        Ok(cur)
    }

    /// `name` opened with `flags` (and never through a link) if it is a
    /// regular file. Looked at before opening too: opening a device node can
    /// itself act (a driver's open), and a FIFO must not be waited on.
    fn open_regular(&self, name: &str, flags: OFlags) -> FsResult<OwnedFd> {
        let whole = self.child(name.as_ref());
        let regular = |t: FileType| {
            if t == FileType::RegularFile {
                return Ok(());
            }
            Err(HostFsError::NotRegular {
                path: whole.display().to_string(),
                kind: kind_name(t),
            })
        };
        if let Some(st) = self.stat(name)? {
            let t = FileType::from_raw_mode(st.st_mode);
            if t == FileType::Symlink {
                return Err(self.refusal(name.as_ref(), &whole, "opening", Errno::LOOP));
            }
            regular(t)?;
        }
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.refusal(name.as_ref(), &whole, "opening", e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("inspecting", &whole, e))?;
        regular(FileType::from_raw_mode(st.st_mode))?;
        Ok(fd)
    }

    /// The file `name` in this directory, opened read-only without following
    /// a link or blocking, if it is a regular file.
    pub fn open_file(&self, name: &str) -> FsResult<std::fs::File> {
        let fd = self.open_regular(name, OFlags::RDONLY | OFlags::NONBLOCK)?;
        Ok(std::fs::File::from(fd))
    }

    /// The content of regular file `name`, at most `max` bytes.
    pub fn read(&self, name: &str, max: u64) -> FsResult<Vec<u8>> {
        let file = self.open_file(name)?;
        read_capped(file, max, &self.child(name.as_ref()))
    }

    /// Like [`read`](Self::read), None when the file does not exist.
    pub fn read_optional(&self, name: &str, max: u64) -> FsResult<Option<Vec<u8>>> {
        match self.read(name, max) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `content` to the existing file `name` in one `write` (a sysfs
    /// attribute takes its whole value from one call): opened write-only
    /// without following a link, never created; truncated as shell
    /// redirection does, which sysfs ignores and which leaves only the last
    /// value in a planted tree. Anything but a regular file is refused.
    pub fn write_existing(&self, name: &str, content: &[u8]) -> FsResult<()> {
        let fd = self.open_regular(name, OFlags::WRONLY | OFlags::TRUNC)?;
        let whole = self.child(name.as_ref());
        let n = rustix::io::write(&fd, content).map_err(|e| io_err("writing", &whole, e))?;
        if n != content.len() {
            return Err(io_err("writing", &whole, Errno::IO));
        }
        Ok(())
    }

    /// The target of the link `name`, None when it is absent or not a link.
    pub fn read_link(&self, name: &str) -> FsResult<Option<PathBuf>> {
        match rustix::fs::readlinkat(&self.fd, name, Vec::new()) {
            Ok(t) => Ok(Some(PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(t.into_bytes()),
            ))),
            Err(Errno::NOENT | Errno::INVAL) => Ok(None),
            Err(e) => Err(io_err("reading the link", &self.child(name.as_ref()), e)),
        }
    }

    /// The type, owner and mode of `name` without following a link; None
    /// when absent.
    pub fn stat(&self, name: &str) -> FsResult<Option<rustix::fs::Stat>> {
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(io_err("inspecting", &self.child(name.as_ref()), e)),
        }
    }

    /// Refuses an existing `name` that is not a regular file (a planted link,
    /// FIFO or device where the agent writes or removes a file).
    fn check_replaceable(&self, name: &str) -> FsResult<bool> {
        let Some(st) = self.stat(name)? else {
            return Ok(false);
        };
        let t = FileType::from_raw_mode(st.st_mode);
        match t {
            FileType::RegularFile => Ok(true),
            FileType::Symlink => Err(self.refusal(
                name.as_ref(),
                &self.child(name.as_ref()),
                "replacing",
                Errno::LOOP,
            )),
            _ => Err(HostFsError::NotRegular {
                path: self.child(name.as_ref()).display().to_string(),
                kind: kind_name(t),
            }),
        }
    }

    /// Writes `name` with `mode` from `content`: a new temporary file in this
    /// directory (O_EXCL, never through a link), fsync, rename over `name`,
    /// fsync of the directory. An existing `name` that is not a regular file
    /// is refused; on error the temporary file is removed and `name` is untouched.
    pub fn write_atomic(&self, name: &str, content: &mut dyn Read, mode: u32) -> FsResult<()> {
        self.check_replaceable(name)?;
        let (tmp_name, fd) = self.create_temp(name)?;
        let tmp_path = self.child(tmp_name.as_ref());
        let result = (|| {
            let mut file = std::fs::File::from(fd);
            io::copy(content, &mut file).map_err(|e| HostFsError::Io {
                op: "writing",
                path: tmp_path.display().to_string(),
                source: e,
            })?;
            rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))
                .map_err(|e| io_err("setting the mode of", &tmp_path, e))?;
            file.flush().map_err(|e| HostFsError::Io {
                op: "writing",
                path: tmp_path.display().to_string(),
                source: e,
            })?;
            rustix::fs::fsync(&file).map_err(|e| io_err("syncing", &tmp_path, e))?;
            rustix::fs::renameat(&self.fd, tmp_name.as_str(), &self.fd, name)
                .map_err(|e| io_err("renaming into place", &self.child(name.as_ref()), e))
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp_name.as_str(), AtFlags::empty());
            return result;
        }
        // Make the rename itself durable; best effort on filesystems that refuse.
        let _ = rustix::fs::fsync(&self.fd);
        Ok(())
    }

    fn create_temp(&self, name: &str) -> FsResult<(String, OwnedFd)> {
        let pid = std::process::id();
        let mut last = Errno::EXIST;
        for _ in 0..16 {
            let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
            let tmp = format!(".{name}.{pid}.{seq}.tmp");
            match rustix::fs::openat(
                &self.fd,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => return Ok((tmp, fd)),
                Err(Errno::EXIST) => last = Errno::EXIST,
                Err(e) => return Err(io_err("creating a temporary file in", &self.path, e)),
            }
        }
        Err(io_err("creating a temporary file in", &self.path, last))
    }

    /// Removes the regular file `name`; a link or other non-regular file there
    /// is refused. Returns whether a file was removed.
    pub fn remove_file(&self, name: &str) -> FsResult<bool> {
        if !self.check_replaceable(name)? {
            return Ok(false);
        }
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(io_err("removing", &self.child(name.as_ref()), e)),
        }
    }

    /// Removes the directory `name` and everything in it, links as links
    /// (never what they point to). A link at `name` itself is refused.
    pub fn remove_tree(&self, name: &str) -> FsResult<()> {
        let sub = self.open_dir(name, false)?;
        for (entry, t) in sub.entries()? {
            if t == FileType::Directory {
                sub.remove_tree(&entry)?;
            } else {
                rustix::fs::unlinkat(&sub.fd, entry.as_str(), AtFlags::empty())
                    .map_err(|e| io_err("removing", &sub.child(entry.as_ref()), e))?;
            }
        }
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
            .map_err(|e| io_err("removing", &self.child(name.as_ref()), e))
    }

    /// Bytes free (to an unprivileged writer) and in all on the filesystem
    /// holding this directory; None when the kernel will not say.
    pub fn space(&self) -> Option<(u64, u64)> {
        let st = rustix::fs::fstatvfs(&self.fd).ok()?;
        Some((
            st.f_bavail.saturating_mul(st.f_frsize),
            st.f_blocks.saturating_mul(st.f_frsize),
        ))
    }

    /// Removes the directory `name` if it is empty.
    pub fn remove_empty_dir(&self, name: &str) -> FsResult<()> {
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
            .map_err(|e| io_err("removing", &self.child(name.as_ref()), e))
    }

    /// Sets the mode of `name` when it is not a link; the caller has checked
    /// what it is.
    pub fn chmod(&self, name: &str, mode: u32) -> FsResult<()> {
        rustix::fs::chmodat(&self.fd, name, Mode::from_raw_mode(mode), AtFlags::empty())
            .map_err(|e| io_err("setting the mode of", &self.child(name.as_ref()), e))
    }

    /// Names (UTF-8 only) and types of the entries, sorted; links are
    /// reported as links.
    pub fn entries(&self) -> FsResult<Vec<(String, FileType)>> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("listing", &self.path, e))?;
        let dir =
            rustix::fs::Dir::read_from(fd.as_fd()).map_err(|e| io_err("listing", &self.path, e))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| io_err("listing", &self.path, e))?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let t = match entry.file_type() {
                FileType::Unknown => self
                    .stat(name)?
                    .map_or(FileType::Unknown, |st| FileType::from_raw_mode(st.st_mode)),
                t => t,
            };
            out.push((name.to_string(), t));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Reads at most `max` bytes of `file`; more is an error.
pub fn read_capped(file: std::fs::File, max: u64, path: &Path) -> FsResult<Vec<u8>> {
    let mut out = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| HostFsError::Io {
            op: "reading",
            path: path.display().to_string(),
            source: e,
        })?;
    if out.len() as u64 > max {
        return Err(HostFsError::TooLarge {
            path: path.display().to_string(),
            max,
        });
    }
    Ok(out)
}

/// Splits an absolute host path into its directory and file name.
pub fn split(host_path: &Path) -> FsResult<(&Path, &str)> {
    let invalid = |reason| HostFsError::Invalid {
        path: host_path.display().to_string(),
        reason,
    };
    let name = host_path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| invalid("it has no UTF-8 file name"))?;
    let dir = host_path
        .parent()
        .ok_or_else(|| invalid("it has no parent"))?;
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn write_existing_writes_files_only_and_never_creates_or_follows() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("bind"), "old value").expect("plant");
        fs::write(dir.path().join("target"), "kept").expect("plant");
        std::os::unix::fs::symlink("target", dir.path().join("link")).expect("link");
        fs::create_dir(dir.path().join("sub")).expect("mkdir");
        let host = HostDir::open_root(dir.path()).expect("root");

        host.write_existing("bind", b"0000:01:00.0").expect("write");
        assert_eq!(
            fs::read_to_string(dir.path().join("bind")).expect("read"),
            "0000:01:00.0"
        );

        let e = host.write_existing("link", b"x").expect_err("a link");
        assert!(matches!(e, HostFsError::Link { .. }), "{e}");
        assert_eq!(
            fs::read_to_string(dir.path().join("target")).expect("read"),
            "kept"
        );
        let e = host.write_existing("sub", b"x").expect_err("a directory");
        assert!(matches!(e, HostFsError::NotRegular { .. }), "{e}");
        let e = host.write_existing("absent", b"x").expect_err("absent");
        assert!(e.is_not_found(), "{e}");
        assert!(!dir.path().join("absent").exists());

        assert_eq!(
            host.read_link("link").expect("readlink"),
            Some(PathBuf::from("target"))
        );
        assert_eq!(host.read_link("bind").expect("not a link"), None);
        assert_eq!(host.read_link("absent").expect("absent"), None);
    }
}
