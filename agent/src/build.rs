//! Building the module from source: `git clone --depth 1 --branch ttkmd-<version>`
//! of the configured repository, then `make -C <headers> M=<src> modules`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::error::{AgentError, Result};
use crate::host::MODULE_NAME;

/// Git tag of a tt-kmd release.
pub fn tag_for(version: &str) -> String {
    format!("ttkmd-{version}")
}

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
pub trait Builder {
    fn build(&self, req: &BuildRequest<'_>) -> Result<PathBuf>;
}

/// The real builder: git and make.
#[derive(Debug, Clone)]
pub struct GitMakeBuilder {
    pub repository: String,
}

impl GitMakeBuilder {
    pub fn new(repository: impl Into<String>) -> Self {
        GitMakeBuilder {
            repository: repository.into(),
        }
    }
}

fn run(program: &str, cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|source| AgentError::Spawn {
            program: program.to_string(),
            source,
        })
}

/// The last `n` non-empty lines of a command's combined output.
fn tail(out: &Output, n: usize) -> String {
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
        let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
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
