//! The messages between the PolicyManager and its PolicySupervisors, in a
//! module of their own so that neither actor's module depends on the other's
//! for them.

use std::collections::HashSet;
use std::sync::Arc;

use actix::prelude::*;
use ttdrv_core::selection::Assignment;

/// What a pass must look at.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassScope {
    /// Every node of the policy (and the policy-level work).
    pub full: bool,
    /// The periodic tick: nodes in the middle of a cycle are due for their
    /// deadlines and eviction retries.
    pub tick: bool,
    /// Nodes whose Node or pods changed.
    pub nodes: HashSet<String>,
}

impl PassScope {
    pub(crate) fn is_empty(&self) -> bool {
        !self.full && !self.tick && self.nodes.is_empty()
    }

    pub(crate) fn merge(&mut self, other: &PassScope) {
        self.full |= other.full;
        self.tick |= other.tick;
        if !self.full {
            self.nodes.extend(other.nodes.iter().cloned());
        }
        if self.full {
            self.nodes.clear();
        }
    }
}

/// Re-evaluate the policy against the current caches: every node it owns
/// (`scope.full`), or only the nodes named in `scope.nodes` plus, on the
/// periodic tick, those in the middle of a cycle. The driver kind's
/// trigger of a pass ([`crate::runtime::policy_actor::RunPass`]).
#[derive(Clone)]
pub struct Reconcile {
    pub assignment: Arc<Assignment>,
    pub scope: PassScope,
}

/// A supervisor's policy is now refused by the cluster (or accepted again):
/// a refused policy keeps only the nodes it is mid-cycle on.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct RefusalChanged {
    pub policy: String,
    pub refused: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: &[&str]) -> PassScope {
        PassScope {
            nodes: n.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn scopes_merge_and_full_absorbs_nodes() {
        let mut s = PassScope::default();
        assert!(s.is_empty());
        s.merge(&nodes(&["a"]));
        s.merge(&nodes(&["b", "a"]));
        assert_eq!(s, nodes(&["a", "b"]));
        s.merge(&PassScope {
            full: true,
            ..Default::default()
        });
        assert!(s.full && s.nodes.is_empty(), "{s:?}");
        s.merge(&nodes(&["c"]));
        assert!(
            s.full && s.nodes.is_empty(),
            "a full pass covers every node: {s:?}"
        );
    }
}
