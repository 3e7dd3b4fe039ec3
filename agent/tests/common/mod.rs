//! A fake Kubernetes API server for running the agent binary: plain HTTP on
//! 127.0.0.1, serving the one Node the agent reads and labels (GET and merge
//! PATCH of `/api/v1/nodes/<name>`) and a pod list (`/api/v1/pods`), plus a
//! kubeconfig pointing at it. One request per connection.

#![allow(dead_code)]

pub mod host;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

#[derive(Debug, Default)]
struct State {
    node: Value,
    pods: Vec<Value>,
    gets: u32,
    patches: Vec<Value>,
}

pub struct FakeApi {
    state: Arc<Mutex<State>>,
    dir: tempfile::TempDir,
    pub port: u16,
}

impl FakeApi {
    /// Serves `node` (its name is the path it answers) until the test ends.
    pub fn start(node: &Node) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(State {
            node: serde_json::to_value(node).expect("node json"),
            ..State::default()
        }));
        let s = Arc::clone(&state);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let s = Arc::clone(&s);
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\n"
            ),
        )
        .expect("kubeconfig");
        FakeApi { state, dir, port }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Adds a pod on the node (for naming holders).
    pub fn add_pod(&self, uid: &str, namespace: &str, name: &str) {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "uid": uid, "namespace": namespace, "name": name }
        });
        self.state.lock().expect("state").pods.push(pod);
    }

    /// Replaces the Node's annotations with `node`'s (labels stay as patched).
    pub fn set_annotations(&self, node: &Node) {
        let v = serde_json::to_value(node).expect("node json");
        let mut s = self.state.lock().expect("state");
        s.node["metadata"]["annotations"] = v["metadata"]["annotations"].clone();
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        let s = self.state.lock().expect("state");
        serde_json::from_value(s.node["metadata"]["labels"].clone()).unwrap_or_default()
    }

    pub fn gets(&self) -> u32 {
        self.state.lock().expect("state").gets
    }

    pub fn patches(&self) -> Vec<Value> {
        self.state.lock().expect("state").patches.clone()
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let path = target.split('?').next().unwrap_or_default().to_string();
    let (status, reply) = answer(&method, &path, &body, state);
    let text = reply.to_string();
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = conn.flush();
}

fn answer(method: &str, path: &str, body: &[u8], state: &Mutex<State>) -> (&'static str, Value) {
    let Ok(mut s) = state.lock() else {
        return ("500 Internal Server Error", json!({}));
    };
    let name = s.node["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let node_path = format!("/api/v1/nodes/{name}");
    match (method, path) {
        ("GET", p) if p == node_path => {
            s.gets += 1;
            ("200 OK", s.node.clone())
        }
        ("PATCH", p) if p == node_path => {
            let patch: Value = serde_json::from_slice(body).unwrap_or_default();
            s.patches.push(patch.clone());
            if let Some(labels) = patch["metadata"]["labels"].as_object() {
                if !s.node["metadata"]["labels"].is_object() {
                    s.node["metadata"]["labels"] = json!({});
                }
                for (k, v) in labels {
                    let current = s.node["metadata"]["labels"]
                        .as_object_mut()
                        .expect("labels object");
                    if v.is_null() {
                        current.remove(k);
                    } else {
                        current.insert(k.clone(), v.clone());
                    }
                }
            }
            ("200 OK", s.node.clone())
        }
        ("GET", "/api/v1/pods") => (
            "200 OK",
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": s.pods}),
        ),
        _ => (
            "404 Not Found",
            json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                   "reason": "NotFound", "code": 404, "message": format!("{method} {path}")}),
        ),
    }
}

/// The environment for running the agent binary against `api` as the pod
/// would: the Node, the policy, the kubeconfig, and paths in `scratch`.
pub fn agent_command(bin: &Path, api: Option<&FakeApi>, scratch: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(bin);
    for var in [
        "NODE_NAME",
        "TTDRV_POLICY",
        "TT_FORCE_UNLOAD",
        "TT_KMD_VERSION",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
    ] {
        c.env_remove(var);
    }
    c.env("RUST_LOG", "info")
        .env("TTDRV_STATUS_FILE", scratch.join("waiting"))
        .env("TTDRV_TERMINATION_LOG", scratch.join("termination-log"));
    if let Some(api) = api {
        c.env("KUBECONFIG", api.kubeconfig());
    } else {
        c.env("KUBECONFIG", scratch.join("no-kubeconfig"));
    }
    c
}

/// The trimmed standard output of a finished command, which must have
/// succeeded; `what` names it in the failure, with its standard error.
pub fn stdout_of(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
