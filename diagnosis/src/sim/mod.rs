//! A deterministic discrete-event simulator of what a training job's probe clients report: a
//! Megatron-style TP×PP×DP job on NVLink nodes under ToR switches, one step after another, with
//! one injected fault (or control) and measurement noise. It exists so the analyzer can be scored
//! against ground truth at any scale without GPUs.
//!
//! The collective semantics are what make the fault signatures faithful: a rank enqueues when
//! it arrives, data moves once the last member has arrived, the transfer runs at the pace of the
//! slowest link of the ring or tree, so an early rank shows a long op and a straggler a short
//! one. Every host's events carry that host's clock skew; the analyzer's clock is the true time.
//!
//! Everything is drawn from one seeded `StdRng` (timing) and a second one derived from the same
//! seed (noise), so one seed gives one timeline, and turning noise on does not move it.

mod counters;
mod engine;
mod faults;
mod flight_recorder;
mod topology;
mod workload;

pub use faults::{Fault, Label, LabelLink, MismatchKind};
pub use flight_recorder::{fr_dumps, missing_dumps};
pub use topology::{GroupKind, SimGroup, Topology};
pub use workload::kind_spec;

use crate::event::Event;
use crate::import;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// How a group's all-reduce moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algo {
    /// Each rank sends 2(n−1)/n·S to the next rank of the ring.
    Ring,
    /// A binary tree: reduce up, then broadcast down; every edge carries S each way.
    Tree,
}

/// Which training recipe the job runs: it decides the ops each group carries, how Flight
/// Recorder records them and how the groups are named.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Megatron TP×PP×DP: TP all-reduces per pass, blocking PP send/recv, a DP all-reduce.
    #[default]
    Megatron,
    /// Megatron with sequence parallelism: each TP all-reduce becomes an all-gather before the
    /// layer and a reduce-scatter after it.
    TpSp,
    /// A pipeline whose stage hand-offs go through `batch_isend_irecv`: Flight Recorder then
    /// writes each send or recv plus one `nccl:coalesced` entry under one `p2p_seq_id`.
    Pipeline,
    /// HSDP: the TP groups are shard groups (an all-gather per layer forward and backward, a
    /// reduce-scatter per layer backward), the DP groups replica groups (an all-reduce of the
    /// reduced shard at step end).
    Hsdp,
    /// DiLoCo-style: inner steps touch only the node-local group; every `outer_every` steps the
    /// DP groups all-reduce the pseudo-gradient over slow links, which legitimately takes long.
    Diloco,
}

/// When the Flight Recorder dumps are taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "trigger", rename_all = "snake_case")]
pub enum DumpTrigger {
    /// By the watchdog, once the oldest op in flight has been so for the timeout.
    #[default]
    Timeout,
    /// On demand (`_dump_nccl_trace`, a debug endpoint) at this offset from the job's start,
    /// whatever is in flight.
    OnDemand { at_ns: u64 },
}

/// Bytes each rank contributes to one op, by group kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpBytes {
    /// Each TP all-reduce (activations).
    pub tp: u64,
    /// Each PP send/recv (activations or their gradients).
    pub pp: u64,
    /// The DP gradient all-reduce at step end.
    pub dp: u64,
    /// The world barrier and loss all-reduce.
    pub world: u64,
}

/// Link speeds and the switch layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkSpec {
    /// NVLink bandwidth per pair inside a node, bytes per ns (= GB/s).
    pub nvlink_bytes_per_ns: f64,
    pub nvlink_latency_ns: u64,
    /// Bandwidth of a path between two nodes' NICs, bytes per ns.
    pub nic_bytes_per_ns: f64,
    pub nic_latency_ns: u64,
    /// Nodes under one ToR switch.
    pub nodes_per_tor: u32,
}

/// Measurement noise.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Noise {
    /// How many ranks (chosen by seed) have no Flight Recorder dump, besides a crashed rank.
    pub missing_dumps: u32,
    /// Flight Recorder ring-buffer entries per rank (`TORCH_NCCL_TRACE_BUFFER_SIZE`); 0 keeps all.
    pub fr_buffer: usize,
    /// Fraction of probe reports (collective phases, per-peer progress, heartbeats) lost on the
    /// way to the analyzer.
    pub dropped_events: f64,
}

/// One simulated job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimSpec {
    pub job: String,
    #[serde(default)]
    pub kind: JobKind,
    /// Layers per stage (the per-layer collectives of `TpSp` and `Hsdp`).
    #[serde(default = "default_layers")]
    pub layers: u32,
    /// DiLoCo's inner steps per outer all-reduce.
    #[serde(default = "default_outer_every")]
    pub outer_every: u32,
    #[serde(default)]
    pub dump: DumpTrigger,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub algo: Algo,
    pub steps: u32,
    /// One rank's compute per step (forward and backward together), before jitter.
    pub step_compute_ns: u64,
    /// σ of the lognormal compute jitter (0.02 = about 2 %).
    pub jitter: f64,
    pub bytes: OpBytes,
    pub links: LinkSpec,
    /// A loss all-reduce over the world group every this many steps (0: only the start-up
    /// barrier touches the world group).
    pub log_every: u32,
    pub heartbeat_interval_ns: u64,
    /// Probe clients batch their reports and ship them this often; it is the delivery delay.
    pub summary_interval_ns: u64,
    /// Each host's clock is off the true time by a random amount within ±this.
    pub clock_skew_ns: u64,
    /// How long the simulation goes on after the last progress of a hung job (the detection
    /// horizon).
    pub tail_ns: u64,
    /// The job's start on the true (analyzer) clock.
    pub epoch_ns: u64,
    pub fault: Option<Fault>,
    pub noise: Noise,
    pub seed: u64,
}

impl SimSpec {
    /// A healthy ring job of `nodes × gpus_per_node` ranks with data parallelism filling the rest;
    /// realistic defaults for everything else (an H100-class node: 8 GPUs, NVLink ~150 GB/s,
    /// one 400 Gb/s NIC; a 300 ms step).
    pub fn new(nodes: u32, gpus_per_node: u32, tp: u32, pp: u32) -> SimSpec {
        let world = nodes.saturating_mul(gpus_per_node);
        let dp = world / tp.max(1) / pp.max(1);
        SimSpec {
            job: "sim".into(),
            kind: JobKind::Megatron,
            layers: default_layers(),
            outer_every: default_outer_every(),
            dump: DumpTrigger::Timeout,
            nodes,
            gpus_per_node,
            tp,
            pp,
            dp,
            algo: Algo::Ring,
            steps: 6,
            step_compute_ns: 300_000_000,
            jitter: 0.02,
            bytes: OpBytes {
                tp: 16 << 20,
                pp: 8 << 20,
                dp: 256 << 20,
                world: 8,
            },
            links: LinkSpec {
                nvlink_bytes_per_ns: 150.0,
                nvlink_latency_ns: 3_000,
                nic_bytes_per_ns: 50.0,
                nic_latency_ns: 10_000,
                nodes_per_tor: 4,
            },
            log_every: 0,
            heartbeat_interval_ns: 100_000_000,
            summary_interval_ns: 100_000_000,
            clock_skew_ns: 0,
            tail_ns: 10_000_000_000,
            epoch_ns: 1_700_000_000_000_000_000,
            fault: None,
            noise: Noise::default(),
            seed: 1,
        }
    }

    pub fn world(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }
}

fn default_layers() -> u32 {
    4
}

fn default_outer_every() -> u32 {
    4
}

/// Why a simulation cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("bad job shape: {0}")]
    Shape(String),
    #[error("bad fault: {0}")]
    Fault(String),
    #[error("the fault never fired: {0}")]
    NeverFired(String),
    #[error("bad simulation parameter: {0}")]
    Param(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode {path}: {reason}")]
    Encode { path: PathBuf, reason: String },
    #[error(transparent)]
    Dump(#[from] import::ImportError),
}

/// A whole simulation held in memory; prefer [`simulate_into`] for large jobs.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// Events with their delivery time on the analyzer's clock, in delivery order.
    pub events: Vec<(u64, Event)>,
    pub label: Label,
    /// When the last event has been delivered (analyzer's clock).
    pub end_ns: u64,
    pub world: u32,
}

/// What the streaming form reports once the last event has been handed over.
#[derive(Clone, Debug, PartialEq)]
pub struct SimSummary {
    pub label: Label,
    pub end_ns: u64,
    pub world: u32,
    /// Events handed to the sink.
    pub events: u64,
    /// The most events ever buffered at once: the simulator's memory high-water mark.
    pub peak_buffered: usize,
}

/// Runs the simulation, handing each event to `sink` with its delivery time, in delivery order.
/// Memory stays bounded by about one step's worth of events, so this is the form for 16k ranks.
pub fn simulate_into(
    spec: &SimSpec,
    sink: &mut impl FnMut(u64, &Event),
) -> Result<SimSummary, SimError> {
    engine::Engine::new(spec)?.run(sink)
}

/// Runs the simulation and keeps every event.
pub fn simulate(spec: &SimSpec) -> Result<Simulation, SimError> {
    let mut events = Vec::new();
    let summary = simulate_into(spec, &mut |t, ev| events.push((t, ev.clone())))?;
    Ok(Simulation {
        events,
        label: summary.label,
        end_ns: summary.end_ns,
        world: summary.world,
    })
}

/// One line of `events.jsonl`: the event with the time the analyzer received it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delivered {
    pub recv_ns: u64,
    #[serde(flatten)]
    pub event: Event,
}

/// Writes under `dir` (created if needed): `events.jsonl` (one [`Delivered`] per line),
/// `label.json`, `spec.json`, and each rank's Flight Recorder dump as PyTorch's pickle
/// (`fr/rank_<r>`) and JSON (`fr-json/rank_<r>.json`).
pub fn write_outputs(sim: &Simulation, spec: &SimSpec, dir: &Path) -> Result<(), SimError> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SimError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;

    let path = dir.join("events.jsonl");
    let file = File::create(&path).map_err(write_err(&path))?;
    let mut out = BufWriter::new(file);
    for (recv_ns, event) in &sim.events {
        let line = Delivered {
            recv_ns: *recv_ns,
            event: event.clone(),
        };
        serde_json::to_writer(&mut out, &line).map_err(|e| SimError::Encode {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        out.write_all(b"\n").map_err(write_err(&path))?;
    }
    out.flush().map_err(write_err(&path))?;

    write_json(&dir.join("label.json"), &sim.label)?;
    write_json(&dir.join("spec.json"), spec)?;

    let (pickles, jsons) = (dir.join("fr"), dir.join("fr-json"));
    for sub in [&pickles, &jsons] {
        std::fs::create_dir_all(sub).map_err(write_err(sub))?;
    }
    for dump in fr_dumps(sim, spec)? {
        let rank = dump.rank;
        import::fr::write_pickle(&dump, &pickles.join(format!("rank_{rank}")))?;
        import::fr::write_json(&dump, &jsons.join(format!("rank_{rank}.json")))?;
    }
    Ok(())
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), SimError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| SimError::Encode {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    std::fs::write(path, text).map_err(|source| SimError::Write {
        path: path.to_path_buf(),
        source,
    })
}
