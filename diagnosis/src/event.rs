//! The event model every source is reduced to: live probe clients (Python, Rust, the NCCL
//! profiler plugin), Flight Recorder dumps, NCCL RAS output and the simulator all produce
//! [`Event`]s for one job, and the analyzer consumes nothing else.
//!
//! Times are nanoseconds on the reporting host's wall clock (`CLOCK_REALTIME`). Hosts' clocks
//! are skewed, so the analyzer compares a rank's own times with each other (durations) and
//! uses its own receive clock for "how long has nothing happened"; it never orders two ranks'
//! events by their absolute times alone.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A global rank in the job, and the collective or point-to-point operation: defined with the
/// verdict types (which name both) in `yard-verdict`.
pub use yard_verdict::{Op, Rank};

/// A process group's name, shared by all its members (PyTorch's `pg_config` key, e.g. "0").
pub type PgName = Arc<str>;

/// Element type of the tensors, in PyTorch's dtype names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Dtype {
    Float32 = 0,
    Float16 = 1,
    BFloat16 = 2,
    Float64 = 3,
    Int32 = 4,
    Int64 = 5,
    Int8 = 6,
    UInt8 = 7,
    Bool = 8,
    Float8 = 9,
    Other = 255,
}

impl Dtype {
    /// Every named dtype (not `Other`).
    pub const ALL: [Dtype; 10] = [
        Dtype::Float32,
        Dtype::Float16,
        Dtype::BFloat16,
        Dtype::Float64,
        Dtype::Int32,
        Dtype::Int64,
        Dtype::Int8,
        Dtype::UInt8,
        Dtype::Bool,
        Dtype::Float8,
    ];

    /// PyTorch's name (`torch.float32` prints as "Float" in Flight Recorder, see [`Dtype::parse`]).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Float16 => "float16",
            Dtype::BFloat16 => "bfloat16",
            Dtype::Float64 => "float64",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::Int8 => "int8",
            Dtype::UInt8 => "uint8",
            Dtype::Bool => "bool",
            Dtype::Float8 => "float8",
            Dtype::Other => "other",
        }
    }

    /// Bytes per element (1 for unknown types, so a size is never zero by accident).
    pub fn size(self) -> u64 {
        match self {
            Dtype::Float64 | Dtype::Int64 => 8,
            Dtype::Float32 | Dtype::Int32 => 4,
            Dtype::Float16 | Dtype::BFloat16 => 2,
            _ => 1,
        }
    }

    /// Parses our names, `torch.`-prefixed names and the C++ scalar names Flight Recorder
    /// writes ("Float", "Half", "BFloat16", "Double", "Int", "Long", "Char", "Byte", "Bool").
    pub fn parse(name: &str) -> Dtype {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        match name {
            "Float" | "float" => return Dtype::Float32,
            "Half" | "half" => return Dtype::Float16,
            "BFloat16" => return Dtype::BFloat16,
            "Double" | "double" => return Dtype::Float64,
            "Int" | "int" => return Dtype::Int32,
            "Long" | "long" => return Dtype::Int64,
            "Char" => return Dtype::Int8,
            "Byte" => return Dtype::UInt8,
            "Bool" => return Dtype::Bool,
            _ => {}
        }
        if name.starts_with("Float8") || name.starts_with("float8") {
            return Dtype::Float8;
        }
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .unwrap_or(Dtype::Other)
    }

    /// The wire code (`repr(u8)`).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The dtype for a wire code; unknown codes are `None`.
    pub fn from_code(code: u8) -> Option<Dtype> {
        if code == Dtype::Other as u8 {
            return Some(Dtype::Other);
        }
        Dtype::ALL.into_iter().find(|d| d.code() == code)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an operation is in its life on one rank (Flight Recorder's `state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Phase {
    /// Handed to the communication library (FR `time_created_ns`); the rank has arrived.
    Enqueue = 0,
    /// Data movement began on this rank (FR `time_discovered_started_ns`, NCCL kernel start).
    Start = 1,
    /// Finished on this rank (FR `time_discovered_completed_ns`).
    End = 2,
}

impl Phase {
    /// The phase for a wire code.
    pub fn from_code(code: u8) -> Option<Phase> {
        match code {
            0 => Some(Phase::Enqueue),
            1 => Some(Phase::Start),
            2 => Some(Phase::End),
            _ => None,
        }
    }
}

/// Direction of a per-peer transfer, seen from the reporting rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Dir {
    Send = 0,
    Recv = 1,
}

impl Dir {
    /// The direction for a wire code.
    pub fn from_code(code: u8) -> Option<Dir> {
        match code {
            0 => Some(Dir::Send),
            1 => Some(Dir::Recv),
            _ => None,
        }
    }
}

/// One rank's process, as it introduced itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub rank: Rank,
    pub world_size: u32,
    /// The node (host) the rank runs on, e.g. the yard node's name.
    pub host: String,
    /// The host's underlay address, to relate eBPF per-peer counters to ranks ("" if unknown).
    pub addr: String,
    /// The NIC the rank's traffic uses ("" if unknown), e.g. "eth0" or "mlx5_3".
    pub nic: String,
    /// The switch (ToR) above the host ("" if unknown), for congestion correlation.
    pub switch: String,
    pub pid: u32,
}

/// A process group: its name and its members' global ranks, in group-rank order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub name: PgName,
    /// PyTorch's `desc` ("default_pg", "tp", "dp", …). Groups of one description and size
    /// run one program's ops (a data-parallel job's replicas): the offline rules compare a
    /// group with these siblings.
    pub desc: String,
    pub ranks: Vec<Rank>,
}

/// One phase of one collective (or p2p op) on one rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coll {
    pub rank: Rank,
    pub pg: PgName,
    /// Per-group sequence number: FR `collective_seq_id`, or `p2p_seq_id` for send/recv.
    pub seq: u64,
    pub op: Op,
    pub dtype: Dtype,
    /// Element count of the input (per rank).
    pub count: u64,
    /// Bytes this rank contributes (count × dtype size for most ops).
    pub bytes: u64,
    /// Element count of the output, where the source records it (Flight Recorder's
    /// `output_sizes`); 0 when it does not (the live probe, whose clients report inputs).
    /// Not serialized: only offline imports set it, and they are analyzed where they are read,
    /// while the live events it would add to cross nodes in bincode, which is positional, so a
    /// new field would make one version's probe reports unreadable to the other in a rolling
    /// upgrade.
    #[serde(skip)]
    pub out_count: u64,
    /// The other rank of a send/recv (global rank); `None` for collectives.
    pub peer: Option<Rank>,
    pub phase: Phase,
    pub t_ns: u64,
}

/// Cumulative progress of one rank's transfers with one peer inside one op: bytes moved and the
/// time spent moving or waiting for them. Throughput per (from, to) pair is what names a link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerProgress {
    pub rank: Rank,
    pub pg: PgName,
    pub seq: u64,
    pub peer: Rank,
    pub dir: Dir,
    pub bytes: u64,
    /// Time this rank spent blocked on this peer in this direction (NCCL's `RecvWait` /
    /// `SendWait` analogue).
    pub busy_ns: u64,
    pub t_ns: u64,
}

/// eBPF counters of one host's traffic with one peer host, for the job's ports; cumulative.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkCounters {
    /// The counting host's underlay address.
    pub addr: String,
    /// The peer host's underlay address.
    pub peer_addr: String,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub rx_packets: u64,
    /// When a packet from the peer was last seen (counting host's clock), 0 if never.
    pub last_rx_ns: u64,
    pub t_ns: u64,
}

/// Everything a source can say about a job.
///
/// Externally tagged (`{"heartbeat": {...}}` in JSON) rather than internally tagged, because
/// the node ships events to the analyzer with bincode, which cannot decode internal tags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Member(Member),
    Group(Group),
    Coll(Coll),
    Peer(PeerProgress),
    /// The rank's process is alive (sent by clients every ~100 ms, independent of progress).
    Heartbeat {
        rank: Rank,
        t_ns: u64,
    },
    /// The rank's process said goodbye (clean exit); silence after this is not a fault.
    Exit {
        rank: Rank,
        t_ns: u64,
    },
    Counters(LinkCounters),
}

impl Event {
    /// The rank the event is about, if it is about one.
    pub fn rank(&self) -> Option<Rank> {
        match self {
            Event::Member(m) => Some(m.rank),
            Event::Coll(c) => Some(c.rank),
            Event::Peer(p) => Some(p.rank),
            Event::Heartbeat { rank, .. } | Event::Exit { rank, .. } => Some(*rank),
            Event::Group(_) | Event::Counters(_) => None,
        }
    }
}

/// A finished, offline record of a job (from dumps or a simulation): events in any order, the
/// ranks expected, and the ranks whose record is missing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub job: String,
    pub events: Vec<Event>,
    /// The job's world: every global rank that should have reported.
    pub world: Vec<Rank>,
    /// Ranks with no record at all (e.g. a missing Flight Recorder dump).
    pub missing: Vec<Rank>,
    /// When the record was taken (latest dump time); the "now" of offline analysis.
    pub taken_ns: u64,
    /// The record was taken because the job timed out (a Flight Recorder dump on timeout, a
    /// RAS query of a stuck job): an op still in flight in it is stuck, whatever its age.
    #[serde(default)]
    pub stuck: bool,
    /// Completed ops' `End` times are their GPU's own (Flight Recorder with
    /// `TORCH_NCCL_ENABLE_TIMING`: creation plus GPU duration), not when a watchdog noticed
    /// them done.
    #[serde(default)]
    pub timed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_round_trip_and_parse_flight_recorder_spellings() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), op);
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
        assert_eq!(Op::parse("nccl:all_reduce"), Op::AllReduce);
        assert_eq!(Op::parse("nccl:_all_gather_base"), Op::AllGather);
        assert_eq!(Op::parse("nccl:_allgather_base"), Op::AllGather);
        assert_eq!(Op::parse("gloo:all_reduce"), Op::AllReduce);
        assert_eq!(Op::parse("ncclx:_broadcast_oop"), Op::Broadcast);
        assert_eq!(Op::parse("nccl:_reduce_oop"), Op::Reduce);
        assert_eq!(Op::parse("nccl:send 1->2"), Op::Send);
        assert_eq!(Op::parse("nccl:recv 3<-0"), Op::Recv);
        assert_eq!(
            Op::parse("nccl:reduce_scatter_tensor_coalesced"),
            Op::Coalesced
        );
        assert_eq!(Op::parse("gloo:foo"), Op::Other);
        assert_eq!(Op::from_code(200), None);
    }

    #[test]
    fn dtype_names_parse_torch_and_cpp_spellings() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::parse(d.name()), d);
            assert_eq!(Dtype::from_code(d.code()), Some(d));
        }
        assert_eq!(Dtype::parse("Float"), Dtype::Float32);
        assert_eq!(Dtype::parse("torch.bfloat16"), Dtype::BFloat16);
        assert_eq!(Dtype::parse("Long"), Dtype::Int64);
        assert_eq!(Dtype::parse("complex32"), Dtype::Other);
    }

    #[test]
    fn events_serialize_externally_tagged() {
        let ev = Event::Heartbeat { rank: 3, t_ns: 7 };
        let json = serde_json::to_string(&ev).unwrap();
        assert_eq!(json, r#"{"heartbeat":{"rank":3,"t_ns":7}}"#);
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), ev);
    }
}
