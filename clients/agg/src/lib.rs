//! Gradient aggregation through Switchyard's aggregator (XAgg), from the worker's side.
//!
//! - [`wire`]: the frame format (docs/aggregation-protocol.md), the one encoder and decoder
//!   every party uses: the worker client, the reference model and the tests of the XDP program.
//! - [`fixed`]: float32 gradients as block fixed point, scaled so an N-way sum cannot overflow.
//! - [`model`]: the aggregator's state machine in plain Rust: the reference the XDP program is
//!   tested against, and the user-space UDP aggregator the benchmark compares it with.
//! - [`worker`]: a worker's all-reduce over UDP: windowed sending, timeouts with
//!   retransmission, result assembly.
//! - [`session`]: joining a job through the local `yard` node's agent and following its
//!   membership.

pub mod fixed;
pub mod model;
pub mod session;
pub mod wire;
pub mod worker;
