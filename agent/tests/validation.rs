//! The check after a swap (`validate`), on a fake host with two Tenstorrent
//! functions: a swap that serves every card validates; one whose new module
//! probes none is rolled back to the cached previous version (or held), its
//! go-ahead is not used twice, and an agent restarted after the swap still
//! checks it.

mod common;

use ttdrv_agent::Rollback;
use ttdrv_agent::fake::{FakeKernel, add_cards, bind_cards, set_loaded};
use ttdrv_agent::node::fake::{FAKE_NODE, FAKE_POLICY, FakeNode, node_with, upgrading_record};
use ttdrv_agent::validate::{self, SwapOutcome};
use ttdrv_agent::{AgentError, Outcome};
use ttdrv_api::OnValidationFailure;
use ttdrv_api::labels;
use ttdrv_core::go_ahead::GoAhead;
use ttdrv_core::reason;

use common::host::{TestHost as Host, assert_matches, go_ahead, run, run_polls};

use ttdrv_agent::fake::FakeBuilder;

/// 2.7.0 loaded, serving two cards; 2.7.0 and 2.8.0 cached.
fn two_cards() -> Host {
    let h = Host::with_loaded("2.7.0", 0);
    add_cards(h.root(), 2).expect("cards");
    bind_cards(h.root()).expect("bind");
    h.cache("2.7.0");
    h.cache("2.8.0");
    h
}

/// What the host's swap record says of the last swap, if there is one.
fn outcome(h: &Host) -> Option<SwapOutcome> {
    validate::read_record(&h.hr()).map(|r| r.outcome)
}

/// A restart of the agent under the go-ahead of the cycle whose swap was
/// rolled back to 2.7.0: it waits, saying so (the caller checks it loaded
/// nothing).
fn assert_waits_rolled_back(h: &Host, kernel: &FakeKernel, node: &FakeNode) {
    let r = run_polls(&h.config("2.8.0"), kernel, &FakeBuilder::default(), node, 3);
    assert_matches!(r.result, Ok(Outcome::Stopped { ref waiting }) if waiting.contains("rolled back to 2.7.0"));
}

fn kmd_label(node: &FakeNode) -> Option<String> {
    node.labels().get(labels::KMD_VERSION).cloned().flatten()
}

/// A node whose go-ahead to swap to `target` is for the cycle that started at `cycle`.
fn go_ahead_in_cycle(target: &str, cycle: i64) -> FakeNode {
    let mut record = upgrading_record(FAKE_POLICY, target);
    record.started = Some(cycle);
    let go = GoAhead::for_cycle(FAKE_NODE, &record);
    FakeNode::with(node_with(Some(&record), go.as_ref()))
}

#[test]
fn a_swap_that_serves_every_card_validates_and_keeps_its_record_for_the_controller() {
    let h = two_cards();
    let kernel = FakeKernel::new(h.root());
    let node = go_ahead("2.8.0");
    let out = h.run_with("2.8.0", &kernel, &node).expect("installed");
    assert_matches!(out, Outcome::Installed { .. });
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    let now = validate::inventory(&h.hr());
    assert_eq!(now.functions.len(), 2, "{now:?}");
    assert_eq!(now.device_nodes.len(), 2, "{now:?}");
    // Kept: the controller may still find the swap failed and roll it back.
    let record = validate::read_record(&h.hr()).expect("record kept");
    assert_eq!(record.outcome, SwapOutcome::Validated);
    assert_eq!(record.previous.as_deref(), Some("2.7.0"));
    assert!(record.cycle.is_some());
}

#[test]
fn a_module_that_probes_no_card_is_rolled_back_to_the_previous_version() {
    let h = two_cards();
    let kernel = FakeKernel::new(h.root()).probing_none("2.8.0");
    let node = go_ahead("2.8.0");
    let err = h
        .run_with("2.8.0", &kernel, &node)
        .expect_err("validation fails");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED), "{err}");
    assert_matches!(&err, AgentError::ValidationFailed { rollback, .. }
        if matches!(rollback.as_ref(), Rollback::Restored { previous } if previous == "2.7.0"));
    let msg = err.to_string();
    for part in [
        "2.8.0",
        "0000:01:00.0",
        "0000:02:00.0",
        "rolled back",
        "2.7.0",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    // 2.8.0 was loaded, then 2.7.0 again; both cards served as before.
    assert_eq!(
        kernel.loads(),
        vec!["2.8.0".to_string(), "2.7.0".to_string()]
    );
    assert_eq!(kernel.unloads(), 2);
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    assert_eq!(validate::inventory(&h.hr()).functions.len(), 2);
    // The node says what runs now.
    assert_eq!(kmd_label(&node).as_deref(), Some("2.7.0"));
    let record = validate::read_record(&h.hr()).expect("record kept");
    assert_eq!(
        record.outcome,
        SwapOutcome::RolledBack { to: "2.7.0".into() }
    );
    assert!(record.cycle.is_some());
}

#[test]
fn a_rolled_back_swap_is_not_tried_again_under_the_same_go_ahead() {
    let h = two_cards();
    let node = go_ahead("2.8.0");
    let first = FakeKernel::new(h.root()).probing_none("2.8.0");
    h.run_with("2.8.0", &first, &node)
        .expect_err("validation fails");
    // The container restarts while the go-ahead is still on the node.
    let again = FakeKernel::new(h.root()).probing_none("2.8.0");
    assert_waits_rolled_back(&h, &again, &node);
    assert!(
        again.loads().is_empty(),
        "swapped again: {:?}",
        again.loads()
    );
    assert_eq!(again.unloads(), 0);
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    // A retry is a new cycle: its go-ahead opens the swap again.
    let retry = go_ahead_in_cycle("2.8.0", 1_700_000_999);
    let fixed = FakeKernel::new(h.root());
    let out = h.run_with("2.8.0", &fixed, &retry).expect("swapped");
    assert_matches!(out, Outcome::Installed { .. });
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert_eq!(outcome(&h), Some(SwapOutcome::Validated));
}

#[test]
fn hold_keeps_the_new_module_loaded_and_a_restart_checks_it_again() {
    let h = two_cards();
    let config = ttdrv_agent::Config {
        on_validation_failure: OnValidationFailure::Hold,
        ..h.config("2.8.0")
    };
    let node = go_ahead("2.8.0");
    let kernel = FakeKernel::new(h.root()).probing_none("2.8.0");
    let err = run(&config, &kernel, &FakeBuilder::default(), &node).expect_err("held");
    assert_matches!(&err, AgentError::ValidationFailed { rollback, .. }
        if matches!(rollback.as_ref(), Rollback::Held { version } if version == "2.8.0"));
    assert!(err.to_string().contains("hold"), "{err}");
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert_eq!(kernel.unloads(), 1, "only the old module was unloaded");
    assert_eq!(kmd_label(&node).as_deref(), Some("2.8.0"));
    assert_eq!(
        validate::read_record(&h.hr()).map(|r| r.outcome),
        Some(SwapOutcome::Held)
    );
    // Restarted: the target is loaded, but it has not validated: still failed, nothing unloaded.
    let restarted = FakeKernel::new(h.root());
    let err = run(&config, &restarted, &FakeBuilder::default(), &node).expect_err("still held");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED));
    assert_eq!(restarted.unloads(), 0);
    assert!(restarted.loads().is_empty());
    // A person brings the cards back (here: binds them): the next start validates.
    bind_cards(h.root()).expect("bind");
    let out = run(
        &config,
        &FakeKernel::new(h.root()),
        &FakeBuilder::default(),
        &node,
    )
    .expect("validated");
    assert_matches!(out, Outcome::AlreadyCurrent { .. });
    assert_eq!(outcome(&h), Some(SwapOutcome::Validated));
}

#[test]
fn without_the_previous_version_cached_the_new_one_stays_loaded() {
    let h = Host::with_loaded("2.7.0", 0);
    add_cards(h.root(), 1).expect("cards");
    bind_cards(h.root()).expect("bind");
    h.cache("2.8.0");
    let kernel = FakeKernel::new(h.root()).probing_none("2.8.0");
    let err = h
        .run_with("2.8.0", &kernel, &go_ahead("2.8.0"))
        .expect_err("validation fails");
    assert_matches!(&err, AgentError::ValidationFailed { rollback, .. }
        if matches!(rollback.as_ref(), Rollback::NotCached { .. }));
    assert!(
        err.to_string().contains("could not roll back to 2.7.0"),
        "{err}"
    );
    assert_eq!(
        h.loaded().as_deref(),
        Some("2.8.0"),
        "not left with nothing"
    );
    assert_eq!(kernel.unloads(), 1);
}

/// What a swap 2.7.0 -> 2.8.0 leaves when it stops after the unload (an
/// agent killed, a node rebooted): the record of what 2.7.0 served, nothing
/// loaded, the cards unbound.
fn swap_cut_after_the_unload(h: &Host) {
    let record = validate::SwapRecord {
        target: "2.8.0".into(),
        previous: Some("2.7.0".into()),
        previous_parameters: String::new(),
        cycle: Some(1),
        before: validate::inventory(&h.hr()),
        outcome: SwapOutcome::Validating,
        problems: vec![],
    };
    validate::write_record(&h.hr(), &record).expect("record");
    ttdrv_agent::fake::unbind_cards(h.root()).expect("unbind");
    std::fs::remove_dir_all(h.p("/sys/module/tenstorrent")).expect("unload");
}

#[test]
fn an_agent_stopped_between_the_load_and_the_check_checks_on_its_next_start() {
    let h = two_cards();
    // What a swap leaves when the agent dies right after the load: the
    // record of what 2.7.0 served, 2.8.0 loaded, its cards not (yet) there.
    swap_cut_after_the_unload(&h);
    set_loaded(h.root(), "2.8.0", 0).expect("loaded");
    let err = h
        .run_with("2.8.0", &FakeKernel::new(h.root()), &go_ahead("2.8.0"))
        .expect_err("not validated");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED), "{err}");
    assert!(err.to_string().contains("0000:01:00.0"), "{err}");
}

#[test]
fn a_swap_cut_by_a_reboot_is_validated_when_the_next_boot_loads_the_target() {
    let h = two_cards();
    swap_cut_after_the_unload(&h);
    let kernel = FakeKernel::new(h.root());
    let out = h
        .run_with("2.8.0", &kernel, &go_ahead("2.8.0"))
        .expect("installed");
    assert_matches!(out, Outcome::Installed { .. });
    assert_eq!(kernel.unloads(), 0, "nothing was loaded");
    assert_eq!(
        outcome(&h),
        Some(SwapOutcome::Validated),
        "the record of the cut swap validated"
    );
}

#[test]
fn a_swap_cut_by_a_reboot_whose_target_serves_no_card_fails_validation() {
    let h = two_cards();
    swap_cut_after_the_unload(&h);
    let kernel = FakeKernel::new(h.root()).probing_none("2.8.0");
    let err = h
        .run_with("2.8.0", &kernel, &go_ahead("2.8.0"))
        .expect_err("the cards the old module served are not served");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED), "{err}");
    assert!(err.to_string().contains("0000:01:00.0"), "{err}");
    assert_eq!(
        validate::read_record(&h.hr()).map(|r| r.outcome),
        Some(SwapOutcome::Held)
    );
}

#[test]
fn a_failed_load_put_back_is_not_retried_under_the_same_go_ahead() {
    let h = two_cards();
    let node = go_ahead("2.8.0");
    let kernel = FakeKernel::new(h.root()).failing("2.8.0");
    let err = h.run_with("2.8.0", &kernel, &node).expect_err("load fails");
    assert_eq!(err.reason(), Some(reason::LOAD_FAILED));
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    let again = FakeKernel::new(h.root());
    let r = run_polls(
        &h.config("2.8.0"),
        &again,
        &FakeBuilder::default(),
        &node,
        3,
    );
    assert_matches!(r.result, Ok(Outcome::Stopped { .. }));
    assert!(again.loads().is_empty(), "{:?}", again.loads());
}

/// Removes one served function from the fake host, as a card that fell off
/// the bus: its driver link, its class device and one device node.
fn lose_card(h: &Host, function: &str, card: u32) {
    let r = h.hr();
    std::fs::remove_file(r.path(format!("/sys/bus/pci/drivers/tenstorrent/{function}")))
        .expect("unbind");
    std::fs::remove_dir_all(r.path(format!("/sys/class/tenstorrent/tenstorrent!{card}")))
        .expect("class device");
    std::fs::remove_file(r.path(format!("/dev/tenstorrent/{card}"))).expect("device node");
}

#[test]
fn after_a_validated_swap_a_lost_card_makes_the_installer_not_ready() {
    let h = two_cards();
    let kernel = FakeKernel::new(h.root());
    let node = go_ahead("2.8.0");
    h.run_with("2.8.0", &kernel, &node).expect("installed");
    let ready = |h: &Host| ttdrv_agent::pod::readiness(&h.hr(), "2.8.0", &Default::default(), None);
    assert!(ready(&h).is_ok(), "{:?}", ready(&h));
    lose_card(&h, "0000:02:00.0", 1);
    let err = ready(&h).expect_err("a lost card: not Ready");
    for part in ["lost cards", "0000:02:00.0", "when it validated"] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    // Handed to a VM instead (vfio-pci): not lost.
    let vfio = h.hr().path("/sys/bus/pci/drivers/vfio-pci/0000:02:00.0");
    std::fs::create_dir_all(&vfio).expect("vfio-pci");
    assert!(ready(&h).is_ok(), "{:?}", ready(&h));
}

#[test]
fn an_agent_that_finds_its_target_loaded_notes_what_it_serves() {
    let h = Host::with_loaded("2.8.0", 0);
    add_cards(h.root(), 2).expect("cards");
    bind_cards(h.root()).expect("bind");
    h.cache("2.8.0");
    let kernel = FakeKernel::new(h.root());
    h.run_with("2.8.0", &kernel, &go_ahead("2.8.0"))
        .expect("at target");
    assert!(kernel.loads().is_empty(), "nothing swapped");
    lose_card(&h, "0000:01:00.0", 0);
    let err = ttdrv_agent::pod::readiness(&h.hr(), "2.8.0", &Default::default(), None)
        .expect_err("not Ready");
    assert!(err.contains("0000:01:00.0"), "{err}");
    // Another version loaded: the note is not its baseline.
    assert!(validate::lost(&h.hr(), "2.9.0").is_empty());
}

#[test]
fn a_card_served_without_the_telemetry_it_had_fails_a_swap_to_any_2x_but_not_to_1x() {
    // 2.8.0 serves both cards but without tt_* (a Blackhole whose firmware
    // was late at probe): the upgrade fails naming them and rolls back.
    let h = two_cards();
    let kernel = FakeKernel::new(h.root()).without_telemetry("2.8.0");
    let node = go_ahead("2.8.0");
    let err = h
        .run_with("2.8.0", &kernel, &node)
        .expect_err("validation fails");
    assert_matches!(&err, AgentError::ValidationFailed { rollback, .. }
        if matches!(rollback.as_ref(), Rollback::Restored { previous } if previous == "2.7.0"));
    let msg = err.to_string();
    assert!(
        msg.contains("0000:01:00.0, 0000:02:00.0 served without tt_* attributes"),
        "{msg}"
    );
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    // Down to a 2.x release: the same.
    let from_2_8 = || {
        let h = Host::with_loaded("2.8.0", 0);
        add_cards(h.root(), 2).expect("cards");
        bind_cards(h.root()).expect("bind");
        h.cache("2.8.0");
        h
    };
    let h = from_2_8();
    h.cache("2.7.0");
    let kernel = FakeKernel::new(h.root()).without_telemetry("2.7.0");
    let err = h
        .run_with("2.7.0", &kernel, &go_ahead("2.7.0"))
        .expect_err("2.7.0 serves tt_* attributes: their absence fails");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED), "{err}");
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    // To tt-kmd 1.x, which may have none: no failure.
    let h = from_2_8();
    h.cache("1.27.1");
    let kernel = FakeKernel::new(h.root()).without_telemetry("1.27.1");
    let out = h
        .run_with("1.27.1", &kernel, &go_ahead("1.27.1"))
        .expect("a 1.x release is not failed for telemetry");
    assert_matches!(out, Outcome::Installed { .. });
    assert_eq!(h.loaded().as_deref(), Some("1.27.1"));
}

/// The go-ahead of `cycle` to swap to `target`, and the controller's verdict
/// (`labels::ROLLBACK_VERDICT`) naming `verdict`.
fn go_ahead_with_verdict(target: &str, cycle: i64, verdict: i64) -> FakeNode {
    let mut record = upgrading_record(FAKE_POLICY, target);
    record.started = Some(cycle);
    let go = GoAhead::for_cycle(FAKE_NODE, &record);
    let mut node = node_with(Some(&record), go.as_ref());
    node.metadata
        .annotations
        .get_or_insert_default()
        .insert(labels::ROLLBACK_VERDICT.into(), verdict.to_string());
    FakeNode::with(node)
}

#[test]
fn the_controllers_verdict_rolls_a_validated_swap_back_once() {
    const CYCLE: i64 = 1_700_000_500;
    let h = two_cards();
    let kernel = FakeKernel::new(h.root());
    let out = h
        .run_with("2.8.0", &kernel, &go_ahead_in_cycle("2.8.0", CYCLE))
        .expect("installed");
    assert_matches!(out, Outcome::Installed { .. });
    assert_eq!(outcome(&h), Some(SwapOutcome::Validated));
    // The scheduler did not see every card: the controller restarts the
    // agent with its verdict on the node.
    let node = go_ahead_with_verdict("2.8.0", CYCLE, CYCLE);
    let restarted = FakeKernel::new(h.root());
    let err = h
        .run_with("2.8.0", &restarted, &node)
        .expect_err("rolled back");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED), "{err}");
    assert_matches!(&err, AgentError::ValidationFailed { rollback, .. }
        if matches!(rollback.as_ref(), Rollback::Restored { previous } if previous == "2.7.0"));
    let msg = err.to_string();
    for part in ["scheduler", "cycle 1700000500", "rolled back", "2.7.0"] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    assert_eq!(restarted.loads(), vec!["2.7.0".to_string()]);
    assert_eq!(restarted.unloads(), 1);
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    assert_eq!(validate::inventory(&h.hr()).functions.len(), 2);
    assert_eq!(kmd_label(&node).as_deref(), Some("2.7.0"));
    assert_eq!(
        outcome(&h),
        Some(SwapOutcome::RolledBack { to: "2.7.0".into() })
    );
    // Restarted again under the same go-ahead: no second swap to 2.8.0.
    let again = FakeKernel::new(h.root());
    assert_waits_rolled_back(&h, &again, &node);
    assert!(again.loads().is_empty(), "{:?}", again.loads());
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
}

#[test]
fn a_verdict_on_another_cycle_leaves_the_validated_swap_alone() {
    const CYCLE: i64 = 1_700_000_500;
    let h = two_cards();
    h.run_with(
        "2.8.0",
        &FakeKernel::new(h.root()),
        &go_ahead_in_cycle("2.8.0", CYCLE),
    )
    .expect("installed");
    let kernel = FakeKernel::new(h.root());
    let node = go_ahead_with_verdict("2.8.0", CYCLE, CYCLE - 100);
    let out = h.run_with("2.8.0", &kernel, &node).expect("current");
    assert_matches!(out, Outcome::AlreadyCurrent { .. });
    assert_eq!((kernel.loads().len(), kernel.unloads()), (0, 0));
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert_eq!(outcome(&h), Some(SwapOutcome::Validated));
}

#[test]
fn with_hold_the_verdict_keeps_the_new_module_loaded() {
    const CYCLE: i64 = 1_700_000_500;
    let h = two_cards();
    let config = ttdrv_agent::Config {
        on_validation_failure: OnValidationFailure::Hold,
        ..h.config("2.8.0")
    };
    run(
        &config,
        &FakeKernel::new(h.root()),
        &FakeBuilder::default(),
        &go_ahead_in_cycle("2.8.0", CYCLE),
    )
    .expect("installed");
    let kernel = FakeKernel::new(h.root());
    let node = go_ahead_with_verdict("2.8.0", CYCLE, CYCLE);
    let err = run(&config, &kernel, &FakeBuilder::default(), &node).expect_err("held");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED), "{err}");
    assert!(err.to_string().contains("not rolled back"), "{err}");
    assert_eq!((kernel.loads().len(), kernel.unloads()), (0, 0));
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert_eq!(outcome(&h), Some(SwapOutcome::Held));
}

#[test]
fn a_validated_swap_loaded_afresh_after_a_reboot_is_checked_again() {
    let h = two_cards();
    h.run_with(
        "2.8.0",
        &FakeKernel::new(h.root()),
        &go_ahead_in_cycle("2.8.0", 1_700_000_500),
    )
    .expect("installed");
    assert_eq!(outcome(&h), Some(SwapOutcome::Validated));
    // A reboot: nothing loaded, the cards unbound; this boot's load of
    // 2.8.0 probes none of them.
    ttdrv_agent::fake::unbind_cards(h.root()).expect("unbind");
    std::fs::remove_dir_all(h.p("/sys/module/tenstorrent")).expect("unload");
    let kernel = FakeKernel::new(h.root()).probing_none("2.8.0");
    let err = h
        .run_with("2.8.0", &kernel, &FakeNode::default())
        .expect_err("the cards on the bus are not served");
    assert_eq!(err.reason(), Some(reason::VALIDATION_FAILED), "{err}");
    assert!(err.to_string().contains("0000:01:00.0"), "{err}");
}
