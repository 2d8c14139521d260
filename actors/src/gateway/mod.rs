//! The gateway: XDP east-west forwarding through a cluster of gateway nodes that owns a pool of
//! VIPs. The leader places VIPs ([`placement`]) and grants leases ([`lease`]); every gateway node
//! keeps its XDP maps equal to the replicated tables and its lease.

pub mod actor;
pub mod announce;
pub mod core;
pub mod dataplane;
pub mod lease;
pub mod neigh;
pub mod placement;
