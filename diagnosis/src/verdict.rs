//! What the analyzer concludes. The JSON form is an interface operators script against
//! (`yard diagnose --json`): `{"class", "subtype", "culprits", "links", "pg", "seq", "op",
//! "evidence", "confidence"}`, root cause first.

use crate::event::{Op, Rank};
use serde::{Deserialize, Serialize};
use std::fmt;

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

impl fmt::Display for Subtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self).expect("subtype serializes");
        f.write_str(s.as_str().unwrap_or("unknown"))
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
}
