//! Replicated diagnosis verdicts: the analyzer on the leader commits each job's current
//! verdict set here, so `yard diagnose --job J` answers from any node and a new leader starts
//! from what the old one concluded.
//!
//! Bounded: at most [`MAX_JOBS`] jobs (the least recently updated is forgotten first) and
//! [`MAX_HISTORY`] past verdicts per job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use yard_verdict::Verdict;

/// Jobs kept; beyond this the least recently updated job is forgotten.
pub const MAX_JOBS: usize = 1024;
/// Verdicts kept per job in its history (every verdict that was ever raised, newest last).
pub const MAX_HISTORY: usize = 64;

/// A job's diagnosis as last committed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobDiagnosis {
    /// The current verdicts, root cause first; empty for a healthy job.
    pub verdicts: Vec<Verdict>,
    /// Verdicts raised since the job was first seen, newest last (bounded).
    pub history: Vec<Verdict>,
    /// The proposer's wall clock when this was committed (carried in the command).
    pub updated_unix_ms: u64,
    /// Cluster revision of the last change.
    pub revision: u64,
}

/// A change to the diagnosis table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DiagnosisCommand {
    /// Replace `job`'s current verdicts. Verdicts not current before are appended to its
    /// history.
    SetVerdicts {
        job: String,
        verdicts: Vec<Verdict>,
        now_unix_ms: u64,
    },
    /// Forget a job.
    ClearJob { job: String },
}

/// Every job's diagnosis.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiagnosisTables {
    pub jobs: BTreeMap<String, JobDiagnosis>,
}

impl DiagnosisTables {
    /// Applies one command at `revision`; returns whether anything changed.
    pub fn apply(&mut self, cmd: &DiagnosisCommand, revision: u64) -> bool {
        match cmd {
            DiagnosisCommand::SetVerdicts {
                job,
                verdicts,
                now_unix_ms,
            } => {
                let entry = self.jobs.entry(job.clone()).or_default();
                if entry.revision != 0 && entry.verdicts == *verdicts {
                    return false;
                }
                for v in verdicts {
                    if !entry.verdicts.iter().any(|old| old.key() == v.key()) {
                        entry.history.push(v.clone());
                    }
                }
                let excess = entry.history.len().saturating_sub(MAX_HISTORY);
                entry.history.drain(..excess);
                entry.verdicts = verdicts.clone();
                entry.updated_unix_ms = *now_unix_ms;
                entry.revision = revision;
                self.evict();
                true
            }
            DiagnosisCommand::ClearJob { job } => self.jobs.remove(job).is_some(),
        }
    }

    /// Forgets the least recently updated jobs beyond [`MAX_JOBS`] (ties by name, so every
    /// node forgets the same one).
    fn evict(&mut self) {
        while self.jobs.len() > MAX_JOBS {
            let oldest = self
                .jobs
                .iter()
                .min_by_key(|(name, j)| (j.updated_unix_ms, j.revision, (*name).clone()))
                .map(|(name, _)| name.clone());
            match oldest {
                Some(name) => {
                    self.jobs.remove(&name);
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yard_verdict::{Class, Subtype};

    fn verdict(culprit: u32) -> Verdict {
        Verdict {
            class: Class::Hang,
            subtype: Subtype::DeadProcess,
            culprits: vec![culprit],
            links: vec![],
            pg: None,
            seq: None,
            op: None,
            evidence: vec!["silent".into()],
            confidence: 0.9,
            detected_ns: 1,
        }
    }

    fn set(t: &mut DiagnosisTables, job: &str, v: Vec<Verdict>, rev: u64) -> bool {
        t.apply(
            &DiagnosisCommand::SetVerdicts {
                job: job.into(),
                verdicts: v,
                now_unix_ms: rev,
            },
            rev,
        )
    }

    #[test]
    fn verdicts_replace_and_history_keeps_each_raised_verdict_once() {
        let mut t = DiagnosisTables::default();
        assert!(set(&mut t, "j", vec![verdict(3)], 1));
        assert!(
            !set(&mut t, "j", vec![verdict(3)], 2),
            "same set is no change"
        );
        assert!(set(&mut t, "j", vec![], 3));
        assert!(set(&mut t, "j", vec![verdict(3), verdict(4)], 4));
        let j = &t.jobs["j"];
        assert_eq!(j.verdicts.len(), 2);
        let culprits: Vec<_> = j.history.iter().map(|v| v.culprits[0]).collect();
        assert_eq!(culprits, vec![3, 3, 4]);
        assert_eq!(j.revision, 4);
    }

    /// Every field and variant a replicated verdict can carry, for the encoding test.
    fn rich_tables() -> (DiagnosisCommand, DiagnosisTables) {
        use yard_verdict::Op;
        use yard_verdict::{Link, LinkKind, PgRef};
        let classes = [Class::Hang, Class::Slow, Class::Mismatch];
        let subtypes = Subtype::ALL;
        let ops: Vec<Op> = Op::ALL.into_iter().chain([Op::Other]).collect();
        let kinds = [LinkKind::Pair, LinkKind::Nic, LinkKind::Switch];
        let verdicts: Vec<Verdict> = subtypes
            .iter()
            .enumerate()
            .map(|(i, &subtype)| Verdict {
                class: classes[i % classes.len()],
                subtype,
                culprits: (0..i as u32).map(|r| r * 300).collect(),
                links: vec![Link {
                    kind: kinds[i % kinds.len()],
                    name: format!("rank {i} (h{i}) -> rank 2 (h3)"),
                    from: (i % 2 == 0).then_some(i as u32),
                    to: (i % 3 == 0).then_some(70_000),
                }],
                pg: (i % 2 == 1).then(|| PgRef {
                    name: "dp".into(),
                    ranks: vec![0, 1, 1 << 20],
                }),
                seq: (i % 2 == 0).then_some(u64::MAX - i as u64),
                op: Some(ops[i]),
                evidence: vec![format!("fact {i}"), "é".into()],
                confidence: 0.1 * i as f64,
                detected_ns: 1 << (3 * i),
            })
            .chain(std::iter::once(Verdict {
                op: Some(Op::Other),
                pg: None,
                seq: None,
                links: vec![],
                ..verdict(3)
            }))
            .collect();
        let cmd = DiagnosisCommand::SetVerdicts {
            job: "train".into(),
            verdicts,
            now_unix_ms: 1_700_000_000_000,
        };
        let mut t = DiagnosisTables::default();
        t.apply(&cmd, 42);
        (cmd, t)
    }

    /// Verdicts are in the Raft log and in snapshots: their encoding must never change by
    /// accident (a moved or reordered type would make every stored entry unreadable). The
    /// digest pins the bytes; the round trip checks they decode to what was written.
    #[test]
    fn the_replicated_verdict_encoding_round_trips_and_is_unchanged() {
        let (cmd, tables) = rich_tables();
        let cmd_bytes = crate::codec::encode(&cmd).unwrap();
        let table_bytes = crate::codec::encode(&tables).unwrap();
        assert_eq!(
            crate::codec::decode::<DiagnosisCommand>(&cmd_bytes).unwrap(),
            cmd
        );
        assert_eq!(
            crate::codec::decode::<DiagnosisTables>(&table_bytes).unwrap(),
            tables
        );
        // FNV-1a over the encodings, recorded when verdicts moved out of yard-diagnosis.
        let fnv = |b: &[u8]| {
            b.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &x| {
                (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
            })
        };
        assert_eq!(
            (
                cmd_bytes.len(),
                fnv(&cmd_bytes),
                table_bytes.len(),
                fnv(&table_bytes)
            ),
            (990, 4354710854132877978, 1965, 1055084645771074708)
        );
    }

    #[test]
    fn a_healthy_job_is_recorded_with_no_verdicts() {
        let mut t = DiagnosisTables::default();
        assert!(set(&mut t, "ok", vec![], 1));
        assert!(t.jobs["ok"].verdicts.is_empty());
    }

    #[test]
    fn history_and_jobs_are_bounded() {
        let mut t = DiagnosisTables::default();
        for i in 0..(MAX_HISTORY as u32 + 10) {
            set(&mut t, "j", vec![verdict(i)], u64::from(i) + 1);
        }
        assert_eq!(t.jobs["j"].history.len(), MAX_HISTORY);
        for i in 0..(MAX_JOBS + 5) {
            set(&mut t, &format!("job{i}"), vec![], 1000 + i as u64);
        }
        assert_eq!(t.jobs.len(), MAX_JOBS);
        assert!(
            !t.jobs.contains_key("j"),
            "the least recently updated job goes first"
        );
        assert!(t.apply(
            &DiagnosisCommand::ClearJob {
                job: format!("job{}", MAX_JOBS + 4)
            },
            5000
        ));
    }
}
