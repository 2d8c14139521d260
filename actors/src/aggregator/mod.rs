//! The aggregator (XAgg): gradient aggregation in XDP, the whole gradient of each job in
//! kernel memory (see `ebpf/bpf/aggregator.bpf.c` and docs/aggregation-protocol.md).
//!
//! - [`placement`]: the leader's decisions, pure: which host sums each job (its slot budget,
//!   not a worker's own host unless the job allows it), moved in one command when that host is
//!   unreachable, and the workers lost with their host.
//! - [`tree`]: the leader's tree for a grouped job (ALEPH): the planner's grouping on the
//!   measured bandwidths, and whether it is worth a regrouping.
//! - [`core`]: a host's side, pure: which jobs of the replicated tables it serves, as the XDP
//!   program's table entries, and what changed since the last time.
//! - [`bandwidth`]: a node's side, pure: which aggregating hosts it measures its bandwidth to
//!   now (the grouping's input).
//! - [`eligible`]: the one rule for which hosts may aggregate a job and which bandwidth figure
//!   stands for each worker-host pair, used by the placement, the trees and the probes.
//! - [`auth`]: the frames' tokens, drawn from each job's secret per epoch, aggregator and
//!   worker: what proves a frame is a member's own, or its aggregator's.
//! - [`actor`]: the actix shell that owns the XDP program and applies the core's effects.

pub mod actor;
pub mod auth;
pub mod bandwidth;
pub mod core;
pub mod eligible;
pub mod placement;
pub mod tree;
