//! Where a host's role is executed. The decisions live in `yard_control` (pure cores); the
//! loops here carry them out:
//! - `watch`: a Raft member serves agents' watches from its watch log;
//! - `agent`: a host that holds no vote follows the tables through a watch from a member and
//!   forwards every write and linearizable read to the leader it learns from the watch.

pub mod agent;
pub mod autopilot;
pub mod liveness;
pub mod members;
pub mod watch;
