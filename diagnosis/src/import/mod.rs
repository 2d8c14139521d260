//! Importers: offline records of a job from other tools, reduced to a [`Trace`](crate::event::Trace)
//! the analyzer reads like any live job.
//!
//! - [`fr`]: PyTorch Flight Recorder dumps (pickle or JSON), one per rank; also writers, so the
//!   simulator produces dumps in exactly PyTorch's shape.
//! - [`ras`]: the output of NCCL's RAS client (`ncclras`, text or `-f json`).
//!
//! Every failure is an [`ImportError`] naming the file; no input makes these functions panic.

mod error;
pub mod fr;
pub mod ras;

pub use error::ImportError;
pub use fr::{
    read_dir, read_dump, to_trace, write_json, write_pickle, FrDump, FrEntry, FrPg, FrPgStatus,
};
pub use ras::read_ras;
