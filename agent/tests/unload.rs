//! `spec.unmanage` on a fake host root: the unload-only installer leaves the
//! module alone until the controller's unload go-ahead for this node's
//! Unloading cycle, then unloads it (holder rules as for a swap), removes the
//! driver labels and is Ready; a DKMS host is reported and not touched.

mod common;

use ttdrv_agent::fake::{FakeBuilder, FakeKernel, add_holder, set_loaded};
use ttdrv_agent::node::fake::{FAKE_CYCLE, FAKE_NODE, FAKE_POLICY, FakeNode, node_with};
use ttdrv_agent::pod::FakePause;
use ttdrv_agent::unload::{self, Unloaded};
use ttdrv_agent::{Agent, AgentError, Config};
use ttdrv_api::{NodeState, labels};
use ttdrv_core::go_ahead::GoAhead;
use ttdrv_core::machine::{Cordon, NodeRecord};

use common::host::{TestHost as Host, assert_matches};

/// A fake host with `loaded` loaded (no users), nothing cached, no tt-smi.
fn host(loaded: Option<&str>) -> Host {
    let h = Host::without_tt_smi();
    if let Some(v) = loaded {
        set_loaded(h.root(), v, 0).expect("loaded");
    }
    h
}

/// The unload step's agent: target 2.8.0, no tt-smi to install.
fn config(h: &Host) -> Config {
    Config {
        tt_smi_version: None,
        ..h.config("2.8.0")
    }
}

fn record(state: NodeState) -> NodeRecord {
    let mut r = NodeRecord::new(FAKE_POLICY, "2.8.0", FAKE_CYCLE);
    r.state = state;
    r.started = Some(FAKE_CYCLE);
    r.cordon = Cordon::Ours;
    r
}

fn unloading_node() -> k8s_openapi::api::core::v1::Node {
    let r = record(NodeState::Unloading);
    node_with(Some(&r), GoAhead::for_cycle(FAKE_NODE, &r).as_ref())
}

fn run(
    config: &Config,
    kernel: &FakeKernel,
    node: &FakeNode,
    pause: &FakePause,
) -> Result<Unloaded, AgentError> {
    Agent {
        config,
        kernel,
        killer: kernel,
        builder: &FakeBuilder::default(),
        node,
        pause,
    }
    .run_unload()
}

/// Runs the unload step on `h` with the unload go-ahead on its node.
fn run_with_go_ahead(h: &Host, kernel: &FakeKernel) -> (FakeNode, Result<Unloaded, AgentError>) {
    let n = FakeNode::with(unloading_node());
    let r = run(&config(h), kernel, &n, &FakePause::stopping_after(3));
    (n, r)
}

#[test]
fn without_the_unload_go_ahead_nothing_is_touched() {
    let h = host(Some("2.8.0"));
    let kernel = FakeKernel::new(h.root());
    // Still draining; and a swap go-ahead opens no unload.
    let draining = record(NodeState::Draining);
    let upgrading = record(NodeState::Upgrading);
    for node in [
        node_with(Some(&draining), None),
        node_with(
            Some(&upgrading),
            GoAhead::for_cycle(FAKE_NODE, &upgrading).as_ref(),
        ),
    ] {
        let n = FakeNode::with(node);
        let r = run(&config(&h), &kernel, &n, &FakePause::stopping_after(3));
        assert_matches!(r, Ok(Unloaded::Stopped { .. }));
        assert_eq!(kernel.unloads(), 0);
        assert_eq!(
            h.hr().loaded_version().expect("sysfs").as_deref(),
            Some("2.8.0")
        );
        // It wrote nothing to the Node, and is not Ready.
        assert!(n.calls().is_empty(), "{:?}", n.calls());
        let nr = unload::readiness(&h.hr(), Some(&h.note())).expect_err("not ready");
        assert!(nr.contains("go-ahead"), "{nr}");
    }
}

#[test]
fn with_the_go_ahead_it_unloads_and_removes_the_labels() {
    let h = host(Some("2.8.0"));
    let kernel = FakeKernel::new(h.root());
    let (n, r) = run_with_go_ahead(&h, &kernel);
    assert_eq!(
        r.expect("unloaded"),
        Unloaded::Done {
            previous: Some("2.8.0".into()),
            killed: vec![]
        }
    );
    assert_eq!(kernel.unloads(), 1);
    assert!(kernel.loads().is_empty(), "nothing loaded");
    assert_eq!(h.hr().loaded_version().expect("sysfs"), None);
    let l = n.labels();
    for k in [
        labels::KMD_VERSION,
        labels::INSTALL_MODE,
        labels::TT_SMI_VERSION,
    ] {
        assert_eq!(l.get(k), Some(&None), "{k} removed");
    }
    assert!(unload::readiness(&h.hr(), Some(&h.note())).is_ok());
}

#[test]
fn a_holder_stops_the_unload_with_device_busy() {
    let h = host(None);
    set_loaded(h.root(), "2.8.0", 1).expect("loaded");
    add_holder(h.root(), 4242, "python3", "0::/\n").expect("holder");
    let kernel = FakeKernel::new(h.root());
    let (_, r) = run_with_go_ahead(&h, &kernel);
    let e = r.expect_err("busy");
    let msg = unload::termination_message(&e);
    assert!(msg.starts_with("DeviceBusy:"), "{msg}");
    assert_eq!(kernel.unloads(), 0);
    assert!(kernel.killed().is_empty(), "no kill without forceUnload");
    assert!(unload::readiness(&h.hr(), Some(&h.note())).is_err());
}

#[test]
fn a_dkms_host_is_reported_and_left_alone() {
    let h = host(Some("2.6.0"));
    std::fs::create_dir_all(h.hr().path("/var/lib/dkms/tenstorrent")).expect("dkms");
    let kernel = FakeKernel::new(h.root());
    let (n, r) = run_with_go_ahead(&h, &kernel);
    assert_eq!(r.expect("host"), Unloaded::HostManaged);
    assert_eq!(kernel.unloads(), 0);
    assert_eq!(
        n.labels().get(labels::INSTALL_MODE),
        Some(&Some(labels::INSTALL_MODE_HOST.into()))
    );
}

#[test]
fn nothing_loaded_is_ready_at_once_after_the_go_ahead() {
    let h = host(None);
    let kernel = FakeKernel::new(h.root());
    let (_, r) = run_with_go_ahead(&h, &kernel);
    assert_eq!(
        r.expect("done"),
        Unloaded::Done {
            previous: None,
            killed: vec![]
        }
    );
    assert_eq!(kernel.unloads(), 0);
    assert!(unload::readiness(&h.hr(), Some(&h.note())).is_ok());
}
