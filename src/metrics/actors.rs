//! Metrics of the actor system itself, by actor kind: supervised restarts and
//! messages refused by a full mailbox. No `cr` label: they survive a lost
//! lease and the deletion of policies.

use super::family::Families;
use super::registry::{ActorMetrics, Metrics};

/// The actor kinds that count restarts or full mailboxes; their series start
/// at 0, so a dashboard shows 0 rather than "no data" until one happens.
pub const ACTOR_KINDS: &[&str] = &[
    "policy_manager",
    "policy_supervisor",
    "node",
    "firmware_node",
];

impl ActorMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        let m = ActorMetrics {
            actor_restarts: families.counter(
                "ttdriver_actor_restarts_total",
                "Restarts of a supervised actor, by actor kind.",
                &["actor"],
            ),
            actor_mailbox_full: families.counter(
                "ttdriver_actor_mailbox_full_total",
                "Messages refused because the actor's mailbox was full, by actor kind.",
                &["actor"],
            ),
        };
        for actor in ACTOR_KINDS {
            m.actor_restarts.touch(&[actor]);
            m.actor_mailbox_full.touch(&[actor]);
        }
        m
    }
}

impl Metrics {
    /// `ttdriver_actor_restarts_total{actor}`.
    pub fn inc_actor_restart(&self, actor: &str) {
        self.actors.actor_restarts.add(&[actor], 1.0);
    }

    /// `ttdriver_actor_mailbox_full_total{actor}`.
    pub fn inc_mailbox_full(&self, actor: &str) {
        self.actors.actor_mailbox_full.add(&[actor], 1.0);
    }
}
