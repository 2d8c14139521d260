//! The control plane's decisions at cluster size, as pure cores (no I/O, no clock: time comes
//! in as milliseconds): which hosts vote and whom the autopilot promotes (`roles`), when a
//! host that holds no vote is dead (`host_liveness`), and which replica an agent follows
//! (`follow`), and whether a voter may stand for election (`prevote`). The node's loops in `node/src/roles/` only execute what these return.

pub mod follow;
pub mod host_liveness;
pub mod prevote;
pub mod roles;
