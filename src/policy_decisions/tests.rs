use super::*;
use EventReason::*;

fn refused(kind: RefusalKind, message: &str, attempted: bool) -> Refused {
    Refused {
        kind,
        message: message.into(),
        attempted,
    }
}

/// The Event reasons among `effects`, in order.
fn events(effects: &[Effect]) -> Vec<EventReason> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

fn told(effects: &[Effect]) -> Vec<bool> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::RefusalChanged { refused } => Some(*refused),
            _ => None,
        })
        .collect()
}

/// A fresh policy's first pass ending at `t0` with its DaemonSet refused
/// (`spec.x: invalid`, attempted).
fn refused_at(t0: Instant) -> (PolicyMemo, Vec<Effect>) {
    let bad = refused(RefusalKind::Refused, "spec.x: invalid", true);
    decide(&PolicyMemo::default(), &ended(Some(&bad), None, t0))
}

fn ended<'a>(
    refused: Option<&'a Refused>,
    braked: Option<&'a [String]>,
    now: Instant,
) -> Facts<'a> {
    ended_with(refused, braked, &[], BTreeMap::new(), now)
}

/// A pass of generation 1 at 2.1.0 that ended with these facts.
fn ended_with<'a>(
    refused: Option<&'a Refused>,
    braked: Option<&'a [String]>,
    waiting_on: &'a [(String, String)],
    next_kernel_failed: BTreeMap<String, String>,
    now: Instant,
) -> Facts<'a> {
    Facts::PassEnded {
        generation: Some(1),
        refused,
        braked,
        brake_percent: 30,
        waiting_on,
        version: "2.1.0",
        next_kernel_failed,
        now,
    }
}

/// A run of passes: each row is what the pass found and what must come of it
/// (Events, what the manager is told, whether the refused metric counts).
#[test]
fn refusal_and_takeover_over_passes() {
    let t0 = Instant::now();
    let bad = refused(RefusalKind::Refused, "spec.x: invalid", true);
    let bad_again_waiting = refused(RefusalKind::Refused, "spec.x: invalid", false);
    let other = refused(RefusalKind::Refused, "spec.y: invalid", true);
    let takeover = refused(
        RefusalKind::Takeover,
        "taking over DaemonSet ttdrv-p: ...",
        true,
    );
    type Row<'a> = (
        &'a str,
        Option<&'a Refused>,
        Vec<EventReason>,
        Vec<bool>,
        bool,
        Option<u32>,
    );
    let rows: Vec<Row<'_>> = vec![
        (
            "accepted, nothing standing",
            None,
            vec![],
            vec![],
            false,
            None,
        ),
        (
            "first refusal",
            Some(&bad),
            vec![PolicyRefused],
            vec![true],
            true,
            Some(1),
        ),
        (
            "backing off, the API server not asked",
            Some(&bad_again_waiting),
            vec![],
            vec![],
            false,
            Some(1),
        ),
        (
            "asked again, same error: no Event",
            Some(&bad),
            vec![],
            vec![],
            true,
            Some(2),
        ),
        (
            "another error: news",
            Some(&other),
            vec![PolicyRefused],
            vec![],
            true,
            Some(3),
        ),
        (
            "accepted again",
            None,
            vec![PolicyApplied],
            vec![false],
            false,
            None,
        ),
        (
            "a takeover: its Event is the renderer's",
            Some(&takeover),
            vec![],
            vec![true],
            false,
            Some(1),
        ),
        (
            "the takeover is over",
            None,
            vec![DaemonSetTakenOver],
            vec![false],
            false,
            None,
        ),
    ];
    let mut memo = PolicyMemo::default();
    for (what, r, want_events, want_told, counts, attempts) in rows {
        let (next, effects) = decide(&memo, &ended(r, None, t0));
        assert_eq!(events(&effects), want_events, "{what}");
        assert_eq!(told(&effects), want_told, "{what}");
        assert_eq!(effects.contains(&Effect::CountRefused), counts, "{what}");
        assert_eq!(
            next.refusal.as_ref().map(|r| r.attempts),
            attempts,
            "{what}"
        );
        memo = next;
    }
}

#[test]
fn a_refusal_backs_off_and_logs_it() {
    let t0 = Instant::now();
    let (memo, effects) = refused_at(t0);
    assert!(effects.contains(&Effect::Log(Log::BackingOff {
        attempts: 1,
        retry_in_s: 5,
        message: "spec.x: invalid".into()
    })));
    assert_eq!(memo.apply(Some(1), t0), Apply::Wait);
    assert_eq!(
        memo.apply(Some(2), t0),
        Apply::Now,
        "a new spec is tried at once"
    );
    assert_eq!(memo.apply(Some(1), t0 + Duration::from_secs(5)), Apply::Now);
}

#[test]
fn brake_events_only_on_a_change() {
    let t0 = Instant::now();
    let held = vec!["n1".to_string(), "n2".to_string()];
    let rows: Vec<(Option<&[String]>, Vec<EventReason>)> = vec![
        (None, vec![]),
        (Some(&held), vec![FleetNotReady]),
        (Some(&held), vec![]),
        (None, vec![FleetReady]),
        (None, vec![]),
    ];
    let mut memo = PolicyMemo::default();
    for (i, (braked, want)) in rows.into_iter().enumerate() {
        let (next, effects) = decide(&memo, &ended(None, braked, t0));
        assert_eq!(events(&effects), want, "pass {i}");
        assert_eq!(next.braked, braked.is_some(), "pass {i}");
        memo = next;
    }
}

#[test]
fn conflicts_and_deprecation_warned_once() {
    let a = vec![("n1".to_string(), "older".to_string())];
    let b = vec![
        ("n1".to_string(), "older".to_string()),
        ("n2".to_string(), "older".to_string()),
    ];
    let none: Vec<(String, String)> = vec![];
    // (generation, deprecated selector, conflicts, Events)
    type Row<'a> = (i64, bool, &'a [(String, String)], Vec<EventReason>);
    let rows: Vec<Row<'_>> = vec![
        (1, false, &none, vec![]),
        (1, true, &a, vec![DeprecatedField, SelectorConflict]),
        (1, true, &a, vec![]),
        (2, true, &b, vec![DeprecatedField, SelectorConflict]),
        (2, false, &none, vec![]),
        (2, false, &a, vec![SelectorConflict]),
    ];
    let mut memo = PolicyMemo::default();
    for (i, (generation, deprecated, conflicts, want)) in rows.into_iter().enumerate() {
        let (next, effects) = decide(
            &memo,
            &Facts::PassStarts {
                generation: Some(generation),
                uses_deprecated_node_selector: deprecated,
                go_builder_image: None,
                conflicts,
            },
        );
        assert_eq!(events(&effects), want, "pass {i}");
        memo = next;
    }
}

#[test]
fn next_kernel_warnings_for_new_kernels_only() {
    let t0 = Instant::now();
    let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(n, k)| (n.to_string(), k.to_string()))
            .collect()
    };
    let rows = [
        (map(&[("n1", "6.9")]), vec!["n1"]),
        (map(&[("n1", "6.9")]), vec![]),
        (map(&[("n1", "6.10"), ("n2", "6.9")]), vec!["n1", "n2"]),
        (map(&[]), vec![]),
        (map(&[("n1", "6.10")]), vec!["n1"]),
    ];
    let mut memo = PolicyMemo::default();
    for (i, (failed, want)) in rows.into_iter().enumerate() {
        let (next, effects) = decide(&memo, &ended_with(None, None, &[], failed, t0));
        let warned: Vec<String> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Log(Log::NextKernelFailed { node, .. }) => Some(node.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(warned, want, "pass {i}");
        assert_eq!(events(&effects).len(), want.len(), "pass {i}");
        memo = next;
    }
}

#[test]
fn restart_forgets_the_refusal_and_says_so() {
    let t0 = Instant::now();
    let (memo, _) = refused_at(t0);
    let (memo, effects) = decide(&memo, &Facts::Restarted);
    assert_eq!(memo.refusal, None);
    assert_eq!(told(&effects), vec![false]);
    let (_, effects) = decide(&memo, &Facts::Restarted);
    assert!(effects.is_empty(), "nothing to forget: nothing said");
}

#[test]
fn status_written_urgently_or_at_most_once_a_second() {
    let t0 = Instant::now();
    let later = t0 + Duration::from_millis(200);
    let written = PolicyMemo {
        last_status_write: Some(t0),
        ..Default::default()
    };
    let same = [true, false, false, false, false];
    let flipped = [false, true, false, false, false];
    // (memo, previous flags, flags, previous generation, replacing, now, due)
    type Row<'a> = (
        &'a PolicyMemo,
        Option<&'a [bool]>,
        &'a [bool],
        Option<Option<i64>>,
        bool,
        Instant,
        bool,
    );
    let rows: Vec<Row<'_>> = vec![
        (
            &written,
            Some(&same),
            &same,
            Some(Some(1)),
            false,
            later,
            false,
        ),
        (
            &written,
            Some(&same),
            &flipped,
            Some(Some(1)),
            false,
            later,
            true,
        ),
        (
            &written,
            Some(&same),
            &same,
            Some(Some(0)),
            false,
            later,
            true,
        ),
        (&written, None, &same, None, false, later, true),
        (
            &written,
            Some(&same),
            &same,
            Some(Some(1)),
            true,
            later,
            true,
        ),
        (
            &written,
            Some(&same),
            &same,
            Some(Some(1)),
            false,
            t0 + STATUS_INTERVAL,
            true,
        ),
    ];
    for (i, (memo, previous_flags, flags, previous_generation, replacing, now, want)) in
        rows.into_iter().enumerate()
    {
        let facts = StatusFacts {
            previous_flags,
            flags,
            previous_generation,
            generation: Some(1),
            replacing,
            now,
        };
        assert_eq!(memo.status_due(&facts), want, "row {i}");
    }
}

#[test]
fn an_unreadable_status_is_replaced_once_per_version() {
    let t0 = Instant::now();
    let memo = PolicyMemo::default();
    assert!(memo.replaces_unreadable(true, Some("10")));
    assert!(!memo.replaces_unreadable(false, Some("10")));
    let (memo, _) = decide(
        &memo,
        &Facts::StatusWritten {
            replaced: Some(Some("10".into())),
            now: t0,
        },
    );
    assert!(
        !memo.replaces_unreadable(true, Some("10")),
        "the watch lags behind"
    );
    assert!(memo.replaces_unreadable(true, Some("11")));
    let (memo, _) = decide(
        &memo,
        &Facts::StatusWritten {
            replaced: None,
            now: t0,
        },
    );
    assert_eq!(memo.replaced_unreadable.as_deref(), Some("10"));
    assert_eq!(memo.last_status_write, Some(t0));
}

#[test]
fn a_rollout_held_by_someone_elses_cordon_says_so_once_per_change() {
    let t0 = Instant::now();
    let fw = [(
        "n3".to_string(),
        "cordoned by the Go firmware controller for TenstorrentFirmwarePolicy fw".to_string(),
    )];
    let both = [
        fw[0].clone(),
        ("n5".to_string(), "NotReady (Ready=Unknown)".to_string()),
    ];
    // (what holds the rollout, Events due)
    let rows: [(&[(String, String)], usize); 5] =
        [(&fw, 1), (&fw, 0), (&both, 1), (&[], 0), (&fw, 1)];
    let mut memo = PolicyMemo::default();
    for (i, (waiting_on, due)) in rows.into_iter().enumerate() {
        let (next, effects) = decide(
            &memo,
            &ended_with(None, None, waiting_on, BTreeMap::new(), t0),
        );
        let notes: Vec<&String> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Event {
                    reason: EventReason::RolloutWaitingOnOthers,
                    warning: true,
                    note,
                    ..
                } => Some(note),
                _ => None,
            })
            .collect();
        assert_eq!(notes.len(), due, "pass {i}: {effects:?}");
        for note in notes {
            assert!(
                note.contains("n3 cordoned by the Go firmware controller"),
                "{note}"
            );
        }
        memo = next;
    }
}

#[test]
fn a_go_builder_image_is_warned_once_per_generation() {
    let go = Some((
        "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:v0.4.2",
        "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:0.1.0",
    ));
    // (generation, Go image named, Events)
    let rows = [
        (1, go, vec![GoBuilderImageReplaced]),
        (1, go, vec![]),
        (2, None, vec![]),
        (3, go, vec![GoBuilderImageReplaced]),
    ];
    let mut memo = PolicyMemo::default();
    for (i, (generation, image, want)) in rows.into_iter().enumerate() {
        let (next, effects) = decide(
            &memo,
            &Facts::PassStarts {
                generation: Some(generation),
                uses_deprecated_node_selector: false,
                go_builder_image: image,
                conflicts: &[],
            },
        );
        assert_eq!(events(&effects), want, "pass {i}");
        if let Some(Effect::Event { note, warning, .. }) = effects.first() {
            assert!(*warning, "a Warning");
            assert!(
                note.contains("agent:0.1.0") && note.contains("builder:v0.4.2"),
                "{note}"
            );
        }
        memo = next;
    }
}
