//! The in-process side of one disruption at a time ([`ttdrv_core::claim`]):
//! a driver cycle and a firmware cycle each take the node's claim here, in
//! the same instant as they decide to start, before anything is written. The
//! records on the Node carry the claim across restarts; this registry closes
//! the window between one actor's decision and its write showing in the
//! other's cache.
//!
//! It closes the same window for the budgets: each policy plans its starts
//! from its cache, where a cycle the other policy started a moment ago does
//! not show yet. A start that takes a node out of service is checked here,
//! under the registry's lock, against its policy's cap counting the nodes
//! the other starts have claimed meanwhile ([`Budget`]).

use std::sync::Mutex;

use ttdrv_core::slots::SlotBook;
pub use ttdrv_core::slots::{Budget, Holder, Refused};

/// The controller's one slot book ([`ttdrv_core::slots`]), behind a lock so
/// each start is decided and booked in one instant.
#[derive(Default)]
pub struct Claims {
    book: Mutex<SlotBook>,
}

impl Claims {
    /// Runs `f` on the book under its lock.
    pub fn with<T>(&self, f: impl FnOnce(&mut SlotBook) -> T) -> T {
        let mut book = self
            .book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut book)
    }

    /// Takes `node` for `holder`, a start that takes it out of service
    /// within `budget` ([`SlotBook::take`]).
    pub fn take_within(
        &self,
        node: &str,
        holder: Holder,
        budget: Option<&Budget>,
    ) -> Result<(), Refused> {
        self.with(|b| b.take(node, holder, budget))
    }

    /// Gives `node` back, if `holder` has it.
    pub fn release(&self, node: &str, holder: &Holder) {
        self.with(|b| b.release(node, holder));
    }
}
