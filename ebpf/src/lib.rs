//! Switchyard's XDP and TC programs and their typed Rust loaders.
//!
//! The programs are C in `ebpf/bpf/*.bpf.c`, compiled by `build.rs` with `clang -target bpf`
//! and embedded in this crate, so nothing needs a compiler at run time:
//!
//! - [`Gateway`] (`yard_gateway`): the overlay gateway's data plane: forwards VXLAN traffic sent
//!   to the cluster's VIPs to the compute host of the inner destination and answers ARP, fenced by
//!   the node's lease (see DESIGN.md, "Failure detection and fencing").
//! - [`Bounce`] (`yard_bounce`): swaps MACs and bounces; the per-packet cost floor benchmarks
//!   report every program against.
//! - [`PeerCounters`] (`yard_peers_ingress`/`yard_peers_egress`, TC): a training job's traffic
//!   per peer host and direction, which the probe reads to corroborate a slow link.
//! - [`Aggregator`] (`yard_agg`, XDP, and `yard_agg_fanout`, TC): gradient aggregation with the
//!   whole gradient of each job in kernel memory, results sent to every worker.
//!
//! The structs shared with C are mirrored in [`layout`]; [`frames`] builds test and benchmark
//! frames; [`ktime_now_ns`] reads the clock the program compares lease deadlines with.

pub mod aggregator;
mod bounce;
mod clock;
mod counters;
mod emunic;
pub mod frames;
mod gateway;
pub mod layout;
mod maps;
pub mod peers;
mod program;
mod sys;
mod test_run;

use std::io;
use std::path::PathBuf;

pub use aggregator::{AggCounter, AggJobEntry, AggParent, Aggregator, SumVariant};
pub use bounce::Bounce;
pub use clock::ktime_now_ns;
pub use counters::{Counter, CounterValue};
pub use emunic::{error_chain, hardware_refused, try_hardware, EmulatedNic};
pub use gateway::{Endpoint, Gateway, GatewayConfig, GatewayImage, VipMode, VipStats, XdpMode};
pub use peers::{Direction, PeerCounter, PeerCounters, PeerStat, TcAction};
pub use test_run::{bench_xdp, run_xdp, TestOutcome, XdpAction};

/// Why an operation on an eBPF program or its maps failed.
///
/// Every variant names what was being done; the underlying aya or OS error is its `source()`.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// The embedded object could not be parsed, or its maps could not be created or adopted.
    #[error("could not load the eBPF object {object}")]
    Load {
        object: &'static str,
        #[source]
        source: aya::EbpfError,
    },
    /// The object lacks a program or map this crate expects: build and code are out of step.
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        kind: &'static str,
        name: &'static str,
    },
    /// The kernel refused the program (verifier, permissions) or an attach/test-run call.
    #[error("could not {action} the eBPF program {program}")]
    Program {
        action: &'static str,
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map operation failed.
    #[error("could not {action} map {map}")]
    Map {
        action: &'static str,
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    /// A pinned map left by an earlier run does not match this build's definition, so adopting it
    /// would make the program misread its entries.
    #[error("pinned map {path} is incompatible with this build ({detail}); remove the pin directory to start afresh")]
    IncompatiblePin { path: PathBuf, detail: String },
    /// Pinning, opening or replacing a pinned XDP link failed.
    #[error("could not {action} the XDP link pinned at {path}")]
    Link {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A file-system operation on the pin directory failed.
    #[error("could not {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// BPF_PROG_TEST_RUN refuses packet input shorter than an Ethernet header.
    #[error("a test frame must be at least 14 bytes long, got {0}")]
    FrameTooShort(usize),
    /// The VNI does not fit the 24 bits VXLAN carries.
    #[error("vni {0} does not fit in 24 bits")]
    InvalidVni(u32),
    /// The interface name cannot be used (empty, too long or containing '/' or NUL).
    #[error("invalid interface name {0:?}")]
    InvalidInterface(String),
    /// Adding the clsact qdisc that legacy (pre-tcx) TC attachment needs failed.
    #[error("could not add the clsact qdisc to {iface}")]
    Qdisc {
        iface: String,
        #[source]
        source: aya::programs::tc::TcError,
    },
    /// A job's slot range does not fit the slot map (the placement and the loader disagree).
    #[error("job {job} needs slots {base}..{end} but the slot map holds {have}")]
    SlotRange {
        job: u32,
        base: u32,
        end: u64,
        have: u32,
    },
    /// More workers than a job's contribution bitmap holds.
    #[error("job {job} has {count} workers; a job holds at most 64")]
    TooManyWorkers { job: u32, count: usize },
    /// A redirect map slot could not be pointed at an interface (the emulated NIC's handoff).
    #[error("could not point {map} at {iface}")]
    Redirect {
        map: &'static str,
        iface: String,
        #[source]
        source: Box<aya::maps::xdp::XdpMapError>,
    },
    /// More ports than the program's port map holds.
    #[error("{count} ports do not fit the port map, which holds {max}")]
    TooManyPorts { count: usize, max: u32 },
    /// A job the chosen sum strategy of the aggregator cannot sum (see `SumVariant`).
    #[error("the {variant} sum strategy {reason}")]
    SumVariant {
        variant: &'static str,
        reason: &'static str,
    },
    /// The possible CPUs could not be counted (a per-CPU map's values are one per CPU).
    #[error("could not count the possible CPUs ({what})")]
    Cpus {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A job's entry does not give one token per member.
    #[error("job {job} has {members} members but {tokens} tokens")]
    Tokens {
        job: u32,
        members: usize,
        tokens: usize,
    },
    /// The kernel's random generator could not be read (the aggregator's fan-out tag).
    #[error("could not read random bytes for the aggregator's fan-out tag")]
    Random(#[source] std::io::Error),
}
