//! `spec.moduleParameters` on a fake host: passed at load, refused before
//! the unload when the module lacks one, a same-version change reloaded only
//! with the go-ahead, read back, and the host's `options tenstorrent` lines
//! adopted under the policy's.

mod common;

use std::fs;

use ttdrv_agent::fake::{FakeBuilder, FakeKernel, set_loaded, set_parameters};
use ttdrv_agent::node::fake::FakeNode;
use ttdrv_agent::{AgentError, Config, Outcome};
use ttdrv_api::labels;
use ttdrv_api::module_params::{self, Values};

use common::host::{TestHost as Host, WAITING, assert_untouched, go_ahead, run, run_polls};

fn values(s: &str) -> Values {
    module_params::parse(s).expect("canonical")
}

fn with_parameters(h: &Host, target: &str, parameters: &str) -> Config {
    Config {
        module_parameters: values(parameters),
        ..h.config(target)
    }
}

/// What sysfs shows of the loaded module's parameters.
fn sysfs(h: &Host) -> String {
    let s = h.hr().module_state().expect("sysfs").expect("loaded");
    module_params::canonical(&s.parameters)
}

fn annotation(node: &FakeNode, key: &str) -> Option<String> {
    node.annotations().get(key).cloned().flatten()
}

#[test]
fn parameters_are_passed_at_load_read_back_and_reported() {
    let h = Host::new();
    h.cache("2.8.0");
    let kernel = FakeKernel::new(h.root());
    let node = FakeNode::default();
    let config = with_parameters(&h, "2.8.0", "max_devices=4 power_policy=N");
    let outcome = run(&config, &kernel, &FakeBuilder::default(), &node).expect("installed");
    assert!(matches!(outcome, Outcome::Installed { .. }), "{outcome:?}");
    assert_eq!(
        kernel.load_parameters(),
        vec!["max_devices=4 power_policy=N".to_string()]
    );
    // 2.8.0 has no idle_power_down_grace_ms (2.9.0 and later).
    let shown =
        "auto_reset_timeout=10 dma_address_bits=0 max_devices=4 power_policy=N reset_limit=10";
    assert_eq!(sysfs(&h), shown);
    assert_eq!(
        annotation(&node, labels::KMD_PARAMETERS).as_deref(),
        Some(shown)
    );
    // Without parameters the load string stays empty, as before.
    let h = Host::new();
    h.cache("2.8.0");
    let kernel = FakeKernel::new(h.root());
    run(
        &h.config("2.8.0"),
        &kernel,
        &FakeBuilder::default(),
        &FakeNode::default(),
    )
    .expect("installed");
    assert_eq!(kernel.load_parameters(), vec![String::new()]);
}

#[test]
fn a_parameter_the_module_lacks_is_refused_before_the_go_ahead_and_the_unload() {
    let h = Host::with_loaded("2.7.0", 0);
    h.cache("2.8.0");
    let kernel = FakeKernel::new(h.root());
    // The go-ahead is there: even so nothing is unloaded.
    let node = go_ahead("2.8.0");
    let config = with_parameters(&h, "2.8.0", "idle_power_down_grace_ms=0 max_devices=4");
    let err = run(&config, &kernel, &FakeBuilder::default(), &node).expect_err("refused");
    let msg = err.to_string();
    assert!(
        matches!(err, AgentError::ParameterNotDeclared { .. }),
        "{msg}"
    );
    for part in [
        "tenstorrent 2.8.0 has no module parameter idle_power_down_grace_ms",
        "since tt-kmd 2.9.0",
        "nothing was unloaded",
    ] {
        assert!(msg.contains(part), "{part}: {msg}");
    }
    assert_eq!(err.reason(), Some(ttdrv_core::reason::LOAD_FAILED));
    assert_untouched(&h, &kernel);
    // Not reported prepared: the controller must not start a cycle on it.
    assert_eq!(node.labels().get(labels::KMD_PREPARED), None);
}

#[test]
fn a_same_version_parameter_change_reloads_only_with_the_go_ahead() {
    let h = Host::with_loaded("2.8.0", 0);
    set_parameters(h.root(), &module_params::defaults()).expect("sysfs");
    h.cache("2.8.0");
    let config = with_parameters(&h, "2.8.0", "max_devices=4");

    // No go-ahead: prepared, waiting, the module left alone.
    let kernel = FakeKernel::new(h.root());
    let node = FakeNode::default();
    let r = run_polls(&config, &kernel, &FakeBuilder::default(), &node, 2);
    assert!(
        matches!(&r.result, Ok(Outcome::Stopped { waiting }) if waiting.contains(
            "reload tt-kmd 2.8.0 with module parameters max_devices=4 (now: max_devices=32 (wanted 4))"
        )),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert_eq!(kernel.unloads(), 0);
    assert!(kernel.loads().is_empty());
    assert!(r.log.contains(WAITING), "{}", r.log);
    assert_eq!(
        node.labels().get(labels::KMD_PREPARED),
        Some(&Some("2.8.0".to_string()))
    );
    assert!(
        annotation(&node, labels::KMD_PARAMETERS).is_some_and(|a| a.contains("max_devices=32")),
        "what is in effect is reported before the wait: {:?}",
        node.annotations()
    );

    // With it: unloaded, the same version loaded from the cache with them.
    let kernel = FakeKernel::new(h.root());
    let node = go_ahead("2.8.0");
    let outcome = run(&config, &kernel, &FakeBuilder::default(), &node).expect("reloaded");
    assert!(
        matches!(&outcome, Outcome::Installed { version, previous: Some(p), .. } if version == "2.8.0" && p == "2.8.0"),
        "{outcome:?}"
    );
    assert_eq!(kernel.unloads(), 1);
    assert_eq!(kernel.load_parameters(), vec!["max_devices=4".to_string()]);
    assert!(sysfs(&h).contains("max_devices=4"), "{}", sysfs(&h));
    assert!(
        annotation(&node, labels::KMD_PARAMETERS).is_some_and(|a| a.contains("max_devices=4")),
        "{:?}",
        node.annotations()
    );
    // The target is loaded: nothing is prepared for a swap any more.
    assert_eq!(node.labels().get(labels::KMD_PREPARED), Some(&None));

    // Ready only with the parameters in effect.
    let ready = |p: &str| ttdrv_agent::pod::readiness(&h.hr(), "2.8.0", &values(p), None);
    assert!(ready("max_devices=4").is_ok());
    let e = ready("max_devices=8").expect_err("other parameters");
    assert!(
        e.contains("with module parameters max_devices=4 (wanted 8)"),
        "{e}"
    );

    // A restart finds the target in effect: nothing to do, no go-ahead read;
    // the node is read once, for the controller's verdict on the swap it
    // validated (unreadable here: no verdict).
    let kernel = FakeKernel::new(h.root());
    let node = FakeNode::default();
    let outcome = run(&config, &kernel, &FakeBuilder::default(), &node).expect("current");
    assert_eq!(
        outcome,
        Outcome::AlreadyCurrent {
            version: "2.8.0".into()
        }
    );
    assert_eq!(kernel.unloads(), 0);
    assert_eq!(node.gets(), 1);
}

#[test]
fn parameters_not_in_effect_after_the_load_fail_the_node() {
    let h = Host::new();
    h.cache("2.8.0");
    let mut kernel = FakeKernel::new(h.root());
    kernel.drop_parameters = true;
    let config = with_parameters(&h, "2.8.0", "reset_limit=3");
    let err = run(
        &config,
        &kernel,
        &FakeBuilder::default(),
        &FakeNode::default(),
    )
    .expect_err("not in effect");
    let msg = err.to_string();
    assert!(
        matches!(err, AgentError::ParametersNotInEffect { .. }),
        "{msg}"
    );
    assert!(msg.contains("reset_limit=10 (wanted 3)"), "{msg}");
    assert_eq!(err.reason(), Some(ttdrv_core::reason::LOAD_FAILED));
}

#[test]
fn a_dkms_hosts_options_are_adopted_at_the_hand_over_under_the_policys() {
    // DKMS is gone (no signal left), its module still loaded with the
    // host's options; /etc/modprobe.d keeps them.
    let h = Host::with_loaded("2.7.0", 0);
    set_parameters(
        h.root(),
        &values(
            "auto_reset_timeout=10 dma_address_bits=0 max_devices=8 power_policy=N reset_limit=3",
        ),
    )
    .expect("sysfs");
    fs::create_dir_all(h.p("/etc/modprobe.d")).expect("mkdir");
    fs::write(
        h.p("/etc/modprobe.d/tenstorrent.conf"),
        "# written by the site's DKMS setup\noptions tenstorrent max_devices=8 \\\n  power_policy=0 arc_fw_init=Y\noptions tenstorrent reset_limit=3\n",
    )
    .expect("conf");
    h.cache("2.8.0");
    let kernel = FakeKernel::new(h.root());
    let node = go_ahead("2.8.0");
    // The policy sets reset_limit: it wins over the host's 3.
    let config = with_parameters(&h, "2.8.0", "reset_limit=5");
    let r = run_polls(&config, &kernel, &FakeBuilder::default(), &node, 2);
    assert!(
        matches!(r.result, Ok(Outcome::Installed { .. })),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert_eq!(
        kernel.load_parameters(),
        vec!["max_devices=8 power_policy=N reset_limit=5".to_string()]
    );
    assert_eq!(
        sysfs(&h),
        "auto_reset_timeout=10 dma_address_bits=0 max_devices=8 power_policy=N reset_limit=5"
    );
    // The host's options as it wrote them, its arc_fw_init (2.0.0's own) too.
    assert_eq!(
        annotation(&node, labels::KMD_HOST_OPTIONS).as_deref(),
        Some("arc_fw_init=Y max_devices=8 power_policy=N reset_limit=3")
    );
    for part in [
        "are adopted at every load",
        "/etc/modprobe.d/tenstorrent.conf",
        "arc_fw_init",
    ] {
        assert!(r.log.contains(part), "{part}: {}", r.log);
    }
    // Without options on the host the annotation goes.
    fs::remove_file(h.p("/etc/modprobe.d/tenstorrent.conf")).expect("rm");
    let node = FakeNode::default();
    h.run_config(&config, &node).expect("current");
    assert_eq!(
        node.annotations().get(labels::KMD_HOST_OPTIONS),
        Some(&None)
    );
}

#[test]
fn an_unloaded_module_leaves_no_parameters_reported() {
    let h = Host::new();
    set_loaded(h.root(), "2.8.0", 0).expect("loaded");
    // A module without a parameters/ directory shows none.
    let node = FakeNode::default();
    run(
        &h.config("2.8.0"),
        &FakeKernel::new(h.root()),
        &FakeBuilder::default(),
        &node,
    )
    .expect("current");
    assert_eq!(node.annotations().get(labels::KMD_PARAMETERS), Some(&None));
}

#[test]
fn an_older_releases_own_options_are_passed_to_it_as_it_declares_them() {
    // A host on 2.0.0 (which the chart pins) with that release's own
    // parameters in its options: today's list has neither, the module has.
    let h = Host::with_loaded("2.0.0", 0);
    fs::create_dir_all(h.p("/etc/modprobe.d")).expect("mkdir");
    fs::write(
        h.p("/etc/modprobe.d/tenstorrent.conf"),
        "options tenstorrent arc_fw_init=0 ddr_frequency_override=0x10 max_devices=4 watchdog_fw_en=1\n",
    )
    .expect("conf");
    h.cache("2.1.0");
    let kernel = FakeKernel::new(h.root());
    let node = go_ahead("2.1.0");
    let config = with_parameters(&h, "2.1.0", "");
    let r = run_polls(&config, &kernel, &FakeBuilder::default(), &node, 2);
    assert!(
        matches!(r.result, Ok(Outcome::Installed { .. })),
        "{:?}\n{}",
        r.result,
        r.log
    );
    // Read as the module's parmtype says (bool N, uint 16); watchdog_fw_en
    // is not one of the fake 2.1.0's: not passed, and said so.
    assert_eq!(
        kernel.load_parameters(),
        vec!["arc_fw_init=N ddr_frequency_override=16 max_devices=4".to_string()]
    );
    assert!(
        r.log.contains("watchdog_fw_en=1 is not adopted"),
        "{}",
        r.log
    );
}

#[test]
fn a_parameter_writable_at_run_time_is_written_in_sysfs_without_a_reload() {
    // 2.10.0 loaded and in use: idle_power_down_grace_ms is 0644 in tt-kmd.
    let h = Host::with_loaded("2.10.0", 2);
    set_parameters(
        h.root(),
        &values("auto_reset_timeout=10 dma_address_bits=0 idle_power_down_grace_ms=5000 max_devices=32 power_policy=Y reset_limit=10"),
    )
    .expect("sysfs");
    let kernel = FakeKernel::new(h.root());
    // No go-ahead on the node: none is needed, nothing is unloaded.
    let node = FakeNode::default();
    let config = with_parameters(&h, "2.10.0", "idle_power_down_grace_ms=50");
    let r = run_polls(&config, &kernel, &FakeBuilder::default(), &node, 2);
    assert!(
        matches!(r.result, Ok(Outcome::AlreadyCurrent { .. })),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert!(kernel.load_parameters().is_empty(), "nothing loaded");
    assert!(
        sysfs(&h).contains("idle_power_down_grace_ms=50"),
        "{}",
        sysfs(&h)
    );
    assert!(r.log.contains("written at run time"), "{}", r.log);
    // A load-time parameter with it: that is a swap, which waits for the
    // go-ahead (none here), and nothing is written.
    set_parameters(
        h.root(),
        &values("auto_reset_timeout=10 dma_address_bits=0 idle_power_down_grace_ms=5000 max_devices=32 power_policy=Y reset_limit=10"),
    )
    .expect("sysfs");
    let config = with_parameters(&h, "2.10.0", "idle_power_down_grace_ms=50 max_devices=4");
    let r = run_polls(&config, &kernel, &FakeBuilder::default(), &node, 2);
    assert!(
        !matches!(r.result, Ok(Outcome::AlreadyCurrent { .. })),
        "{:?}",
        r.result
    );
    assert!(
        sysfs(&h).contains("idle_power_down_grace_ms=5000"),
        "{}",
        sysfs(&h)
    );
    assert_eq!(kernel.unloads(), 0);
}
