//! The rollout planner's hard cap over random fleets whose readiness and
//! cordons change between passes: slots are handed out one request at a time
//! (as the RolloutActor does), nodes finish at random, and at no instant are
//! more than `maxUnavailable` nodes ours, nor does a NotReady node get a slot.

use std::collections::BTreeSet;

use proptest::prelude::*;
use ttdrv_core::rollout::{Candidate, DEFAULT_BRAKE_PERCENT, Limits, plan};

#[derive(Clone, Debug)]
enum Event {
    /// Node i's readiness flips.
    Flip(usize),
    /// Node i is cordoned or uncordoned by someone else.
    AdminCordon(usize),
    /// Node i asks for a slot.
    Ask(usize),
    /// Node i's cycle ends (Done), its slot given back.
    Finish(usize),
}

fn event(n: usize) -> impl Strategy<Value = Event> {
    prop_oneof![
        (0..n).prop_map(Event::Flip),
        (0..n).prop_map(Event::AdminCordon),
        (0..n).prop_map(Event::Ask),
        (0..n).prop_map(Event::Ask),
        (0..n).prop_map(Event::Finish),
    ]
}

fn fleet() -> impl Strategy<Value = (usize, usize, Vec<Event>)> {
    (1usize..12, 1usize..4).prop_flat_map(|(n, max)| {
        (
            Just(n),
            Just(max),
            proptest::collection::vec(event(n), 1..200),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_more_than_max_ours((n, max, events) in fleet()) {
        let mut nodes: Vec<Candidate> = (0..n)
            .map(|i| Candidate {
                name: format!("n{i:02}"),
                wants_slot: true,
                in_progress: false,
                ready: true,
                has_device_pods: i % 3 == 0,
                prepared: true,
                ..Default::default()
            })
            .collect();
        let mut admin = vec![false; n];
        let mut held: BTreeSet<String> = BTreeSet::new();
        let limits = Limits { max_unavailable: max, brake_percent: DEFAULT_BRAKE_PERCENT };
        for e in events {
            match e {
                Event::Flip(i) => nodes[i].ready = !nodes[i].ready,
                Event::AdminCordon(i) => admin[i] = !admin[i],
                Event::Ask(i) => {
                    if nodes[i].wants_slot {
                        let p = plan(&nodes, &held, limits);
                        if p.granted.contains(&nodes[i].name) {
                            prop_assert!(nodes[i].ready, "a NotReady node got a slot: {:?}", nodes[i]);
                            held.insert(nodes[i].name.clone());
                            nodes[i].wants_slot = false;
                            nodes[i].in_progress = true;
                        }
                    }
                }
                Event::Finish(i) => {
                    if nodes[i].in_progress {
                        nodes[i].in_progress = false;
                        held.remove(&nodes[i].name);
                    }
                }
            }
            for (c, a) in nodes.iter_mut().zip(&admin) {
                c.unavailable = !c.ready || (*a && !c.in_progress);
            }
            let ours = nodes.iter().filter(|c| c.in_progress || held.contains(&c.name)).count();
            prop_assert!(ours <= max, "{ours} nodes ours, max {max}: {nodes:?}");
        }
    }
}
