//! The analyzer: a pure core (events and the caller's clock in, verdicts out) that runs on the
//! Raft leader for live jobs and in `yard diagnose --fr-dumps` for offline ones.
//!
//! - [`state`] keeps a bounded picture of the job, updated per event;
//! - [`hang`] finds stuck group streams and says why (mismatch, dead process, missing or extra
//!   participant, data-plane stall);
//! - [`slow`] compares ops with the job's own baselines and with their peers in the same step
//!   (compute straggler, slow link, congestion), so a fault present from the first step is
//!   seen too;
//! - this module adds dead processes, orders verdicts root cause first and keeps a verdict's
//!   first detection time while it holds.
//!
//! Two clocks: "how long since anything happened" is measured on the analyzer's receive clock
//! (`now_ns`), and every timing comparison is between one rank's own timestamps (durations),
//! so hosts' clock skew changes nothing.

mod baseline;
mod hang;
mod paths;
mod record;
mod slow;
mod state;
mod text;

use crate::event::{Coll, Event, Op, Phase, Rank, Trace};
use crate::verdict::{Class, Subtype, Verdict};
use state::State;
pub use state::{Rejected, UNDECLARED_MAX_RANKS};

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
    /// Slow conditions are judged over this many recent ops of a kind (at most 32): they must
    /// hold in three quarters of them to raise a verdict and in none to clear it.
    pub slow_window: u32,
    /// A time must also exceed its baseline by this much to count as slow, so that jitter on a
    /// near-zero baseline (back-to-back collectives) is not read as a large ratio.
    pub slow_min_delta_ns: u64,
    /// Most heap bytes one job's state may hold (by the analyzer's own estimate, see
    /// [`JobAnalyzer::footprint`]); an event that would take it further is refused. Sized
    /// for a 16,384-rank job, with room, by [`DEFAULT_JOB_BUDGET`].
    pub job_budget_bytes: usize,
}

/// The default per-job budget: 512 MiB. A 16,384-rank Megatron-shaped job (each rank in
/// about six collective and point-to-point streams) holds about 16,384 × 6 × 2.6 KB ≈ 260 MB
/// of per-member windows and baselines; twice that leaves room for pairs, keys and Vec
/// slack, while a single job can no longer take the leader's memory.
pub const DEFAULT_JOB_BUDGET: usize = 512 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            hang_floor_ns: 2_000_000_000,
            hang_factor: 10.0,
            heartbeat_timeout_ns: 2_000_000_000,
            slow_factor: 1.5,
            slow_window: 8,
            slow_min_delta_ns: 1_000_000,
            job_budget_bytes: DEFAULT_JOB_BUDGET,
        }
    }
}

/// What only an offline record knows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Offline {
    /// Ranks that left no record, sorted.
    missing: Vec<Rank>,
    /// The record was taken at a timeout: whatever is in flight is stuck.
    pub(crate) stuck: bool,
    /// The record shows when it was taken: some op still in flight carries a start time (a
    /// Flight Recorder dump marks the ops it finds started as discovered at the dump). Without
    /// it the record's latest time is only its latest op, and how long an op has been in
    /// flight is unknown.
    pub(crate) dated: bool,
}

/// One job's analyzer.
#[derive(Debug)]
pub struct JobAnalyzer {
    job: String,
    cfg: Config,
    state: State,
    offline: Option<Offline>,
    /// Offline: the whole record, for the slow rules that compare groups with their siblings.
    record: Option<Box<record::Record>>,
    verdicts: Vec<Verdict>,
    /// Events refused for naming a rank outside the job's world.
    rejected: u64,
    /// [`JobAnalyzer::base_bytes`] as of the last evaluation (it changes only there).
    base: usize,
}

impl JobAnalyzer {
    pub fn new(job: impl Into<String>, cfg: Config) -> Self {
        JobAnalyzer {
            job: job.into(),
            cfg,
            state: State::default(),
            offline: None,
            record: None,
            verdicts: Vec::new(),
            rejected: 0,
            base: 0,
        }
        .with_base()
    }

    fn with_base(mut self) -> Self {
        self.base = self.base_bytes();
        self
    }

    pub fn job(&self) -> &str {
        &self.job
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Takes one event, received at `now_ns` on the analyzer's clock. An event naming a rank
    /// outside the job's world is dropped and counted ([`JobAnalyzer::rejected_events`]); use
    /// [`JobAnalyzer::try_ingest`] to hear why.
    pub fn ingest(&mut self, ev: &Event, now_ns: u64) {
        let _ = self.try_ingest(ev, now_ns);
    }

    /// [`JobAnalyzer::ingest`], saying why an event was refused.
    ///
    /// Ranks are bounded by the job's declared world size (the largest `world_size` its
    /// members announced) or, before any member declared one, by [`UNDECLARED_MAX_RANKS`]:
    /// rank state is indexed by rank, so one event with a huge rank number would otherwise
    /// grow the job by as many entries.
    ///
    /// An event that would take the job's state past [`Config::job_budget_bytes`] is refused
    /// too ([`Rejected::OverBudget`]).
    pub fn try_ingest(&mut self, ev: &Event, now_ns: u64) -> Result<(), Rejected> {
        self.try_ingest_within(ev, now_ns, usize::MAX)
    }

    /// [`JobAnalyzer::try_ingest`] with the job's footprint held to at most `limit` bytes as
    /// well as its own budget: the caller's share of a budget over many jobs.
    pub fn try_ingest_within(
        &mut self,
        ev: &Event,
        now_ns: u64,
        limit: usize,
    ) -> Result<(), Rejected> {
        let budget = self
            .cfg
            .job_budget_bytes
            .min(limit)
            .saturating_sub(self.base);
        let r = self.state.ingest(ev, now_ns, &self.cfg, budget);
        if r.is_err() {
            self.rejected += 1;
        }
        r
    }

    /// Events refused so far for naming a rank outside the job's world.
    pub fn rejected_events(&self) -> u64 {
        self.rejected
    }

    /// Re-evaluates at `now_ns` and returns the current verdicts, root cause first. A verdict
    /// that keeps holding keeps the `detected_ns` of its first evaluation.
    pub fn evaluate(&mut self, now_ns: u64) -> &[Verdict] {
        let dead = self.dead(now_ns);
        // Offline, a rank without a record is not known to be dead: the hang rules treat its
        // position as unknown, and it is blamed only if nothing else explains the hang.
        let dead_ranks: Vec<Rank> = match self.offline {
            Some(_) => Vec::new(),
            None => dead.iter().map(|d| d.0).collect(),
        };
        let mut hang = hang::evaluate(
            &self.state,
            &self.cfg,
            now_ns,
            self.offline.as_ref(),
            &dead_ranks,
        );
        let mut verdicts = Vec::new();
        // Reported after everything else the dumps say.
        let mut unexplained = None;
        if !dead.is_empty() {
            let mut notes = std::mem::take(&mut hang.dead_notes);
            if self.offline.is_some() {
                notes = std::mem::take(&mut hang.unknown_notes);
            }
            let explained = hang.verdicts.iter().any(|v| {
                (!v.culprits.is_empty() || !v.links.is_empty()) && v.confidence >= hang::WEAK
            });
            match &self.offline {
                None => verdicts.push(self.dead_verdict(&dead, notes)),
                Some(_) if explained || hang.unknown_blocking.is_empty() => {
                    unexplained = Some(self.unexplained_missing(&dead));
                }
                Some(_) => {
                    let blocking: Vec<(Rank, String)> = dead
                        .into_iter()
                        .filter(|d| hang.unknown_blocking.binary_search(&d.0).is_ok())
                        .collect();
                    verdicts.push(self.dead_verdict(&blocking, notes));
                }
            }
        }
        // Offline, the whole record is compared at once (see [`record`]), and only when nothing
        // is stuck or mismatched: then the hang is the finding, and what it delays is not slow.
        let slow = match &self.record {
            None => slow::evaluate(&self.state, &self.cfg, &hang.stuck, now_ns),
            Some(r) if verdicts.is_empty() && hang.verdicts.is_empty() => {
                record::evaluate(r, &self.cfg)
            }
            Some(_) => Vec::new(),
        };
        verdicts.extend(hang.verdicts);
        knock_on(&mut verdicts);
        verdicts.extend(slow);
        verdicts.extend(unexplained);
        by_node(&self.state, &mut verdicts);
        verdicts.sort_by_key(|v| (v.confidence < hang::WEAK, order(v)));
        condense(&mut verdicts);
        // One map of the previous keys, not a scan per verdict: a hung 16k-rank job holds
        // thousands of verdicts with long culprit lists, and the quadratic scan dominated.
        let before: std::collections::HashMap<_, u64> = self
            .verdicts
            .iter()
            .map(|old| (old.key(), old.detected_ns))
            .collect();
        for v in &mut verdicts {
            v.detected_ns = before.get(&v.key()).copied().unwrap_or(now_ns);
        }
        self.verdicts = verdicts;
        self.base = self.base_bytes();
        &self.verdicts
    }

    /// The collective records around a verdict's op, for the timeline picture: the culprits
    /// and link ends (an undecided verdict's ranked candidates when it names none) plus a few
    /// neighbours in group order (at most 16 ranks), for the seqs from three before to two
    /// after the verdict's seq in its group.
    pub fn window(&self, verdict: &Verdict) -> Vec<Coll> {
        const MAX_RANKS: usize = 16;
        const NEIGHBOURS: usize = 4;
        let mut focus: Vec<Rank> = verdict.culprits.clone();
        for l in &verdict.links {
            focus.extend(l.from.into_iter().chain(l.to));
        }
        // An undecided verdict's ranked candidates are where to look.
        if focus.is_empty() {
            focus = crate::timeline::candidates(verdict);
        }
        dedup_keep_order(&mut focus);
        let p2p = verdict.op.is_some_and(Op::is_p2p);
        let pgi = match &verdict.pg {
            Some(p) => self.state.find_pg(&p.name, &p.ranks, p2p),
            None => focus.iter().find_map(|&r| {
                let pgs = &self.state.ranks.get(r)?.pgs;
                let busy = pgs
                    .iter()
                    .find(|(p, m)| self.state.pgs[*p as usize].state[*m as usize].in_flight);
                busy.or(pgs.first()).map(|(p, _)| *p as usize)
            }),
        };
        let Some(pg) = pgi.and_then(|i| self.state.pgs.get(i)) else {
            return Vec::new();
        };
        let order = pg.ranks();
        focus.retain(|r| order.contains(r));
        focus.truncate(MAX_RANKS);
        let want = if focus.is_empty() {
            8
        } else {
            (focus.len() + NEIGHBOURS).min(MAX_RANKS)
        };
        let positions: Vec<usize> = focus
            .iter()
            .filter_map(|r| order.iter().position(|o| o == r))
            .collect();
        let mut picks = focus.clone();
        let mut d = 1;
        while picks.len() < want.min(order.len()) && d <= order.len() {
            for &p in &positions {
                for q in [p + d, p + order.len() - d] {
                    let r = order[q % order.len()];
                    if picks.len() < want && !picks.contains(&r) {
                        picks.push(r);
                    }
                }
            }
            if positions.is_empty() {
                picks.extend(order.iter().take(want));
                break;
            }
            d += 1;
        }
        picks.sort_unstable();
        let center = verdict.seq.unwrap_or_else(|| {
            pg.state
                .iter()
                .filter_map(|m| m.last_enq)
                .max()
                .unwrap_or(0)
        });
        let mut out = Vec::new();
        for rank in picks {
            let Some(m) = pg.member_of(rank) else {
                continue;
            };
            for seq in center.saturating_sub(3)..=center.saturating_add(2) {
                let Some(rec) = pg.rec(m, seq) else {
                    continue;
                };
                let phases = [
                    (rec.has_enq(), Phase::Enqueue, rec.enq),
                    (rec.has_start(), Phase::Start, rec.start),
                    (rec.has_end(), Phase::End, rec.end),
                ];
                for (_, phase, t_ns) in phases.into_iter().filter(|p| p.0) {
                    out.push(Coll {
                        rank,
                        pg: pg.name.clone(),
                        seq,
                        op: rec.sig.op,
                        dtype: rec.sig.dtype,
                        count: rec.sig.bytes / rec.sig.dtype.size(),
                        bytes: rec.sig.bytes,
                        out_count: rec.sig.out,
                        peer: rec.peer,
                        phase,
                        t_ns,
                    });
                }
            }
        }
        out
    }

    /// Heap bytes the job's analyzer holds, by its own estimate: every rank, stream member,
    /// declaration, pair, baseline and counter it stores (counted as stored, so this costs
    /// nothing to ask), plus the analyzer itself and its verdicts.
    pub fn footprint(&self) -> usize {
        self.base + self.state.bytes()
    }

    /// What the analyzer holds besides its state: itself, the job's name, its verdicts.
    fn base_bytes(&self) -> usize {
        let verdicts: usize = self
            .verdicts
            .iter()
            .map(|v| {
                std::mem::size_of::<Verdict>()
                    + v.culprits.len() * 4
                    + v.evidence.iter().map(String::len).sum::<usize>()
                    + v.pg
                        .as_ref()
                        .map_or(0, |p| p.name.len() + p.ranks.len() * 4)
                    + v.links.len() * 64
            })
            .sum();
        std::mem::size_of::<Self>() + self.job.len() + verdicts
    }

    /// The introduction rank `rank` sent, if any (for naming ranks in pictures).
    pub fn member(&self, rank: Rank) -> Option<&crate::event::Member> {
        self.state.ranks.get(rank)?.info.as_deref()
    }

    /// How many records the analyzer retains (per-member slots, pairs, baselines, ranks): a
    /// figure for metrics and for tests that memory stays bounded over long runs.
    pub fn retained_records(&self) -> usize {
        self.state.retained()
    }

    /// Dead ranks with why: silent past the heartbeat timeout (live) or without a record
    /// (offline); a rank that said goodbye is never dead.
    fn dead(&self, now: u64) -> Vec<(Rank, String)> {
        let exited = |r: Rank| self.state.ranks.get(r).is_some_and(|s| s.exited);
        match &self.offline {
            Some(o) => o
                .missing
                .iter()
                .filter(|&&r| !exited(r))
                .map(|&r| (r, format!("no flight recorder dump from rank {r}")))
                .collect(),
            None => {
                let mut dead: Vec<(Rank, &state::RankState)> = self
                    .state
                    .ranks
                    .iter()
                    .filter(|(_, s)| s.known && !s.exited)
                    .filter(|(_, s)| {
                        now.saturating_sub(s.last_seen) > self.cfg.heartbeat_timeout_ns
                    })
                    .collect();
                // Ranks are stored in the order they were first seen; verdicts name them in
                // rank order.
                dead.sort_unstable_by_key(|d| d.0);
                dead.into_iter()
                    .map(|(r, s)| {
                        let silent = now.saturating_sub(s.last_seen) as f64;
                        (
                            r,
                            format!(
                                "{} silent for {}: no heartbeat or event (timeout {})",
                                text::rank_at(&self.state, r),
                                text::dur(silent),
                                text::dur(self.cfg.heartbeat_timeout_ns as f64)
                            ),
                        )
                    })
                    .collect()
            }
        }
    }

    /// Offline ranks without a record when the records present explain the hang: reported
    /// after the root cause, with low confidence, since whether their absence matters is
    /// unknown (a dump can be lost for reasons that have nothing to do with the hang).
    fn unexplained_missing(&self, missing: &[(Rank, String)]) -> Verdict {
        let mut evidence: Vec<String> = missing.iter().map(|d| d.1.clone()).collect();
        evidence.push(
            "the records present explain the hang without them; their state is unknown".into(),
        );
        Verdict {
            class: Class::Hang,
            subtype: Subtype::Undecided,
            culprits: missing.iter().map(|d| d.0).collect(),
            links: Vec::new(),
            pg: None,
            seq: None,
            op: None,
            evidence,
            confidence: 0.2,
            detected_ns: 0,
        }
    }

    fn dead_verdict(&self, dead: &[(Rank, String)], notes: Vec<String>) -> Verdict {
        const SHOWN: usize = 8;
        let mut evidence: Vec<String> = dead.iter().take(SHOWN).map(|d| d.1.clone()).collect();
        if dead.len() > SHOWN {
            evidence.push(format!("{} more ranks are silent", dead.len() - SHOWN));
        }
        let blocking = !notes.is_empty();
        evidence.extend(notes);
        let confidence = match (&self.offline, blocking) {
            (None, true) => 0.95,
            (None, false) => 0.8,
            (Some(_), true) => 0.8,
            (Some(_), false) => 0.5,
        };
        Verdict {
            class: Class::Hang,
            subtype: Subtype::DeadProcess,
            culprits: dead.iter().map(|d| d.0).collect(),
            links: Vec::new(),
            pg: None,
            seq: None,
            op: None,
            evidence,
            confidence,
            detected_ns: 0,
        }
    }
}

/// Root cause first: dead processes, mismatches, missing/extra participants, data-plane
/// stalls, undecided hangs, then slow verdicts. Weak verdicts (below [`hang::WEAK`]) follow
/// all strong ones in the same order, so a guess never hides a well-founded verdict.
fn order(v: &Verdict) -> u8 {
    match (v.class, v.subtype) {
        (Class::Hang, Subtype::DeadProcess) => 0,
        (Class::Mismatch, _) => 1,
        (_, Subtype::MissingParticipant) => 2,
        (_, Subtype::ExtraParticipant) => 3,
        (Class::Hang, Subtype::DataplaneStall) => 4,
        (Class::Hang, _) => 5,
        (Class::Slow, Subtype::ComputeStraggler) => 6,
        (Class::Slow, Subtype::SlowLink) => 7,
        (Class::Slow, Subtype::Congestion) => 8,
        (Class::Slow, _) => 9,
    }
}

/// One fault seen in many groups of one node is one finding. A node whose ranks all misbehave
/// the same way (a stale config makes each of its eight ranks enqueue the wrong size in its own
/// data-parallel group; a slow host makes each a straggler in its own group) shows as one
/// verdict per group, each naming one rank of that node. Verdicts of one class and subtype that
/// each name only ranks of one host (known from the ranks' introductions), in two or more
/// groups, are folded into one naming the host and all its ranks. Offline records say nothing of
/// hosts; there only verdicts whose culprits together form one unbroken run of ranks (as one
/// node's ranks are numbered) are folded, and the evidence says the node is inferred.
fn by_node(state: &State, verdicts: &mut Vec<Verdict>) {
    use std::collections::BTreeMap;
    let host_of = |v: &Verdict| -> Option<String> {
        let first = state.ranks.get(*v.culprits.first()?)?.host();
        v.culprits
            .iter()
            .all(|&r| state.ranks.get(r).is_some_and(|s| s.host() == first))
            .then(|| first.to_string())
    };
    let eligible = |v: &Verdict| {
        !v.culprits.is_empty()
            && v.links.is_empty()
            && v.pg.is_some()
            && v.subtype != Subtype::Undecided
            && v.confidence >= hang::WEAK
    };
    let mut groups: BTreeMap<(Class, Subtype, String), Vec<usize>> = BTreeMap::new();
    for (i, v) in verdicts.iter().enumerate() {
        if !eligible(v) {
            continue;
        }
        if let Some(h) = host_of(v) {
            groups.entry((v.class, v.subtype, h)).or_default().push(i);
        }
    }
    let mut folds: Vec<(String, Vec<usize>)> = Vec::new();
    for ((_, _, host), idx) in groups {
        let pgs: std::collections::BTreeSet<_> = idx
            .iter()
            .filter_map(|&i| {
                verdicts[i]
                    .pg
                    .as_ref()
                    .map(|p| (p.name.clone(), p.ranks.clone()))
            })
            .collect();
        if idx.len() < 2 || pgs.len() < 2 {
            continue;
        }
        let mut all: Vec<Rank> = idx
            .iter()
            .flat_map(|&i| verdicts[i].culprits.iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        // One rank blamed in each of its groups is one rank's fault, which the report already
        // folds into its first verdict (`condense`); a node-level fault names several.
        if all.len() < 2 {
            continue;
        }
        // No hosts known: one unbroken run of ranks.
        if host.is_empty() && !all.windows(2).all(|w| w[1] == w[0] + 1) {
            continue;
        }
        folds.push((host, idx));
    }
    if folds.is_empty() {
        return;
    }
    let mut remove = Vec::new();
    for (host, idx) in folds {
        let mut culprits: Vec<Rank> = idx
            .iter()
            .flat_map(|&i| verdicts[i].culprits.iter().copied())
            .collect();
        culprits.sort_unstable();
        culprits.dedup();
        let first = idx[0];
        let ops: std::collections::BTreeSet<Option<Op>> =
            idx.iter().map(|&i| verdicts[i].op).collect();
        let confidence = idx
            .iter()
            .map(|&i| verdicts[i].confidence)
            .fold(0.0, f64::max);
        let place = if host.is_empty() {
            format!(
                "{} (an unbroken run of ranks, as one node's are numbered; the records name no hosts)",
                text::ranks(&culprits)
            )
        } else {
            format!("host {host} ({})", text::ranks(&culprits))
        };
        let mut evidence = vec![format!(
            "one node-level fault: every verdict below names only ranks of {place}, the same {} in {} groups",
            verdicts[first].subtype,
            idx.len()
        )];
        for &i in &idx {
            let v = &verdicts[i];
            let pg =
                v.pg.as_ref()
                    .map_or(String::new(), |p| format!("pg {}", p.name));
            if let Some(e) = v.evidence.first() {
                evidence.push(format!("{pg}: {e}"));
            }
        }
        let v = &mut verdicts[first];
        v.culprits = culprits;
        v.pg = None;
        v.seq = None;
        if ops.len() > 1 {
            v.op = None;
        }
        v.evidence = evidence;
        v.confidence = confidence;
        remove.extend(idx.into_iter().skip(1));
    }
    remove.sort_unstable();
    for i in remove.into_iter().rev() {
        verdicts.remove(i);
    }
}

fn dedup_keep_order(v: &mut Vec<Rank>) {
    let mut seen = std::collections::BTreeSet::new();
    v.retain(|r| seen.insert(*r));
}

/// The time an event carries, if any (offline analysis replays events on their own clocks).
fn event_time(ev: &Event) -> Option<u64> {
    match ev {
        Event::Coll(c) => Some(c.t_ns),
        Event::Peer(p) => Some(p.t_ns),
        Event::Heartbeat { t_ns, .. } | Event::Exit { t_ns, .. } => Some(*t_ns),
        Event::Counters(c) => Some(c.t_ns),
        Event::Member(_) | Event::Group(_) => None,
    }
}

/// Offline analysis of a finished record. Events are replayed on their own timestamps (there
/// is no receive clock), heartbeat silence is not judged (a dump has no heartbeats; a missing
/// dump is what marks a dead rank), and with `stuck` anything in flight is stuck.
pub fn analyze_trace(trace: &Trace, cfg: &Config) -> Vec<Verdict> {
    // A record the user hands in is read whole: the budget guards the leader from its
    // clients, not a command from its own user's files.
    let cfg = Config {
        job_budget_bytes: usize::MAX,
        ..cfg.clone()
    };
    let mut a = JobAnalyzer::new(trace.job.clone(), cfg);
    let mut missing = trace.missing.clone();
    missing.sort_unstable();
    missing.dedup();
    a.offline = Some(Offline {
        missing,
        stuck: trace.stuck,
        dated: dated(trace),
    });
    a.state.offline = true;
    a.state.seq_window = Some(record_window(trace));
    a.record = Some(Box::new(record::Record::from_trace(trace)));
    // The record's world is its declaration (its ranks need not be numbered densely).
    if let Some(&last) = trace.world.iter().max() {
        a.state.declare_world(last.saturating_add(1));
    }
    for ev in &trace.events {
        let now = event_time(ev).map_or(0, |t| t.min(trace.taken_ns));
        a.ingest(ev, now);
    }
    let mut verdicts = a.evaluate(trace.taken_ns).to_vec();
    for v in &mut verdicts {
        v.detected_ns = 0;
    }
    verdicts
}

/// A hang with a well-founded root cause (a dead process, a mismatch, a missing participant,
/// a stalled rank: named, not weak) stops the groups its ranks are in and, through them, their
/// peers' other groups. The hang rules rank candidates in those knock-on groups too ("its op
/// never started", "it waits elsewhere"), which is what waiting behind the root looks like,
/// not a second fault: their weak undecided verdicts become one sentence of the root's
/// evidence instead of verdicts naming ranks beside it.
fn knock_on(verdicts: &mut Vec<Verdict>) {
    let named = |v: &Verdict| !v.culprits.is_empty() || !v.links.is_empty();
    let Some(root) = verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| {
            matches!(v.class, Class::Hang | Class::Mismatch)
                && v.subtype != Subtype::Undecided
                && named(v)
                && v.confidence >= hang::WEAK
        })
        .min_by_key(|(_, v)| order(v))
        .map(|(i, _)| i)
    else {
        return;
    };
    let weak = |v: &Verdict| {
        v.class == Class::Hang && v.subtype == Subtype::Undecided && v.confidence < hang::WEAK
    };
    let mut notes = Vec::new();
    let root_culprits = verdicts[root].culprits.clone();
    for v in verdicts.iter().filter(|v| weak(v)) {
        let place = match (&v.pg, v.op, v.seq) {
            (Some(pg), Some(op), Some(seq)) => format!("pg {} at {op} #{seq} is", pg.name),
            (Some(pg), _, _) => format!("pg {} is", pg.name),
            _ => "several other groups are".to_string(),
        };
        let others: Vec<Rank> = v
            .culprits
            .iter()
            .copied()
            .filter(|r| !root_culprits.contains(r))
            .collect();
        notes.push(match others.len() {
            0 => format!("{place} stuck behind it too"),
            n => format!(
                "{place} stuck behind it too ({} {} out there only as waiting on it)",
                text::ranks(&others),
                if n == 1 { "stands" } else { "stand" }
            ),
        });
    }
    if notes.is_empty() {
        return;
    }
    verdicts[root].evidence.extend(notes);
    verdicts.retain(|v| !weak(v));
}

/// Whether some op in flight in the record carries a start time (see [`Offline::dated`]).
fn dated(trace: &Trace) -> bool {
    use std::collections::HashSet;
    let mut started: HashSet<(Rank, &str, bool, u64)> = HashSet::new();
    let mut ended: HashSet<(Rank, &str, bool, u64)> = HashSet::new();
    for ev in &trace.events {
        if let Event::Coll(c) = ev {
            let key = (c.rank, &*c.pg, c.op.is_p2p(), c.seq);
            match c.phase {
                Phase::Start => {
                    started.insert(key);
                }
                Phase::End => {
                    ended.insert(key);
                }
                Phase::Enqueue => {}
            }
        }
    }
    started.difference(&ended).next().is_some()
}

/// Most seqs an offline record keeps per stream member.
const MAX_RECORD_WINDOW: usize = 4096;
/// What the larger windows of an offline record may cost in all: 1 GiB of records.
const RECORD_WINDOW_BYTES: usize = 1 << 30;

/// Seqs to keep per stream member for an offline record: from each rank's oldest unfinished op
/// of a stream to the last op it enqueued there, with room, within [`RECORD_WINDOW_BYTES`] over
/// all members (a 16,384-rank record in six streams a rank still gets over a hundred each). A
/// dump taken at a timeout shows the ranks' hosts run ahead of a stuck op until the step's host
/// sync (every layer's tensor-parallel ops of the rest of the step), and the stuck op must
/// still be in the window when they are judged.
fn record_window(trace: &Trace) -> usize {
    use std::collections::HashMap;
    // (rank, group, p2p) -> (last enqueued, oldest unfinished)
    let mut span: HashMap<(Rank, &str, bool), (u64, Option<u64>)> = HashMap::new();
    let mut ended: std::collections::HashSet<(Rank, &str, bool, u64)> =
        std::collections::HashSet::new();
    for ev in &trace.events {
        if let Event::Coll(c) = ev {
            if c.phase == Phase::End {
                ended.insert((c.rank, &c.pg, c.op.is_p2p(), c.seq));
            }
        }
    }
    for ev in &trace.events {
        let Event::Coll(c) = ev else { continue };
        if c.phase != Phase::Enqueue {
            continue;
        }
        let key = (c.rank, &*c.pg, c.op.is_p2p());
        let e = span.entry(key).or_insert((c.seq, None));
        e.0 = e.0.max(c.seq);
        if !ended.contains(&(c.rank, &*c.pg, c.op.is_p2p(), c.seq)) {
            e.1 = Some(e.1.map_or(c.seq, |o| o.min(c.seq)));
        }
    }
    let ahead = span
        .values()
        .filter_map(|&(last, oldest)| oldest.map(|o| last.saturating_sub(o)))
        .max()
        .unwrap_or(0);
    let need = usize::try_from(ahead)
        .unwrap_or(usize::MAX)
        .saturating_add(9);
    // A window per stream member: at most what the budget allows over all of them.
    let members = span.len().max(1);
    let affordable = RECORD_WINDOW_BYTES / (members * std::mem::size_of::<state::Rec>());
    need.next_power_of_two()
        .min((affordable.max(1) + 1).next_power_of_two() / 2)
        .clamp(state::SEQ_WINDOW, MAX_RECORD_WINDOW)
}

/// Most verdicts reported at once; the rest are counted in the top verdict's evidence.
pub const MAX_VERDICTS: usize = 32;

/// Keeps the report readable and the Raft entry small: once a confident verdict names a
/// culprit or a link, the "undecided" hangs with nobody to name are its knock-on effects (a hung
/// 16k-rank job has a thousand groups stuck behind one rank), so they become one sentence of
/// the root cause's evidence; and at most [`MAX_VERDICTS`] are listed.
fn condense(verdicts: &mut Vec<Verdict>) {
    let named = |v: &Verdict| !v.culprits.is_empty() || !v.links.is_empty();
    let root_found = verdicts
        .first()
        .is_some_and(|v| named(v) && v.confidence >= hang::WEAK);
    if !root_found {
        return;
    }
    let before = verdicts.len();
    verdicts.retain(|v| v.subtype != Subtype::Undecided || named(v));
    let knock_on = before - verdicts.len();
    if knock_on > 0 {
        verdicts[0].evidence.push(format!(
            "{knock_on} more stuck group{} wait behind this and name no culprit of their own",
            if knock_on == 1 { "" } else { "s" }
        ));
    }
    // The same culprits with the same cause in other groups (a rank stuck in host code is
    // missing from every group it belongs to) are one finding, not several.
    let (class, subtype, culprits) = (
        verdicts[0].class,
        verdicts[0].subtype,
        verdicts[0].culprits.clone(),
    );
    let mut also = Vec::new();
    let mut i = 1;
    while i < verdicts.len() {
        let v = &verdicts[i];
        let same_finding = v.class == class
            && v.subtype == subtype
            && !v.culprits.is_empty()
            && v.culprits.iter().all(|c| culprits.contains(c));
        if same_finding {
            let v = verdicts.remove(i);
            let place = match (&v.pg, v.op, v.seq) {
                (Some(pg), Some(op), Some(seq)) => format!("pg {} at {op} #{seq}", pg.name),
                (Some(pg), _, _) => format!("pg {}", pg.name),
                _ => "another group".to_string(),
            };
            also.push(place);
        } else {
            i += 1;
        }
    }
    if !also.is_empty() {
        verdicts[0]
            .evidence
            .push(format!("the same holds in {}", also.join(", ")));
    }
    if verdicts.len() > MAX_VERDICTS {
        let more = verdicts.len() - MAX_VERDICTS;
        verdicts.truncate(MAX_VERDICTS);
        verdicts[0]
            .evidence
            .push(format!("{more} further verdicts are not listed"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::PgRef;

    fn verdict(
        class: Class,
        subtype: Subtype,
        culprits: &[Rank],
        pg: &str,
        confidence: f64,
    ) -> Verdict {
        Verdict {
            class,
            subtype,
            culprits: culprits.to_vec(),
            links: Vec::new(),
            pg: Some(PgRef {
                name: pg.into(),
                ranks: vec![0, 1, 2, 3],
            }),
            seq: Some(5),
            op: Some(Op::AllReduce),
            evidence: vec!["why".into()],
            confidence,
            detected_ns: 0,
        }
    }

    /// A dtype mismatch in the data-parallel group stops it; the tensor-parallel groups of its
    /// ranks stop behind it, and the hang rules rank "candidates" there (ranks whose op never
    /// started because their stream is held by the mismatched op). Those are one sentence of
    /// the mismatch's evidence, not verdicts naming ranks beside it.
    #[test]
    fn weak_undecided_hangs_behind_a_named_root_are_folded_into_it() {
        let mut vs = vec![
            verdict(Class::Mismatch, Subtype::DtypeMismatch, &[3], "dp", 0.75),
            verdict(Class::Hang, Subtype::Undecided, &[1, 3], "tp", 0.35),
            verdict(Class::Hang, Subtype::Undecided, &[], "pp", 0.2),
        ];
        knock_on(&mut vs);
        assert_eq!(vs.len(), 1, "{vs:#?}");
        assert_eq!(vs[0].culprits, vec![3]);
        assert!(
            vs[0].evidence.iter().any(|e| e
                .starts_with("pg tp at all_reduce #5 is stuck behind it too (rank 1 stands out")),
            "{:?}",
            vs[0].evidence
        );
        assert!(vs[0]
            .evidence
            .iter()
            .any(|e| e == "pg pp at all_reduce #5 is stuck behind it too"));
    }

    /// Without a well-founded root the candidates are the finding, and they stay.
    #[test]
    fn weak_undecided_hangs_stay_when_nothing_named_explains_them() {
        let mut vs = vec![
            verdict(Class::Hang, Subtype::Undecided, &[1], "tp", 0.35),
            verdict(Class::Hang, Subtype::MissingParticipant, &[2], "dp", 0.35),
        ];
        knock_on(&mut vs);
        assert_eq!(vs.len(), 2);
    }
}
