//! The decisions of the driver manager, with no I/O, shared by every program
//! that needs them: the controller carries them out, the kubectl plugin
//! previews them, the simulated agent and the benchmark play along with them.
//!
//! | module | decides |
//! |---|---|
//! | [`node`] | what a Node says: ready, available, its labels, its persisted record, a retry request |
//! | [`selection`] | which policy owns which node (oldest wins on overlap) |
//! | [`record`] | nothing: one node's driver-cycle record (and who cordoned it) as persisted on the Node; a leaf |
//! | [`machine`] | one node's next upgrade state and the commands that get it there, one function per state (`machine/pending`, `cordon`, `upgrading`, `settle`, `vacate`; its input in `machine/observation`, a leaf) |
//! | [`firmware`] | one node's next firmware state and the commands that get it there; its flash Job (`firmware/job`) and observation (`firmware/observe`) |
//! | [`condition`] | how a status condition is stamped, for every kind: its generation, and a transition time that moves only when its status flips |
//! | [`slots`] | the slot book: who holds each node's one maintenance slot, whether a start fits its budget, and the gate every kind's start goes through (a leaf; kinds plug in through its `Cycle` trait) |
//! | [`claim`] | which maintenance cycle (driver or firmware) holds a node: one disruption at a time |
//! | [`surface`] | whether the scheduler sees a swapped node's cards again (DRA slices, extended resources), and which DRA plugin pods to restart first |
//! | [`soak`] | whether a just-upgraded node still soaks, and whether trouble on it fails the rollout |
//! | [`window`] | whether a maintenance window lets a new cycle start now, and when the next one opens |
//! | [`observe`] | one node as a policy sees it, from plain Node and pod facts: its observation, next evictions and slot facts |
//! | [`reason`] | the bounded set of reasons a node's state carries |
//! | [`event`] | the closed set of Event reasons the controller emits |
//! | [`drain`] | which pods a drain evicts, in which pass, and what blocks it; what it reads of pods and DaemonSets (which deploy gates a DaemonSet's template follows) |
//! | [`device_holders`] | which DaemonSet pods will still hold a node's device after its gates close and its drain runs, and the gate each lacks |
//! | [`installer`] | what an installer pod's status says: unhealthy, or failed for good and why |
//! | [`handover`] | whether a Go operator's controller pod still runs, so ours must not act yet |
//! | [`go_ahead`] | whether the agent may swap the loaded module now (the second key) |
//! | [`prepare`] | which installer pods are replaced ahead of their cycle to build the target, and whether a cycle may start |
//! | [`promotion`] | whether a policy that follows a canary (`spec.promoteAfter`) may start its new cycles |
//! | [`rollout`] | which waiting nodes may start now under `maxUnavailable` |
//! | [`limits`] | the `maxUnavailable` a driver policy's pass plans with (0 while refused or held) and the one it reports |
//! | [`trust`] | which installer images and source repositories a policy may name, and the commit a version is built from |
//! | `fixtures` | hidden: Nodes, pods and observations for the tests of every crate |
//!
//! No import circle between these files (test code aside), and no function
//! over 150 lines (`hack/check-structure.py`, in `make lint`).

pub mod claim;
pub mod condition;
pub mod device_holders;
pub mod drain;
pub mod event;
pub mod firmware;
#[doc(hidden)]
pub mod fixtures;
pub mod go_ahead;
pub mod handover;
pub mod installer;
pub mod limits;
pub mod machine;
pub mod node;
pub mod observe;
pub mod prepare;
pub mod promotion;
pub mod reason;
pub mod record;
pub mod rollout;
pub mod selection;
pub mod slots;
pub mod soak;
pub mod surface;
pub mod trust;
pub mod window;
