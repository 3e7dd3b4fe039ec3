//! Building the module from source: `git clone --depth 1 --branch ttkmd-<version>`
//! of the configured repository, a check that the tag names the pinned commit
//! (a tag that moved is refused), then `make -C <headers> M=<src> modules`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::error::{AgentError, Result};
use crate::host::MODULE_NAME;

/// Git tag of a tt-kmd release.
pub fn tag_for(version: &str) -> String {
    format!("ttkmd-{version}")
}

/// The most compilers run at once (`make -j`).
pub const BUILD_JOBS_MAX: usize = 4;

/// What to build, and where.
#[derive(Debug, Clone)]
pub struct BuildRequest<'a> {
    pub version: &'a str,
    pub kernel_release: &'a str,
    /// Kernel build directory (`lib/modules/<kver>/build`, resolved under the root).
    pub headers: &'a Path,
    /// Scratch directory owned by the caller; removed after the build.
    pub workdir: &'a Path,
}

/// Produces `tenstorrent.ko` for a version; returns the path of the built file
/// (inside the request's workdir).
pub trait Builder: Sync {
    fn build(&self, req: &BuildRequest<'_>) -> Result<PathBuf>;
}

/// The real builder: git and make.
#[derive(Debug, Clone)]
pub struct GitMakeBuilder {
    pub repository: String,
    /// The commit the version's tag must name (TT_KMD_SOURCE_COMMIT); None:
    /// unpinned, the cloned commit is only logged.
    pub commit: Option<String>,
    /// Public keys (a file gpg imports) that must have signed the version's
    /// tag (TT_KMD_TAG_KEYS); None: signatures are not checked.
    pub tag_keys: Option<PathBuf>,
}

impl GitMakeBuilder {
    pub fn new(repository: impl Into<String>) -> Self {
        GitMakeBuilder {
            repository: repository.into(),
            commit: None,
            tag_keys: None,
        }
    }

    /// Refuses any tree but `commit` (a full hex object name).
    pub fn pinned(mut self, commit: Option<String>) -> Self {
        self.commit = commit;
        self
    }

    /// Refuses a tag not signed by one of the keys in `keys`.
    pub fn signed_by(mut self, keys: Option<PathBuf>) -> Self {
        self.tag_keys = keys;
        self
    }

    /// `git verify-tag` against a keyring holding only `keys`, in a GNUPGHOME
    /// of its own under `workdir` (the host's and the image's keys play no part).
    fn verify_tag(&self, keys: &Path, src: &Path, workdir: &Path, tag: &str) -> Result<()> {
        let home = workdir.join("gnupg");
        std::fs::create_dir_all(&home).map_err(|e| AgentError::io("creating", &home, e))?;
        std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| AgentError::io("setting the mode of", &home, e))?;
        let refused = |output: String| AgentError::TagSignature {
            tag: tag.to_string(),
            repo: self.repository.clone(),
            output,
        };
        let out = run(
            "gpg",
            Command::new("gpg")
                .args(["--batch", "--quiet", "--import"])
                .arg(keys)
                .env("GNUPGHOME", &home),
        )?;
        if !out.status.success() {
            return Err(refused(format!(
                "cannot import the keys in {}: {}",
                keys.display(),
                tail(&out, 3)
            )));
        }
        // A shallow clone of a tag may leave out the tag object: fetch it.
        let _ = run(
            "git",
            Command::new("git")
                .arg("-C")
                .arg(src)
                .args(["fetch", "--quiet", "--depth", "1", "origin", "tag", tag])
                .env("GIT_TERMINAL_PROMPT", "0"),
        )?;
        let out = run(
            "git",
            Command::new("git")
                .arg("-C")
                .arg(src)
                .args(["verify-tag", "--", tag])
                .env("GNUPGHOME", &home),
        )?;
        if !out.status.success() {
            return Err(refused(tail(&out, 5)));
        }
        tracing::info!(%tag, keys = %keys.display(), "the tag's signature verifies");
        Ok(())
    }
}

/// A full git object name ([`ttdrv_core::trust::validate_commit`]).
pub fn validate_commit(commit: &str) -> Result<String> {
    ttdrv_core::trust::validate_commit(commit)
        .map_err(|_| AgentError::InvalidSourceCommit(commit.to_string()))
}

pub(crate) fn run(program: &str, cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|source| AgentError::Spawn {
            program: program.to_string(),
            source,
        })
}

/// The last `n` non-empty lines of a command's combined output.
pub(crate) fn tail(out: &Output, n: usize) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Builder for GitMakeBuilder {
    fn build(&self, req: &BuildRequest<'_>) -> Result<PathBuf> {
        let tag = tag_for(req.version);
        let src = req.workdir.join("tt-kmd");
        let out = run(
            "git",
            Command::new("git")
                .arg("-c")
                .arg("advice.detachedHead=false")
                .args(["clone", "--quiet", "--depth", "1", "--branch", &tag, "--"])
                .arg(&self.repository)
                .arg(&src)
                .env("GIT_TERMINAL_PROMPT", "0"),
        )?;
        if !out.status.success() {
            let stderr = tail(&out, 5);
            if stderr.contains("not found in upstream")
                || stderr.contains("Could not find remote branch")
            {
                return Err(AgentError::MissingTag {
                    tag,
                    repo: self.repository.clone(),
                });
            }
            return Err(AgentError::GitClone {
                tag,
                repo: self.repository.clone(),
                stderr,
            });
        }
        let out = run(
            "git",
            Command::new("git").arg("-C").arg(&src).args([
                "rev-parse",
                "--verify",
                "HEAD^{commit}",
            ]),
        )?;
        let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let found = (out.status.success() && !found.is_empty()).then_some(found);
        match (&self.commit, found) {
            (Some(pin), Some(found)) if found.eq_ignore_ascii_case(pin) => {
                tracing::info!(%tag, commit = %found, "the tag names the pinned commit")
            }
            (Some(pin), found) => {
                return Err(AgentError::SourceCommitMismatch {
                    tag,
                    repo: self.repository.clone(),
                    expected: pin.clone(),
                    found: found.unwrap_or_else(|| format!("none readable ({})", tail(&out, 3))),
                });
            }
            (None, found) => tracing::warn!(
                %tag,
                commit = found.as_deref().unwrap_or("unknown"),
                "no pinned commit for this version (TT_KMD_SOURCE_COMMIT): building what the tag names now"
            ),
        }
        if let Some(keys) = &self.tag_keys {
            self.verify_tag(keys, &src, req.workdir, &tag)?;
        }
        // Bounded: the installer pod's memory limit is sized for this many
        // compilers at once (docs/security.md), not for every core of a big node.
        let jobs = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(BUILD_JOBS_MAX);
        let out = run(
            "make",
            Command::new("make")
                .arg(format!("-j{jobs}"))
                .arg("-C")
                .arg(req.headers)
                .arg(format!("M={}", src.display()))
                .arg("modules"),
        )?;
        if !out.status.success() {
            return Err(AgentError::Make {
                version: req.version.to_string(),
                headers: req.headers.to_path_buf(),
                status: out.status.to_string(),
                output: tail(&out, 20),
            });
        }
        let ko = src.join(format!("{MODULE_NAME}.ko"));
        if !ko.is_file() {
            return Err(AgentError::BuildOutputMissing {
                version: req.version.to_string(),
                path: ko,
            });
        }
        Ok(ko)
    }
}
