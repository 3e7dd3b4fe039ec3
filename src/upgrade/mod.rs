//! Upgrade logic without I/O: the per-node state machine, drain planning and
//! rollout sequencing. Actors in [`crate::actors`] carry out what these decide.
pub mod drain;
pub mod machine;
pub mod rollout;
