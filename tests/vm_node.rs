//! The VM-node test (hack/test-vm-node.sh, `make test-vm-node`): a real module
//! swap, driven by the controller, on a node whose kernel loads modules. The
//! script brings up the namespace and control plane (hack/realnode.sh), builds
//! the guest's initramfs and boots it under QEMU; this test runs inside the
//! namespace (VMNODE_* variables) and drives and checks everything else, in
//! the order of docs/development.md ("The VM node"):
//!
//!   1. the chart; the guest's boot, containerd, images, node Ready
//!   2. a policy at the real tt-kmd's older release (2.8.0): the agent clones,
//!      builds and loads it (first install), validated on the guest's emulated
//!      Wormhole (testkit's ttdrv-ttcard); udevd names the by-id link from
//!      the card's own tt_asic_id
//!   3. a workload holds /dev/tenstorrent/0 by a mapping alone (refcnt 1)
//!   4. the real 2.8.0 -> 2.10.0, built ahead; 2.10.0 -> 2.8.0 from the cache;
//!      (VMNODE_COMPARE=1, the default) 2.8.0 -> the stub's 2.9.0 with prepare
//!      off (the stub binds the same PCI function); each cordon window checked
//!      by ttdrv_testkit::real_node::cycle. The stub (seconds to build under
//!      TCG, not minutes) serves the phases below, at 2.9.0 and 2.11.0
//!   5. (VMNODE_FAULTS=1, the default) real faults: the guest's kubelet
//!      restarted while the installer builds and while the node drains,
//!      containerd while it waits for the go-ahead, the node cut off from the
//!      API server for two minutes while it drains ([`fault_phase`]); the
//!      leader controller killed and its node's kubelet restarted while the
//!      node validates ([`leader_fault`]); the guest rebooted while Draining,
//!      after the go-ahead before the unload, at rest, between the unload and
//!      the load, and right after the load ([`reboot_faults`])
//!   6. (VMNODE_STACK=1, the default) the stack's privileged DaemonSets
//!      holding the device (a telemetry collector's fd, a fabric-manager
//!      agent's mapping): stood down by their deploy gates for a cycle; one
//!      without a gate named before the cordon and in the real agent's
//!      refusal, the node retried once it is removed ([`the_stack`])
//!   7. (VMNODE_REBOOT_SOAK=N, none by default) a boot made to hang, which
//!      the watchdog must dump and reset, then N power cuts at rest
//!      ([`reboot_soak`])
//!   8. the deliberate break: no controller, the installer edited by hand: no
//!      go-ahead, the loaded module stays
//!
//! [`vm_node`] lists the steps in that order, one call each; their code is
//! in the modules named for what they check (`boot`, `real_swaps`,
//! `stub_cycles`, `the_stack`, `the_break`), over the helpers here.
//!
//! The API server cannot reach the guest's kubelet: the guest reports the
//! module and the installer pods' log lines on its console (hack/vm-node/init).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use ttdrv_api::TenstorrentDriverPolicy;
use ttdrv_testkit::controller::metric_sum;
use ttdrv_testkit::real_node::cycle::{self, Console, Mode, Sample};
use ttdrv_testkit::real_node::{
    AuditQuery, Diagnostics, Phases, apply_fixture, env, http_get, run, timeout_from_env,
};
use ttdrv_testkit::{client, wait_for, wait_for_result};

#[path = "vm_node/boot.rs"]
mod boot;
#[path = "vm_node/real_swaps.rs"]
mod real_swaps;
#[path = "vm_node/stub_cycles.rs"]
mod stub_cycles;
#[path = "vm_node/the_break.rs"]
mod the_break;
#[path = "vm_node/the_stack.rs"]
mod the_stack;

const POLICY: &str = "vmnode";
const INSTALLER: &str = "app.kubernetes.io/name=tt-driver-installer";
const PCI: &str = "feature.node.kubernetes.io/pci-1200_1e52.present";
const KMD: &str = "driver.tenstorrent.com/kmd-version";
const PREPARED: &str = "driver.tenstorrent.com/kmd-prepared";
const GO_AHEAD: &str = "driver.tenstorrent.com/go-ahead";

/// Two versions from a space-separated environment variable, older first.
fn versions(var: &str) -> Vec<String> {
    let v: Vec<String> = env(var).split_whitespace().map(String::from).collect();
    assert_eq!(
        v.len(),
        2,
        "{var} must name two versions, older first: {v:?}"
    );
    v
}

/// Text without the terminal's escape sequences (ESC [ ... letter) and
/// carriage returns.
fn strip_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\u{1b}' => {
                if it.peek() == Some(&'[') {
                    it.next();
                    for d in it.by_ref() {
                        if d.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vm_node")
        .join(name)
}

#[derive(Clone)]
struct Vm {
    c: Client,
    node: String,
    ns: String,
    console: String,
    /// The guest's second serial port (hack/vm-node/init's fault commands).
    ctl: String,
    /// QEMU's monitor (HMP): the guest's state when it hangs.
    monitor: String,
    /// Resets of a guest that did not come back from a reboot
    /// ([`back_from_reboot`]).
    watchdog: Arc<std::sync::atomic::AtomicUsize>,
    t: Duration,
    /// How long a reboot may take until the kubelet reports the new boot
    /// (VMNODE_BOOT_TIMEOUT, default 300 s: 35-110 s here, on one TCG thread).
    boot_t: Duration,
}

impl Vm {
    fn con(&self) -> Console {
        Console::read(&self.console)
    }

    /// The console's last `n` lines, raw (kernel messages included).
    fn con_tail(&self, n: usize) -> String {
        let raw = std::fs::read(&self.console).unwrap_or_default();
        let text = String::from_utf8_lossy(&raw).replace('\r', "");
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// One command on QEMU's monitor (HMP); its answer, the terminal's
    /// escapes taken out.
    async fn hmp(&self, cmd: &str) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const PROMPT: &str = "(qemu) ";
        let talk = async {
            let mut m = tokio::net::UnixStream::connect(&self.monitor)
                .await
                .map_err(|e| format!("QEMU's monitor {}: {e}", self.monitor))?;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // the banner, then the answer: each ends with the prompt
            for round in 0..2 {
                if round == 1 {
                    buf.clear();
                    m.write_all(format!("{cmd}\n").as_bytes())
                        .await
                        .map_err(|e| e.to_string())?;
                }
                while !String::from_utf8_lossy(&buf).ends_with(PROMPT) {
                    let n = m.read(&mut chunk).await.map_err(|e| e.to_string())?;
                    if n == 0 {
                        return Err("the monitor closed".to_string());
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
            // (the first line is the monitor's echo of the command, as typed)
            let answer = strip_escapes(&String::from_utf8_lossy(&buf));
            let answer = answer.split_once('\n').map_or("", |a| a.1);
            Ok(answer.trim_end_matches(PROMPT).to_string())
        };
        tokio::time::timeout(Duration::from_secs(20), talk)
            .await
            .map_err(|_| format!("QEMU's monitor did not answer {cmd:?} in 20 s"))?
    }

    /// What the guest is doing when it does not come back from a reboot:
    /// QEMU's view (run state, every vCPU's registers) and the kernel's,
    /// asked through the keyboard's SysRq (the guest boots with
    /// sysrq_always_enabled): every message level on the console, the
    /// blocked tasks, every CPU's backtrace, memory; then the console from
    /// the dump on.
    async fn guest_dump(&self) -> String {
        let mut out = String::new();
        for cmd in ["info status", "info registers -a"] {
            let a = self.hmp(cmd).await.unwrap_or_else(|e| e);
            out.push_str(&format!("--- QEMU: {cmd}\n{a}\n"));
        }
        let before = self.con_tail(40);
        out.push_str(&format!(
            "--- the guest's console before the dump (last 40 lines)\n{before}\n"
        ));
        let from = std::fs::metadata(&self.console).map_or(0, |m| m.len() as usize);
        for key in ["9", "w", "l", "m"] {
            if let Err(e) = self.hmp(&format!("sendkey alt-sysrq-{key}")).await {
                out.push_str(&format!("--- sysrq {key}: {e}\n"));
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let con = std::fs::read(&self.console).unwrap_or_default();
        let tail = String::from_utf8_lossy(con.get(from..).unwrap_or_default());
        out.push_str(&format!(
            "--- the guest's console after SysRq 9, w, l, m\n{}",
            tail.replace('\r', "")
        ));
        out
    }

    /// Waits for a console report starting with `prefix`.
    async fn wait_con(&self, what: &str, prefix: &str) {
        wait_for(what, self.t, || async {
            if self.con().has(prefix) {
                Ok(())
            } else {
                Err(format!("no report {prefix:?} yet"))
            }
        })
        .await
    }

    /// Sends a fault command to the guest (hack/vm-node/init) and waits for
    /// its answer on the console; returns the answer's guest time. The
    /// serial line has lost a command's first byte: an empty line goes
    /// first, and a command the guest read garbled ("ctl eboot unknown", not
    /// run) is sent again.
    async fn ctl(&self, cmd: &str) -> f64 {
        use tokio::io::AsyncWriteExt;
        let name = cmd.split_whitespace().next().unwrap_or(cmd).to_string();
        let done = format!("ctl {name} done");
        let failed = format!("ctl {name} failed");
        // (guest time; it may lag the host's by a second or two)
        let mut since = now() - 2.0;
        for _ in 0..3 {
            let mut port = tokio::net::UnixStream::connect(&self.ctl)
                .await
                .unwrap_or_else(|e| panic!("the guest's fault port {}: {e}", self.ctl));
            port.write_all(format!("\n{cmd}\n").as_bytes())
                .await
                .unwrap_or_else(|e| panic!("writing {cmd:?} to the guest: {e}"));
            let _ = port.flush().await;
            let answer = wait_for(
                &format!("the guest's answer to {cmd:?}"),
                self.t,
                || async {
                    self.con()
                        .reports()
                        .filter(|(t, _)| *t >= since)
                        .find_map(|(t, w)| {
                            if w.starts_with(&done) {
                                return Some(Ok(t));
                            }
                            assert!(!w.starts_with(&failed), "the guest could not {cmd:?}: {w}");
                            // a garbled command: not run
                            let garbled = w.strip_prefix("ctl ")?.strip_suffix(" unknown")?;
                            let garbled = garbled.split_whitespace().next().unwrap_or("");
                            (!garbled.is_empty() && name.ends_with(garbled)).then_some(Err(t))
                        })
                        .ok_or_else(|| "no answer yet".to_string())
                },
            )
            .await;
            drop(port);
            match answer {
                Ok(at) => return at,
                // the next answer comes after this one
                Err(t) => since = t + 0.001,
            }
        }
        panic!("the guest read {cmd:?} garbled three times")
    }

    async fn wait_state(&self, what: &str, state: &str, reason: Option<&str>) {
        wait_for(what, self.t, || async {
            let (s, r) = self.state().await?;
            if s == state && (reason.is_none() || r.as_deref() == reason) {
                Ok(())
            } else {
                Err(format!("state {s} ({r:?})"))
            }
        })
        .await
    }

    async fn ready(&self) -> Result<Option<String>, String> {
        let n = self.node_obj().await?;
        let conds = n.status.and_then(|s| s.conditions).unwrap_or_default();
        Ok(conds
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.clone()))
    }

    async fn go_ahead(&self) -> Option<String> {
        let n = self.node_obj().await.ok()?;
        n.metadata.annotations?.get(GO_AHEAD).cloned()
    }

    /// A PodDisruptionBudget that refuses every eviction of the workload.
    async fn block_drain(&self, on: bool) {
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.c.clone(), "ml");
        if on {
            let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "hold-all", "namespace": "ml"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "hold"}}},
            }))
            .unwrap_or_else(|e| panic!("the PDB: {e}"));
            api.create(&Default::default(), &pdb)
                .await
                .unwrap_or_else(|e| panic!("creating the PDB: {e}"));
        } else {
            api.delete("hold-all", &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("deleting the PDB: {e}"));
        }
    }

    async fn wait_module(&self, what: &str, prefix: &str) {
        wait_for(what, self.t, || async {
            match self.con().module_now() {
                Some(m) if m.starts_with(prefix) => Ok(()),
                m => Err(format!("module report {m:?}")),
            }
        })
        .await
    }

    /// Waits for a module report containing `prefix` at or after `at`
    /// (guest time: e.g. the first load after a reboot).
    async fn wait_module_since(&self, what: &str, at: f64, prefix: &str) {
        wait_for(what, self.t, || async {
            self.con()
                .module_at(at, prefix)
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", self.con().module_now()))
        })
        .await
    }

    async fn wait_summary(&self, version: &str, previous: &str) -> String {
        let what = format!("the agent's summary for {version} (previous {previous})");
        wait_for(&what, self.t, || async {
            match self.con().summary_of(version) {
                Some(s) if s.contains(&format!("previous={previous} ")) => Ok(s),
                s => Err(format!("{s:?}")),
            }
        })
        .await
    }

    /// The agent's summary of an install of `version` logged after `t0`
    /// (an earlier cycle may have logged the same one).
    async fn wait_summary_after(&self, t0: f64, version: &str, previous: &str) -> String {
        let needle = format!("summary: result=installed version={version} ");
        let prev = format!("previous={previous} ");
        let what = format!("the agent's summary for {version} (previous {previous}) after {t0:.0}");
        wait_for(&what, self.t, || async {
            self.con()
                .reports()
                .filter(|(t, _)| *t >= t0)
                .find_map(|(_, w)| w.find(&needle).map(|i| w[i..].to_string()))
                .filter(|s| s.contains(&prev))
                .ok_or_else(|| "none yet".to_string())
        })
        .await
    }

    /// The console once it holds the agent's installed summary of `version`
    /// logged at or after `t0`. The guest forwards the pods' logs on its
    /// report loop, which under TCG can lag the controller's record Done by
    /// seconds: the cordon-window checks read the agent's lines from here.
    async fn con_with_summary(&self, t0: f64, version: &str) -> Console {
        let asked = now();
        let con = wait_for(
            &format!("the agent's installed summary of {version} on the console"),
            self.t,
            || async {
                let con = self.con();
                match cycle::loader(&con.agent_lines(), t0, version) {
                    Some(_) => Ok(con),
                    None => Err(format!(
                        "not yet; last agent line: {:?}",
                        con.agent_lines().last().map(|l| l.text.clone())
                    )),
                }
            },
        )
        .await;
        let lag = now() - asked;
        if lag > 0.5 {
            eprintln!(
                "[test-vm-node] the console showed the summary of {version} {lag:.1} s after the cycle was recorded Done"
            );
        }
        con
    }

    async fn node_obj(&self) -> Result<Node, String> {
        Api::<Node>::all(self.c.clone())
            .get(&self.node)
            .await
            .map_err(|e| e.to_string())
    }

    async fn label(&self, key: &str) -> Option<String> {
        let n = self.node_obj().await.ok()?;
        n.metadata.labels.and_then(|l| l.get(key).cloned())
    }

    async fn cordoned(&self) -> Result<bool, String> {
        Ok(self
            .node_obj()
            .await?
            .spec
            .and_then(|s| s.unschedulable)
            .unwrap_or(false))
    }

    async fn state(&self) -> Result<(String, Option<String>), String> {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.c.clone());
        let p = api.get_opt(POLICY).await.map_err(|e| e.to_string())?;
        let st = p.and_then(|p| p.status).unwrap_or_default();
        Ok(st
            .nodes
            .iter()
            .find(|n| n.name == self.node)
            .map(|r| (r.state.as_str().to_string(), r.reason.clone()))
            .unwrap_or_else(|| ("-".into(), None)))
    }

    async fn pods(&self, ns: &str, sel: &str, fields: &str) -> Result<Vec<String>, String> {
        let lp = ListParams::default().labels(sel).fields(fields);
        let l = Api::<Pod>::namespaced(self.c.clone(), ns)
            .list(&lp)
            .await
            .map_err(|e| e.to_string())?;
        Ok(l.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect())
    }

    async fn installers(&self) -> Result<Vec<String>, String> {
        self.pods(&self.ns, INSTALLER, &format!("spec.nodeName={}", self.node))
            .await
    }

    async fn first_installer(&self) -> Result<String, String> {
        self.installers()
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| "no installer pod".into())
    }

    /// The `/metrics` text of the controller replica that leads (the test
    /// runs in the namespace, where the replicas' pod IPs answer).
    async fn leader_metrics(&self) -> String {
        let rel = env("VMNODE_RELEASE");
        wait_for("the leader's /metrics", self.t, || async {
            let api: Api<EndpointSlice> = Api::namespaced(self.c.clone(), &self.ns);
            let lp =
                ListParams::default().labels(&format!("kubernetes.io/service-name={rel}-metrics"));
            let l = api.list(&lp).await.map_err(|e| e.to_string())?;
            let addrs: Vec<String> = l
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .filter_map(|e| e.addresses.first().map(|a| format!("{a}:8080")))
                .collect();
            for a in &addrs {
                if let Ok(t) = http_get(a, "/metrics").await
                    && metric_sum(&t, "ttdriver_leader", &[]) == 1.0
                {
                    return Ok(t);
                }
            }
            Err(format!("no leader among {addrs:?}"))
        })
        .await
    }

    async fn hold_pod(&self) -> String {
        let p = self.pods("ml", "app=hold", "").await.unwrap_or_default();
        p.into_iter()
            .next()
            .unwrap_or_else(|| panic!("no workload pod"))
    }

    async fn wait_gone(&self, what: &str, ns: &str, name: &str) {
        let api = Api::<Pod>::namespaced(self.c.clone(), ns);
        wait_for(what, self.t, || async {
            match api.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err(format!("{name} still there")),
            }
        })
        .await
    }

    async fn wait_cordoned(&self, what: &str) {
        wait_for(what, self.t, || async {
            if self.cordoned().await? {
                Ok(())
            } else {
                Err("schedulable".into())
            }
        })
        .await
    }

    /// The record Done, the label at `version`, not cordoned.
    async fn wait_done(&self, what: &str, version: &str) {
        wait_for(what, self.t, || async {
            let (s, r) = self.state().await?;
            let kmd = self.label(KMD).await;
            let c = self.cordoned().await?;
            if s == "Done" && kmd.as_deref() == Some(version) && !c {
                Ok(())
            } else {
                Err(format!(
                    "state {s} ({r:?}) kmd-version {kmd:?} cordoned {c}"
                ))
            }
        })
        .await
    }

    async fn patch_policy(&self, spec: serde_json::Value) {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.c.clone());
        let p = serde_json::json!({ "spec": spec });
        api.patch(POLICY, &PatchParams::default(), &Patch::Merge(&p))
            .await
            .unwrap_or_else(|e| panic!("patching policy {POLICY}: {e}"));
    }

    /// One API snapshot of the node, its record, its installer pods and the workload.
    async fn sample(&self) -> Result<Sample, String> {
        // Its reads happen after this: what it shows held at least then.
        let begun = now();
        let (node, state, inst, wl) = futures::join!(
            self.node_obj(),
            self.state(),
            self.installers(),
            self.pods("ml", "app=hold", "status.phase=Running")
        );
        // a failed query is no sample (an empty pod list would read as gone)
        let (node, (state, reason), inst, wl) = (node?, state?, inst?, wl?);
        let labels = node.metadata.labels.unwrap_or_default();
        let annotations = node.metadata.annotations.unwrap_or_default();
        Ok(Sample {
            t: now(),
            seen_until: begun,
            state,
            reason,
            cordoned: node.spec.and_then(|s| s.unschedulable).unwrap_or(false),
            go_ahead: annotations.contains_key(GO_AHEAD),
            kmd: labels.get(KMD).cloned(),
            prepared: labels.get(PREPARED).cloned(),
            installer: inst.into_iter().collect(),
            workload: wl.into_iter().collect(),
        })
    }
}

/// The timeline: a snapshot every 0.5 s, kept when it changed (also written
/// to VMNODE_TIMELINE for a look afterwards).
struct Watcher {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    fn start(vm: Vm, path: String) -> Self {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let out = samples.clone();
        let task = tokio::spawn(async move {
            let mut last = String::new();
            loop {
                let Ok(s) = vm.sample().await else {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                if s.key() == last {
                    // Unchanged: what the last sample shows held until now.
                    if let Ok(mut v) = out.lock()
                        && let Some(l) = v.last_mut()
                    {
                        l.seen_until = s.seen_until;
                    }
                } else {
                    last = s.key();
                    let line = s.line();
                    if let Ok(mut v) = out.lock() {
                        v.push(s);
                    }
                    use std::io::Write;
                    if let Ok(mut f) = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                    {
                        let _ = writeln!(f, "{line}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { samples, task }
    }

    fn timeline(&self) -> Vec<Sample> {
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The by-id link in a module report ("... links=wormhole-<16 hex>,"), as
/// tt-kmd's rule names it: Wormhole's device id, then tt_asic_id.
fn by_id_link(report: &str) -> Option<String> {
    let rest = report.split(" links=").nth(1)?;
    let first = rest.split(',').next()?;
    let id = first.strip_prefix("wormhole-")?;
    (id.len() == 16
        && id
            .chars()
            .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)))
    .then(|| first.to_string())
}

/// The module changed only after the eviction and the go-ahead (the agent's
/// own time of the unload; the console's reports lag). The timeline proves
/// a violation only where a snapshot taken after the swap still showed the
/// workload or no go-ahead: a snapshot's first sighting lags the change by
/// up to its 0.5 s period and its reads (seconds under CI load). One second
/// covers the guest's clock against the host's.
fn swap_after_drain(tl: &[Sample], con: &Console, t0: f64, version: &str) {
    let lines = con.agent_lines();
    let pod = cycle::loader(&lines, t0, version);
    let gone = cycle::tl_time(tl, t0, |s| s.workload.is_empty());
    let go = cycle::tl_time(tl, t0, |s| s.go_ahead);
    let swap = cycle::agent_at(&lines, t0, "step=\"unload\"", pod.as_deref());
    let (Some(gone), Some(go), Some(swap)) = (gone, go, swap) else {
        panic!("timeline incomplete: evicted={gone:?} go-ahead={go:?} swap={swap:?}");
    };
    let running_until = cycle::tl_not_yet(tl, t0, |s| s.workload.is_empty());
    let no_go_until = cycle::tl_not_yet(tl, t0, |s| s.go_ahead);
    assert!(
        running_until.is_none_or(|t| t <= swap + 1.0)
            && no_go_until.is_none_or(|t| t <= swap + 1.0),
        "module swapped at {swap}, yet the workload was still seen at {running_until:?} (gone by {gone}) \
         or the go-ahead still absent at {no_go_until:?} (seen by {go})"
    );
}

const FIGURES: &str = "cordon windows (out_of_service: cordon to uncordon; phase: version change to record Done; \
cordon_to_go_ahead: the drain; host clock. go_ahead_to_load, load_to_uncordon, build_*_vs_cordon: agent clock against host clock)";
const CYCLES: &str = "rollout cycles (from the node record and the guest console)";
const FAULTS: &str = "real faults on the VM node (kubelet and containerd restarts, two minutes cut off from the API server, the leader killed, reboots)";

/// What every step reads: the VM node, the release and its images, the
/// audit log, the tt-kmd versions the test swaps between.
struct Run {
    vm: Vm,
    rel: String,
    ctl_ref: String,
    agent_ref: String,
    audit: String,
    /// The real tt-kmd's releases (the first install, the upgrade under the
    /// mmap workload, the downgrade from the cache) and the stub's (prepare
    /// off, the faults, the reboots), tags of one repository in the guest
    /// (hack/test-vm-node.sh).
    real: Vec<String>,
    r_old: String,
    r_new: String,
    s_cmp: String,
    s_fault: String,
    /// VMNODE_STOP_AFTER: the phase after which the test stops (boot, ready,
    /// install, real), none by default.
    stop_after: String,
}

impl Run {
    /// From the VMNODE_* variables hack/test-vm-node.sh passes.
    async fn from_env() -> Self {
        let vm = Vm {
            c: client().await,
            node: env("VMNODE_NODE"),
            ns: env("VMNODE_NAMESPACE"),
            console: env("VMNODE_CONSOLE"),
            ctl: env("VMNODE_CTL"),
            monitor: env("VMNODE_MONITOR"),
            watchdog: Arc::default(),
            t: timeout_from_env(900),
            boot_t: Duration::from_secs(
                std::env::var("VMNODE_BOOT_TIMEOUT")
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(300),
            ),
        };
        let rel = env("VMNODE_RELEASE");
        let (ctl_ref, agent_ref) = (env("VMNODE_CONTROLLER_IMAGE"), env("VMNODE_AGENT_IMAGE"));
        let audit = env("VMNODE_AUDIT_LOG");
        let (real, stub) = (
            versions("VMNODE_REAL_VERSIONS"),
            versions("VMNODE_STUB_VERSIONS"),
        );
        let (r_old, r_new) = (real[0].clone(), real[1].clone());
        let (s_cmp, s_fault) = (stub[0].clone(), stub[1].clone());
        let stop_after = std::env::var("VMNODE_STOP_AFTER").unwrap_or_default();
        Run {
            vm,
            rel,
            ctl_ref,
            agent_ref,
            audit,
            real,
            r_old,
            r_new,
            s_cmp,
            s_fault,
            stop_after,
        }
    }

    /// What a failed run prints (see `Diagnostics`).
    fn diagnostics(&self) -> Diagnostics {
        let (vm, ns) = (&self.vm, &self.vm.ns);
        Diagnostics(vec![
            "kubectl get nodes -o wide".into(),
            "kubectl get pods -A -o wide".into(),
            "kubectl get ttdp -o jsonpath='{.items[*].status.nodes}'; echo".into(),
            format!("kubectl -n {ns} logs -l app.kubernetes.io/component=controller --tail=20"),
            "kubectl get events -A --sort-by=.lastTimestamp | tail -n 25".into(),
            format!(
                "echo '--- guest console (last 40 lines)'; tr -d '\\r' <{} | tail -n 40",
                vm.console
            ),
        ])
    }

    /// The rollout cycle's table (node record and guest console) into the report.
    fn table(
        &self,
        watch: &Watcher,
        ph: &mut Phases,
        title: &str,
        t0: f64,
        v: &str,
        workload: bool,
    ) {
        let vm = &self.vm;
        let out = cycle::cycle_table(title, &watch.timeline(), &vm.con(), t0, v, workload);
        eprint!("{out}");
        ph.add_to_report(CYCLES, out);
    }

    /// The cordon window of the swap to `v` checked, its figures into the report.
    fn window(&self, watch: &Watcher, ph: &mut Phases, title: &str, t0: f64, v: &str, mode: Mode) {
        let vm = &self.vm;
        let con = vm.con();
        let f = cycle::check(&watch.timeline(), &con.agent_lines(), t0, v, mode)
            .unwrap_or_else(|e| panic!("{title}: cordon window check failed: {e}"));
        ph.log(&format!("{title}: {f}"));
        ph.add_to_report(
            FIGURES,
            format!("[test-vm-node]   {:<44} {f}", format!("{title}:")),
        );
    }

    /// The controller (its service account) evicted `ml/{pod}` (audit log).
    fn evicted_by_controller(&self, pod: &str) {
        let (ns, rel, audit) = (&self.vm.ns, &self.rel, &self.audit);
        let ctl_sa = format!("system:serviceaccount:{ns}:{rel}-controller");
        AuditQuery {
            verb: "create",
            resource: "pods",
            subresource: "eviction",
            user: &ctl_sa,
            name: Some(pod),
            node_claim: None,
        }
        .find_in(audit)
        .unwrap_or_else(|e| panic!("no eviction of ml/{pod} by the controller: {e}"));
    }
}

#[tokio::test]
#[ignore = "runs inside the VM node's namespace: bash hack/test-vm-node.sh (make test-vm-node)"]
async fn vm_node() {
    let mut ph = Phases::from_env("test-vm-node");
    let t = Run::from_env().await;
    let (r_old, r_new, s_cmp) = (t.r_old.as_str(), t.r_new.as_str(), t.s_cmp.as_str());
    let _diag = t.diagnostics();

    // --- the chart, while the guest boots: the controller on the host-side
    // node; the installer DaemonSet it renders (the agent image) on the VM node.
    boot::install_chart(&t, &mut ph);
    // the guest boots to init, containerd up, the images imported
    boot::guest_boots(&t, &mut ph).await;
    if t.stop_after == "boot" {
        return ph.report();
    }
    // the guest's kubelet registers the node, Ready
    boot::node_ready(&t, &mut ph).await;
    if t.stop_after == "ready" {
        return ph.report();
    }
    let watch = Watcher::start(t.vm.clone(), env("VMNODE_TIMELINE"));

    // --- first install of the real tt-kmd (r_old): a real build in the installer pod
    // a source build, loaded, Done; udev names card 0's by-id link from its tt_asic_id
    let (mut link, real_link) = real_swaps::first_install(&t, &mut ph, &watch).await;
    if t.stop_after == "install" {
        return ph.report();
    }

    // --- the workload: /dev/tenstorrent/0 held by a mapping alone (map-hold)
    let hold1 = real_swaps::workload_holds_device(&t, &mut ph).await;
    // --- the upgrade r_old -> r_new under the workload, built ahead: the build
    // before the cordon, the workload evicted, the swap after the drain
    real_swaps::upgrade_built_ahead(&t, &mut ph, &watch, &hold1).await;
    // the leader's metrics: the node Done, on r_new, a pod evicted, a cycle timed
    real_swaps::leader_metrics_after_upgrade(&t, &mut ph).await;
    // --- the downgrade back to r_old, from the agent's cache
    real_swaps::downgrade_from_cache(&t, &mut ph, &watch).await;
    if t.stop_after == "real" {
        return ph.report();
    }

    // --- without build-ahead: r_old -> s_cmp (the stub), cache-cold, prepare off. The
    // comparison: the pod is replaced after the cordon and the drain, and the
    // build falls inside the window. VMNODE_COMPARE=0 skips it.
    let (mut cur, mut other) = (r_old, r_new);
    if std::env::var("VMNODE_COMPARE").as_deref().unwrap_or("1") == "1" {
        // the stub's by-id link: its own, not the real driver's
        link = stub_cycles::upgrade_prepare_off(&t, &mut ph, &watch, &link).await;
        // the cache keeps the target and the previous version
        (cur, other) = (s_cmp, r_old);
    }

    // --- real faults in two cycles (VMNODE_FAULTS=0 skips them)
    if std::env::var("VMNODE_FAULTS").as_deref().unwrap_or("1") == "1" {
        // ends with s_fault loaded, the version loaded before in the cache
        (cur, other) = stub_cycles::real_faults(&t, &mut ph, &watch, cur).await;
    }

    // --- the stack's privileged device holders, gated and not
    // (VMNODE_STACK=0 skips them): ends with cur loaded, as it began
    if std::env::var("VMNODE_STACK").as_deref().unwrap_or("1") == "1" {
        the_stack::privileged_holders(&t, &mut ph, &watch, cur, other).await;
    }

    // --- many reboots at rest (VMNODE_REBOOT_SOAK=N; none by default):
    // each back within the boot bound, the module loaded again, Done
    stub_cycles::reboots_at_rest(&t, &mut ph, &watch, cur).await;

    // --- the break: no go-ahead, the module stays
    // the last cycle left no go-ahead behind
    the_break::no_go_ahead_left(&t).await;
    // no controller runs
    the_break::controller_scaled_to_zero(&t).await;
    // an installer pod restarted by hand with another target waits for the go-ahead
    let held = the_break::installer_restarted_by_hand(&t, other).await;
    // the module, the workload, the cordon and the labels stay as they were
    the_break::module_stays(&t, &mut ph, held, cur, other, link, &real_link).await;
    drop(watch);

    the_break::print_events(&t, &mut ph);
    ph.report();
}

/// Waits until the timeline (sampled every 0.5 s) has the node Done at
/// `version` and uncordoned after `t0`: what the API showed is in it before
/// it is checked.
async fn wait_recorded_done(vm: &Vm, watch: &Watcher, t0: f64, version: &str) {
    wait_for("the timeline to record the node Done", vm.t, || async {
        let tl = watch.timeline();
        if tl.iter().any(|s| {
            s.t >= t0 && s.state == "Done" && !s.cordoned && s.kmd.as_deref() == Some(version)
        }) {
            Ok(())
        } else {
            Err(tl.last().map(|s| s.line()).unwrap_or_default())
        }
    })
    .await
}

/// A maintenance window `from_h` to `to_h` hours from now (UTC, whole minutes).
fn window_from_now(from_h: i64, to_h: i64) -> serde_json::Value {
    let hhmm = |h: i64| {
        let m = ((now() as i64 / 60) + h * 60).rem_euclid(24 * 60);
        format!("{:02}:{:02}", m / 60, m % 60)
    };
    serde_json::json!({"start": hhmm(from_h), "end": hhmm(to_h)})
}

/// From the first cordoned sample after `t0` to the first with `kmd-version`
/// at `version`: cordoned at every sample (the cordon never lost), and the
/// go-ahead only once the workload was gone.
fn cordon_held_to_swap(tl: &[Sample], t0: f64, version: &str) -> Result<(), String> {
    let tl: Vec<&Sample> = tl.iter().filter(|s| s.t >= t0).collect();
    let c = tl.iter().position(|s| s.cordoned).ok_or("never cordoned")?;
    let swapped = (c..tl.len())
        .find(|&i| tl[i].kmd.as_deref() == Some(version))
        .ok_or_else(|| format!("kmd-version never {version} after the cordon"))?;
    if let Some(s) = tl[c..swapped].iter().find(|s| !s.cordoned) {
        return Err(format!(
            "uncordoned at {:.1} before the swap: {}",
            s.t,
            s.line()
        ));
    }
    if let Some(s) = tl[..=swapped]
        .iter()
        .find(|s| s.go_ahead && !s.workload.is_empty())
    {
        return Err(format!("a go-ahead while the workload ran: {}", s.line()));
    }
    Ok(())
}

/// Real faults on the VM node (issue 35; docs/reliability.md, "Faults on the
/// real parts"), each in a cycle under the workload, from `from`:
///   A. to `to` (cache-cold, built ahead) outside a maintenance window:
///      the guest's kubelet restarted while the installer pod builds,
///      containerd restarted while it waits for the go-ahead (held by the
///      window), then the window opens and the kubelet is restarted again
///      while the node is Draining (a PDB holds the drain);
///   B. back to `from` (cache hit): the node cut off from the API server for
///      two minutes while Draining.
/// Each: no swap without the go-ahead, the cordon held from cordon to swap,
/// the node Done on the target and uncordoned. Returns the figures.
async fn fault_phase(
    vm: &Vm,
    ph: &mut Phases,
    watch: &Watcher,
    from: &str,
    to: &str,
) -> Vec<String> {
    let mut rows = vec![];
    let pods_now = || async { vm.installers().await.unwrap_or_default() };

    // --- A. kubelet and containerd restarts
    let t0 = now();
    vm.patch_policy(serde_json::json!({"version": to, "upgradePolicy": {
        "prepare": {"enabled": true}, "maintenanceWindows": [window_from_now(2, 3)]}}))
        .await;
    let building = wait_for(
        &format!("the installer's agent building {to} (cache miss)"),
        vm.t,
        || async {
            vm.con()
                .agent_lines()
                .into_iter()
                .find(|l| l.t >= t0 - 2.0 && l.text.contains("cache miss"))
                .map(|l| l.pod)
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let t_k = vm.ctl("restart-kubelet").await;
    ph.phase(&format!(
        "fault A1: the guest's kubelet restarted while the installer pod builds {to}"
    ));
    wait_for(
        &format!("{to} built ahead after the kubelet restart"),
        vm.t,
        || async {
            match vm.label(PREPARED).await {
                Some(v) if v == to => Ok(()),
                v => Err(format!("kmd-prepared {v:?}")),
            }
        },
    )
    .await;
    // (the console reports the agent's lines a moment after they are written)
    let built = wait_for("the agent's log of the build's end", vm.t, || async {
        cycle::agent_at(&vm.con().agent_lines(), t0 - 2.0, "step=\"build\"", None)
            .ok_or_else(|| "not on the console yet".to_string())
    })
    .await;
    let builder_now = pods_now().await;
    ph.log(&format!(
        "build ended {:.1} s after the kubelet restart; the building pod {building} {}",
        built - t_k,
        if builder_now.contains(&building) {
            "survived"
        } else {
            "was replaced"
        }
    ));
    vm.wait_state(
        "the node held outside the window",
        "Pending",
        Some("OutsideMaintenanceWindow"),
    )
    .await;
    ph.phase(&format!(
        "{to} prepared; the node held outside the maintenance window"
    ));
    let before = pods_now().await;
    let t_c = vm.ctl("restart-containerd").await;
    // Three of the agent's go-ahead polls.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let m = vm.con().module_now().unwrap_or_default();
    assert!(
        m.starts_with(&format!("module={from} refcnt=1 ")),
        "the module changed after containerd's restart, without a go-ahead: {m}"
    );
    assert_eq!(vm.go_ahead().await, None, "a go-ahead outside the window");
    assert_eq!(
        vm.cordoned().await,
        Ok(false),
        "cordoned outside the window"
    );
    let after = pods_now().await;
    ph.log(&format!(
        "containerd restarted at {t_c:.1}: installer pods {before:?} -> {after:?}; module {m}"
    ));
    ph.phase("fault A2: containerd restarted while the installer waits for the go-ahead: no swap, no cordon");
    let hold = vm.hold_pod().await;
    vm.block_drain(true).await;
    vm.patch_policy(
        serde_json::json!({"upgradePolicy": {"maintenanceWindows": [window_from_now(-1, 1)]}}),
    )
    .await;
    vm.wait_state("the node Draining behind the PDB", "Draining", None)
        .await;
    let t_d = vm.ctl("restart-kubelet").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (s, r) = vm.state().await.unwrap_or_default();
    assert_eq!(
        s, "Draining",
        "after the kubelet restart while Draining ({r:?})"
    );
    assert_eq!(
        vm.cordoned().await,
        Ok(true),
        "the cordon lost with the kubelet restart"
    );
    assert_eq!(
        vm.go_ahead().await,
        None,
        "a go-ahead before the drain finished"
    );
    ph.phase(
        "fault A3: the guest's kubelet restarted while the node is Draining: cordon and drain hold",
    );
    vm.block_drain(false).await;
    let unblocked = now();
    vm.wait_gone("the workload evicted", "ml", &hold).await;
    vm.wait_done(&format!("the node Done at {to} after the restarts"), to)
        .await;
    wait_recorded_done(vm, watch, t0, to).await;
    let done_a = now() - unblocked;
    let tl = watch.timeline();
    let con = vm.con_with_summary(t0, to).await;
    swap_after_drain(&tl, &con, t0, to);
    cordon_held_to_swap(&tl, t0, to).unwrap_or_else(|e| panic!("fault A: {e}"));
    let f = cycle::check(&tl, &con.agent_lines(), t0, to, Mode::Ahead)
        .unwrap_or_else(|e| panic!("fault A: cordon window check failed: {e}"));
    rows.push(format!(
        "A kubelet restart during the build (build ended {:.0} s later), containerd restart while waiting (held), kubelet restart while Draining ({:.0} s before the PDB went): Done at {to} {done_a:.0} s after the PDB went; {f}",
        built - t_k,
        unblocked - t_d,
    ));
    vm.wait_module(
        &format!("the workload back on {to}"),
        &format!("module={to} refcnt=1 "),
    )
    .await;

    // --- B. two minutes without the API server, while Draining
    let t0 = now();
    let hold = vm.hold_pod().await;
    vm.block_drain(true).await;
    vm.patch_policy(
        serde_json::json!({"version": from, "upgradePolicy": {"maintenanceWindows": []}}),
    )
    .await;
    vm.wait_state("the node Draining behind the PDB", "Draining", None)
        .await;
    let cut = now();
    vm.ctl("partition 120").await;
    wait_for("the node not Ready (cut off)", vm.t, || async {
        match vm.ready().await? {
            Some(r) if r != "True" => Ok(()),
            r => Err(format!("Ready={r:?}")),
        }
    })
    .await;
    let not_ready = now() - cut;
    vm.wait_state(
        "the cycle says why it waits (NodeNotReady), keeping its slot",
        "Draining",
        Some("NodeNotReady"),
    )
    .await;
    // The drain may go on from the API server's side meanwhile.
    vm.block_drain(false).await;
    ph.phase(&format!(
        "fault B: the node cut off from the API server: NotReady after {not_ready:.0} s, Draining (NodeNotReady), still cordoned"
    ));
    assert_eq!(
        vm.cordoned().await,
        Ok(true),
        "the cordon lost while cut off"
    );
    wait_for("the partition healed", vm.t, || async {
        if vm.con().at(cut - 2.0, "ctl partition healed").is_some() {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await;
    let healed = now();
    vm.wait_done("the node Done after the partition healed", from)
        .await;
    wait_recorded_done(vm, watch, t0, from).await;
    let recovered = now() - healed;
    vm.wait_gone("the workload evicted", "ml", &hold).await;
    let tl = watch.timeline();
    let con = vm.con_with_summary(t0, from).await;
    swap_after_drain(&tl, &con, t0, from);
    cordon_held_to_swap(&tl, t0, from).unwrap_or_else(|e| panic!("fault B: {e}"));
    let f = cycle::check(&tl, &con.agent_lines(), t0, from, Mode::Ahead)
        .unwrap_or_else(|e| panic!("fault B: cordon window check failed: {e}"));
    rows.push(format!(
        "B cut off from the API server 120 s while Draining: NotReady after {not_ready:.0} s, Done {recovered:.0} s after the heal; {f}"
    ));
    ph.phase(&format!(
        "fault B: healed; Done at {from} {recovered:.0} s later"
    ));
    vm.wait_module(
        &format!("the workload back on {from}"),
        &format!("module={from} refcnt=1 "),
    )
    .await;
    rows
}

/// The controller replica holding the lease.
async fn lease_holder(c: &Client, ns: &str) -> Result<String, String> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(c.clone(), ns);
    let l = api
        .get("tt-k8s-driver-manager")
        .await
        .map_err(|e| e.to_string())?;
    l.spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
        .ok_or_else(|| "no holder".to_string())
}

/// The in-cluster controller killed mid-cycle (issue 35, fault 5): the chart's
/// two replicas run on the host-side node (real-node-1). While the VM node is
/// Upgrading (its validation pod runs: `upgradePolicy.validation`, a pod
/// that sleeps), real-node-1's kubelet is stopped and the leader's container
/// SIGKILLed (hack/realnode.sh stop-kubelet, kill-container): the other
/// replica must take the lease; the kubelet is started again once it has,
/// and restarts the killed one, a follower now. The other replica finishes
/// the cycle: one go-ahead and one validation pod in the cycle, the node
/// Done on the target, the lease still its own.
async fn leader_fault(
    vm: &Vm,
    ph: &mut Phases,
    watch: &Watcher,
    from: &str,
    to: &str,
    agent_image: &str,
) -> String {
    let ns = vm.ns.clone();
    let template: k8s_openapi::api::core::v1::PodTemplate =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "vm-validate", "namespace": ns},
            "template": {"spec": {
                "containers": [{"name": "check", "image": agent_image, "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "test -c /dev/tenstorrent/0 && sleep 25"],
                    "securityContext": {"privileged": true},
                    "volumeMounts": [{"name": "dev", "mountPath": "/dev/tenstorrent"}]}],
                "volumes": [{"name": "dev", "hostPath": {"path": "/dev/tenstorrent"}}],
            }},
        }))
        .unwrap_or_else(|e| panic!("the PodTemplate: {e}"));
    Api::<k8s_openapi::api::core::v1::PodTemplate>::namespaced(vm.c.clone(), &ns)
        .create(&Default::default(), &template)
        .await
        .unwrap_or_else(|e| panic!("creating the PodTemplate: {e}"));
    let leader = wait_for("a controller replica holds the lease", vm.t, || {
        lease_holder(&vm.c, &ns)
    })
    .await;
    let t0 = now();
    vm.patch_policy(serde_json::json!({"version": to, "upgradePolicy": {
        "validation": {"podTemplateName": "vm-validate", "timeoutSeconds": 300}}}))
        .await;
    // Every go-ahead value the node carries in this cycle, and every
    // validation pod made for it.
    type Seen = Arc<Mutex<std::collections::BTreeSet<String>>>;
    let (seen, pods): (Seen, Seen) = Default::default();
    let poll = {
        let (vm, seen, pods, ns) = (vm.clone(), seen.clone(), pods.clone(), ns.clone());
        tokio::spawn(async move {
            loop {
                if let Some(g) = vm.go_ahead().await
                    && let Ok(mut s) = seen.lock()
                {
                    s.insert(g);
                }
                if let Ok(v) = vm.pods(&ns, ttdrv_api::labels::VALIDATION_CYCLE, "").await
                    && let Ok(mut p) = pods.lock()
                {
                    p.extend(v);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    vm.wait_state(
        "the node Upgrading, its validation pod running",
        "Upgrading",
        Some("Validating"),
    )
    .await;
    let pod = Api::<Pod>::namespaced(vm.c.clone(), &ns)
        .get(&leader)
        .await
        .unwrap_or_else(|e| panic!("the leader pod {leader}: {e}"));
    let id = pod
        .status
        .clone()
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .into_iter()
        .find_map(|c| c.container_id)
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_string))
        .unwrap_or_else(|| panic!("no container id for {leader}"));
    // Its kubelet stopped first, the killed container stays dead: the lease
    // must go to the other replica (both run on real-node-1, in their shims).
    run("bash", &["hack/realnode.sh", "stop-kubelet"])
        .unwrap_or_else(|e| panic!("stopping real-node-1's kubelet: {e}"));
    let killed = now();
    run("bash", &["hack/realnode.sh", "kill-container", &id])
        .unwrap_or_else(|e| panic!("SIGKILL of the leader {leader}: {e}"));
    let (state, reason) = vm.state().await.unwrap_or_default();
    ph.phase(&format!(
        "fault C: leader {leader} SIGKILLed, real-node-1's kubelet stopped, while the VM node was {state} ({reason:?})"
    ));
    let next = wait_for("the other replica holds the lease", vm.t, || async {
        let h = lease_holder(&vm.c, &ns).await?;
        if h != leader {
            Ok(h)
        } else {
            Err(format!("still the killed {h}"))
        }
    })
    .await;
    let took = now() - killed;
    run("bash", &["hack/realnode.sh", "start-kubelet"])
        .unwrap_or_else(|e| panic!("starting real-node-1's kubelet: {e}"));
    let back = now() - killed;
    // The killed pod's container restarted: a follower now.
    let pods_api = Api::<Pod>::namespaced(vm.c.clone(), &ns);
    let restarts = |p: &Pod| -> i32 {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0)
    };
    let before = restarts(&pod);
    wait_for("the killed replica restarted", vm.t, || async {
        let p = pods_api.get(&leader).await.map_err(|e| e.to_string())?;
        if restarts(&p) > before && ttdrv_testkit::pod_ready(&p) {
            Ok(())
        } else {
            Err(format!("{leader}: {} restarts", restarts(&p)))
        }
    })
    .await;
    vm.wait_done("the node Done after the leader's death", to)
        .await;
    assert_eq!(
        lease_holder(&vm.c, &ns).await.as_deref(),
        Ok(next.as_str()),
        "the lease left the replica that took it over"
    );
    wait_recorded_done(vm, watch, t0, to).await;
    let done = now() - killed;
    poll.abort();
    let go_aheads = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(go_aheads.len(), 1, "go-aheads in one cycle: {go_aheads:?}");
    let validation = pods.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(
        validation.len(),
        1,
        "validation pods of one cycle: {validation:?}"
    );
    let tl = watch.timeline();
    swap_after_drain(&tl, &vm.con_with_summary(t0, to).await, t0, to);
    cordon_held_to_swap(&tl, t0, to).unwrap_or_else(|e| panic!("fault C: {e}"));
    vm.patch_policy(
        serde_json::json!({"upgradePolicy": {"validation": {"podTemplateName": null}}}),
    )
    .await;
    ph.phase(&format!("fault C: the lease taken by {next}; Done at {to}"));
    format!(
        "C leader {leader} SIGKILLed + real-node-1 kubelet stopped while the VM node was {state} ({reason:?}): the lease taken by the other replica {next} {took:.1} s after the kill, the kubelet back at {back:.1} s and the killed replica a follower, Done at {to} {done:.1} s after the kill; go-aheads in the cycle: 1; validation pods: {}; from {from}",
        validation.len()
    )
}

/// The guest's boots: (guest time, boot ID) of each init report.
fn boots(con: &Console) -> Vec<(f64, String)> {
    con.reports()
        .filter(|(_, w)| w.starts_with("init "))
        .filter_map(|(t, w)| {
            let id = w.split(" boot_id=").nth(1)?.split_whitespace().next()?;
            Some((t, id.to_string()))
        })
        .collect()
}

/// Record states the node went through after `t0` (from the timeline).
fn states_since(tl: &[Sample], t0: f64) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for s in tl.iter().filter(|s| s.t >= t0) {
        if out.last() != Some(&s.state) {
            out.push(s.state.clone());
        }
    }
    out
}

/// Reboots the guest (a power cut: no shutdown) and waits for its next boot;
/// returns the new boot ID, how long the labels were the last boot's and
/// the status showed their version, and the reset's time. While the node's
/// driver labels are from the earlier boot (stale:
/// [`ttdrv_core::node::driver_labels_stale`]) the policy's status must stop
/// showing their version as loaded within its cadence, and not show it again.
async fn reboot(vm: &Vm, stale_version: &str) -> (String, String, f64) {
    reboot_by(vm, "reboot", stale_version).await
}

/// As [`reboot`], with the guest's command `cmd` (`reboot`, or
/// `reboot-hang`: the next boot hangs before it starts containerd).
async fn reboot_by(vm: &Vm, cmd: &str, stale_version: &str) -> (String, String, f64) {
    let before = last_boot(vm);
    let at = vm.ctl(cmd).await;
    back_from_reboot(vm, &before, at, stale_version).await
}

fn last_boot(vm: &Vm) -> String {
    boots(&vm.con())
        .last()
        .map(|b| b.1.clone())
        .unwrap_or_default()
}

/// Waits for a reboot trap armed in the guest (`reboot-on-unload`,
/// `reboot-on-load V`) to fire, then for the next boot as [`reboot`] does;
/// returns also what the trap saw loaded when it cut the power.
async fn trapped_reboot(
    vm: &Vm,
    trap: &str,
    before: &str,
    armed: f64,
    stale_version: &str,
) -> (String, String, f64, String) {
    let fired = format!("ctl {trap} fired ");
    let (at, seen) = wait_for(&format!("the guest's {trap} trap"), vm.t, || async {
        vm.con()
            .reports()
            .find(|(t, w)| *t >= armed && w.starts_with(&fired))
            .map(|(t, w)| (t, w[fired.len()..].to_string()))
            .ok_or_else(|| format!("not fired; {:?}", vm.con().module_now()))
    })
    .await;
    let (id, stale, at) = back_from_reboot(vm, before, at, stale_version).await;
    (id, stale, at, seen)
}

/// Waits for the guest's next boot after the cut at `at` (its init report,
/// then the kubelet's report of the new boot and the agent's labels; see
/// [`back_once`]). A guest not back within the boot bound is dumped
/// ([`Vm::guest_dump`]) and reset through QEMU, as a node's hardware
/// watchdog would: counted in `vm.watchdog` and reported; a second miss
/// fails the test.
async fn back_from_reboot(
    vm: &Vm,
    before: &str,
    at: f64,
    stale_version: &str,
) -> (String, String, f64) {
    let e = match back_once(vm, before, at, stale_version).await {
        Ok(r) => return r,
        Err(e) => e,
    };
    let dump = vm.guest_dump().await;
    println!(
        "[test-vm-node] WATCHDOG: the guest did not come back from its reboot within {:?}: {e}\n{dump}\n[test-vm-node] WATCHDOG: resetting the guest (QEMU system_reset)",
        vm.boot_t
    );
    vm.watchdog
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let hung = last_boot(vm);
    let reset_at = now() - 2.0;
    if let Err(e) = vm.hmp("system_reset").await {
        panic!("the watchdog's reset of the hung guest: {e}");
    }
    match back_once(vm, &hung, reset_at, stale_version).await {
        Ok((id, stale, _)) => (id, stale, at),
        Err(e) => panic!(
            "the guest did not come back after the watchdog's reset either: {e}\n{}",
            vm.guest_dump().await
        ),
    }
}

/// The boot after `at` that is not `before`, reported by the guest and then
/// by its kubelet, and the agent's labels of it, each within the boot bound.
async fn back_once(
    vm: &Vm,
    before: &str,
    at: f64,
    stale_version: &str,
) -> Result<(String, String, f64), String> {
    let id = wait_for_result("the guest booted again", vm.boot_t, || async {
        boots(&vm.con())
            .into_iter()
            .rfind(|(t, id)| *t >= at && *id != before)
            .map(|b| b.1)
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    // Until the agent labels this boot its labels are the last boot's, and
    // the status must stop showing their version as loaded. The status is
    // the controller's: written at most once a second, on a pass every 2 s
    // at the latest, so it may show it for a moment after the kubelet reports
    // the new boot; it must drop it while the labels are still stale, and
    // not show it again.
    #[derive(Default)]
    struct Watch {
        kubelet: Option<f64>,
        stale_from: Option<f64>,
        shown_until: Option<f64>,
        dropped: Option<f64>,
    }
    let w = Mutex::new(Watch::default());
    let (w, booted_id) = (&w, &id);
    wait_for_result("the agent's labels of the new boot", vm.boot_t, || async move {
        let n = vm.node_obj().await?;
        let booted = n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .unwrap_or_default();
        if booted != *booted_id {
            return Err(format!("the kubelet reports boot {booted}"));
        }
        let t = now();
        let stale = ttdrv_core::node::driver_labels_stale(&n);
        let api: Api<TenstorrentDriverPolicy> = Api::all(vm.c.clone());
        let shown = api
            .get_opt(POLICY)
            .await
            .map_err(|e| e.to_string())?
            .and_then(|p| p.status)
            .and_then(|st| st.nodes.into_iter().find(|e| e.name == vm.node))
            .and_then(|e| e.current_version);
        let mut w = w.lock().map_err(|e| e.to_string())?;
        w.kubelet.get_or_insert(t);
        if !stale {
            if let (Some(from), None) = (w.stale_from, w.dropped) {
                panic!(
                    "the status showed {stale_version} loaded for the {:.1} s the labels were the last boot's",
                    t - from
                );
            }
            return Ok(());
        }
        w.stale_from.get_or_insert(t);
        if shown.as_deref() == Some(stale_version) {
            assert!(
                w.dropped.is_none(),
                "the status shows {stale_version} loaded again, from the last boot's labels"
            );
            w.shown_until = Some(t);
        } else {
            w.dropped.get_or_insert(t);
        }
        Err("the labels are the last boot's".into())
    })
    .await?;
    let stale = match w
        .lock()
        .map(|w| (w.kubelet, w.stale_from, w.shown_until, w.dropped))
    {
        Ok((Some(k), Some(from), shown, Some(d))) => format!(
            "stale for {:.1} s after the kubelet reported the new boot; the status showed the last boot's {stale_version} for {:.1} s of them",
            now() - from,
            if shown.is_some() { d - k } else { 0.0 }
        ),
        _ => "not seen stale (the agent reported first)".to_string(),
    };
    // The module went with the boot (the guest's first report of it).
    let first = vm
        .con()
        .modules()
        .find(|(t, _)| *t >= at)
        .map(|(_, m)| m.to_string())
        .unwrap_or_default();
    assert!(
        first.starts_with("module=none "),
        "the first module report after the reboot: {first:?}"
    );
    Ok((id, stale, at))
}

/// Real reboots of the VM node mid-cycle (issue 35, fault 1): the guest
/// reset without a shutdown; its disk keeps the module cache and the images,
/// the module is gone, the boot ID new.
///   D1. while Draining (a PDB holds the drain), `from` -> `to`;
///   D2. after the go-ahead is on the node and before the agent unloads (the
///       agent cut off from the API server does not see it), `to` -> `from`;
///   D3. at rest (Done at `from`): never cordoned or drained, its installer
///       pod kept, Done again once the agent has loaded the target;
///   D4. between the unload and the load, `from` -> `to` (a trap in the
///       guest cuts the power the moment the module is gone);
///   D5. right after the load, before the agent reports it, `to` -> `from`
///       (the moment the module's init has run).
/// Each: the node ends Done on the target, loaded from the cache by the
/// agent of the new boot (nothing to swap: a first install); never drained
/// twice (no state before the one it rebooted in); the cordon held from the
/// cordon to the load; the status never shows the last boot's version.
async fn reboot_faults(
    vm: &Vm,
    ph: &mut Phases,
    watch: &Watcher,
    from: &str,
    to: &str,
) -> Vec<String> {
    let mut rows = vec![];
    // --- D1. reboot while Draining
    let t0 = now();
    let hold = vm.hold_pod().await;
    vm.block_drain(true).await;
    vm.patch_policy(serde_json::json!({"version": to})).await;
    vm.wait_state("the node Draining behind the PDB", "Draining", None)
        .await;
    let t_r = now();
    let (boot, stale, at) = reboot(vm, from).await;
    let back = now() - t_r;
    ph.phase(&format!(
        "fault D1: rebooted while Draining: boot {boot} after {back:.0} s"
    ));
    vm.wait_module_since(
        &format!("{to} loaded at the new boot"),
        at,
        &format!("module={to} "),
    )
    .await;
    vm.block_drain(false).await;
    vm.wait_done("the node Done after the reboot while Draining", to)
        .await;
    wait_recorded_done(vm, watch, t0, to).await;
    let done = now() - t_r;
    let tl = watch.timeline();
    let states = states_since(&tl, t_r);
    assert!(
        !states.iter().any(|s| s == "Pending" || s == "Cordoning"),
        "the cycle started over after the reboot: {states:?}"
    );
    cordon_held_to_swap(&tl, t0, to).unwrap_or_else(|e| panic!("fault D1: {e}"));
    let s = vm.wait_summary_after(at, to, "none").await;
    assert!(
        s.contains("source=cache"),
        "after the reboot {to} did not come from the cache: {s}"
    );
    let _ = hold;
    rows.push(format!(
        "D1 reboot while Draining: back (new boot ID, labels of the new boot) after {back:.0} s, Done at {to} from the cache {done:.0} s after the reboot; states after it {states:?}; labels of the last boot: {stale}"
    ));
    vm.wait_module(
        &format!("the workload on {to}"),
        &format!("module={to} refcnt=1 "),
    )
    .await;

    // --- D2. reboot after the go-ahead, before the unload
    let deploys: Api<Deployment> = Api::namespaced(vm.c.clone(), "ml");
    let scale = |n: i32| serde_json::json!({"spec": {"replicas": n}});
    deploys
        .patch("hold", &PatchParams::default(), &Patch::Merge(&scale(0)))
        .await
        .unwrap_or_else(|e| panic!("scaling the workload to 0: {e}"));
    let t0 = now();
    vm.patch_policy(serde_json::json!({"version": from, "upgradePolicy": {
        "maintenanceWindows": [window_from_now(2, 3)]}}))
        .await;
    wait_for(
        &format!("{from} prepared, the cycle held by the window"),
        vm.t,
        || async {
            let (s, r) = vm.state().await?;
            let p = vm.label(PREPARED).await;
            if p.as_deref() == Some(from) && r.as_deref() == Some("OutsideMaintenanceWindow") {
                Ok(())
            } else {
                Err(format!("state {s} ({r:?}) kmd-prepared {p:?}"))
            }
        },
    )
    .await;
    vm.ctl("partition 900").await;
    let seen = GoAheadSeen::start(vm);
    vm.patch_policy(serde_json::json!({"upgradePolicy": {"maintenanceWindows": []}}))
        .await;
    let go = wait_for("the go-ahead on the node", vm.t, || async {
        seen.first().ok_or_else(|| "none".to_string())
    })
    .await;
    // The agent cannot read it: the module is untouched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m = vm.con().module_now().unwrap_or_default();
    assert!(
        m.starts_with(&format!("module={to} ")),
        "the module changed while cut off: {m}"
    );
    let t_r = now();
    let (boot, stale, at) = reboot(vm, to).await;
    let back = now() - t_r;
    ph.phase(&format!(
        "fault D2: rebooted after the go-ahead, before the unload: boot {boot} after {back:.0} s"
    ));
    let (done, states) = finished_after_reboot(vm, watch, t0, at, Some(go), from).await;
    rows.push(format!(
        "D2 reboot after the go-ahead, before the unload: back after {back:.0} s, Done at {from} from the cache {done:.0} s after the reboot; states after it {states:?}; labels of the last boot: {stale}"
    ));
    deploys
        .patch("hold", &PatchParams::default(), &Patch::Merge(&scale(1)))
        .await
        .unwrap_or_else(|e| panic!("scaling the workload to 1: {e}"));
    vm.wait_module(
        &format!("the workload on {from}"),
        &format!("module={from} refcnt=1 "),
    )
    .await;

    // --- D3. reboot of a node at rest: it stays Done, nothing is replaced
    let t0 = now();
    let installers = vm.installers().await.unwrap_or_default();
    let t_r = now();
    let (_, stale, at) = reboot(vm, from).await;
    vm.wait_module_since(
        &format!("{from} loaded again at the new boot"),
        at,
        &format!("module={from} refcnt=1 "),
    )
    .await;
    let back = now() - t_r;
    vm.wait_done("the node Done after its reboot at rest", from)
        .await;
    wait_recorded_done(vm, watch, t0, from).await;
    let tl = watch.timeline();
    // The agent of the new boot says first what runs (nothing), then loads:
    // the node may show that as an install in place (Pending, Upgrading
    // FirstInstall), never as a drained cycle.
    let states = states_since(&tl, t0);
    assert!(
        !states
            .iter()
            .any(|s| s == "Cordoning" || s == "Draining" || s == "Failed"),
        "a reboot at rest disrupted the node: {states:?}"
    );
    assert!(
        !tl.iter().any(|s| s.t >= t0 && s.cordoned),
        "cordoned for a reboot at rest"
    );
    assert_eq!(
        vm.installers().await.unwrap_or_default(),
        installers,
        "the installer pod replaced for a reboot"
    );
    ph.phase(&format!(
        "fault D3: rebooted at rest: {states:?}, never cordoned, {from} and the workload back {back:.0} s later"
    ));
    rows.push(format!(
        "D3 reboot at rest: states {states:?} (no drained cycle), installer pod kept, never cordoned, {from} loaded from the cache and the workload back {back:.0} s after the reboot; labels of the last boot: {stale}"
    ));

    // --- D4. reboot between the unload and the load, `from` -> `to`
    let t0 = now();
    let before = last_boot(vm);
    let armed = vm.ctl("reboot-on-unload").await;
    let go = GoAheadSeen::start(vm);
    vm.patch_policy(serde_json::json!({"version": to})).await;
    let (boot, stale, at, seen) =
        trapped_reboot(vm, "reboot-on-unload", &before, armed, from).await;
    ph.phase(&format!(
        "fault D4: rebooted between the unload and the load ({seen}): boot {boot} after {:.0} s",
        now() - at
    ));
    assert_eq!(
        seen, "module=none",
        "the D4 trap fired with a module loaded"
    );
    let row = after_trapped_reboot(vm, watch, t0, at, go.first(), to).await;
    rows.push(format!(
        "D4 reboot between the unload and the load (nothing loaded at the cut): {row}; labels of the last boot: {stale}"
    ));

    // --- D5. reboot right after the load, before the agent reports it, `to` -> `from`
    let t0 = now();
    let before = last_boot(vm);
    let armed = vm.ctl(&format!("reboot-on-load {from}")).await;
    let go = GoAheadSeen::start(vm);
    vm.patch_policy(serde_json::json!({"version": from})).await;
    let (boot, stale, at, seen) = trapped_reboot(vm, "reboot-on-load", &before, armed, to).await;
    ph.phase(&format!(
        "fault D5: rebooted right after the load ({seen}): boot {boot} after {:.0} s",
        now() - at
    ));
    assert_eq!(
        seen,
        format!("module={from}"),
        "the D5 trap fired on another module"
    );
    let row = after_trapped_reboot(vm, watch, t0, at, go.first(), from).await;
    rows.push(format!(
        "D5 reboot right after the load of {from}, before the agent reported it: {row}; labels of the last boot: {stale}"
    ));
    rows
}

/// A boot made to hang (the watchdog must dump and reset it), then `n`
/// power cuts of the node at rest, one after the other: each boot must
/// report within the boot bound (else the watchdog resets it), load
/// `version` from the cache and end Done, never cordoned. Returns the
/// figures.
async fn reboot_soak(vm: &Vm, ph: &mut Phases, watch: &Watcher, version: &str, n: usize) -> String {
    let t0 = now();
    let mut backs = vec![];
    // The installer pod is kept across the reboots, and each one restarts
    // its container: from 3 restarts on, a crash loop counted that way
    // failed a node at rest (InstallerCrashLoop).
    let installers = vm.installers().await.unwrap_or_default();
    // (restarts, and whether the container waits in CrashLoopBackOff)
    let container = || async {
        let api: Api<Pod> = Api::namespaced(vm.c.clone(), &vm.ns);
        let name = installers.first().cloned().unwrap_or_default();
        let p = api.get(&name).await.map_err(|e| format!("{name}: {e}"))?;
        let cs = p
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        let backing_off = cs.iter().any(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref())
                == Some("CrashLoopBackOff")
        });
        Ok::<(i32, bool), String>((cs.iter().map(|c| c.restart_count).sum(), backing_off))
    };
    let restarts = || async { container().await.map(|(r, _)| r) };
    let restarts_before = restarts().await.unwrap_or_else(|e| panic!("{e}"));
    // First the watchdog itself: a boot made to hang is dumped and reset.
    let resets = vm.watchdog.load(std::sync::atomic::Ordering::SeqCst);
    let (boot, _, _) = reboot_by(vm, "reboot-hang", version).await;
    assert_eq!(
        vm.watchdog.load(std::sync::atomic::Ordering::SeqCst),
        resets + 1,
        "the boot made to hang was not caught by the watchdog"
    );
    let con = std::fs::read_to_string(&vm.console).unwrap_or_default();
    for dumped in [
        "Show Blocked State",
        "Show backtrace of all active CPUs",
        "Mem-Info",
    ] {
        assert!(
            con.contains(dumped),
            "the hung guest's dump lacks SysRq's {dumped:?}"
        );
    }
    vm.wait_done("the node Done after the watchdog's reset", version)
        .await;
    ph.log(&format!(
        "soak: a boot made to hang was dumped and reset by the watchdog; boot {boot} Done"
    ));
    for i in 1..=n {
        let t_r = now();
        let (boot, _, at) = reboot(vm, version).await;
        let booted = now() - t_r;
        vm.wait_module_since(
            &format!("{version} loaded again at boot {i}"),
            at,
            &format!("module={version} "),
        )
        .await;
        vm.wait_done(&format!("the node Done after reboot {i}"), version)
            .await;
        let back = now() - t_r;
        ph.log(&format!(
            "soak reboot {i}/{n}: boot {boot} reported after {booted:.0} s, {version} loaded and Done after {back:.0} s"
        ));
        backs.push(back);
    }
    let tl = watch.timeline();
    assert!(
        !tl.iter().any(|s| s.t >= t0 && s.cordoned),
        "cordoned during the reboots at rest"
    );
    assert_eq!(
        vm.installers().await.unwrap_or_default(),
        installers,
        "the installer pod replaced during the reboots at rest"
    );
    let restarts_after = restarts().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        restarts_after >= restarts_before + n as i32,
        "the installer's restarts went from {restarts_before} to {restarts_after} over {n} reboots"
    );
    // Then two crashes of the agent's own in the last boot's sandbox (the
    // second inside the kubelet's back-off, so the container is seen down
    // after it): the reboots' restarts do not count towards a crash loop.
    // The old rule (every restart counts) would fail the node the moment it
    // sees the container down with 3 restarts: the test makes sure it was.
    let t_k = now();
    let down_seen = Mutex::new(None);
    for k in 1..=2 {
        vm.ctl("kill-agent").await;
        wait_for(
            &format!("the installer restarted after kill {k}"),
            vm.t,
            || async {
                let (r, backing_off) = container().await?;
                if backing_off && let Ok(mut d) = down_seen.lock() {
                    *d = Some(r);
                }
                if r >= restarts_after + k {
                    Ok(())
                } else {
                    Err(format!("restarts {r}"))
                }
            },
        )
        .await;
    }
    let down_at = down_seen.lock().ok().and_then(|d| *d);
    assert!(
        down_at.is_some_and(|r| r >= 3),
        "the container was not seen in CrashLoopBackOff with 3 restarts or more ({down_at:?}): the kills did not test the rule"
    );
    vm.wait_done("the node Done after the agent's two crashes", version)
        .await;
    let crashed = restarts().await.unwrap_or_else(|e| panic!("{e}"));
    let failed: Vec<String> = watch
        .timeline()
        .iter()
        .filter(|s| s.t >= t_k && s.state == "Failed")
        .map(|s| s.line())
        .collect();
    assert!(
        failed.is_empty(),
        "two crashes after {restarts_after} restarts by reboots failed the node: {failed:?}"
    );
    ph.log(&format!(
        "soak: the agent SIGKILLed twice after the reboots: restarts {restarts_after} -> {crashed} (seen in CrashLoopBackOff at {down_at:?}), the node stayed Done"
    ));
    backs.sort_by(f64::total_cmp);
    let q = |f: f64| backs[((backs.len() - 1) as f64 * f).round() as usize];
    let row = format!(
        "soak: {n} power cuts at rest, every boot back; {version} loaded again and Done after {:.0} s min, {:.0} s median, {:.0} s max; never cordoned; the same installer pod throughout, its restarts {restarts_before} -> {restarts_after} (none a crash loop); then two crashes of the agent in the last boot's sandbox ({restarts_after} -> {crashed}): still Done",
        q(0.0),
        q(0.5),
        q(1.0)
    );
    ph.phase(&row);
    row
}

/// When the go-ahead first appeared on the node (polled every 100 ms: the
/// timeline's 0.5 s samples can miss the moment between the go-ahead and a
/// swap from the cache).
struct GoAheadSeen {
    first: Arc<Mutex<Option<(f64, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl GoAheadSeen {
    fn start(vm: &Vm) -> Self {
        let first: Arc<Mutex<Option<(f64, bool)>>> = Arc::default();
        let (vm, out) = (vm.clone(), first.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Ok(n) = vm.node_obj().await
                    && n.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(GO_AHEAD))
                {
                    let cordoned = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.unschedulable)
                        .unwrap_or(false);
                    if let Ok(mut f) = out.lock() {
                        *f = Some((now(), cordoned));
                    }
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { first, task }
    }

    /// When the go-ahead was first seen, and whether the Node that carried
    /// it was cordoned (one object: the order of the two writes, exactly).
    fn first(&self) -> Option<(f64, bool)> {
        self.first.lock().ok().and_then(|f| *f)
    }
}

impl Drop for GoAheadSeen {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The end of a cycle a reboot cut (D2, D4, D5; the cycle started at `t0`,
/// the power cut at `at`, the go-ahead first seen at `go_ahead`, with
/// whether that Node was cordoned), checked: the go-ahead was on the
/// cordoned node before the cut (the swap had it), the node ends Done on
/// `version` from the cache with no second drain, the cordon held from the
/// cordon to the load. Returns when it was Done (seconds after the cut) and
/// the states after the cut.
async fn finished_after_reboot(
    vm: &Vm,
    watch: &Watcher,
    t0: f64,
    at: f64,
    go_ahead: Option<(f64, bool)>,
    version: &str,
) -> (f64, Vec<String>) {
    vm.wait_done(
        &format!("the node Done at {version} after the reboot"),
        version,
    )
    .await;
    wait_recorded_done(vm, watch, t0, version).await;
    let done = now() - at;
    let tl = watch.timeline();
    // (one second for the guest's clock, read from the RTC at boot)
    let (go, cordoned) =
        go_ahead.unwrap_or_else(|| panic!("no go-ahead seen on the node in the cycle"));
    assert!(
        go <= at + 1.0,
        "the swap the reboot cut ran before the go-ahead: go-ahead at {go:.1}, cut at {at:.1}"
    );
    assert!(
        cordoned,
        "the go-ahead at {go:.1} was on a node not cordoned"
    );
    let states = states_since(&tl, at + 1.0);
    assert!(
        !states
            .iter()
            .any(|s| s == "Pending" || s == "Cordoning" || s == "Draining"),
        "a second drain or a new cycle after the reboot: {states:?}"
    );
    cordon_held_to_swap(&tl, t0, version).unwrap_or_else(|e| panic!("after the reboot: {e}"));
    let s = vm.wait_summary_after(at, version, "none").await;
    assert!(
        s.contains("source=cache"),
        "after the reboot {version} did not come from the cache: {s}"
    );
    (done, states)
}

/// After a trapped reboot ([`trapped_reboot`]): [`finished_after_reboot`],
/// the new boot's agent validated the cut swap against its record, then the
/// workload back on `version`. Returns the figures.
async fn after_trapped_reboot(
    vm: &Vm,
    watch: &Watcher,
    t0: f64,
    at: f64,
    go_ahead: Option<(f64, bool)>,
    version: &str,
) -> String {
    let (done, states) = finished_after_reboot(vm, watch, t0, at, go_ahead, version).await;
    // The cut swap's record (written, synced, before the unload) survived
    // the power cut, and the new boot's agent checked the load against it.
    let con = vm.con();
    let checked = con
        .at(at, "the swap to this version has not validated yet")
        .and_then(|t| con.at(t, "validated: the module serves every card served before"));
    assert!(
        checked.is_some(),
        "the new boot's agent did not validate the swap the reboot cut (no record check in its log)"
    );
    vm.wait_module(
        &format!("the workload on {version}"),
        &format!("module={version} refcnt=1 "),
    )
    .await;
    format!(
        "Done at {version} from the cache {done:.0} s after the cut, the workload back {:.0} s after it; states after it {states:?}",
        now() - at
    )
}
