//! The controller under test as the faults see it: processes that are
//! SIGKILLed (the Lease holder, with leader election) and restarted under a
//! new identity, so that each process keeps its own log.

use std::path::PathBuf;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use ttdrv_testkit::{ControllerOptions, ControllerProcess, TestEnv};

use crate::common::controller_with;

/// The controller, restarted after every kill under a new identity (so each
/// process keeps its own log file).
pub(crate) struct Controller {
    pub(crate) env_id: String,
    pub(crate) ns: String,
    /// Running processes: one, or (with leader election) a leader and a standby.
    pub(crate) procs: Vec<ControllerProcess>,
    /// Start processes with leader election (the `leader-handover` trials).
    pub(crate) leader_elect: bool,
    /// How many processes the trial runs: 1, or 2 with leader election. A
    /// fault's restart brings the count back to it, never above: two faults
    /// that kill and restart at once (the kill schedule and a firmware
    /// trial's kill at a Flashing node) must not leave two controllers
    /// running without leader election, a split brain no deployment has.
    pub(crate) replicas: usize,
    pub(crate) starts: usize,
    pub(crate) kills: usize,
    pub(crate) logs: Vec<PathBuf>,
}

impl Controller {
    /// No process yet; [`Controller::restore`] starts the first.
    pub(crate) fn new(env: &TestEnv, ns: &str) -> Self {
        Self {
            env_id: env.id.clone(),
            ns: ns.to_string(),
            procs: vec![],
            leader_elect: false,
            replicas: 1,
            starts: 0,
            kills: 0,
            logs: vec![],
        }
    }

    /// Starts processes until `replicas` run (none if they do already: the
    /// other fault's restart came first). Returns how many it started.
    pub(crate) fn restore(&mut self, env: &TestEnv) -> usize {
        let missing = self.replicas.saturating_sub(self.procs.len());
        for _ in 0..missing {
            self.start(env);
        }
        missing
    }

    fn start(&mut self, env: &TestEnv) {
        self.starts += 1;
        let identity = format!("chaos-{}-{}", self.env_id, self.starts);
        self.logs
            .push(std::env::temp_dir().join(format!("ttdrv-controller-{identity}.log")));
        let proc = controller_with(
            env,
            &self.ns,
            ControllerOptions {
                identity: Some(identity),
                leader_elect: self.leader_elect,
                ..Default::default()
            },
        );
        // hack/chaos.sh kills these if the test itself is killed.
        if let Ok(path) = std::env::var("CHAOS_PIDFILE") {
            let line = format!("{}\n", proc.child.id());
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        }
        self.procs.push(proc);
    }

    /// SIGKILLs the acting controller: the Lease holder with leader election
    /// (or, while the Lease is vacant, the oldest process), else the only
    /// process. Returns what was killed, None if no process was running
    /// (another fault killed it and has not restarted it yet).
    pub(crate) async fn kill_acting(&mut self, env: &TestEnv) -> Option<String> {
        let mut idx = 0;
        let mut role = "controller";
        if self.leader_elect {
            let leases: Api<Lease> = Api::namespaced(env.client.clone(), &self.ns);
            let holder = leases
                .get_opt(&format!("ttdrv-{}", env.id))
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec.and_then(|s| s.holder_identity));
            role = "standby (lease vacant)";
            if let Some(h) = holder
                && let Some(i) = self.procs.iter().position(|p| p.identity == h)
            {
                idx = i;
                role = "leader";
            }
        }
        if idx >= self.procs.len() {
            return None;
        }
        let mut p = self.procs.remove(idx);
        p.kill();
        self.kills += 1;
        Some(format!("{role} {}", p.identity))
    }

    /// Stops every process (not counted as a fault) and starts `n` new ones.
    pub(crate) fn replace_all(&mut self, env: &TestEnv, leader_elect: bool, n: usize) {
        for mut p in self.procs.drain(..) {
            p.kill();
        }
        self.leader_elect = leader_elect;
        self.replicas = n;
        self.restore(env);
    }

    pub(crate) fn kill_all(&mut self) {
        for mut p in self.procs.drain(..) {
            p.kill();
            self.kills += 1;
        }
    }

    pub(crate) fn any_running(&mut self) -> bool {
        self.procs.iter_mut().any(|p| p.is_running())
    }
}
