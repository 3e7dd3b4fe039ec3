//! The API-server restart fault: kills the chaos cluster's kube-apiserver and
//! starts it again with its recorded command line, and supervises the other
//! control-plane processes, which may exit during the outage. It only ever
//! acts on the cluster named by `CHAOS_CLUSTER`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ttdrv_testkit::TestEnv;

/// The cluster directory of KUBECONFIG, if it is the chaos cluster.
pub(crate) fn chaos_cluster_dir() -> Result<PathBuf, String> {
    let want = std::env::var("CHAOS_CLUSTER").unwrap_or_else(|_| "ttdrv-chaos".into());
    let kc = std::env::var("CHAOS_DIRECT_KUBECONFIG")
        .or_else(|_| std::env::var("KUBECONFIG"))
        .map_err(|_| "KUBECONFIG is not set".to_string())?;
    let dir = Path::new(&kc)
        .parent()
        .ok_or("KUBECONFIG has no directory")?
        .to_path_buf();
    if dir.file_name().and_then(|n| n.to_str()) != Some(want.as_str()) {
        return Err(format!(
            "refusing to restart the API server of {} (only the cluster {want} may be restarted)",
            dir.display()
        ));
    }
    Ok(dir)
}

fn pid_alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            // state is the field after the parenthesised command name
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|st| st != "Z" && st != "X")
        })
        .unwrap_or(false)
}

/// Sends `sig` to `pid` (a control-plane process of the chaos cluster, by
/// the pid its pid file recorded) and waits until it is gone: SIGKILL after
/// 10 s, an error after 60 s.
async fn stop(pid: &str, sig: &str) -> Result<(), String> {
    let t0 = Instant::now();
    let st = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .map_err(|e| format!("kill: {e}"))?;
    if !st.success() {
        return Err(format!("kill {sig} {pid} failed"));
    }
    while pid_alive(pid) {
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid])
                .status();
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err(format!("process {pid} did not exit"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A control-plane process of the chaos cluster, as kwokctl started it.
#[derive(Clone, Debug)]
pub(crate) struct Component {
    name: &'static str,
    args: Vec<String>,
    dir: PathBuf,
}

impl Component {
    fn pid_file(&self) -> PathBuf {
        self.dir.join(format!("pids/{}.pid", self.name))
    }

    fn pid(&self) -> Option<String> {
        std::fs::read_to_string(self.pid_file())
            .ok()
            .map(|p| p.trim().to_string())
    }

    /// Reads the running process's command line from its pid file.
    pub(crate) fn record(dir: &Path, name: &'static str) -> Result<Component, String> {
        let pid_file = dir.join(format!("pids/{name}.pid"));
        let pid = std::fs::read_to_string(&pid_file)
            .map_err(|e| format!("reading {}: {e}", pid_file.display()))?
            .trim()
            .to_string();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map_err(|e| format!("reading the command line of {name} (pid {pid}): {e}"))?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let bin = args.first().cloned().unwrap_or_default();
        if !bin.starts_with(&dir.display().to_string()) || !bin.ends_with(name) {
            return Err(format!("pid {pid} is not this cluster's {name}: {bin}"));
        }
        Ok(Component {
            name,
            args,
            dir: dir.to_path_buf(),
        })
    }

    fn alive(&self) -> bool {
        self.pid().is_some_and(|p| pid_alive(&p))
    }

    /// Starts the process again with the same command line, output appended
    /// to its log, in its own process group (it outlives this test and is
    /// stopped by `hack/cluster.sh down`).
    fn spawn(&self) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("logs/{}.log", self.name)))
            .map_err(|e| format!("{} log: {e}", self.name))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let child = std::process::Command::new(&self.args[0])
            .args(&self.args[1..])
            .current_dir(&self.dir)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.name))?;
        std::fs::write(self.pid_file(), child.id().to_string()).map_err(|e| e.to_string())?;
        // Not waited for here: reaped by init once this test exits.
        std::mem::forget(child);
        Ok(())
    }
}

/// After an API-server restart the harness made: stops the
/// controller-manager and the scheduler (SIGTERM, by the pid kwokctl
/// recorded, after checking it is this cluster's), and waits until the
/// component supervisor has started them again. Their informers can hang on
/// the re-watch after an outage: twice the DaemonSet controller never
/// observed a new template (`observedGeneration` stuck one behind for
/// minutes) and no installer pod came back, which measures the
/// controller-manager, not the controller under test. Returns what it did.
pub(crate) async fn refresh_control_plane(api: &Component) -> Vec<String> {
    let mut done = vec![];
    for name in ["kube-controller-manager", "kube-scheduler"] {
        let c = match Component::record(&api.dir, name) {
            Ok(c) => c,
            Err(e) => {
                done.push(format!("{name} not refreshed: {e}"));
                continue;
            }
        };
        let Some(pid) = c.pid() else { continue };
        if let Err(e) = stop(&pid, "-TERM").await {
            done.push(format!("{name} not refreshed: {e}"));
            continue;
        }
        // The supervisor notices within 500 ms and starts it again.
        let t0 = Instant::now();
        while !c.alive() && t0.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        done.push(format!(
            "{name} restarted after the API-server restart{}",
            if c.alive() { "" } else { " (not running yet)" }
        ));
    }
    done
}

/// Plays the kubelet that would restart static control-plane pods: the
/// controller-manager and scheduler exit when they lose their leader lease
/// during an API-server outage, and kwok's controller may too.
pub(crate) fn spawn_component_supervisor(
    components: Vec<Component>,
    restarts: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for c in &components {
                if !c.alive() {
                    let what = match c.spawn() {
                        Ok(()) => format!("{} exited; restarted", c.name),
                        Err(e) => format!("{} exited; restart failed: {e}", c.name),
                    };
                    eprintln!("  control plane: {what}");
                    restarts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(what);
                }
            }
        }
    })
}

/// Kills the chaos cluster's kube-apiserver (SIGKILL, or SIGTERM then SIGKILL
/// after 10s), keeps it down for `down`, and starts it again with the same
/// command line. Returns how long the API was unavailable.
pub(crate) async fn restart_apiserver(
    env: &TestEnv,
    api: &Component,
    hard: bool,
    down: Duration,
) -> Result<Duration, String> {
    let pid = api.pid().ok_or("no kube-apiserver pid")?;
    let t0 = Instant::now();
    // A graceful shutdown waits up to a minute for long-running requests; an
    // operator's restart would not wait that long either (SIGKILL after 10 s).
    stop(&pid, if hard { "-KILL" } else { "-TERM" })
        .await
        .map_err(|e| format!("kube-apiserver: {e}"))?;
    tokio::time::sleep(down).await;
    api.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if env.client.apiserver_version().await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            return Err("kube-apiserver did not come back within 90s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(t0.elapsed())
}
