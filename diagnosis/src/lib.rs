//! Diagnosis of slow and hung collective communication: the event model every source reduces
//! to, the analyzer (a pure core), importers for PyTorch Flight Recorder dumps and NCCL RAS
//! output, the probe clients' wire format, a simulator with fault injection and a scorer, and
//! the timeline picture. No I/O happens here except reading and writing the files named by the
//! importers' and simulator's callers.

pub mod analyzer;
pub mod client;
pub mod event;
pub mod import;
pub mod score;
pub mod sim;
pub mod timeline;
pub mod verdict;
pub mod wire;
