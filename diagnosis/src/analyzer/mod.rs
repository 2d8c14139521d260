//! The analyzer: a pure core (events and the caller's clock in, verdicts out) that runs on the
//! Raft leader for live jobs and in `yard diagnose --fr-dumps` for offline ones.

use crate::event::{Coll, Event, Trace};
use crate::verdict::Verdict;

/// Thresholds. Every time is nanoseconds on the analyzer's own clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// A collective in flight with no progress for this long is a hang, whatever its history.
    pub hang_floor_ns: u64,
    /// ... or for this many times the op's usual duration, if that is longer.
    pub hang_factor: f64,
    /// A rank silent (no heartbeat, no event) this long is dead.
    pub heartbeat_timeout_ns: u64,
    /// An op this many times slower than its own baseline is slow.
    pub slow_factor: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hang_floor_ns: 2_000_000_000,
            hang_factor: 10.0,
            heartbeat_timeout_ns: 2_000_000_000,
            slow_factor: 1.5,
        }
    }
}

/// One job's analyzer.
#[derive(Debug)]
pub struct JobAnalyzer {
    job: String,
    cfg: Config,
    verdicts: Vec<Verdict>,
}

impl JobAnalyzer {
    pub fn new(job: impl Into<String>, cfg: Config) -> Self {
        JobAnalyzer {
            job: job.into(),
            cfg,
            verdicts: Vec::new(),
        }
    }

    pub fn job(&self) -> &str {
        &self.job
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Takes one event, received at `now_ns` on the analyzer's clock.
    pub fn ingest(&mut self, _ev: &Event, _now_ns: u64) {}

    /// Re-evaluates at `now_ns` and returns the current verdicts, root cause first.
    pub fn evaluate(&mut self, _now_ns: u64) -> &[Verdict] {
        &self.verdicts
    }

    /// The collective records around a verdict's op, for the timeline picture.
    pub fn window(&self, _verdict: &Verdict) -> Vec<Coll> {
        Vec::new()
    }
}

/// Offline analysis of a finished record.
pub fn analyze_trace(trace: &Trace, cfg: &Config) -> Vec<Verdict> {
    let mut a = JobAnalyzer::new(trace.job.clone(), cfg.clone());
    for ev in &trace.events {
        a.ingest(ev, trace.taken_ns);
    }
    a.evaluate(trace.taken_ns).to_vec()
}
