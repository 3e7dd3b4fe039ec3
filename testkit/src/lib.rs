//! Support for tests against the local simulated cluster (`hack/cluster.sh up`).
//!
//! Every test gets a [`TestEnv`] with a unique id; everything it creates carries
//! the label `ttdrv-test=<id>`, so tests share one cluster without colliding.
//! The cluster tests are `#[ignore]`d, so plain `cargo test` skips them (listed as
//! ignored); `make test` runs them with `--ignored` (`hack/run-cluster-tests.sh`).
//! Once asked to run, a test that cannot reach the cluster fails with
//! instructions; it never skips.
//!
//! | module | what it gives a test |
//! |---|---|
//! | [`cluster`] | [`TestEnv`], the client, [`wait_for`], node, pod and CRD helpers (re-exported here) |
//! | [`controller`] | the real controller binary against the test cluster, scoped to one test |
//! | [`policy`] | driver and firmware policy helpers (create, patch, status) |
//! | [`sim_agent`] | the node agent's stand-in on kwok nodes |
//! | [`sim_flasher`] | the flasher's stand-in on kwok nodes |
//! | [`stack`] | simulated DaemonSets of the Tenstorrent stack (telemetry collector, fabric-manager agent), each modelling a contract of ../shared/design/STACK.md |
//! | [`sim_workload`] | a workload pod that takes seconds to stop when evicted (held by a finalizer the simulated agent removes), for the demo |
//! | [`real_node`] | the tests on a real kubelet |
//! | [`ttcard`] | emulated Wormhole and Blackhole cards for QEMU (`ttdrv-ttcard`) |

pub mod cluster;
pub mod controller;
pub mod policy;
pub mod real_node;
pub mod sim_agent;
pub mod sim_flasher;
pub mod sim_workload;
pub mod stack;
pub mod ttcard;

pub use cluster::*;
pub use controller::{ControllerOptions, ControllerProcess};
pub use sim_agent::{SimAgent, SimAgentConfig};
