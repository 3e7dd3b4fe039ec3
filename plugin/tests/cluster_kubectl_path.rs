//! The plugin as kubectl finds it on PATH, under both names it is installed as:
//! `kubectl-tt-driver` (make install-plugins, the release archive) and
//! `kubectl-tt` (krew's name for plugin `tt`), and kubectl's plugin completion
//! through `kubectl_complete-tt-driver` / `kubectl_complete-tt`. Needs the real kubectl on PATH (make test
//! puts the test cluster's there), hence ignored by plain `cargo test`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kubectl() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
        .expect(
            "kubectl on PATH (make test or PATH=$(bash hack/build-testbin.sh | tail -n1):$PATH)",
        )
}

/// A PATH of `dir` and kubectl's directory only, so no other plugin interferes.
fn path_with(dir: &Path) -> String {
    let k = kubectl();
    let kdir = k.parent().expect("kubectl's directory");
    std::env::join_paths([dir, kdir])
        .expect("joins")
        .into_string()
        .expect("utf-8 PATH")
}

fn plugin_dir(names: &[&str]) -> tempdir::Dir {
    let dir = tempdir::Dir::new();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_kubectl-tt-driver"));
    for n in names {
        std::os::unix::fs::symlink(&bin, dir.path().join(n)).expect("symlink");
    }
    // The completion shim, under the name kubectl looks for with each plugin name.
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("kubectl_complete-tt-driver");
    for n in names {
        let comp = n.replacen("kubectl-", "kubectl_complete-", 1);
        std::fs::copy(&shim, dir.path().join(comp)).expect("copy the completion shim");
    }
    dir
}

fn kubectl_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(kubectl())
        .args(args)
        .env("PATH", path_with(dir))
        // No cluster is needed; a kubeconfig that does not exist proves it.
        .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
        .output()
        .expect("runs kubectl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A temporary directory removed on drop (std only).
mod tempdir {
    use std::path::{Path, PathBuf};
    pub struct Dir(PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!(
                "ttdrv-plugin-path-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("temp dir");
            Dir(p)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
#[ignore = "needs kubectl on PATH (make test)"]
fn kubectl_runs_both_install_names_as_tt_driver() {
    for name in ["kubectl-tt-driver", "kubectl-tt"] {
        let dir = plugin_dir(&[name]);
        let v = kubectl_in(dir.path(), &["tt", "driver", "--version"]);
        assert!(v.status.success(), "{name}: {v:?}");
        assert!(
            stdout(&v).starts_with("kubectl tt driver "),
            "{name}: {}",
            stdout(&v)
        );
        let list = kubectl_in(dir.path(), &["plugin", "list", "--name-only"]);
        assert!(stdout(&list).contains(name), "{name}: {}", stdout(&list));
        // Exit codes pass through kubectl: a usage error is 64, not watch's 2.
        let bad = kubectl_in(dir.path(), &["tt", "driver", "--no-such-flag"]);
        assert_eq!(bad.status.code(), Some(64), "{name}: {bad:?}");
        // The kubeconfig flag is the plugin's, and a missing file is an error (1).
        let missing = kubectl_in(
            dir.path(),
            &[
                "tt",
                "driver",
                "--kubeconfig",
                "/nonexistent/kubeconfig",
                "status",
            ],
        );
        assert_eq!(missing.status.code(), Some(1), "{name}: {missing:?}");
        assert!(
            String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/kubeconfig"),
            "{name}: {missing:?}"
        );
    }
}

/// Why the krew plugin is named `tt`: krew installs plugin `<name>` as
/// `kubectl-<name with - as _>`, so a plugin `tt-driver` would be
/// `kubectl-tt_driver`, which kubectl runs as `kubectl tt-driver`, not as
/// `kubectl tt driver`.
#[test]
#[ignore = "needs kubectl on PATH (make test)"]
fn a_krew_plugin_named_tt_driver_would_not_be_kubectl_tt_driver() {
    let dir = plugin_dir(&["kubectl-tt_driver"]);
    let dashed = kubectl_in(dir.path(), &["tt-driver", "--version"]);
    assert!(dashed.status.success(), "{dashed:?}");
    let spaced = kubectl_in(dir.path(), &["tt", "driver", "--version"]);
    assert!(!spaced.status.success(), "{spaced:?}");
}

#[test]
#[ignore = "needs kubectl on PATH (make test)"]
fn kubectl_completes_the_plugin_through_its_completion_shim() {
    for name in ["kubectl-tt-driver", "kubectl-tt"] {
        let dir = plugin_dir(&[name]);
        // What bash, zsh and fish call: cobra's hidden __complete command.
        let subs = kubectl_in(dir.path(), &["__complete", "tt", "driver", "wa"]);
        let lines: Vec<String> = stdout(&subs).lines().map(String::from).collect();
        assert_eq!(
            lines.first().map(String::as_str),
            Some("watch"),
            "{name}: {lines:?}"
        );
        let flags = kubectl_in(
            dir.path(),
            &["__complete", "tt", "driver", "status", "--kube"],
        );
        assert!(
            stdout(&flags).lines().any(|l| l == "--kubeconfig"),
            "{name}: {}",
            stdout(&flags)
        );
        let values = kubectl_in(dir.path(), &["__complete", "tt", "driver", "-o", ""]);
        for v in ["json", "text", "yaml"] {
            assert!(
                stdout(&values).lines().any(|l| l == v),
                "{name}: {}",
                stdout(&values)
            );
        }
    }
}
