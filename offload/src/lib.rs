//! XDP offload to a SmartNIC (the planner's OXDP part, DESIGN.md): which parts of an XDP
//! program a NIC could run, and where to split a pipeline between the NIC and the host.
//!
//! - [`profile`]: capability profiles (`nfp`, `hxdp`, `none`) as data, each rule traced to the
//!   driver source or the paper it comes from;
//! - [`elf`], [`btf`], [`insn`]: a compiled BPF object read into programs, functions,
//!   instructions, maps and relocations;
//! - [`check`]: the static eligibility checker over those, answering per function and per
//!   instruction range;
//! - [`plan`], [`gateway`]: a forwarding function as a DAG of primitive ops (the gateway's is
//!   built in) and the NIC/host split that maximises modelled throughput under a profile;
//! - [`gen`]: the NIC and host programs for a cut, in C, from one template per op;
//! - [`attach`]: the shell that attaches them (hardware mode tried, clean fallback).
//!
//! Everything but [`attach`] is pure: no I/O beyond reading the object's bytes the caller
//! hands in, so it is tested in microseconds and runs on a machine with no SmartNIC at all. Figures that
//! depend on a NIC (target instruction counts, throughput) are models and say so.

pub mod attach;
pub mod btf;
pub mod check;
pub mod elf;
mod error;
pub mod gateway;
pub mod gen;
pub mod insn;
pub mod plan;
pub mod profile;

pub use check::{check, Report, Verdict};
pub use elf::Object;
pub use error::Error;
pub use profile::Profile;

/// Reads and checks one object file: the CLI's `yard offload check`.
pub fn check_file(path: &std::path::Path, profile: &Profile) -> Result<Report, Error> {
    let data = std::fs::read(path)?;
    let obj = Object::parse(&data)?;
    Ok(check(&obj, profile))
}
