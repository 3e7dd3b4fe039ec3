//! The Helm chart against the real API server, installed as a user would: the
//! rendered chart passes server-side validation; its node-patch
//! ValidatingAdmissionPolicies let an agent change only the driver labels of
//! its own node and the VFIO binder only its report there, and its CRD
//! upgrade hook may bring back an older release's
//! CRD and do nothing else. Both are checked by impersonating their
//! ServiceAccounts with kubectl. (The static checks of the chart: tests/chart.rs
//! over the renders of hack/test-chart.sh.)

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use ttdrv_testkit::TestEnv;

/// A release of its own, so the cluster shared with other tests is not
/// disturbed.
const RELEASE: &str = "ttdrv-chart-test";
/// One install at a time: both tests install the CRDs (Helm's `crds/`),
/// and the first test's server-side dry run of them must not race the
/// other's create.
static INSTALLS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/chart");
const CRD: &str = "tenstorrentdriverpolicies.driver.tenstorrent.com";
const NODE_A: &str = "ttdrv-chart-vap-a";
const NODE_B: &str = "ttdrv-chart-vap-b";
/// A go-ahead written on node A (only the controller may).
const GO_AHEAD_A: [&str; 5] = [
    "annotate",
    "node",
    NODE_A,
    r#"driver.tenstorrent.com/go-ahead={"policy":"p"}"#,
    "--overwrite",
];
/// A cordon of node A (`kubectl cordon` exits 0 even when the patch is refused).
const CORDON_A: [&str; 7] = [
    "patch",
    "node",
    NODE_A,
    "--type",
    "merge",
    "-p",
    r#"{"spec":{"unschedulable":true}}"#,
];

fn kubectl<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Command {
    let mut c = Command::new("kubectl");
    c.arg("--request-timeout=20s").args(args);
    c
}

/// kubectl as the agent's ServiceAccount, with the node claim its projected
/// token carries (`None`: a token without one).
fn as_agent(node: Option<&str>, args: &[&str]) -> Command {
    as_account("agent", node, args)
}

/// kubectl as the VFIO binder's ServiceAccount, as [`as_agent`].
fn as_binder(node: Option<&str>, args: &[&str]) -> Command {
    as_account("vfio", node, args)
}

fn as_account(account: &str, node: Option<&str>, args: &[&str]) -> Command {
    let mut c = kubectl(&[format!(
        "--as=system:serviceaccount:{RELEASE}:{RELEASE}-{account}"
    )]);
    if let Some(n) = node {
        c.arg(format!(
            "--as-user-extra=authentication.kubernetes.io/node-name={n}"
        ));
    }
    c.args(args);
    c
}

/// `helm template` of the test's release for Kubernetes `kv`.
fn helm_template(kv: &str, extra: &[&str]) -> String {
    let name = format!("fullnameOverride={RELEASE}");
    let args = [
        "template",
        RELEASE,
        CHART,
        "-n",
        RELEASE,
        "--kube-version",
        kv,
        "--set",
        &name,
    ];
    run(Command::new("helm").args(args).args(extra), None)
}

enum Expect {
    Allowed,
    /// Refused, and the error says this.
    Refused(&'static str),
}

fn check(what: &str, mut cmd: Command, expect: Expect) -> Option<String> {
    match (try_run(&mut cmd, None), expect) {
        (Ok(_), Expect::Allowed) => None,
        (Err(e), Expect::Allowed) => Some(format!("refused: {what}: {e}")),
        (Ok(out), Expect::Refused(_)) => {
            Some(format!("allowed but must be refused: {what}: {out}"))
        }
        (Err(e), Expect::Refused(want)) if !e.contains(want) => Some(format!(
            "refused for another reason (want {want:?}): {what}: {e}"
        )),
        (Err(_), Expect::Refused(_)) => None,
    }
}

/// Uninstalls the release and deletes what the test created, whatever the
/// outcome.
struct Cleanup;

/// Uninstalls `release` and deletes namespace `ns`, whatever is left of
/// them (errors ignored: this runs on the way out of a test).
fn uninstall(release: &str, ns: &str) {
    let _ = try_run(
        Command::new("helm").args(["uninstall", release, "-n", ns]),
        None,
    );
    let _ = try_run(
        &mut kubectl(&[
            "delete",
            "namespace",
            "--ignore-not-found",
            "--timeout=60s",
            ns,
        ]),
        None,
    );
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        uninstall(RELEASE, RELEASE);
        let _ = try_run(
            &mut kubectl(&["delete", "node", "--ignore-not-found", NODE_A, NODE_B]),
            None,
        );
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn chart_installs_and_its_admission_policy_and_crd_hook_allow_only_their_job() {
    let _one = INSTALLS.lock().await;
    let env = TestEnv::new("chart").await;
    let kv = kube_version(&env).await;
    let _cleanup = Cleanup;
    let mut failures = Vec::new();

    // The rendered chart, CRD included, passes server-side validation.
    run(
        &mut kubectl(&["apply", "-f", "-"]),
        Some(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {RELEASE}\n"
        )),
    );
    let manifest = helm_template(
        &kv,
        &[
            "--skip-tests",
            "--set",
            "vfioManager.enabled=true",
            "--set",
            "vfioManager.hotplugStub.enabled=true",
            "--set",
            "vfioManager.devices[0].resourceName=tenstorrent.com/wormhole-vfio",
            "--set-string",
            "vfioManager.devices[0].vendorId=1e52",
            "--set-string",
            "vfioManager.devices[0].deviceId[0]=401e",
        ],
    );
    let crds = format!("{CHART}/crds/");
    run(
        &mut kubectl(&["apply", "--dry-run=server", "-f", &crds]),
        None,
    );
    run(
        &mut kubectl(&["apply", "--dry-run=server", "-f", "-"]),
        Some(&manifest),
    );

    // Installed for real, without a controller replica: only its identities,
    // RBAC and admission policy matter here.
    run(
        Command::new("helm").args([
            "upgrade",
            "--install",
            RELEASE,
            CHART,
            "-n",
            RELEASE,
            "--set",
            &format!("fullnameOverride={RELEASE}"),
            "--set",
            "controller.replicas=0",
            // The binder's identity and policy, and no binder pod anywhere.
            "--set",
            "vfioManager.enabled=true",
            "--set",
            "vfioManager.nodeSelector.ttdrv-chart-test=none",
            "--wait=false",
        ]),
        None,
    );
    for n in [NODE_A, NODE_B] {
        let node = format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n  labels:\n    \
             feature.node.kubernetes.io/pci-1200_1e52.present: \"true\"\n    pool: test\n  \
             annotations:\n    note: keep\nspec: {{}}\n"
        );
        run(&mut kubectl(&["apply", "-f", "-"]), Some(&node));
    }

    // The policy takes effect a moment after it is created: wait until it
    // refuses an agent labelling another node.
    let vap = format!("{RELEASE}-agent-node-patch");
    let foreign = [
        "label",
        "node",
        NODE_B,
        "driver.tenstorrent.com/kmd-version=2.8.0",
        "--overwrite",
    ];
    let mut enforcing = false;
    for _ in 0..40 {
        if try_run(&mut as_agent(Some(NODE_A), &foreign), None).is_err() {
            enforcing = true;
            break;
        }
        let _ = try_run(
            &mut kubectl(&[
                "label",
                "node",
                NODE_B,
                "driver.tenstorrent.com/kmd-version-",
            ]),
            None,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        enforcing,
        "{vap} never refused an agent labelling another node"
    );
    let warnings = run(
        &mut kubectl(&[
            "get",
            "validatingadmissionpolicy",
            &vap,
            "-o",
            "jsonpath={.status.typeChecking.expressionWarnings}",
        ]),
        None,
    );
    if !warnings.trim().is_empty() {
        failures.push(format!("type-checking warnings on {vap}: {warnings}"));
    }

    use Expect::*;
    let a = Some(NODE_A);
    let not_b = "may not modify node ttdrv-chart-vap-b";
    let only_labels = "may change only the node labels";
    let spec = "may not change the node spec";
    let table: Vec<(&str, Command, Expect)> = vec![
        (
            "agent sets the driver labels of its own node",
            as_agent(
                a,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-version=2.8.0",
                    "driver.tenstorrent.com/kmd-cards=2",
                    "driver.tenstorrent.com/install-mode=container",
                    "tt-smi.driver.tenstorrent.com/version=6.8.0",
                    "--overwrite",
                ],
            ),
            Allowed,
        ),
        (
            "agent removes a driver label of its own node",
            as_agent(
                a,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-version-",
                ],
            ),
            Allowed,
        ),
        (
            "agent reports a prepared module and a next-kernel failure on its own node",
            as_agent(
                a,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-prepared=2.9.0",
                    "driver.tenstorrent.com/kmd-next-kernel-failed=6.12.0-1-amd64",
                    "--overwrite",
                ],
            ),
            Allowed,
        ),
        (
            "agent removes the next-kernel warning of its own node",
            as_agent(
                a,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-next-kernel-failed-",
                ],
            ),
            Allowed,
        ),
        (
            "agent reports a prepared module on another node",
            as_agent(
                a,
                &[
                    "label",
                    "node",
                    NODE_B,
                    "driver.tenstorrent.com/kmd-prepared=2.9.0",
                    "--overwrite",
                ],
            ),
            Refused(not_b),
        ),
        (
            "agent reads nodes",
            as_agent(a, &["get", "node", NODE_B]),
            Allowed,
        ),
        (
            "agent labels another node",
            as_agent(a, &foreign),
            Refused(not_b),
        ),
        (
            "agent sets another label on its node",
            as_agent(a, &["label", "node", NODE_A, "pool=stolen", "--overwrite"]),
            Refused(only_labels),
        ),
        (
            "agent adds a label",
            as_agent(a, &["label", "node", NODE_A, "extra=1"]),
            Refused(only_labels),
        ),
        (
            "agent removes the PCI label",
            as_agent(
                a,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "feature.node.kubernetes.io/pci-1200_1e52.present-",
                ],
            ),
            Refused(only_labels),
        ),
        (
            "agent sets the skip label",
            as_agent(
                a,
                &["label", "node", NODE_A, "driver.tenstorrent.com/skip=true"],
            ),
            Refused(only_labels),
        ),
        (
            "agent annotates its node",
            as_agent(
                a,
                &["annotate", "node", NODE_A, "note=changed", "--overwrite"],
            ),
            Refused("may not change node annotations"),
        ),
        (
            "agent reports the module parameters of its node",
            as_agent(
                a,
                &[
                    "annotate",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-parameters=max_devices=4 power_policy=Y",
                    "driver.tenstorrent.com/kmd-host-options=max_devices=4",
                    "--overwrite",
                ],
            ),
            Allowed,
        ),
        (
            "agent removes its parameter reports",
            as_agent(
                a,
                &[
                    "annotate",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-parameters-",
                    "driver.tenstorrent.com/kmd-host-options-",
                ],
            ),
            Allowed,
        ),
        (
            "agent reports module parameters on another node",
            as_agent(
                a,
                &[
                    "annotate",
                    "node",
                    NODE_B,
                    "driver.tenstorrent.com/kmd-parameters=max_devices=4",
                    "--overwrite",
                ],
            ),
            Refused(not_b),
        ),
        (
            "agent taints its node",
            as_agent(a, &["taint", "node", NODE_A, "x=y:NoSchedule"]),
            Refused(spec),
        ),
        (
            "agent token without node claim",
            as_agent(
                None,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-version=2.8.0",
                    "--overwrite",
                ],
            ),
            Refused("no authentication.kubernetes.io/node-name"),
        ),
        (
            "binder reports its node's functions and boards",
            as_binder(
                a,
                &[
                    "annotate",
                    "node",
                    NODE_A,
                    r#"vfio.tenstorrent.com/pci-functions={"bootId":"b","drivers":{"vfio-pci":2}}"#,
                    "--overwrite",
                ],
            ),
            Allowed,
        ),
        (
            "binder labels its node's board kinds",
            as_binder(
                a,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "vfio.tenstorrent.com/board-types=n150.n300",
                    "--overwrite",
                ],
            ),
            Allowed,
        ),
        (
            "binder reports on another node",
            as_binder(
                a,
                &[
                    "annotate",
                    "node",
                    NODE_B,
                    r#"vfio.tenstorrent.com/pci-functions={"bootId":"b","drivers":{}}"#,
                    "--overwrite",
                ],
            ),
            Refused(not_b),
        ),
        (
            "binder sets a driver label",
            as_binder(
                a,
                &[
                    "label",
                    "node",
                    NODE_A,
                    "driver.tenstorrent.com/kmd-version=2.9.0",
                    "--overwrite",
                ],
            ),
            Refused(only_labels),
        ),
        (
            "an administrator is not restricted",
            kubectl(&["label", "node", NODE_A, "pool=admin", "--overwrite"]),
            Allowed,
        ),
    ];
    for (what, cmd, expect) in table {
        failures.extend(check(what, cmd, expect));
    }
    // What neither node identity may do: give itself the go-ahead, cordon its
    // node, delete a node.
    type AsAccount = fn(Option<&str>, &[&str]) -> Command;
    for (who, as_who) in [("agent", as_agent as AsAccount), ("binder", as_binder)] {
        for (what, args, expect) in [
            (
                "writes the go-ahead",
                &GO_AHEAD_A[..],
                Refused("may not change node annotations"),
            ),
            ("cordons its node", &CORDON_A[..], Refused(spec)),
            (
                "may not delete nodes (RBAC)",
                &["delete", "node", NODE_A, "--wait=false"][..],
                Refused("forbidden"),
            ),
        ] {
            failures.extend(check(&format!("{who} {what}"), as_who(a, args), expect));
        }
    }
    let cordoned = run(
        &mut kubectl(&[
            "get",
            "node",
            NODE_A,
            "-o",
            "jsonpath={.spec.unschedulable}",
        ]),
        None,
    );
    if cordoned.trim() == "true" {
        failures.push(format!("node {NODE_A} got cordoned by its agent"));
    }

    failures.extend(crd_upgrade_hook(&kv).await);
    assert!(
        failures.is_empty(),
        "chart checks failed:\n{}",
        failures.join("\n")
    );
}

/// The CRD upgrade hook's command, run as its ServiceAccount with its RBAC and
/// its ConfigMap's CRD (the test cluster runs no containers): it brings back a
/// CRD an older release left, and may not do more than get and patch it.
async fn crd_upgrade_hook(kv: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let docs = yaml_docs(&helm_template(
        kv,
        &["--show-only", "templates/crd-upgrade-job.yaml"],
    ));
    let of_kind = |k: &'static str| docs.iter().filter(move |d| d["kind"].as_str() == Some(k));
    let rbac: Vec<String> = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
        .into_iter()
        .flat_map(of_kind)
        .map(|d| serde_yaml::to_string(d).expect("yaml"))
        .collect();
    let rbac = rbac.join("---\n");
    let dir = std::env::temp_dir().join(format!("ttdrv-crd-hook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for crd_file in [
        "tenstorrentdriverpolicies.yaml",
        "tenstorrentfirmwarepolicies.yaml",
    ] {
        let crd_text = of_kind("ConfigMap")
            .find_map(|d| d["data"][crd_file].as_str())
            .unwrap_or_else(|| panic!("the hook's ConfigMap carries {crd_file}"));
        std::fs::write(dir.join(crd_file), crd_text).expect("write the CRD");
    }
    let args: Vec<String> = of_kind("Job")
        .find_map(|d| d["spec"]["template"]["spec"]["containers"][0]["args"].as_sequence())
        .expect("the hook Job's args")
        .iter()
        .filter_map(|a| a.as_str())
        .map(|a| a.replace("/crds/", &format!("{}/", dir.display())))
        .collect();
    run(&mut kubectl(&["apply", "-f", "-"]), Some(&rbac));

    // An older release's CRD: no categories.
    let _ = try_run(
        &mut kubectl(&[
            "patch",
            "crd",
            CRD,
            "--type",
            "json",
            "-p",
            r#"[{"op":"remove","path":"/spec/names/categories"}]"#,
        ]),
        None,
    );
    let sa = format!("--as=system:serviceaccount:{RELEASE}:{RELEASE}-crd-upgrade");
    let mut result = Err(String::new());
    // (RBAC takes a moment to reach the authorizer after the binding)
    for _ in 0..20 {
        result = try_run(kubectl(&[&sa]).args(&args), None);
        if result.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    match result {
        Ok(_) => {
            let categories = run(
                &mut kubectl(&["get", "crd", CRD, "-o", "jsonpath={.spec.names.categories}"]),
                None,
            );
            if categories.trim() != r#"["tenstorrent"]"# {
                failures.push(format!(
                    "the crd-upgrade hook's command left the CRD without its categories: {categories}"
                ));
            }
        }
        Err(e) => failures.push(format!(
            "the crd-upgrade hook's command failed as its ServiceAccount: {e}"
        )),
    }
    failures.extend(check(
        "crd-upgrade identity deletes the CRD",
        kubectl(&[&sa, "delete", "crd", CRD, "--dry-run=server"]),
        Expect::Refused("forbidden"),
    ));
    failures.extend(check(
        "crd-upgrade identity patches another CRD",
        kubectl(&[
            &sa,
            "patch",
            "crd",
            "not-ours.example.com",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"x":"y"}}}"#,
        ]),
        Expect::Refused("forbidden"),
    ));
    let _ = try_run(
        &mut kubectl(&["delete", "--ignore-not-found", "-f", "-"]),
        Some(&rbac),
    );
    let _ = std::fs::remove_dir_all(&dir);
    failures
}

/// Uninstalls the umbrella's release and deletes its namespace, whatever the
/// outcome.
struct UmbrellaCleanup(std::path::PathBuf);

impl Drop for UmbrellaCleanup {
    fn drop(&mut self) {
        uninstall(UMBRELLA, UMBRELLA_NS);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The umbrella's release and namespace (the tt-operator chart's).
const UMBRELLA: &str = "tt-operator";
const UMBRELLA_NS: &str = "tt-operator-system";

/// The tt-operator umbrella (tests/fixtures/umbrella: its dependency entry
/// and values for the driver manager) installs with this chart as its
/// `tt-k8s-driver-manager` dependency, built from a local path: the
/// controller Deployment runs our image under the umbrella's release name,
/// and an uninstall takes it away.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn the_umbrella_chart_installs_this_chart_as_its_driver_manager() {
    let _one = INSTALLS.lock().await;
    let _env = TestEnv::new("umbrella").await;
    let dir = std::env::temp_dir().join(format!("ttdrv-umbrella-{}", std::process::id()));
    let _cleanup = UmbrellaCleanup(dir.clone());
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/umbrella");
    run(Command::new("cp").args(["-r", fixture]).arg(&dir), None);
    let chart_yaml = dir.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).expect("the umbrella fixture's Chart.yaml");
    assert!(
        text.contains("file://../../../chart"),
        "the fixture names this chart by its relative path"
    );
    std::fs::write(
        &chart_yaml,
        text.replace("file://../../../chart", &format!("file://{CHART}")),
    )
    .expect("rewriting the fixture's dependency path");
    let umbrella = dir.to_string_lossy().into_owned();
    run(
        Command::new("helm").args(["dependency", "build", &umbrella]),
        None,
    );
    run(
        Command::new("helm").args([
            "upgrade",
            "--install",
            UMBRELLA,
            &umbrella,
            "-n",
            UMBRELLA_NS,
            "--create-namespace",
            // No controller replica: two would compete with the tests' own
            // controllers for the nodes of this shared cluster.
            "--set",
            "tt-k8s-driver-manager.controller.replicas=0",
            "--wait=false",
        ]),
        None,
    );
    let deployment = "tt-operator-tt-k8s-driver-manager-controller";
    let image = run(
        &mut kubectl(&[
            "get",
            "deployment",
            deployment,
            "-n",
            UMBRELLA_NS,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ]),
        None,
    );
    assert_eq!(
        image.trim(),
        "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/controller:0.1.0",
        "the umbrella's Go controller image is replaced by ours"
    );
    let installer = run(
        &mut kubectl(&[
            "get",
            "deployment",
            deployment,
            "-n",
            UMBRELLA_NS,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env[?(@.name==\"TTDRV_INSTALLER_IMAGE\")].value}",
        ]),
        None,
    );
    assert_eq!(
        installer.trim(),
        "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:0.1.0",
        "the umbrella's Go builder image is replaced by our agent"
    );
    let status = run(
        Command::new("helm").args(["status", UMBRELLA, "-n", UMBRELLA_NS, "-o", "json"]),
        None,
    );
    assert!(
        status.contains("\"status\":\"deployed\""),
        "the umbrella release is deployed: {status}"
    );
    run(
        Command::new("helm").args(["uninstall", UMBRELLA, "-n", UMBRELLA_NS]),
        None,
    );
    let left = try_run(
        &mut kubectl(&["get", "deployment", deployment, "-n", UMBRELLA_NS]),
        None,
    );
    assert!(
        left.is_err(),
        "helm uninstall of the umbrella leaves the controller Deployment: {left:?}"
    );
}
