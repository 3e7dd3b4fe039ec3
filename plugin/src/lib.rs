//! `kubectl tt driver`: the rollout of tt-kmd across Tenstorrent nodes, seen and
//! steered from a terminal.
//!
//! Everything that decides what to print is a pure function of the objects read
//! from the cluster (policies, nodes, pods, PodDisruptionBudgets) and the current
//! time: [`view`] turns them into serializable views (also the `-o json|yaml`
//! output), [`plan`] predicts a rollout, [`eta`] estimates durations, and
//! [`render`] turns views into text. [`cli`] and [`commands`] do the I/O.
//! [`fw`] is `kubectl tt fw` (the firmware policies), [`handback`] gives nodes
//! back to the Go operator, [`complete`] completes words for kubectl,
//! [`table`] and [`style`] lay text out and colour it (on a terminal only).
//! [`transitions`] picks the node state changes `watch` prints from the
//! records it sees on the Nodes.

pub mod cli;
pub mod commands;
pub mod complete;
pub mod eta;
pub mod fw;
pub mod handback;
pub mod plan;
pub mod render;
pub mod style;
pub mod table;
pub mod transitions;
pub mod view;
