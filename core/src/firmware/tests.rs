use super::*;
use FirmwareNodeState::*;
use ttdrv_api::firmware::job_name_for;

fn want() -> Desired {
    Desired {
        policy: "fw".into(),
        uid: Some("uid-1".into()),
        version: "19.8.0".into(),
        readback: "19.8.0.0".into(),
        drain_enabled: true,
        drain_timeout_seconds: 600,
        paused: false,
        auto_upgrade: true,
        halted: false,
        min_driver: None,
        surface_timeout_seconds: 300,
    }
}

fn obs() -> Observation {
    Observation {
        now: 1000,
        node: "n1".into(),
        ready: true,
        current: Some("19.7.0.0".into()),
        ..Default::default()
    }
}

fn drained() -> Option<DrainProgress> {
    Some(DrainProgress::default())
}

fn report(after: &[&str]) -> Option<Report> {
    Some(Report {
        after: after.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

fn new() -> FwRecord {
    FwRecord::new("fw", "19.8.0", 0)
}

#[test]
fn a_full_cycle_cordons_drains_flashes_and_uncordons() {
    let w = want();
    let s = step(&new(), &obs(), &w);
    assert!(s.needs_slot && s.commands.is_empty(), "{s:?}");
    assert_eq!(s.record.reason.as_deref(), Some(reason::WAITING_FOR_SLOT));

    let s = step(
        &s.record,
        &Observation {
            slot: true,
            ..obs()
        },
        &w,
    );
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Cordoning, &[Command::Cordon][..])
    );
    assert_eq!(s.record.cordon, Cordon::Ours);

    let cordoned = Observation {
        unschedulable: true,
        ..obs()
    };
    let s = step(&s.record, &cordoned, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Draining, &[Command::Evict][..])
    );

    let busy = Observation {
        drain: Some(DrainProgress {
            remaining: vec!["ns/p".into()],
            blocking_pdbs: vec![],
        }),
        ..cordoned.clone()
    };
    let s = step(&s.record, &busy, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Draining, &[Command::Evict][..])
    );

    let s = step(
        &s.record,
        &Observation {
            drain: drained(),
            ..cordoned.clone()
        },
        &w,
    );
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Flashing, &[Command::CreateJob][..])
    );
    assert_eq!(
        s.record.job.as_deref(),
        Some(job_name_for("fw", "n1", "19.8.0", 0).as_str()),
        "named before it exists"
    );

    // Created by this controller, not in its cache yet: waited for, neither
    // failed nor created again.
    let s = step(
        &s.record,
        &Observation {
            own_job: OwnJob::CreatedUnseen { at: 1000 },
            ..cordoned.clone()
        },
        &w,
    );
    assert_eq!((s.record.state, &s.commands[..]), (Flashing, &[][..]));

    let running = Observation {
        job: FlashJob::Running {
            name: "j".into(),
            image_pull_failed: false,
        },
        ..cordoned.clone()
    };
    let s = step(&s.record, &running, &w);
    assert_eq!(
        (s.record.state, s.record.job.as_deref()),
        (Flashing, Some("j"))
    );
    assert!(s.commands.is_empty());

    let done = Observation {
        job: FlashJob::Succeeded {
            name: "j".into(),
            report: report(&["19.8.0.0", "19.8.0.0"]),
        },
        ..cordoned.clone()
    };
    let s = step(&s.record, &done, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Uncordoning, &[Command::Uncordon][..])
    );
    assert_eq!(s.record.current.as_deref(), Some("19.8.0.0"));

    let s = step(
        &s.record,
        &Observation {
            unschedulable: false,
            ..done
        },
        &w,
    );
    assert_eq!((s.record.state, s.record.cordon), (Done, Cordon::None));
    assert!(s.commands.is_empty());
}

#[test]
fn nothing_starts_while_a_driver_cycle_holds_the_node() {
    let o = Observation {
        slot: true,
        held_by: Some(crate::slots::Holder::driver("fleet".into())),
        ..obs()
    };
    let s = step(&new(), &o, &want());
    assert_eq!(s.record.reason.as_deref(), Some(reason::WAITING_FOR_DRIVER));
    assert!(s.commands.is_empty() && !s.needs_slot, "{s:?}");
    // Drained, and a driver cycle shows up: the flash waits.
    let mut r = new();
    r.state = Draining;
    r.cordon = Cordon::Ours;
    let o = Observation {
        unschedulable: true,
        drain: drained(),
        ..o
    };
    let s = step(&r, &o, &want());
    assert_eq!(s.record.state, Draining);
    assert!(!s.commands.contains(&Command::CreateJob));
}

#[test]
fn someone_elses_cordon_is_left_alone() {
    let o = Observation {
        slot: true,
        unschedulable: true,
        ..obs()
    };
    let s = step(&new(), &o, &want());
    assert_eq!(
        (s.record.state, s.record.reason.as_deref()),
        (Pending, Some(reason::EXTERNAL_CORDON))
    );
    assert!(s.commands.is_empty());
}

#[test]
fn a_node_at_the_target_is_done_without_a_cycle() {
    let o = Observation {
        current: Some("19.8.0.0".into()),
        ..obs()
    };
    let s = step(&new(), &o, &want());
    assert_eq!(s.record.state, Done);
    assert!(s.commands.is_empty() && !s.needs_slot);
}

#[test]
fn policy_knobs_park_pending_nodes_with_their_own_reason() {
    for (w, why) in [
        (
            Desired {
                paused: true,
                ..want()
            },
            reason::PAUSED,
        ),
        (
            Desired {
                halted: true,
                ..want()
            },
            reason::ROLLOUT_HALTED,
        ),
        (
            Desired {
                auto_upgrade: false,
                ..want()
            },
            reason::AUTO_UPGRADE_DISABLED,
        ),
    ] {
        let s = step(
            &new(),
            &Observation {
                slot: true,
                ..obs()
            },
            &w,
        );
        assert_eq!(
            (s.record.state, s.record.reason.as_deref()),
            (Pending, Some(why))
        );
        assert!(s.commands.is_empty() && !s.needs_slot);
    }
    let s = step(
        &new(),
        &Observation {
            slot: true,
            ready: false,
            ..obs()
        },
        &want(),
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::NODE_NOT_READY));
    assert!(s.commands.is_empty());
}

#[test]
fn a_readback_mismatch_fails_and_keeps_the_cordon() {
    let mut r = new();
    r.state = Flashing;
    r.cordon = Cordon::Ours;
    r.job = Some("j".into());
    let o = Observation {
        unschedulable: true,
        job: FlashJob::Succeeded {
            name: "j".into(),
            report: report(&["19.8.0.0", "19.7.0.0"]),
        },
        ..obs()
    };
    let s = step(&r, &o, &want());
    assert_eq!(
        (s.record.state, s.record.reason.as_deref()),
        (Failed, Some(reason::READBACK_MISMATCH))
    );
    assert_eq!(s.record.cordon, Cordon::Ours);
    assert!(s.commands.is_empty(), "no uncordon over half-written cards");
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("19.7.0.0"))
    );
}

#[test]
fn a_failed_job_says_why() {
    let mut r = new();
    r.state = Flashing;
    let cases = [
        (
            FlashJob::Failed {
                name: "j".into(),
                report: None,
                deadline: true,
            },
            reason::FLASH_TIMEOUT,
        ),
        (
            FlashJob::Failed {
                name: "j".into(),
                report: None,
                deadline: false,
            },
            reason::FLASH_JOB_FAILED,
        ),
        (
            FlashJob::Failed {
                name: "j".into(),
                report: Some(Report {
                    reason: Some(reason::READBACK_MISMATCH.into()),
                    message: Some("card 1 reads 19.7.0.0".into()),
                    ..Default::default()
                }),
                deadline: false,
            },
            reason::READBACK_MISMATCH,
        ),
        (
            FlashJob::Failed {
                name: "j".into(),
                report: Some(Report {
                    reason: Some("Invented".into()),
                    ..Default::default()
                }),
                deadline: false,
            },
            reason::FLASH_JOB_FAILED,
        ),
    ];
    for (job, why) in cases {
        let s = step(&r, &Observation { job, ..obs() }, &want());
        assert_eq!(
            (s.record.state, s.record.reason.as_deref()),
            (Failed, Some(why))
        );
    }
}

#[test]
fn a_vanished_job_fails_and_is_never_recreated_by_itself() {
    let mut r = new();
    r.state = Flashing;
    r.job = Some("j".into());
    r.job_seen = true;
    let s = step(&r, &obs(), &want());
    assert_eq!(s.record.state, Failed);
    assert!(s.commands.is_empty());
    // Stays Failed on later steps.
    let s2 = step(
        &s.record,
        &Observation {
            slot: true,
            ..obs()
        },
        &want(),
    );
    assert_eq!(s2.record.state, Failed);
    assert!(s2.commands.is_empty());
}

#[test]
fn a_drain_timeout_fails_and_gives_the_node_back() {
    let mut r = new();
    r.state = Draining;
    r.cordon = Cordon::Ours;
    r.since = 0;
    let o = Observation {
        now: 601,
        unschedulable: true,
        drain: Some(DrainProgress {
            remaining: vec!["ns/hold".into()],
            blocking_pdbs: vec![],
        }),
        ..obs()
    };
    let s = step(&r, &o, &want());
    assert_eq!(
        (s.record.state, s.record.reason.as_deref()),
        (Failed, Some(reason::DRAIN_TIMEOUT))
    );
    assert_eq!(s.commands, vec![Command::Uncordon]);
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("drain timeout after "))
    );
}

#[test]
fn retry_goes_on_from_the_kept_cordon() {
    let mut r = new();
    r.state = Failed;
    r.cordon = Cordon::Ours;
    r.job = Some("j".into());
    let o = Observation {
        unschedulable: true,
        retry_token: Some("1".into()),
        slot: true,
        ..obs()
    };
    let s = step(&r, &o, &want());
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Draining, &[Command::Evict][..])
    );
    assert_eq!(s.record.job, None);
    // The same token again does nothing.
    let mut failed = s.record.clone();
    failed.state = Failed;
    let s = step(&failed, &o, &want());
    assert_eq!(s.record.state, Failed);
}

#[test]
fn a_new_version_restarts_settled_nodes() {
    let mut r = new();
    r.state = Done;
    let w = Desired {
        version: "19.9.0".into(),
        readback: "19.9.0.0".into(),
        ..want()
    };
    let s = step(
        &r,
        &Observation {
            current: Some("19.8.0.0".into()),
            ..obs()
        },
        &w,
    );
    assert_eq!(
        (s.record.state, s.record.target.as_str()),
        (Pending, "19.9.0")
    );
    assert!(s.needs_slot);
}

#[test]
fn paused_holds_a_cycle_where_it_is_but_never_interrupts_a_flash() {
    let w = Desired {
        paused: true,
        ..want()
    };
    let mut r = new();
    r.state = Draining;
    r.cordon = Cordon::Ours;
    let s = step(
        &r,
        &Observation {
            unschedulable: true,
            drain: drained(),
            ..obs()
        },
        &w,
    );
    assert_eq!(s.record.state, Draining);
    assert!(s.commands.is_empty());
    r.state = Flashing;
    let done = Observation {
        unschedulable: true,
        job: FlashJob::Succeeded {
            name: "j".into(),
            report: report(&["19.8.0.0"]),
        },
        ..obs()
    };
    assert_eq!(step(&r, &done, &w).record.state, Uncordoning);
}

#[test]
fn takeover_from_the_go_controller() {
    let w = want();
    // Cordoned for this policy, its Job running: follow the Job.
    let o = Observation {
        unschedulable: true,
        go_cordon_for_us: true,
        go_state: Some(Flashing),
        job: FlashJob::Running {
            name: "ttfwp-fw-n".into(),
            image_pull_failed: false,
        },
        ..obs()
    };
    let r = takeover(&w, &o);
    assert_eq!(
        (r.state, r.cordon, r.job.as_deref()),
        (Flashing, Cordon::Ours, Some("ttfwp-fw-n"))
    );
    // Its Job gone: unknown outcome, Failed, nothing flashed.
    let gone = Observation {
        job: FlashJob::Missing,
        ..o.clone()
    };
    let r = takeover(&w, &gone);
    assert_eq!(
        (r.state, r.reason.as_deref()),
        (Failed, Some(reason::TAKEN_OVER))
    );
    assert!(
        step(
            &r,
            &Observation {
                slot: true,
                ..gone.clone()
            },
            &w
        )
        .commands
        .is_empty()
    );
    // Cordoned and draining: the cordon ours to undo, but the drain and
    // flash wait for a slot (Go cordons every node at once).
    let draining = Observation {
        go_state: Some(Draining),
        ..gone.clone()
    };
    let r = takeover(&w, &draining);
    assert_eq!(
        (r.state, r.cordon, r.reason.as_deref()),
        (Pending, Cordon::Ours, Some(reason::TAKEN_OVER))
    );
    let waiting = step(&r, &draining, &w);
    assert_eq!(
        (waiting.record.state, waiting.needs_slot),
        (Pending, true),
        "no slot: it waits, cordoned"
    );
    assert!(waiting.commands.is_empty(), "{:?}", waiting.commands);
    let granted = step(
        &r,
        &Observation {
            slot: true,
            ..draining.clone()
        },
        &w,
    );
    assert_eq!(
        (granted.record.state, granted.commands),
        (Draining, vec![Command::Evict]),
        "with a slot it drains under the kept cordon"
    );
    // Someone else's cordon (not Go's for us) is not taken.
    let theirs = Observation {
        go_cordon_for_us: false,
        go_state: None,
        ..gone
    };
    let r = takeover(&w, &theirs);
    assert_eq!((r.state, r.cordon), (Pending, Cordon::None));
}

#[test]
fn the_record_round_trips() {
    let mut r = new();
    r.cordon = Cordon::Ours;
    r.job = Some("j".into());
    let text = serde_json::to_string(&r).expect("serializes");
    assert!(text.contains("\"cordon\":\"ours\""), "{text}");
    let back: FwRecord = serde_json::from_str(&text).expect("parses");
    assert_eq!(back, r);
}

#[test]
fn a_stray_record_is_released_unless_the_cards_may_be_half_written() {
    let mut r = new();
    r.cordon = Cordon::Ours;
    for st in [Cordoning, Draining, Uncordoning, Pending] {
        r.state = st;
        assert_eq!(stray(&r, true), Stray::Release { uncordon: true }, "{st:?}");
    }
    r.state = Draining;
    assert_eq!(
        stray(&r, false),
        Stray::Release { uncordon: false },
        "already uncordoned"
    );
    r.state = Flashing;
    assert!(matches!(stray(&r, true), Stray::Keep(_)));
    r.state = Failed;
    r.job = Some("j".into());
    assert!(
        matches!(stray(&r, true), Stray::Keep(_)),
        "failed after a flash"
    );
    r.job = None;
    assert_eq!(
        stray(&r, true),
        Stray::Release { uncordon: true },
        "a drain timeout wrote nothing"
    );
    r.cordon = Cordon::None;
    r.state = Done;
    assert_eq!(stray(&r, false), Stray::Release { uncordon: false });
}

#[test]
fn a_firmware_that_needs_a_newer_driver_waits_for_it() {
    let w = Desired {
        min_driver: Some("2.8.0".into()),
        ..want()
    };
    let old = Observation {
        slot: true,
        driver_version: Some("2.7.0".into()),
        ..obs()
    };
    let s = step(&new(), &old, &w);
    assert_eq!(
        s.record.reason.as_deref(),
        Some(reason::WAITING_FOR_DRIVER_VERSION)
    );
    assert!(s.commands.is_empty() && !s.needs_slot);
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("2.8.0") && m.contains("2.7.0"))
    );
    let none = Observation {
        driver_version: None,
        ..old.clone()
    };
    assert_eq!(step(&new(), &none, &w).record.state, Pending);
    let there = Observation {
        driver_version: Some("2.8.1".into()),
        ..old
    };
    assert_eq!(step(&new(), &there, &w).record.state, Cordoning);
}

#[test]
fn a_flash_hands_its_cordon_to_a_waiting_driver_swap() {
    let w = want();
    let mut flashing = new();
    flashing.state = Flashing;
    flashing.cordon = Cordon::Ours;
    flashing.job = Some("j".into());
    flashing.stood_down = vec!["tt/fabric".into()];
    let flashed = Observation {
        unschedulable: true,
        job: FlashJob::Succeeded {
            name: "j".into(),
            report: report(&["19.8.0.0", "19.8.0.0"]),
        },
        ..obs()
    };
    // Nobody waits: the flash uncordons, as always.
    let s = step(&flashing, &flashed, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Uncordoning, &[Command::Uncordon][..])
    );
    // A driver swap waits: the cordon is handed over, never lifted.
    let waiting = Observation {
        driver_waiting: Some("fleet".into()),
        ..flashed.clone()
    };
    let s = step(&flashing, &waiting, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Done, &[Command::HandOver("fleet".into())][..])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::CORDON_HANDED_OVER));
    assert_eq!(
        s.record.cordon,
        Cordon::None,
        "the cordon is the driver's now"
    );
    assert_eq!(s.record.current.as_deref(), Some("19.8.0.0"));
    assert!(!s.record.state.is_in_progress(), "the claim goes with it");
    assert_eq!(
        s.record.stood_down,
        vec!["tt/fabric".to_string()],
        "the swap taking the cordon learns what the flash stood down"
    );
    // Done stays Done: nothing is uncordoned behind the driver's back.
    let again = step(&s.record, &waiting, &w);
    assert!(again.commands.is_empty(), "{again:?}");
    assert_eq!(again.record.stood_down, s.record.stood_down);

    // A readback that does not match keeps the cordon: nothing to hand over.
    let bad = Observation {
        job: FlashJob::Succeeded {
            name: "j".into(),
            report: report(&["19.8.0.0", "19.7.0.0"]),
        },
        ..waiting.clone()
    };
    let s = step(&flashing, &bad, &w);
    assert_eq!((s.record.state, s.commands.len()), (Failed, 0));
    // A cordon that was never ours (drain disabled) is not handed over.
    let mut uncordoned = flashing.clone();
    uncordoned.cordon = Cordon::None;
    let s = step(
        &uncordoned,
        &Observation {
            unschedulable: false,
            ..waiting
        },
        &w,
    );
    assert_eq!((s.record.state, s.commands.len()), (Done, 0));
}

#[test]
fn a_node_uncordoned_mid_flash_is_cordoned_again() {
    let w = want();
    let mut flashing = new();
    flashing.state = Flashing;
    flashing.cordon = Cordon::Ours;
    flashing.job = Some("j".into());
    let running = Observation {
        unschedulable: false,
        job: FlashJob::Running {
            name: "j".into(),
            image_pull_failed: false,
        },
        ..obs()
    };
    let s = step(&flashing, &running, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Flashing, &[Command::Cordon][..])
    );
    assert_eq!(s.record.cordon, Cordon::Ours, "still ours to undo");
    // Cordoned: nothing to do while the flash runs.
    let s = step(
        &flashing,
        &Observation {
            unschedulable: true,
            ..running.clone()
        },
        &w,
    );
    assert!(s.commands.is_empty(), "{s:?}");
    // A flash that fails while uncordoned: cordoned again, kept for a person.
    let failed = Observation {
        job: FlashJob::Failed {
            name: "j".into(),
            report: None,
            deadline: false,
        },
        ..running.clone()
    };
    let s = step(&flashing, &failed, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Failed, &[Command::Cordon][..])
    );
    // Without a cordon of ours (drain disabled) nothing is cordoned.
    let mut bare = flashing.clone();
    bare.cordon = Cordon::None;
    assert!(step(&bare, &running, &w).commands.is_empty());
}

#[test]
fn a_failure_before_any_card_gives_the_node_back() {
    let w = want();
    let mut flashing = new();
    flashing.state = Flashing;
    flashing.cordon = Cordon::Ours;
    flashing.job = Some("j".into());
    for (why, said, fix) in [
        (
            reason::BUNDLE_CHECKSUM_MISMATCH,
            "the downloaded bundle's SHA-256 is abc",
            "fix spec.bundleSHA256",
        ),
        (
            reason::BUNDLE_DOWNLOAD_FAILED,
            "curl: (3) URL rejected: Port number was not a decimal number between 0 and 65535",
            "fix spec.bundleURL",
        ),
    ] {
        let refused = Observation {
            unschedulable: true,
            job: FlashJob::Failed {
                name: "j".into(),
                report: Some(Report {
                    reason: Some(why.into()),
                    message: Some(said.into()),
                    ..Default::default()
                }),
                deadline: false,
            },
            ..obs()
        };
        let s = step(&flashing, &refused, &w);
        assert_eq!(
            (s.record.state, &s.commands[..]),
            (Failed, &[Command::Uncordon][..]),
            "{why}"
        );
        assert_eq!(s.record.reason.as_deref(), Some(why));
        assert_eq!(s.record.cordon, Cordon::None);
        let msg = s.record.message.clone().unwrap_or_default();
        assert!(
            msg.contains("before any card was touched") && msg.contains(said) && msg.contains(fix),
            "{msg}"
        );
        // Nothing was written: a stray record of it is released, not kept.
        assert!(matches!(
            stray(&s.record, false),
            Stray::Release { uncordon: false }
        ));
    }
    // Any other failure of the Job keeps the cordon: the cards may be
    // half-written.
    let failed = Observation {
        unschedulable: true,
        job: FlashJob::Failed {
            name: "j".into(),
            report: Some(Report {
                reason: Some(reason::FLASH_JOB_FAILED.into()),
                message: Some("tt-flash exited 1".into()),
                ..Default::default()
            }),
            deadline: false,
        },
        ..obs()
    };
    let s = step(&flashing, &failed, &w);
    assert_eq!((s.record.state, s.record.cordon), (Failed, Cordon::Ours));
    assert!(!s.commands.contains(&Command::Uncordon));
}

/// A record Flashing with its Job named, the Job missing from the cache.
fn flashing_named() -> FwRecord {
    let mut r = new();
    r.state = Flashing;
    r.cordon = Cordon::Ours;
    r.since = 990;
    r.job = Some(job_name_for("fw", "n1", "19.8.0", 0));
    r.policy_uid = Some("uid-1".into());
    r
}

fn missing(own_job: OwnJob) -> Observation {
    Observation {
        unschedulable: true,
        job: FlashJob::Missing,
        own_job,
        ..obs()
    }
}

#[test]
fn the_flash_job_is_named_in_the_record_before_it_is_created() {
    // Drain disabled: straight from Pending.
    let w = Desired {
        drain_enabled: false,
        ..want()
    };
    let s = step(
        &new(),
        &Observation {
            slot: true,
            ..obs()
        },
        &w,
    );
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Flashing, &[Command::CreateJob][..])
    );
    assert_eq!(s.record.job, Some(job_name_for("fw", "n1", "19.8.0", 0)));
    // A retry flashes with a Job of its own, named as it starts.
    let mut failed = s.record.clone();
    failed.state = Failed;
    let s = step(
        &failed,
        &Observation {
            slot: true,
            retry_token: Some("1".into()),
            ..obs()
        },
        &w,
    );
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Flashing, &[Command::CreateJob][..])
    );
    assert_eq!(s.record.job, Some(job_name_for("fw", "n1", "19.8.0", 1)));
    assert_ne!(s.record.job, failed.job);
}

#[test]
fn a_job_this_controller_created_is_waited_for_until_its_cache_shows_it() {
    let w = want();
    let r = flashing_named();
    for at in [1000, 999, 1000 - JOB_CACHE_GRACE_SECONDS + 1] {
        let s = step(&r, &missing(OwnJob::CreatedUnseen { at }), &w);
        assert_eq!(s.record, r, "created at {at}: nothing changes");
        assert!(s.commands.is_empty(), "never created again: {s:?}");
    }
    // Seen running: the record goes on as usual.
    let running = Observation {
        job: FlashJob::Running {
            name: r.job.clone().unwrap_or_default(),
            image_pull_failed: false,
        },
        ..missing(OwnJob::NotMine)
    };
    let s = step(&r, &running, &w);
    assert_eq!(
        (s.record.state, s.record.job.as_ref()),
        (Flashing, r.job.as_ref())
    );
    assert!(s.commands.is_empty());
    // Never shown up long after its create: gone, Failed, cordon kept.
    let s = step(
        &r,
        &missing(OwnJob::CreatedUnseen {
            at: 1000 - JOB_CACHE_GRACE_SECONDS,
        }),
        &w,
    );
    assert_eq!(
        (s.record.state, s.record.reason.as_deref(), s.record.cordon),
        (Failed, Some(reason::FLASH_JOB_FAILED), Cordon::Ours)
    );
    assert!(s.commands.is_empty(), "{s:?}");
    assert!(
        s.record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("whether the cards were written is unknown")),
        "{s:?}"
    );
}

#[test]
fn a_named_job_missing_and_not_created_by_this_controller_fails_never_created_again() {
    // A controller that did not create it: gone once some pass saw it, or
    // when it was created for another policy object (the policy deleted
    // and re-created under its name: its Jobs went with the old object),
    // whether or not anything ever saw it run.
    let w = want();
    let mut seen = flashing_named();
    seen.job_seen = true;
    let mut other_policy = flashing_named();
    other_policy.policy_uid = Some("uid-0".into());
    for r in [seen, other_policy] {
        let s = step(&r, &missing(OwnJob::NotMine), &w);
        assert_eq!(
            (s.record.state, s.record.reason.as_deref(), s.record.cordon),
            (Failed, Some(reason::FLASH_JOB_FAILED), Cordon::Ours),
            "{r:?}"
        );
        assert!(!s.commands.contains(&Command::CreateJob), "{s:?}");
        assert!(s.commands.is_empty(), "the cordon stays: {s:?}");
        let msg = s.record.message.clone().unwrap_or_default();
        assert!(
            msg.contains(r.job.as_deref().unwrap_or("?"))
                && msg.contains(
                    "vanished before it finished: whether the cards were written is unknown"
                ),
            "{msg}"
        );
        // Uncordoned meanwhile: cordoned again, still nothing flashed.
        let s = step(
            &r,
            &Observation {
                unschedulable: false,
                ..missing(OwnJob::NotMine)
            },
            &w,
        );
        assert_eq!(
            (s.record.state, &s.commands[..]),
            (Failed, &[Command::Cordon][..])
        );
        // And later steps (a slot, no retry) leave it there.
        let s2 = step(
            &s.record,
            &Observation {
                slot: true,
                ..missing(OwnJob::NotMine)
            },
            &w,
        );
        assert_eq!((s2.record.state, &s2.commands[..]), (Failed, &[][..]));
    }
}

#[test]
fn a_job_named_for_this_policy_object_and_never_seen_is_created_after_a_restart() {
    // The controller stopped between writing the record and creating the
    // Job; the next one has listed its caches and no pass ever saw the Job:
    // it was never created.
    let r = flashing_named();
    let s = step(&r, &missing(OwnJob::NotMine), &want());
    assert_eq!(s.record, r);
    assert_eq!(s.commands, vec![Command::CreateJob]);
    // Seen once, it is never created again (above); nor for a record that
    // names no policy object (it cannot say which one the Job went with).
    let mut unknown_policy = r.clone();
    unknown_policy.policy_uid = None;
    let s = step(&unknown_policy, &missing(OwnJob::NotMine), &want());
    assert_eq!((s.record.state, &s.commands[..]), (Failed, &[][..]));
}

#[test]
fn the_record_says_whether_its_job_was_seen_and_for_which_policy_object() {
    let w = want();
    let s = step(
        &new(),
        &Observation {
            slot: true,
            ..obs()
        },
        &Desired {
            drain_enabled: false,
            ..w.clone()
        },
    );
    assert_eq!(
        (s.record.job_seen, s.record.policy_uid.as_deref()),
        (false, Some("uid-1"))
    );
    let name = s.record.job.clone().unwrap_or_default();
    let s = step(
        &s.record,
        &Observation {
            job: FlashJob::Running {
                name: name.clone(),
                image_pull_failed: false,
            },
            ..obs()
        },
        &w,
    );
    assert!(s.record.job_seen, "{s:?}");
    // A retry forgets them with the Job.
    let mut failed = s.record.clone();
    failed.state = Failed;
    let s = step(
        &failed,
        &Observation {
            retry_token: Some("1".into()),
            ..obs()
        },
        &w,
    );
    assert_eq!(
        (
            s.record.job.as_deref(),
            s.record.job_seen,
            s.record.policy_uid.as_deref()
        ),
        (None, false, None)
    );
    // Old records (without them) read as unseen, for no known object.
    let old: FwRecord = serde_json::from_str(
        r#"{"policy":"fw","state":"Flashing","target":"19.8.0","since":1,"job":"j"}"#,
    )
    .expect("parses");
    assert_eq!((old.job_seen, old.policy_uid), (false, None));
}

#[test]
fn a_named_job_this_controller_never_created_is_created() {
    // Its create was refused (or the step's write failed before it): the
    // create is the Job's first.
    let r = flashing_named();
    let s = step(&r, &missing(OwnJob::NotCreated), &want());
    assert_eq!(s.record, r);
    assert_eq!(s.commands, vec![Command::CreateJob]);
}

#[test]
fn a_flashing_record_of_an_earlier_version_without_its_job_is_never_flashed_blindly() {
    // An earlier controller named the Job only once it saw it run: its
    // record may be Flashing with none. Looked up by its deterministic
    // name, the Job is not there: unknown, Failed, never created.
    let w = want();
    let mut r = flashing_named();
    r.job = None;
    for own in [
        OwnJob::NotMine,
        OwnJob::CreatedUnseen { at: 1000 },
        OwnJob::NotCreated,
    ] {
        let s = step(&r, &missing(own), &w);
        assert_eq!(
            (s.record.state, s.record.reason.as_deref(), s.record.cordon),
            (Failed, Some(reason::FLASH_JOB_FAILED), Cordon::Ours),
            "{own:?}"
        );
        assert!(s.commands.is_empty(), "{own:?}: {s:?}");
        let msg = s.record.message.clone().unwrap_or_default();
        assert!(
            msg.contains(&job_name_for("fw", "n1", "19.8.0", 0))
                && msg.contains("earlier controller version")
                && msg.contains("whether the cards were written is unknown"),
            "{msg}"
        );
    }
    // Its Job found by that name: followed, and named from then on.
    let name = job_name_for("fw", "n1", "19.8.0", 0);
    let s = step(
        &r,
        &Observation {
            job: FlashJob::Running {
                name: name.clone(),
                image_pull_failed: false,
            },
            ..missing(OwnJob::NotMine)
        },
        &w,
    );
    assert_eq!(
        (s.record.state, s.record.job.as_deref()),
        (Flashing, Some(name.as_str()))
    );
    assert!(s.commands.is_empty());
}

/// A drained flash closes the deploy gates with its cordon, flashes only
/// once the gated DaemonSets' pods (telemetry, the fabric-manager agent:
/// privileged, beyond any drain) have left, and opens them with its uncordon.
#[test]
fn a_drained_flash_closes_the_deploy_gates_and_waits_for_their_pods() {
    let w = want();
    let open = Observation {
        gates_open: true,
        ..obs()
    };
    let s = step(
        &new(),
        &Observation {
            slot: true,
            ..open.clone()
        },
        &w,
    );
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Cordoning, &[Command::Cordon, Command::CloseGates][..])
    );
    // Cordoned, a gate still open (the patch not seen yet): closed again,
    // no drain.
    let cordoned_open = Observation {
        unschedulable: true,
        ..open.clone()
    };
    let s = step(&s.record, &cordoned_open, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Cordoning, &[Command::CloseGates][..])
    );
    let closed = Observation {
        unschedulable: true,
        gates_present: true,
        ..obs()
    };
    let s = step(&s.record, &closed, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Draining, &[Command::Evict][..])
    );
    // Evicted, but the telemetry pod is still going: no flash yet.
    let leaving = Observation {
        drain: drained(),
        gated_pods_left: vec!["tt/tt-telemetry-x".into()],
        ..closed.clone()
    };
    let s = step(&s.record, &leaving, &w);
    assert_eq!((s.record.state, &s.commands[..]), (Draining, &[][..]));
    let msg = s.record.message.clone().unwrap_or_default();
    assert!(msg.contains("tt/tt-telemetry-x"), "{msg}");
    // A gate opened behind our back while draining: closed again first.
    let reopened = Observation {
        gates_open: true,
        ..leaving.clone()
    };
    let s2 = step(&s.record, &reopened, &w);
    assert_eq!(
        (s2.record.state, &s2.commands[..]),
        (Draining, &[Command::CloseGates][..])
    );
    // Gone: the flash starts.
    let gone = Observation {
        drain: drained(),
        ..closed.clone()
    };
    let s = step(&s.record, &gone, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Flashing, &[Command::CreateJob][..])
    );
    let done = Observation {
        job: FlashJob::Succeeded {
            name: s.record.job.clone().unwrap_or_default(),
            report: report(&["19.8.0.0"]),
        },
        ..closed.clone()
    };
    let s = step(&s.record, &done, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Uncordoning, &[Command::Uncordon, Command::OpenGates][..])
    );
    // Uncordoned, a gate label still there: removed before Done.
    let s = step(
        &s.record,
        &Observation {
            unschedulable: false,
            ..done.clone()
        },
        &w,
    );
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Uncordoning, &[Command::OpenGates][..])
    );
    let s = step(
        &s.record,
        &Observation {
            unschedulable: false,
            gates_present: false,
            ..done
        },
        &w,
    );
    assert_eq!((s.record.state, &s.commands[..]), (Done, &[][..]));
}

/// A gated pod that never leaves times the drain out like any pod: nothing
/// was written, so the node goes back with its gates open, the pod named.
#[test]
fn a_gated_pod_that_never_leaves_times_the_drain_out_and_opens_the_gates() {
    let w = want();
    let mut rec = new();
    rec.state = Draining;
    rec.cordon = Cordon::Ours;
    rec.since = 0;
    let stuck = Observation {
        now: w.drain_timeout_seconds + 1,
        unschedulable: true,
        gates_present: true,
        drain: drained(),
        gated_pods_left: vec!["tt/tt-fabric-manager-agent-y".into()],
        ..obs()
    };
    let s = step(&rec, &stuck, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Failed, &[Command::Uncordon, Command::OpenGates][..])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::DRAIN_TIMEOUT));
    let msg = s.record.message.clone().unwrap_or_default();
    assert!(msg.contains("tt/tt-fabric-manager-agent-y"), "{msg}");
}

/// After the flash, with a DRA plugin on the node: the gates open with the
/// node still cordoned, the fabric-manager agent that stood down comes back,
/// the plugin is restarted, and only a whole surface uncordons; a shortfall
/// at the deadline fails the node cordoned, and a retry checks again
/// without a second flash.
#[test]
fn after_the_flash_the_scheduler_sees_every_card_before_the_uncordon() {
    use crate::surface::{PublisherPod, StackPod, Surface};
    let w = want();
    let fm = |ready: bool| StackPod {
        daemon_set: "tt/fabric".into(),
        ready,
        deleting: false,
    };
    let plugin = |name: &str, created: i64| PublisherPod {
        pod: crate::drain::PodRef {
            namespace: "tt".into(),
            name: name.into(),
        },
        created,
        ready_since: Some(created),
        deleting: false,
    };
    let surface = |stack: Vec<StackPod>, pods: Vec<PublisherPod>, listed: u32| Surface {
        driver: "tenstorrent.com".into(),
        plugin_selector: "app=dra".into(),
        cards: Some(2),
        plugin_pods: pods,
        dra_devices: Some(listed),
        extended: None,
        stack,
    };
    // The start remembers the agent on the node.
    let s = step(
        &new(),
        &Observation {
            slot: true,
            surface: surface(vec![fm(true)], vec![plugin("dra-a", 10)], 2),
            ..obs()
        },
        &w,
    );
    assert_eq!(s.record.state, Cordoning);
    assert_eq!(s.record.stood_down, vec!["tt/fabric".to_string()]);
    let mut flashing = s.record.clone();
    flashing.state = Flashing;
    flashing.job = Some("job-1".into());
    let after = |now: i64, gates: bool, stack: Vec<StackPod>, pods: Vec<PublisherPod>, listed| {
        Observation {
            now,
            unschedulable: true,
            gates_present: gates,
            current: Some("19.8.0.0".into()),
            job: FlashJob::Succeeded {
                name: "job-1".into(),
                report: report(&["19.8.0.0"]),
            },
            surface: surface(stack, pods, listed),
            ..obs()
        }
    };
    // Flashed: the gates open first, the node still cordoned.
    let s = step(
        &flashing,
        &after(2000, true, vec![], vec![plugin("dra-a", 10)], 2),
        &w,
    );
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Uncordoning, &[Command::OpenGates][..])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::REFRESHING_DEVICES));
    assert_eq!(s.record.surface_since, Some(2000));
    let open = s.record;
    // The agent not Ready yet: nothing restarted, nothing uncordoned.
    let s = step(
        &open,
        &after(2005, false, vec![fm(false)], vec![plugin("dra-a", 10)], 2),
        &w,
    );
    assert_eq!((s.record.state, &s.commands[..]), (Uncordoning, &[][..]));
    // Back: the plugin from before the flash is restarted.
    let s = step(
        &open,
        &after(2010, false, vec![fm(true)], vec![plugin("dra-a", 10)], 2),
        &w,
    );
    assert!(
        matches!(&s.commands[..], [Command::RestartPublishers(p)] if p[0].name == "dra-a"),
        "{:?}",
        s.commands
    );
    // The fresh plugin settled and publishing every card: the uncordon.
    let whole = after(2030, false, vec![fm(true)], vec![plugin("dra-b", 2012)], 2);
    let s = step(&open, &whole, &w);
    assert_eq!(
        (s.record.state, &s.commands[..]),
        (Uncordoning, &[Command::Uncordon][..])
    );
    assert_eq!(s.record.reason.as_deref(), Some(reason::UNCORDONING));
    // One card short past the deadline: Failed, cordon kept.
    let short = after(2301, false, vec![fm(true)], vec![plugin("dra-b", 2012)], 1);
    let failed = step(&open, &short, &w);
    assert_eq!(
        (failed.record.state, &failed.commands[..]),
        (Failed, &[][..])
    );
    assert_eq!(
        failed.record.reason.as_deref(),
        Some(reason::DEVICES_NOT_PUBLISHED)
    );
    assert_eq!(failed.record.cordon, Cordon::Ours);
    assert!(failed.record.stood_down.is_empty());
    // Retried: the check runs again from the start (the plugin restarted
    // once more), and nothing is flashed a second time.
    let retried = Observation {
        retry_token: Some("1".into()),
        slot: true,
        ..whole
    };
    let s = step(&failed.record, &retried, &w);
    assert_eq!(s.record.state, Uncordoning, "{:?}", s.record);
    assert_eq!(s.record.surface_since, Some(2030));
    // The restart once the check's first second is over (creation times
    // are whole seconds).
    assert_eq!(s.commands, vec![]);
    let later = Observation {
        now: 2031,
        ..retried
    };
    let s = step(&s.record, &later, &w);
    assert!(
        matches!(&s.commands[..], [Command::RestartPublishers(_)]),
        "{:?}",
        s.commands
    );
    assert_eq!(s.record.surface_since, Some(2030));
}
