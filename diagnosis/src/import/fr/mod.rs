//! PyTorch Flight Recorder (FR) dumps: the per-rank ring buffer of collectives that
//! `ProcessGroupNCCL` writes on a watchdog timeout (`TORCH_NCCL_DUMP_ON_TIMEOUT=1`).
//!
//! The types mirror the dict PyTorch pickles (`FlightRecorderDetail.hpp`, `dump_dict`): the same
//! key names, and the value shapes of the pickle variant (integers stay integers, missing times
//! are `None`). The JSON variant (`dump_json`) differs in three ways this module absorbs: the
//! `pg_status` numbers and `pg_config` ranks are strings, a missing discovery time is `0`, and
//! `entries` is left out when there are none.
//!
//! **Where the rank comes from.** PyTorch's dump does not say whose it is: the writer names the
//! file `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` + rank (e.g. `nccl_trace_rank_3`) and the analyzer's
//! loader takes the digits at the end of the file name. [`read_dump`] does the same (after
//! dropping a `.json`, `.pkl` or `.pickle` extension). The writers here also store a `rank` key,
//! which PyTorch's loader ignores; it is used when the file name has no trailing digits, and a
//! file whose name and key disagree is rejected.

mod read;
mod trace;
mod write;

use crate::event::Rank;
use std::collections::BTreeMap;

pub use read::read_dump;
pub use trace::{read_dir, to_trace};
pub use write::{write_json, write_pickle};

/// The `version` this module writes; readers accept any `2.x`.
pub const FR_VERSION: &str = "2.10";

/// One rank's dump.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FrDump {
    /// The global rank whose buffer this is (from the file name or the `rank` key).
    pub rank: Rank,
    /// The dump format version, "2.4" … "2.10".
    pub version: String,
    /// Process groups this rank knows, keyed by group name.
    pub pg_config: BTreeMap<String, FrPg>,
    /// Per process group progress, keyed by `pg_id` (as a decimal string, as PyTorch writes it).
    pub pg_status: BTreeMap<String, FrPgStatus>,
    /// The ring buffer, oldest first.
    pub entries: Vec<FrEntry>,
}

/// A process group: its name, its description ("default_pg", "tp", …) and its members' global
/// ranks in group-rank order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrPg {
    pub name: String,
    pub desc: String,
    pub ranks: Vec<Rank>,
}

/// The watchdog's counters for one process group (-1 before the first collective).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrPgStatus {
    pub last_enqueued_collective: i64,
    pub last_started_collective: i64,
    pub last_completed_collective: i64,
}

/// One collective or point-to-point operation in the ring buffer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FrEntry {
    /// Position in this rank's recorder since start (grows across ring wraps).
    pub record_id: u64,
    pub pg_id: u64,
    /// `(name, desc)` of the process group, a tuple in the pickle.
    pub process_group: (String, String),
    /// Per group count of collectives (one per coalesced group).
    pub collective_seq_id: u64,
    /// Per group count of point-to-point ops.
    pub p2p_seq_id: u64,
    /// Per group count of logical ops (each op inside a coalesced group counts).
    pub op_id: u64,
    /// `nccl:all_reduce`, `nccl:send 1->2` (group ranks, self first), `nccl:recv 3<-0`, …
    pub profiling_name: String,
    /// When the op was enqueued (host clock, ns).
    pub time_created_ns: u64,
    /// When the watchdog found the start event done (late by up to a polling period).
    pub time_discovered_started_ns: Option<u64>,
    /// When the watchdog found the end event done.
    pub time_discovered_completed_ns: Option<u64>,
    /// One shape per input tensor.
    pub input_sizes: Vec<Vec<i64>>,
    /// C++ scalar type names: "Float", "BFloat16", …
    pub input_dtypes: Vec<String>,
    pub output_sizes: Vec<Vec<i64>>,
    pub output_dtypes: Vec<String>,
    /// `scheduled`, `started` or `completed`.
    pub state: String,
    /// A retired but not completed entry has timed out.
    pub retired: bool,
    pub timeout_ms: u64,
    /// GPU time of the op, present only with `TORCH_NCCL_ENABLE_TIMING`.
    pub duration_ms: Option<f64>,
    pub is_p2p: bool,
}

/// FR's three entry states.
pub const STATE_SCHEDULED: &str = "scheduled";
pub const STATE_STARTED: &str = "started";
pub const STATE_COMPLETED: &str = "completed";

/// Formats ranks the way PyTorch's `ranks_str` does: `"[0, 1, 2]"`.
pub(crate) fn ranks_str(ranks: &[Rank]) -> String {
    let inner: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    format!("[{}]", inner.join(", "))
}
