//! What runs the controller's actors, whatever the kind: the caches and
//! their watches ([`watch`], [`pod_index`], [`daemon_set_index`]: every
//! DaemonSet's deploy gates and device use; [`slice_index`]: the DRA
//! driver's ResourceSlices as device counts by node), the context every actor shares
//! ([`context`]), the slot book's lock ([`claims`]), per-object write
//! backoff ([`write_backoff`]), one policy's actor whatever its kind
//! ([`policy_actor`]: passes one at a time, restarts, node actors, the
//! status write), leadership ([`leader`]), the Go controller's exit awaited
//! ([`handover`]), the admin server whose `/ready` follows the caches
//! ([`admin`]) and the count of the client's API requests ([`requests`]).

pub mod admin;
pub mod claims;
pub mod context;
pub mod daemon_set_index;
pub mod handover;
pub mod leader;
pub mod pod_index;
pub mod policy_actor;
pub mod requests;
pub mod slice_index;
pub mod watch;
pub mod write_backoff;
