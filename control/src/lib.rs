//! The control plane's decisions at cluster size, as pure cores (no I/O, no clock: time comes
//! in as milliseconds): which hosts vote and whom the autopilot promotes (`roles`), when a
//! host that holds no vote is dead (`host_liveness`), and which replica an agent follows
//! (`follow`), whether a voter may stand for election (`prevote`), and when a node renews its certificate
//! (`cert_renewal`). The node's loops in `node/src/roles/` only execute what these return.

pub mod cert_renewal;
pub mod follow;
pub mod host_liveness;
pub mod leader_transfer;
pub mod prevote;
pub mod roles;
