//! Chaos testing for Switchyard: recorded workloads, a linearizability checker and fault
//! schedules.
//!
//! The pieces are pure so that they can be tested in microseconds and trusted when a real cluster
//! run says "violation":
//! - [`history`]: what clients did and saw, with three-valued outcomes (ok, failed, unknown);
//! - [`linearizability`]: decides whether a history of per-key register operations could have
//!   come from one atomic register per key, and shrinks a violation to a small witness;
//! - [`workload`]: drives any [`workload::KvClient`] with a seeded concurrent mix and records it;
//! - [`schedule`]: a seeded, reproducible fault plan that never faults a majority of hosts;
//! - [`gateway`]: the gateway's invariants under faults (one data-plane owner per VIP at any
//!   instant, a live owner within a budget, probe loss windows per phase of the run).
//!
//! - [`aggregation`]: the aggregator's invariants under faults (every round exact and completed
//!   once, progress after the faults heal).
//!
//! - [`inject`], [`yard_client`], [`gateway_monitor`] and [`agg_monitor`] connect them to a real `yard` cluster
//!   in network namespaces; the `chaos` binary runs a seeded schedule against one.

pub mod agg_monitor;
pub mod aggregation;
pub mod gateway;
pub mod gateway_monitor;
pub mod history;
pub mod inject;
pub mod linearizability;
pub mod schedule;
pub mod workload;
pub mod yard_client;

pub use history::{
    Entry, Event, EventKind, FailReason, History, Op, OpHandle, OpResult, Outcome, ProcessId,
    Recorder,
};
pub use linearizability::{
    check, check_with, CheckConfig, CheckError, Counterexample, InconclusiveKey, Verdict,
};
pub use schedule::{
    generate, stall_within, Fault, FaultKind, Schedule, ScheduleConfig, ScheduleError, Step,
    MAX_TOTAL, STALL_MAX, STALL_MIN,
};
pub use workload::{
    key_set, run_workload, ClientError, KvClient, OpMix, WorkloadConfig, WorkloadError,
    WorkloadSummary,
};
