//! The gateway: XDP east-west forwarding through a cluster of gateway nodes that owns a pool of
//! VIPs. Every voter grants leases ([`lease`]); the leader revokes lapsed nodes, damps their
//! return ([`leader`], [`damping`]) and places VIPs ([`placement`]); every gateway node keeps
//! its XDP maps equal to the replicated tables and its lease.

pub mod actor;
pub mod announce;
pub mod core;
pub mod damping;
pub mod dataplane;
pub mod kernel_path;
pub mod leader;
pub mod lease;
pub mod placement;
pub mod replan;
pub mod service_plan;
pub mod sources;
