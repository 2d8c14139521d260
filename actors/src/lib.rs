//! The node's actors. Each is a pure core (deterministic, no I/O, no clock: events in, effects
//! out) plus a thin actix shell that owns timers and I/O and executes the effects.

pub mod admission;
pub mod aggregator;
pub mod gateway;
pub mod health;
pub mod liveness;
pub mod neigh;
pub mod probe;
