//! The probe: each node takes its local ranks' collective events over a Unix socket, counts
//! the job's traffic per peer in eBPF, and streams compact summaries to the analyzer on the
//! Raft leader.

pub mod actor;
pub mod core;
pub mod socket;
