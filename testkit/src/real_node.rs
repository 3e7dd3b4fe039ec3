//! Support for the tests that run on a real kubelet inside the namespaces of
//! `hack/realnode.sh` (tests/real_node.rs, tests/vm_node.rs): the scripts only
//! bring things up and down; the checks are here and in those tests.
//!
//! - [`Phases`]: times each phase and prints the table the docs quote, also
//!   when the test fails (on drop);
//! - [`AuditQuery`]: finds an event in the API server's audit log (JSON lines);
//! - [`http_get`]: a scrape without curl (read with
//!   [`crate::controller::metric_samples`]);
//! - [`render`], [`apply_fixture`]: manifests from tests/fixtures with
//!   `${VAR}` placeholders, server-side applied;
//! - [`run`]: helm, kubectl and the plugin, where the CLI is what is tested or
//!   its kube-rs equivalent is much bigger;
//! - [`cycle`]: the VM node's timeline, guest console and cordon-window checks.

pub mod cycle;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A required environment variable (the script passes the facts the test needs).
pub fn env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{name} is not set: this test runs inside the real node's namespaces, started by its hack/ script"
        ),
    }
}

/// Phase timer: `phase(name)` closes the current phase; the table (with the
/// phases the script timed before the test, from `TTDRV_PHASES`, and the
/// total from `TTDRV_PHASE_T0`) is printed once, at [`Phases::report`] or when
/// dropped (a failed test prints how far it got).
pub struct Phases {
    prefix: String,
    start: Instant,
    /// Seconds the script spent before the test started.
    before: f64,
    last: Instant,
    done: Vec<(String, f64)>,
    /// Printed after the table: (heading, entries), in order of first use.
    sections: Vec<(String, Vec<String>)>,
    reported: bool,
}

impl Phases {
    /// `TTDRV_PHASE_T0`: the script's start (Unix seconds); `TTDRV_PHASES`:
    /// lines "SECONDS NAME" of the phases it timed itself.
    pub fn from_env(prefix: &str) -> Self {
        let now_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let before = std::env::var("TTDRV_PHASE_T0")
            .ok()
            .and_then(|t| t.trim().parse::<f64>().ok())
            .map(|t0| (now_unix - t0).max(0.0))
            .unwrap_or(0.0);
        let done = std::env::var("TTDRV_PHASES")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (secs, name) = l.trim().split_once(' ')?;
                Some((name.trim().to_string(), secs.parse().ok()?))
            })
            .collect();
        record_panic_message();
        let now = Instant::now();
        Self {
            prefix: prefix.to_string(),
            start: now,
            before,
            last: now,
            done,
            sections: Vec::new(),
            reported: false,
        }
    }

    fn elapsed(&self) -> f64 {
        self.before + self.start.elapsed().as_secs_f64()
    }

    pub fn log(&self, msg: &str) {
        eprintln!("[{} {:6.1}s] {msg}", self.prefix, self.elapsed());
    }

    pub fn phase(&mut self, name: &str) {
        let d = self.last.elapsed().as_secs_f64();
        self.log(&format!("phase done: {name} ({d:.1}s)"));
        self.done.push((name.to_string(), d));
        self.last = Instant::now();
    }

    /// An entry printed under `heading` after the table (e.g. each cycle's steps).
    pub fn add_to_report(&mut self, heading: &str, entry: String) {
        match self.sections.iter_mut().find(|(h, _)| h == heading) {
            Some((_, v)) => v.push(entry),
            None => self.sections.push((heading.to_string(), vec![entry])),
        }
    }

    pub fn report(&mut self) {
        self.reported = true;
        let p = &self.prefix;
        eprintln!("[{p}] phase times:");
        for (name, d) in &self.done {
            eprintln!("[{p}]   {name:<62} {d:7.1}s");
        }
        eprintln!("[{p}]   {:<62} {:7.1}s", "total", self.elapsed());
        for (heading, entries) in &self.sections {
            eprintln!("[{p}] {heading}:");
            for e in entries {
                eprintln!("{}", e.trim_end());
            }
        }
        // Last, where a log cut in its middle still shows it: the failed
        // check, in the phase after the table's last row.
        if std::thread::panicking() {
            let after = self.done.last().map_or("the start", |(n, _)| n.as_str());
            let msg = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
            eprintln!("[{p}] FAILED in the phase after \"{after}\": {msg}");
        }
    }
}

/// The message of the last panic on any thread, for [`Phases::report`].
static LAST_PANIC: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Keeps each panic's message (and location) in [`LAST_PANIC`], then runs
/// the hook that was there (the test harness prints it as before). Installed once.
fn record_panic_message() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let at = info
                .location()
                .map(|l| format!(" ({}:{})", l.file(), l.line()))
                .unwrap_or_default();
            if let Ok(mut m) = LAST_PANIC.lock() {
                *m = format!("{text}{at}");
            }
            previous(info);
        }));
    });
}

impl Drop for Phases {
    fn drop(&mut self) {
        if !self.reported {
            self.report();
        }
    }
}

/// Runs the commands (each through `sh -c`, output to stderr) when dropped
/// during a panic: what the cluster looked like when a check failed.
pub struct Diagnostics(pub Vec<String>);

impl Drop for Diagnostics {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        eprintln!("--- diagnostics");
        for c in &self.0 {
            eprintln!("$ {c}");
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!("{c} 1>&2"))
                .status();
        }
    }
}

/// Runs a program; its stdout on success, else what it said.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{program} {} ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            stdout
        ))
    }
}

/// One audit event to look for: ResponseComplete, a success (code < 300),
/// this verb, resource, subresource ("" = none) and user; optionally the
/// object's name and the node claim of a pod-bound token.
#[derive(Debug, Default, Clone)]
pub struct AuditQuery<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub user: &'a str,
    pub name: Option<&'a str>,
    pub node_claim: Option<&'a str>,
}

/// The claim a pod-bound ServiceAccount token carries for its pod's node.
pub const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";

impl AuditQuery<'_> {
    pub fn matches(&self, e: &Value) -> bool {
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        let o = &e["objectRef"];
        let u = &e["user"];
        s(&e["stage"]) == "ResponseComplete"
            && s(&e["verb"]) == self.verb
            && s(&o["resource"]) == self.resource
            && s(&o["subresource"]) == self.subresource
            && s(&u["username"]) == self.user
            && self.name.is_none_or(|n| s(&o["name"]) == n)
            && e["responseStatus"]["code"].as_i64().unwrap_or(0) < 300
            && self
                .node_claim
                .is_none_or(|n| u["extra"][NODE_CLAIM] == serde_json::json!([n]))
    }

    /// The first matching event of the log text (one JSON object a line).
    pub fn find(&self, log: &str) -> Option<Value> {
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| self.matches(e))
    }

    /// Reads the audit log at `path` and finds the event.
    pub fn find_in(&self, path: &str) -> Result<Value, String> {
        let log = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
        self.find(&log)
            .ok_or_else(|| format!("no audit event {self:?} in {path}"))
    }
}

/// The seconds each wait may take: `TIMEOUT` (the scripts' setting), else `default`.
pub fn timeout_from_env(default: u64) -> std::time::Duration {
    let secs = std::env::var("TIMEOUT")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(default);
    std::time::Duration::from_secs(secs)
}

/// GET http://ADDR/PATH (HTTP/1.0, 5 s); the body of a 200 answer.
pub async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("{addr}{path}: no HTTP answer"))?;
        let status = head.lines().next().unwrap_or("");
        if status.split_whitespace().nth(1) == Some("200") {
            Ok(body.to_string())
        } else {
            Err(format!("{addr}{path}: {status}"))
        }
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| format!("{addr}{path}: no answer in 5 s"))?
}

/// Substitutes `${NAME}` placeholders; a placeholder without a value is an error.
pub fn render(template: &str, vars: &[(&str, &str)]) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unterminated placeholder at {:?}", &rest[i..]))?;
        let key = &after[..end];
        let (_, v) = vars
            .iter()
            .find(|(k, _)| *k == key)
            .ok_or_else(|| format!("no value for ${{{key}}}"))?;
        out.push_str(v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Renders the fixture file and server-side applies each of its documents
/// (kinds resolved through discovery; namespaced objects in their namespace).
pub async fn apply_fixture(client: &Client, path: &Path, vars: &[(&str, &str)]) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()));
    let text = render(&text, vars).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let pp = PatchParams::apply("ttdrv-tests").force();
    // Documents split at their `---` lines (the fixtures are plain YAML).
    for doc in text.split("\n---\n") {
        let v: Value =
            serde_yaml::from_str(doc).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
        if v.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("{}: not an object: {e}", path.display()));
        let tm = obj
            .types
            .clone()
            .unwrap_or_else(|| panic!("{}: a document without apiVersion/kind", path.display()));
        let gvk =
            GroupVersionKind::try_from(&tm).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{}: kind {}: {e}", path.display(), tm.kind));
        let name = obj.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match (&caps.scope, obj.metadata.namespace.as_deref()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        if let Err(e) = api.patch(&name, &pp, &Patch::Apply(&v)).await {
            panic!("{}: applying {} {name}: {e}", path.display(), tm.kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_substitutes_and_refuses_unknown() {
        let vars = [("NODE", "n1"), ("IMG", "a:b")];
        assert_eq!(
            render("node: ${NODE}, image: ${IMG} $x", &vars).as_deref(),
            Ok("node: n1, image: a:b $x")
        );
        assert!(render("${OTHER}", &vars).is_err());
        assert!(render("${NODE", &vars).is_err());
    }

    #[test]
    fn metric_samples_match_the_name_and_labels_exactly() {
        use crate::controller::metric_samples;
        let text = "# HELP ttdriver_leader x\nttdriver_leader_x 5\nttdriver_leader 1\n\
                    ttdriver_nodes{state=\"Done\"} 2\nttdriver_nodes{state=\"Failed\"} 0\n";
        let first = |name, labels| metric_samples(text, name, labels).next();
        assert_eq!(first("ttdriver_leader", &[]), Some(1.0));
        assert_eq!(first("ttdriver_nodes", &[("state", "Failed")]), Some(0.0));
        assert_eq!(first("ttdriver_drain_blocked_total", &[]), None);
    }

    #[test]
    fn audit_query_checks_every_field() {
        let line = |code: i64, claim: &str| {
            serde_json::json!({
                "stage": "ResponseComplete", "verb": "patch",
                "objectRef": {"resource": "nodes", "name": "n1"},
                "user": {"username": "sa", "extra": {NODE_CLAIM: [claim]}},
                "responseStatus": {"code": code}
            })
            .to_string()
        };
        let q = AuditQuery {
            verb: "patch",
            resource: "nodes",
            user: "sa",
            name: Some("n1"),
            node_claim: Some("n1"),
            ..Default::default()
        };
        assert!(q.find(&line(200, "n1")).is_some());
        assert!(q.find(&line(403, "n1")).is_none());
        assert!(q.find(&line(200, "n2")).is_none());
        let sub = AuditQuery {
            subresource: "status",
            ..q.clone()
        };
        assert!(sub.find(&line(200, "n1")).is_none());
        let log = format!("not json\n{}\n{}", line(403, "n1"), line(200, "n1"));
        assert!(q.find(&log).is_some());
    }

    #[test]
    fn a_panic_message_is_kept_for_the_report() {
        record_panic_message();
        let r = std::panic::catch_unwind(|| panic!("the node Done at 9.9.9: state Failed"));
        assert!(r.is_err());
        let m = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
        assert!(
            m.starts_with("the node Done at 9.9.9: state Failed (") && m.contains("real_node.rs:"),
            "{m}"
        );
    }
}
