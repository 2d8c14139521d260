//! What the analyzer concludes, as a type of its own: the verdict is replicated (the Raft
//! state machine stores each job's current verdicts), so `yard-raft-store` depends on this
//! small crate rather than on all of `yard-diagnosis` (its simulator, client and importers).
//! `yard-diagnosis` re-exports everything here from `verdict` (and `Op`, `Rank` from `event`).
//!
//! The JSON form is an interface operators script against (`yard diagnose --json`):
//! `{"class", "subtype", "culprits", "links", "pg", "seq", "op", "evidence", "confidence"}`,
//! root cause first. The serde shapes are also the bincode encoding in the Raft log and in
//! snapshots: change them only with a versioned command.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A global rank in the job.
pub type Rank = u32;

/// The collective or point-to-point operation, in Flight Recorder's `profiling_name` vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Op {
    AllReduce = 0,
    AllGather = 1,
    ReduceScatter = 2,
    Broadcast = 3,
    Reduce = 4,
    AllToAll = 5,
    Barrier = 6,
    Send = 7,
    Recv = 8,
    Gather = 9,
    Scatter = 10,
    Coalesced = 11,
    Other = 255,
}

impl Op {
    /// Every named op (not `Other`), for parsers and generators.
    pub const ALL: [Op; 12] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Reduce,
        Op::AllToAll,
        Op::Barrier,
        Op::Send,
        Op::Recv,
        Op::Gather,
        Op::Scatter,
        Op::Coalesced,
    ];

    /// The name used in output and in Flight Recorder (`nccl:<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
            Op::Barrier => "barrier",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Gather => "gather",
            Op::Scatter => "scatter",
            Op::Coalesced => "coalesced",
            Op::Other => "other",
        }
    }

    /// Parses a name as [`Op::name`] writes it; also accepts Flight Recorder's names with a
    /// backend prefix (`nccl:`, `ncclx:`, `gloo:`, `xccl:`, as fr_trace does), the
    /// `_base`/`_oop`/`_coalesced` forms PyTorch records and its `_allgather_base`. Unknown
    /// names are `Other`.
    pub fn parse(name: &str) -> Op {
        let name = name.split_once(':').map_or(name, |(_, op)| op);
        let name = name.split_whitespace().next().unwrap_or("");
        if name.ends_with("coalesced") {
            return Op::Coalesced;
        }
        let name = name.strip_prefix('_').unwrap_or(name);
        let name = name.strip_suffix("_base").unwrap_or(name);
        let name = name.strip_suffix("_oop").unwrap_or(name);
        let name = name.strip_suffix("_into_tensor").unwrap_or(name);
        // ProcessGroupNCCL names `all_gather_into_tensor` "nccl:_allgather_base".
        if name == "allgather" {
            return Op::AllGather;
        }
        Op::ALL
            .into_iter()
            .find(|op| op.name() == name)
            .unwrap_or(Op::Other)
    }

    /// The wire code (`repr(u8)`).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The op for a wire code; unknown codes are `None` so a decoder can reject the frame.
    pub fn from_code(code: u8) -> Option<Op> {
        if code == Op::Other as u8 {
            return Some(Op::Other);
        }
        Op::ALL.into_iter().find(|op| op.code() == code)
    }

    /// Point-to-point ops pair a send with a recv instead of matching all members.
    pub fn is_p2p(self) -> bool {
        matches!(self, Op::Send | Op::Recv)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of trouble.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Progress stopped.
    Hang,
    /// Progress continues, slower than this job's own history.
    Slow,
    /// Ranks disagree about which collective comes next (type, size, dtype or membership).
    Mismatch,
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Class::Hang => "hang",
            Class::Slow => "slow",
            Class::Mismatch => "mismatch",
        })
    }
}

/// The specific cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subtype {
    /// Some members never entered the stuck collective (they are behind the majority).
    MissingParticipant,
    /// Some members issued a collective the majority did not (they are ahead).
    ExtraParticipant,
    /// Same (group, seq), different collective type.
    TypeMismatch,
    /// Same (group, seq), different size.
    SizeMismatch,
    /// Same (group, seq), different dtype.
    DtypeMismatch,
    /// The process stopped heartbeating (killed, stopped, crashed) or left no record.
    DeadProcess,
    /// Every member entered the collective; data stopped moving (GPU kernel, proxy or link).
    DataplaneStall,
    /// One rank arrives last at collectives and waits least: it computes slowly.
    ComputeStraggler,
    /// Transfers between a pair of ranks (or through one NIC) are slow; no rank is at fault.
    SlowLink,
    /// Several links under one switch slowed together.
    Congestion,
    /// Something is wrong but the evidence does not name a cause; the evidence lists what is
    /// missing (FR's "cannot decide").
    Undecided,
}

impl Subtype {
    /// Every subtype, for tests and generators that must cover them all.
    pub const ALL: [Subtype; 11] = [
        Subtype::MissingParticipant,
        Subtype::ExtraParticipant,
        Subtype::TypeMismatch,
        Subtype::SizeMismatch,
        Subtype::DtypeMismatch,
        Subtype::DeadProcess,
        Subtype::DataplaneStall,
        Subtype::ComputeStraggler,
        Subtype::SlowLink,
        Subtype::Congestion,
        Subtype::Undecided,
    ];

    /// The name in output and in the JSON form (`"missing_participant"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Subtype::MissingParticipant => "missing_participant",
            Subtype::ExtraParticipant => "extra_participant",
            Subtype::TypeMismatch => "type_mismatch",
            Subtype::SizeMismatch => "size_mismatch",
            Subtype::DtypeMismatch => "dtype_mismatch",
            Subtype::DeadProcess => "dead_process",
            Subtype::DataplaneStall => "dataplane_stall",
            Subtype::ComputeStraggler => "compute_straggler",
            Subtype::SlowLink => "slow_link",
            Subtype::Congestion => "congestion",
            Subtype::Undecided => "undecided",
        }
    }
}

impl fmt::Display for Subtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a link-level verdict names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// The path from one rank to another.
    Pair,
    /// One host's NIC (every pair through it is slow).
    Nic,
    /// A switch (pairs under it slowed together).
    Switch,
}

/// A link or component blamed instead of a rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Link {
    pub kind: LinkKind,
    /// Human name: "rank 1 (h2) -> rank 2 (h3)", "h2/eth0", "tor-3".
    pub name: String,
    /// Sending rank of a pair (or a rank behind the NIC); `None` for a switch.
    pub from: Option<Rank>,
    /// Receiving rank of a pair.
    pub to: Option<Rank>,
}

/// The process group a verdict is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PgRef {
    pub name: String,
    pub ranks: Vec<Rank>,
}

/// One diagnosis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub class: Class,
    pub subtype: Subtype,
    /// Global ranks at fault, sorted; empty when a link or component is blamed.
    pub culprits: Vec<Rank>,
    pub links: Vec<Link>,
    pub pg: Option<PgRef>,
    pub seq: Option<u64>,
    pub op: Option<Op>,
    /// One sentence per fact the verdict rests on.
    pub evidence: Vec<String>,
    /// 0..=1.
    pub confidence: f64,
    /// When the analyzer first concluded this (its own clock, ns); 0 offline.
    #[serde(default)]
    pub detected_ns: u64,
}

impl Verdict {
    /// Identity for "is this the same verdict as before": everything but evidence wording,
    /// confidence and time, so a verdict that keeps holding is not re-alerted.
    pub fn key(&self) -> (Class, Subtype, Vec<Rank>, Vec<Link>, Option<String>) {
        (
            self.class,
            self.subtype,
            self.culprits.clone(),
            self.links.clone(),
            self.pg.as_ref().map(|p| p.name.clone()),
        )
    }
}

/// The `--json` document: `{"verdicts": [...]}`, root cause first; empty for a healthy job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub verdicts: Vec<Verdict>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_json_has_the_documented_fields() {
        let v = Verdict {
            class: Class::Hang,
            subtype: Subtype::MissingParticipant,
            culprits: vec![3],
            links: vec![],
            pg: Some(PgRef {
                name: "0".into(),
                ranks: vec![0, 1, 2, 3],
            }),
            seq: Some(12),
            op: Some(Op::AllReduce),
            evidence: vec!["rank 3 never enqueued all_reduce #12".into()],
            confidence: 0.9,
            detected_ns: 0,
        };
        let json = serde_json::to_value(Report { verdicts: vec![v] }).unwrap();
        let v = &json["verdicts"][0];
        for field in [
            "class",
            "subtype",
            "culprits",
            "links",
            "pg",
            "seq",
            "op",
            "evidence",
            "confidence",
        ] {
            assert!(v.get(field).is_some(), "missing {field}");
        }
        assert_eq!(v["class"], "hang");
        assert_eq!(v["subtype"], "missing_participant");
        assert_eq!(v["op"], "all_reduce");
        assert_eq!(v["pg"]["ranks"], serde_json::json!([0, 1, 2, 3]));
        assert_eq!(Subtype::SlowLink.to_string(), "slow_link");
    }

    /// `Display` spells every subtype as its JSON form does.
    #[test]
    fn subtype_names_are_their_json_names() {
        for s in Subtype::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.to_string());
        }
    }
}
