//! Steps 6 and 7: what the agent's own token may do (the admission policy),
//! and `kubectl tt driver`.

use super::*;

/// The admission policy on the agent pod's own token (read from `inst2`).
pub(super) async fn admission_on_agent_token(t: &Ctx, ph: &mut Phases, inst2: &str) {
    let node = &t.rn.node;
    let ns = &t.rn.ns;
    let agent_sa = &t.agent_sa;
    let token = run(
        "kubectl",
        &[
            "-n",
            ns,
            "exec",
            inst2,
            "--",
            "cat",
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
        ],
    )
    .unwrap_or_else(|e| panic!("reading the agent pod's token: {e}"));
    let agent = agent_client(token.trim(), &env("REALNODE_CA")).await;
    let checks = admission_checks(&agent, node, agent_sa, ph).await;
    ph.phase(&format!(
        "admission policy on the agent's pod-bound token ({checks} checks)"
    ));
}

/// `kubectl tt driver` shows the policy and the node.
pub(super) fn kubectl_tt_driver(t: &Ctx, ph: &mut Phases) {
    let node = &t.rn.node;
    let out =
        run("kubectl", &["tt", "driver"]).unwrap_or_else(|e| panic!("kubectl tt driver: {e}"));
    for l in out.lines() {
        eprintln!("[kubectl tt driver] {l}");
    }
    assert!(
        out.contains(POLICY) && out.contains(node.as_str()),
        "kubectl tt driver does not show policy {POLICY} and node {node}"
    );
    ph.phase("kubectl tt driver");
}
