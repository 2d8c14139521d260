//! The aggregator's invariants under faults, judged from what the workers saw.
//!
//! Workers of one int32 job sum round after round through the XDP aggregator while the schedule
//! kills, pauses and cuts off the yard nodes, the aggregating one among them. Whatever happens,
//! every round a worker completes must be the exact sum (int32 sums are exact, so exact on every
//! worker is the same on every worker), completed once (rounds finish in order, none twice, and
//! no chunk's result is ever answered with two different sums), and rounds must complete again
//! once the faults are healed.

use crate::gateway::Ms;

/// One round as one worker completed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundDone {
    pub worker: usize,
    pub round: u32,
    /// The epoch the round completed in.
    pub epoch: u32,
    /// Whether the result was the exact (wrapping) sum of every worker's gradient.
    pub exact: bool,
    /// Results for an already completed chunk of the round that differed from the first.
    pub conflicting: u64,
    /// When it completed, on the run clock.
    pub at_ms: Ms,
}

/// What was wrong, if anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AggVerdict {
    /// Rounds every worker completed.
    pub rounds: u32,
    /// Epochs the rounds completed in (each regrouping is one).
    pub epochs: Vec<u32>,
    /// (worker, round) whose result was not the exact sum.
    pub inexact: Vec<(usize, u32)>,
    /// (worker, round) completed out of order or twice.
    pub out_of_order: Vec<(usize, u32)>,
    /// Chunks answered with two different sums, over all rounds.
    pub conflicting: u64,
    /// Workers that completed no round after `healed_ms`.
    pub stuck: Vec<usize>,
}

impl AggVerdict {
    /// Whether every completed round was exact, identical everywhere and completed once.
    pub fn safe(&self) -> bool {
        self.inexact.is_empty() && self.out_of_order.is_empty() && self.conflicting == 0
    }

    /// Whether every worker made progress after the faults healed.
    pub fn live(&self) -> bool {
        self.stuck.is_empty() && self.rounds > 0
    }
}

/// Judges `done` (in any order) for `workers` workers that each counted rounds from 0, where
/// the last fault healed at `healed_ms`.
pub fn judge(done: &[RoundDone], workers: usize, healed_ms: Ms) -> AggVerdict {
    let mut v = AggVerdict::default();
    let mut per_worker: Vec<Vec<&RoundDone>> = vec![Vec::new(); workers];
    for d in done {
        if let Some(w) = per_worker.get_mut(d.worker) {
            w.push(d);
        }
    }
    for (w, rounds) in per_worker.iter_mut().enumerate() {
        rounds.sort_by_key(|d| d.at_ms);
        for (i, d) in rounds.iter().enumerate() {
            if d.round != i as u32 {
                v.out_of_order.push((w, d.round));
            }
            if !d.exact {
                v.inexact.push((w, d.round));
            }
            v.conflicting += d.conflicting;
            if !v.epochs.contains(&d.epoch) {
                v.epochs.push(d.epoch);
            }
        }
        if !rounds.iter().any(|d| d.at_ms > healed_ms) {
            v.stuck.push(w);
        }
    }
    v.epochs.sort_unstable();
    v.rounds = per_worker.iter().map(|r| r.len() as u32).min().unwrap_or(0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(worker: usize, round: u32, at_ms: Ms) -> RoundDone {
        RoundDone {
            worker,
            round,
            epoch: 1 + round / 3,
            exact: true,
            conflicting: 0,
            at_ms,
        }
    }

    fn healthy() -> Vec<RoundDone> {
        (0..3)
            .flat_map(|w| (0..6).map(move |r| done(w, r, i64::from(r) * 100 + w as i64)))
            .collect()
    }

    #[test]
    fn a_healthy_run_is_safe_and_live() {
        let v = judge(&healthy(), 3, 350);
        assert!(v.safe() && v.live(), "{v:?}");
        assert_eq!(v.rounds, 6);
        assert_eq!(v.epochs, vec![1, 2]);
    }

    #[test]
    fn an_inexact_round_is_named() {
        let mut d = healthy();
        d[4].exact = false;
        let v = judge(&d, 3, 0);
        assert_eq!(v.inexact, vec![(0, 4)]);
        assert!(!v.safe());
    }

    #[test]
    fn a_round_completed_twice_or_skipped_is_out_of_order() {
        let mut d = healthy();
        d.push(done(2, 5, 10_000));
        let v = judge(&d, 3, 0);
        assert_eq!(v.out_of_order, vec![(2, 5)]);
        let mut d = healthy();
        d.retain(|x| !(x.worker == 1 && x.round == 3));
        let v = judge(&d, 3, 0);
        assert_eq!(v.out_of_order, vec![(1, 4), (1, 5)]);
    }

    #[test]
    fn a_conflicting_chunk_result_is_unsafe() {
        let mut d = healthy();
        d[0].conflicting = 1;
        assert!(!judge(&d, 3, 0).safe());
    }

    #[test]
    fn a_worker_with_no_round_after_the_heal_is_stuck() {
        let mut d = healthy();
        d.retain(|x| !(x.worker == 2 && x.round >= 4));
        let v = judge(&d, 3, 350);
        assert_eq!(v.stuck, vec![2]);
        assert!(v.safe() && !v.live());
        assert_eq!(v.rounds, 4);
    }
}
