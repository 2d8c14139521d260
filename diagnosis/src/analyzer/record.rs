//! Slow rules over a whole offline record (Flight Recorder dumps), where the live rules' two
//! sources are missing: there is no per-peer progress to name a pair by, and a dump holds
//! hundreds of ops per group at once rather than a stream of them. What a dump does hold is,
//! per rank and op, its creation on the host and, with `TORCH_NCCL_ENABLE_TIMING`, its GPU
//! duration; without timing, only when the watchdog noticed it done (a 100 ms poll, too coarse
//! to time anything by).
//!
//! **How long an op took on its rank** (its *span*): with timing, the GPU duration (from the
//! rank's stream reaching the op to its end, waiting for late peers included). Without
//! timing, the time to the rank's next op creation: in a GPU-bound loop the host runs a bounded
//! distance ahead of its GPU (launch queues, the caching allocator, NCCL's own events hold it
//! back), so the spacing of one rank's creations follows its GPU's progress, this op included.
//! Either is one rank's own clock, so skew between hosts changes nothing.
//!
//! **Against what.** Data-parallel replicas run one program: every group of one kind (the same
//! description and size) runs the same ops at the same seq, and a member's place in its group
//! (its pipeline stage, its shard) is its role. A span is compared with the spans of the same
//! role at the same seq in the sibling groups, so the shape of the step (pipeline bubbles, a
//! long backward before the gradient all-reduce) cancels out and only what differs remains.
//!
//! The rules:
//! - **slow transfer in a collective group**: the time of its last-arriving member (the
//!   shortest span: with timing, the transfer itself) is `slow_factor` times its siblings' at
//!   the same seqs, in three quarters of its last `slow_window` comparable ops;
//! - **slow pair**: a pipeline boundary both of whose ends spend `slow_min_delta_ns` longer in
//!   their point-to-point ops with each other than the same stage of the other pipelines of
//!   their replica, in three quarters of their last `slow_window` (ranks that share their
//!   busiest collective group move in lockstep, so a stage slowed as a whole by someone else
//!   cancels out); by the excess, not a ratio, since a slow link adds its time to ops that
//!   also wait for the peer's compute (see [`pair_slower`]); without timing a span also holds
//!   the compute after the op, the same in lockstep siblings, so twice `slow_min_delta_ns`
//!   only against siblings that are not in lockstep;
//! - **slow NIC**: one rank behind two or more such findings (its pairs with both pipeline
//!   neighbours, or a pair and its own slow data-parallel group); a pair otherwise;
//! - **compute straggler**: a member that arrives last at most of its busiest group's recent
//!   ops (with timing: the others wait for it `slow_factor` times what it spends there and at
//!   least `slow_min_delta_ns`; without: it creates its ops at least half that later than its
//!   peers beyond its own clock's offset), against the same role in the sibling groups and
//!   [`LATE_K`] robust deviations above its family's members, and whose own transfers are not
//!   slow (a rank delayed by a slow link arrives late too, but only after its slow transfers).
//!   Its busiest group, since a rank whose whole tensor-parallel group is late reaches its
//!   data-parallel all-reduce late through no fault of its own.
//!
//! Nothing here runs on a record the hang rules found stuck: a hang is the finding then.

use super::{text, Config};
use crate::event::{Event, Op, PgName, Phase, Rank, Trace};
use crate::verdict::{Class, Link, LinkKind, PgRef, Subtype, Verdict};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One rank's record of one op.
#[derive(Clone, Copy, Debug)]
struct Rec {
    op: Op,
    bytes: u64,
    enq: Option<u64>,
    end: Option<u64>,
    peer: Option<Rank>,
}

/// One group's collective or point-to-point stream.
#[derive(Debug)]
struct Stream {
    name: PgName,
    desc: String,
    /// Members in group-rank order.
    ranks: Vec<Rank>,
    p2p: bool,
    /// Per member: its records by seq.
    recs: Vec<BTreeMap<u64, Rec>>,
}

impl Stream {
    fn pg(&self) -> PgRef {
        PgRef {
            name: self.name.to_string(),
            ranks: self.ranks.clone(),
        }
    }

    fn label(&self) -> String {
        let kind = if self.desc.is_empty() || self.desc == self.name.as_ref() {
            String::new()
        } else {
            format!(" ({})", self.desc)
        };
        format!(
            "pg {}{kind}{} of {}",
            self.name,
            if self.p2p { " p2p" } else { "" },
            text::ranks(&self.ranks)
        )
    }

    /// The kind of group: siblings share it.
    fn family(&self) -> (&str, usize, bool) {
        (self.desc.as_str(), self.ranks.len(), self.p2p)
    }
}

/// A whole offline record, grouped for the slow rules.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Completed ops carry their GPU duration (`TORCH_NCCL_ENABLE_TIMING`).
    timed: bool,
    streams: Vec<Stream>,
    /// Per rank: when it created ops, sorted, each time once.
    created: HashMap<Rank, Vec<u64>>,
}

impl Record {
    /// Groups a trace's collective records by stream and member. A record's group is the one of
    /// its name that holds its rank (groups made by `split_group` share names).
    pub(crate) fn from_trace(trace: &Trace) -> Record {
        let mut rec = Record {
            timed: trace.timed,
            ..Record::default()
        };
        let mut of: HashMap<(Rank, PgName), usize> = HashMap::new();
        let mut seen: BTreeSet<(PgName, Vec<Rank>)> = BTreeSet::new();
        for ev in &trace.events {
            let Event::Group(g) = ev else { continue };
            let mut set = g.ranks.clone();
            set.sort_unstable();
            set.dedup();
            if set.len() != g.ranks.len() || !seen.insert((g.name.clone(), set)) {
                continue;
            }
            let c = rec.streams.len();
            for p2p in [false, true] {
                rec.streams.push(Stream {
                    name: g.name.clone(),
                    desc: g.desc.clone(),
                    ranks: g.ranks.clone(),
                    p2p,
                    recs: vec![BTreeMap::new(); g.ranks.len()],
                });
            }
            for &r in &g.ranks {
                of.entry((r, g.name.clone())).or_insert(c);
            }
        }
        for ev in &trace.events {
            let Event::Coll(c) = ev else { continue };
            let Some(&i) = of.get(&(c.rank, c.pg.clone())) else {
                continue;
            };
            let s = &mut rec.streams[i + usize::from(c.op.is_p2p())];
            let Some(m) = s.ranks.iter().position(|&r| r == c.rank) else {
                continue;
            };
            let r = s.recs[m].entry(c.seq).or_insert(Rec {
                op: c.op,
                bytes: c.bytes,
                enq: None,
                end: None,
                peer: c.peer,
            });
            match c.phase {
                Phase::Enqueue => {
                    r.enq = Some(c.t_ns);
                    rec.created.entry(c.rank).or_default().push(c.t_ns);
                }
                Phase::End => r.end = Some(c.t_ns),
                Phase::Start => {}
            }
        }
        for times in rec.created.values_mut() {
            times.sort_unstable();
            times.dedup();
        }
        rec
    }

    /// How long member `m` of stream `s` spent in `seq`, on its own clock (see the module
    /// documentation); `None` unless it completed the op.
    fn span(&self, s: usize, m: usize, seq: u64) -> Option<f64> {
        let st = &self.streams[s];
        let r = st.recs[m].get(&seq)?;
        let (enq, end) = (r.enq?, r.end?);
        if self.timed {
            return Some(end.saturating_sub(enq) as f64);
        }
        let times = self.created.get(&st.ranks[m])?;
        let next = times.get(times.partition_point(|&t| t <= enq))?;
        Some((next - enq) as f64)
    }

    /// Sibling streams of each stream: the other streams of its kind.
    fn families(&self, p2p: bool) -> Vec<Vec<usize>> {
        let mut fam: BTreeMap<(&str, usize, bool), Vec<usize>> = BTreeMap::new();
        for (i, s) in self.streams.iter().enumerate() {
            if s.p2p == p2p && s.ranks.len() >= 2 && s.recs.iter().any(|r| !r.is_empty()) {
                fam.entry(s.family()).or_default().push(i);
            }
        }
        fam.into_values().collect()
    }

    /// Each rank's busiest collective stream (most ops recorded): tensor-parallel ranks run a
    /// collective in every layer and move in lockstep.
    fn busiest(&self) -> HashMap<Rank, usize> {
        let mut best: HashMap<Rank, (usize, usize)> = HashMap::new();
        for (i, s) in self.streams.iter().enumerate() {
            if s.p2p || s.ranks.len() < 2 {
                continue;
            }
            for (m, recs) in s.recs.iter().enumerate() {
                let e = best.entry(s.ranks[m]).or_insert((0, i));
                if recs.len() > e.0 {
                    *e = (recs.len(), i);
                }
            }
        }
        best.into_iter().map(|(r, (_, i))| (r, i)).collect()
    }
}

/// Whether span `x` is slow against `base`: by the factor and by the absolute margin. Without
/// timing a span also holds the compute after the op, the same for the role it is compared
/// with, so only the difference says anything: twice the margin, and no ratio.
fn slower(x: f64, base: f64, timed: bool, cfg: &Config) -> bool {
    let margin = cfg.slow_min_delta_ns as f64;
    if timed {
        x >= base * cfg.slow_factor && x - base >= margin
    } else {
        x - base >= 2.0 * margin
    }
}

/// Whether one end's point-to-point span `x` with a peer is slow against `base`, the same
/// stage's span in a sibling pipeline. With timing, by the margin alone: a slow link adds its
/// extra transfer time to every op on the pair, whether or not the op also waits for the peer
/// to finish computing (a receive posted before the peer's send spends most of its span
/// waiting, the same in the sibling), so the ratio of a long op hides what the excess shows.
/// A rank that arrives late (a straggler) does not lengthen its own spans with timing, only its
/// peer's, and a pair needs both ends. Without timing a span also holds the compute after the
/// op: against siblings `in_lockstep` (their ranks share busiest groups with this pair's, so a
/// straggler slows both alike) that compute is the same and the margin is enough; against
/// other siblings, as [`slower`] (twice the margin).
fn pair_slower(x: f64, base: f64, timed: bool, in_lockstep: bool, cfg: &Config) -> bool {
    if timed || in_lockstep {
        x - base >= cfg.slow_min_delta_ns as f64
    } else {
        slower(x, base, timed, cfg)
    }
}

/// The (upper) median, as [`median`](super::baseline::median) takes it; 0 for nothing.
fn med(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The lower median: of two values, the smaller.
fn lower_med(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// Whether three quarters of the last `slow_window` comparisons (at least three) hit, and how
/// many of how many did.
fn mostly(hits: &[bool], cfg: &Config) -> Option<(usize, usize)> {
    let w = (cfg.slow_window as usize).max(1);
    let last = &hits[hits.len().saturating_sub(w)..];
    let n = last.iter().filter(|&&h| h).count();
    (last.len() >= 3 && n * 4 >= last.len() * 3).then_some((n, last.len()))
}

/// A collective stream whose transfers are slow against its siblings'.
#[derive(Debug)]
struct SlowStream {
    s: usize,
    hits: (usize, usize),
    /// Median ratio and excess over the hits, and the last seq compared.
    ratio: f64,
    excess: f64,
    seq: u64,
    op: Op,
}

fn slow_streams(rec: &Record, cfg: &Config) -> Vec<SlowStream> {
    let mut out = Vec::new();
    for fam in rec.families(false) {
        if fam.len() < 3 {
            continue;
        }
        // Per stream and seq: the last-arriving member's span, with the op and size.
        let t: Vec<BTreeMap<u64, (f64, Op, u64)>> = fam
            .iter()
            .map(|&s| {
                let st = &rec.streams[s];
                let mut per = BTreeMap::new();
                for (&seq, r) in &st.recs[0] {
                    let spans: Option<Vec<f64>> =
                        (0..st.ranks.len()).map(|m| rec.span(s, m, seq)).collect();
                    if let Some(spans) = spans {
                        let min = spans.into_iter().fold(f64::INFINITY, f64::min);
                        per.insert(seq, (min, r.op, r.bytes));
                    }
                }
                per
            })
            .collect();
        for (i, &s) in fam.iter().enumerate() {
            let mut hits = Vec::new();
            let mut found = Vec::new();
            let mut last = (0, Op::Other);
            for (&seq, &(x, op, bytes)) in &t[i] {
                let sib: Vec<f64> = t
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .filter_map(|(_, o)| o.get(&seq))
                    .filter(|o| o.1 == op && o.2 == bytes)
                    .map(|o| o.0)
                    .collect();
                if sib.len() < 2 {
                    continue;
                }
                let base = med(sib);
                let hit = slower(x, base, rec.timed, cfg);
                hits.push(hit);
                if hit {
                    found.push((x / base.max(1.0), x - base));
                }
                last = (seq, op);
            }
            if let Some(h) = mostly(&hits, cfg) {
                out.push(SlowStream {
                    s,
                    hits: h,
                    ratio: med(found.iter().map(|f| f.0).collect()),
                    excess: med(found.iter().map(|f| f.1).collect()),
                    seq: last.0,
                    op: last.1,
                });
            }
        }
    }
    out
}

/// One end's view of a pipeline boundary: its point-to-point ops with `peer` against the same
/// stage of the other pipelines of its replica.
#[derive(Debug)]
struct SlowEnd {
    rank: Rank,
    peer: Rank,
    s: usize,
    hits: (usize, usize),
    ratio: f64,
    excess: f64,
    seq: u64,
}

fn slow_ends(rec: &Record, cfg: &Config) -> Vec<SlowEnd> {
    let busiest = rec.busiest();
    let mut out = Vec::new();
    for fam in rec.families(true) {
        for &s in &fam {
            let st = &rec.streams[s];
            let lockstep = |o: usize| {
                let other = &rec.streams[o];
                (0..st.ranks.len()).all(|j| {
                    busiest.contains_key(&st.ranks[j])
                        && busiest.get(&st.ranks[j]) == busiest.get(&other.ranks[j])
                })
            };
            let mut sibs: Vec<usize> = fam
                .iter()
                .copied()
                .filter(|&o| o != s && lockstep(o))
                .collect();
            let in_lockstep = !sibs.is_empty();
            if sibs.is_empty() {
                sibs = fam.iter().copied().filter(|&o| o != s).collect();
            }
            if sibs.is_empty() {
                continue;
            }
            for (m, recs) in st.recs.iter().enumerate() {
                // Per peer: (hit, ratio, excess, seq) in seq order.
                let mut by_peer: BTreeMap<Rank, Vec<(bool, f64, f64, u64)>> = BTreeMap::new();
                for (&seq, r) in recs {
                    let (Some(peer), Some(x)) = (r.peer, rec.span(s, m, seq)) else {
                        continue;
                    };
                    let sib: Vec<f64> = sibs
                        .iter()
                        .filter(|&&o| {
                            rec.streams[o].recs[m]
                                .get(&seq)
                                .is_some_and(|x| x.op == r.op && x.bytes == r.bytes)
                        })
                        .filter_map(|&o| rec.span(o, m, seq))
                        .collect();
                    if sib.is_empty() {
                        continue;
                    }
                    let base = med(sib);
                    by_peer.entry(peer).or_default().push((
                        pair_slower(x, base, rec.timed, in_lockstep, cfg),
                        x / base.max(1.0),
                        x - base,
                        seq,
                    ));
                }
                for (peer, obs) in by_peer {
                    let hits: Vec<bool> = obs.iter().map(|o| o.0).collect();
                    if let Some(h) = mostly(&hits, cfg) {
                        let slow: Vec<&(bool, f64, f64, u64)> =
                            obs.iter().filter(|o| o.0).collect();
                        out.push(SlowEnd {
                            rank: st.ranks[m],
                            peer,
                            s,
                            hits: h,
                            ratio: med(slow.iter().map(|o| o.1).collect()),
                            excess: med(slow.iter().map(|o| o.2).collect()),
                            seq: obs.last().map_or(0, |o| o.3),
                        });
                    }
                }
            }
        }
    }
    out
}

/// A member arriving last at most of its group's ops.
#[derive(Debug)]
struct Late {
    rank: Rank,
    s: usize,
    /// Median lateness against the same role in the sibling groups, and how many ops.
    late: f64,
    ops: usize,
    /// With timing: how many times the op's transfer its peers spend in it (median).
    waits: Option<f64>,
    /// The family's typical lateness and spread, for the evidence.
    typical: f64,
    spread: f64,
    seq: u64,
    op: Op,
}

/// How many recent ops of a group the lateness is judged over without timing: creation times
/// are noisy, so a median over many. With timing the waits are measured, and the last
/// `slow_window` ops are enough (and follow an onset in the middle of the record).
const LATE_OPS: usize = 64;
/// A straggler's lateness also stands this many robust standard deviations above its
/// family's (so a family where every member is that late, as the expert groups of an MoE job
/// with uneven routing can be, names nobody).
const LATE_K: f64 = 3.0;

/// One op of a collective stream that every member completed: how late each member was for
/// it, and (with timing) how many times its own time there the others spent in it.
struct OpLate {
    late: Vec<f64>,
    waits: Vec<f64>,
    op: Op,
    bytes: u64,
}

/// Each member's lateness per completed op of stream `s` (see [`Late`]).
fn op_lateness(rec: &Record, s: usize) -> BTreeMap<u64, OpLate> {
    let st = &rec.streams[s];
    let n = st.ranks.len();
    let mut per = BTreeMap::new();
    for (&seq, r0) in &st.recs[0] {
        let times: Option<Vec<(u64, u64)>> = (0..n)
            .map(|m| st.recs[m].get(&seq).and_then(|r| Some((r.enq?, r.end?))))
            .collect();
        let Some(times) = times else { continue };
        let others = |v: &[f64], m: usize| med((0..n).filter(|&o| o != m).map(|o| v[o]).collect());
        let mut x = OpLate {
            late: Vec::with_capacity(n),
            waits: Vec::new(),
            op: r0.op,
            bytes: r0.bytes,
        };
        if rec.timed {
            // Every member's op ends when the last one's data is in: the shorter its time in
            // the op, the later it came.
            let d: Vec<f64> = times
                .iter()
                .map(|&(enq, end)| end.saturating_sub(enq) as f64)
                .collect();
            for m in 0..n {
                let o = others(&d, m);
                x.late.push(o - d[m]);
                x.waits.push(o / d[m].max(1.0));
            }
        } else {
            // Relative to the first creation: absolute times lose precision as floats.
            let first = times.iter().map(|t| t.0).min().unwrap_or(0);
            let c: Vec<f64> = times.iter().map(|t| (t.0 - first) as f64).collect();
            for m in 0..n {
                x.late.push(c[m] - others(&c, m));
            }
        }
        per.insert(seq, x);
    }
    // Without timing each member's creation times carry its host clock's offset: take it out
    // as the member's lateness at the ops it was least late for (its tenth percentile), where
    // nobody had a reason to be late, when that is positive (a clock ahead). A member early at
    // some ops is just early, and its peer in a pair is then late by as much, which is no
    // clock's doing.
    if !rec.timed && per.len() >= 10 {
        for m in 0..n {
            let mut v: Vec<f64> = per.values().map(|x| x.late[m]).collect();
            v.sort_by(f64::total_cmp);
            let off = v[v.len() / 10].max(0.0);
            for x in per.values_mut() {
                x.late[m] -= off;
            }
        }
    }
    per
}

/// One member's median lateness over its recent ops, against the same role in the siblings.
struct MemberLate {
    /// Index in the family, member index.
    i: usize,
    m: usize,
    late: f64,
    ops: usize,
    waits: Option<f64>,
    seq: u64,
    op: Op,
}

fn late_members(rec: &Record, cfg: &Config) -> Vec<Late> {
    let mut out = Vec::new();
    let recent_ops = if rec.timed {
        (cfg.slow_window as usize).max(3)
    } else {
        LATE_OPS
    };
    for fam in rec.families(false) {
        let lat: Vec<BTreeMap<u64, OpLate>> = fam.iter().map(|&s| op_lateness(rec, s)).collect();
        let mut xs: Vec<MemberLate> = Vec::new();
        for (i, &s) in fam.iter().enumerate() {
            let n = rec.streams[s].ranks.len();
            let mut rel: Vec<Vec<f64>> = vec![Vec::new(); n];
            let mut waits: Vec<Vec<f64>> = vec![Vec::new(); n];
            let mut last = (0, Op::Other);
            let recent: Vec<(&u64, &OpLate)> = lat[i].iter().rev().take(recent_ops).collect();
            for (&seq, x) in recent.into_iter().rev() {
                // The same op in every group of the family, this one included.
                let all: Vec<&OpLate> = lat
                    .iter()
                    .filter_map(|o| o.get(&seq))
                    .filter(|o| o.op == x.op && o.bytes == x.bytes)
                    .collect();
                for m in 0..n {
                    // What the role shows by itself (a pipeline stage that always comes late
                    // to a group spanning stages): the lower median over the groups, since a
                    // fault only adds lateness; with no sibling, nothing.
                    let base = if all.len() < 2 {
                        0.0
                    } else {
                        lower_med(all.iter().map(|o| o.late[m]).collect())
                    };
                    rel[m].push(x.late[m] - base);
                    if let Some(&w) = x.waits.get(m) {
                        waits[m].push(w);
                    }
                }
                last = (seq, x.op);
            }
            for m in 0..n {
                if rel[m].len() < 3 {
                    continue;
                }
                xs.push(MemberLate {
                    i,
                    m,
                    ops: rel[m].len(),
                    late: med(std::mem::take(&mut rel[m])),
                    waits: (!waits[m].is_empty()).then(|| med(std::mem::take(&mut waits[m]))),
                    seq: last.0,
                    op: last.1,
                });
            }
        }
        if xs.len() < 2 {
            continue;
        }
        let typical = med(xs.iter().map(|x| x.late).collect());
        // The members' spread, and at least what one op's noise leaves in a median of many
        // (many members may sit at exactly the same value, which would leave no spread).
        let ops_noise = {
            let all: Vec<f64> = lat
                .iter()
                .flat_map(|per| per.values().flat_map(|v| v.late.iter().copied()))
                .collect();
            let mid = med(all.clone());
            1.4826 * med(all.into_iter().map(|x| (x - mid).abs()).collect())
        };
        let n_ops = xs.iter().map(|x| x.ops).max().unwrap_or(1).max(1) as f64;
        let spread = (1.4826 * med(xs.iter().map(|x| (x.late - typical).abs()).collect()))
            .max(1.25 * ops_noise / n_ops.sqrt());
        // With timing the peers' wait is measured: the slow margin. Creation times carry the
        // host's jitter (a few hundred microseconds between ranks of a healthy job): half of it.
        let floor = if rec.timed {
            cfg.slow_min_delta_ns as f64
        } else {
            cfg.slow_min_delta_ns as f64 / 2.0
        };
        for x in xs {
            let above = x.late - typical;
            let outlier = above >= floor && above >= LATE_K * spread;
            let peers_wait = x.waits.is_none_or(|w| w >= cfg.slow_factor);
            if outlier && peers_wait {
                let s = fam[x.i];
                out.push(Late {
                    rank: rec.streams[s].ranks[x.m],
                    s,
                    late: x.late,
                    ops: x.ops,
                    waits: x.waits,
                    typical,
                    spread,
                    seq: x.seq,
                    op: x.op,
                });
            }
        }
    }
    out
}

/// The slow verdicts of a record no hang holds: slow NICs, slow pairs, compute stragglers, and
/// slow groups nothing names (undecided, with their members as candidates).
pub(crate) fn evaluate(rec: &Record, cfg: &Config) -> Vec<Verdict> {
    let streams = slow_streams(rec, cfg);
    let ends = slow_ends(rec, cfg);
    let late = late_members(rec, cfg);
    let mut out = Vec::new();

    // Slow pairs: both ends see it.
    let seen = |a: Rank, b: Rank| ends.iter().find(|e| e.rank == a && e.peer == b);
    let mut pairs: BTreeMap<(Rank, Rank), (&SlowEnd, &SlowEnd)> = BTreeMap::new();
    for e in &ends {
        if let Some(back) = seen(e.peer, e.rank) {
            let key = (e.rank.min(e.peer), e.rank.max(e.peer));
            let v = if e.rank == key.0 {
                (e, back)
            } else {
                (back, e)
            };
            pairs.insert(key, v);
        }
    }
    // What each rank is behind: its slow pairs and its slow groups.
    #[allow(clippy::type_complexity)]
    let mut behind: BTreeMap<Rank, (Vec<(Rank, Rank)>, Vec<usize>)> = BTreeMap::new();
    for &(a, b) in pairs.keys() {
        behind.entry(a).or_default().0.push((a, b));
        behind.entry(b).or_default().0.push((a, b));
    }
    for (i, s) in streams.iter().enumerate() {
        for &r in &rec.streams[s.s].ranks {
            behind.entry(r).or_default().1.push(i);
        }
    }
    let weight = |r: &Rank| {
        behind
            .get(r)
            .map_or(0, |b| b.0.len() + usize::from(!b.1.is_empty()))
    };
    let mut nics: Vec<Rank> = behind
        .iter()
        .filter(|(_, (p, _))| !p.is_empty())
        .map(|(r, _)| *r)
        .filter(|r| weight(r) >= 2)
        .collect();
    // A NIC's neighbours share one finding each with it; keep only the ranks no neighbour
    // outweighs.
    let nic_set = nics.clone();
    nics.retain(|r| {
        behind[r].0.iter().all(|&(a, b)| {
            let other = if a == *r { b } else { a };
            !nic_set.contains(&other) || weight(&other) < weight(r)
        })
    });
    let mut explained_pairs: BTreeSet<(Rank, Rank)> = BTreeSet::new();
    let mut explained_streams: BTreeSet<usize> = BTreeSet::new();
    let mut slow_ranks: BTreeSet<Rank> = BTreeSet::new();
    for &r in &nics {
        let (p, g) = &behind[&r];
        let mut v = verdict(Class::Slow, Subtype::SlowLink, None, None, None);
        v.links.push(Link {
            kind: LinkKind::Nic,
            name: format!("rank {r}'s NIC"),
            from: Some(r),
            to: None,
        });
        v.evidence.push(format!(
            "every slow transfer the dumps show goes through rank {r}: {} slow pipeline boundar{}{}",
            p.len(),
            if p.len() == 1 { "y" } else { "ies" },
            if g.is_empty() {
                String::new()
            } else {
                format!(" and {} slow group{}", g.len(), if g.len() == 1 { "" } else { "s" })
            }
        ));
        for &k in p {
            v.evidence.extend(pair_evidence(rec, pairs[&k]));
            explained_pairs.insert(k);
        }
        for &i in g {
            v.evidence.push(stream_evidence(rec, &streams[i]));
            explained_streams.insert(i);
        }
        v.evidence
            .push("no rank is at fault: the NIC (or its cable or switch port) is".into());
        v.confidence = 0.7;
        slow_ranks.insert(r);
        for &(a, b) in p {
            slow_ranks.insert(a);
            slow_ranks.insert(b);
        }
        out.push(v);
    }
    for (&(a, b), &ends) in &pairs {
        if explained_pairs.contains(&(a, b)) {
            continue;
        }
        let s = &rec.streams[ends.0.s];
        let mut v = verdict(
            Class::Slow,
            Subtype::SlowLink,
            Some(s.pg()),
            Some(ends.0.seq),
            Some(Op::Send),
        );
        v.links.push(Link {
            kind: LinkKind::Pair,
            name: format!("rank {a} <-> rank {b}"),
            from: Some(a),
            to: Some(b),
        });
        v.evidence.extend(pair_evidence(rec, ends));
        v.evidence.push(
            "their other transfers are not slow: the link between them (or the NIC of one of them) is, not either rank"
                .to_string(),
        );
        v.confidence = 0.6;
        slow_ranks.insert(a);
        slow_ranks.insert(b);
        out.push(v);
    }
    // Compute stragglers: late at most ops of their busiest group (the one they run in
    // lockstep with its members: a rank whose whole tensor-parallel group is late reaches its
    // data-parallel all-reduce late too, through no fault of its own), not delayed by slow
    // transfers of their own.
    let busiest = rec.busiest();
    let mut by_rank: BTreeMap<Rank, Vec<&Late>> = BTreeMap::new();
    for l in &late {
        if !slow_ranks.contains(&l.rank) {
            by_rank.entry(l.rank).or_default().push(l);
        }
    }
    by_rank.retain(|r, ls| ls.iter().any(|l| busiest.get(r) == Some(&l.s)));
    // A group where more than a quarter of the members are late is a pattern of the job.
    let mut per_stream: BTreeMap<usize, usize> = BTreeMap::new();
    for ls in by_rank.values() {
        for l in ls {
            *per_stream.entry(l.s).or_default() += 1;
        }
    }
    for (r, mut ls) in by_rank {
        ls.retain(|l| per_stream[&l.s] <= (rec.streams[l.s].ranks.len() / 4).max(1));
        ls.sort_by(|a, b| b.late.total_cmp(&a.late));
        let Some(first) = ls.first() else { continue };
        let s = &rec.streams[first.s];
        let mut v = verdict(
            Class::Slow,
            Subtype::ComputeStraggler,
            Some(s.pg()),
            Some(first.seq),
            Some(first.op),
        );
        v.culprits = vec![r];
        for l in &ls {
            let st = &rec.streams[l.s];
            v.evidence.push(match l.waits {
                Some(w) => format!(
                    "rank {r} arrives last at {}: over its last {} ops its peers wait {} for it (median), {w:.1}x the time it spends there itself (it waits least), against {} for the same role in the group's siblings",
                    st.label(),
                    l.ops,
                    text::dur(l.late),
                    text::dur(l.typical)
                ),
                None => format!(
                    "rank {r} creates its ops in {} {} later than its peers (median over its last {} ops, its clock's offset taken out), against {} ± {} for every member of groups of this kind",
                    st.label(),
                    text::dur(l.late),
                    l.ops,
                    text::dur(l.typical),
                    text::dur(l.spread)
                ),
            });
        }
        v.evidence.push(
            "its own transfers are not slow: it arrives late because it computes slowly".into(),
        );
        v.confidence = if rec.timed { 0.75 } else { 0.5 };
        out.push(v);
    }
    // Slow groups nothing above explains.
    for (i, s) in streams.iter().enumerate() {
        if explained_streams.contains(&i) {
            continue;
        }
        let st = &rec.streams[s.s];
        let mut v = verdict(
            Class::Slow,
            Subtype::Undecided,
            Some(st.pg()),
            Some(s.seq),
            Some(s.op),
        );
        v.evidence.push(stream_evidence(rec, s));
        let n = st.ranks.len();
        for (k, r) in st.ranks.iter().enumerate().take(8) {
            v.evidence.push(format!(
                "candidate {} of {n}: rank {r}: its NIC or links carry {}'s slow transfers, as much as any other member's",
                k + 1,
                st.label()
            ));
        }
        v.evidence.push(format!(
            "the dumps have no per-peer progress to name the pair or NIC by: no member stands out, every one of {} may hold it",
            text::ranks(&st.ranks)
        ));
        v.confidence = 0.3;
        out.push(v);
    }
    out
}

fn verdict(
    class: Class,
    subtype: Subtype,
    pg: Option<PgRef>,
    seq: Option<u64>,
    op: Option<Op>,
) -> Verdict {
    Verdict {
        class,
        subtype,
        culprits: Vec::new(),
        links: Vec::new(),
        pg,
        seq,
        op,
        evidence: Vec::new(),
        confidence: 0.0,
        detected_ns: 0,
    }
}

fn what(rec: &Record) -> &'static str {
    if rec.timed {
        "GPU time"
    } else {
        "time to its next op (no TORCH_NCCL_ENABLE_TIMING)"
    }
}

fn pair_evidence(rec: &Record, (a, b): (&SlowEnd, &SlowEnd)) -> Vec<String> {
    [a, b]
        .iter()
        .map(|e| {
            format!(
                "rank {}'s ops with rank {} in {} take {:.1}x ({} more) the {} of the same stage in the other pipelines of its replica, in {} of its last {}",
                e.rank,
                e.peer,
                rec.streams[e.s].label(),
                e.ratio,
                text::dur(e.excess),
                what(rec),
                e.hits.0,
                e.hits.1
            )
        })
        .collect()
}

fn stream_evidence(rec: &Record, s: &SlowStream) -> String {
    format!(
        "{} moves its data {:.1}x ({} more) slower than the other groups of its kind at the same ops, by its last-arriving member's {}, in {} of its last {}",
        rec.streams[s.s].label(),
        s.ratio,
        text::dur(s.excess),
        what(rec),
        s.hits.0,
        s.hits.1
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Coll, Dtype, Group};

    const MS: u64 = 1_000_000;

    /// A hand-built offline record: groups and ops with their creation and end times.
    struct Job {
        events: Vec<Event>,
        timed: bool,
    }

    impl Job {
        fn new(timed: bool) -> Job {
            Job {
                events: Vec::new(),
                timed,
            }
        }

        fn group(&mut self, name: &str, desc: &str, ranks: &[Rank]) {
            self.events.push(Event::Group(Group {
                name: name.into(),
                desc: desc.into(),
                ranks: ranks.to_vec(),
            }));
        }

        /// One rank's op: created at `enq`, ended at `end` (its GPU's end with timing; without,
        /// the dump only knows a watchdog poll after it, so it is rounded up to 100 ms).
        #[allow(clippy::too_many_arguments)]
        fn op(
            &mut self,
            rank: Rank,
            pg: &str,
            seq: u64,
            op: Op,
            peer: Option<Rank>,
            enq: u64,
            end: u64,
        ) {
            let end = if self.timed {
                end
            } else {
                end.div_ceil(100 * MS) * 100 * MS
            };
            for (phase, t_ns) in [(Phase::Enqueue, enq), (Phase::End, end)] {
                self.events.push(Event::Coll(Coll {
                    rank,
                    pg: pg.into(),
                    seq,
                    op,
                    dtype: Dtype::BFloat16,
                    count: 1 << 20,
                    bytes: 2 << 20,
                    out_count: 1 << 20,
                    peer,
                    phase,
                    t_ns,
                }));
            }
        }

        /// A collective: each member arrives at its time, all end together once the last
        /// one's data is in.
        fn coll(&mut self, pg: &str, seq: u64, arrive: &[(Rank, u64)], transfer: u64) {
            let end = arrive.iter().map(|a| a.1).max().unwrap_or(0) + transfer;
            for &(r, t) in arrive {
                self.op(r, pg, seq, Op::AllReduce, None, t, end);
            }
        }

        fn verdicts(self) -> Vec<Verdict> {
            let trace = Trace {
                job: "t".into(),
                events: self.events,
                world: Vec::new(),
                missing: Vec::new(),
                taken_ns: 0,
                stuck: false,
                timed: self.timed,
            };
            evaluate(&Record::from_trace(&trace), &Config::default())
        }
    }

    /// Up to 0.3 ms of host and launch jitter, the same for a given rank and op.
    fn jitter(rank: Rank, seq: u64) -> u64 {
        ((u64::from(rank) * 7919 + seq * 104_729) % 97) * 3_000
    }

    /// Four tensor-parallel pairs (the replicas of a data-parallel job); with a straggler, rank
    /// 5 arrives `late` after its peers at the ops that follow compute (two of three: the third
    /// follows its predecessor at once, and nobody is late for it).
    fn tp_pairs(timed: bool, straggler: Option<(Rank, u64)>) -> Vec<Verdict> {
        let mut job = Job::new(timed);
        let groups: [&[Rank]; 4] = [&[0, 1], &[2, 3], &[4, 5], &[6, 7]];
        for g in groups {
            job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", g);
        }
        for seq in 1..=80 {
            let t0 = seq * 5 * MS;
            for g in groups {
                let arrive: Vec<(Rank, u64)> = g
                    .iter()
                    .map(|&r| {
                        let late = straggler
                            .filter(|s| s.0 == r && seq % 3 != 0)
                            .map_or(0, |s| s.1);
                        (r, t0 + jitter(r, seq) + late)
                    })
                    .collect();
                job.coll("tp", seq, &arrive, MS / 5);
            }
        }
        job.verdicts()
    }

    type Ends = Vec<(Option<Rank>, Option<Rank>)>;

    fn summary(vs: &[Verdict]) -> Vec<(Subtype, Vec<Rank>, Ends)> {
        vs.iter()
            .map(|v| {
                (
                    v.subtype,
                    v.culprits.clone(),
                    v.links.iter().map(|l| (l.from, l.to)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_rank_its_peers_wait_for_at_every_op_is_a_compute_straggler() {
        // With timing: its peers' GPU time in each op holds the 2 ms they wait for it.
        let vs = tp_pairs(true, Some((5, 2 * MS)));
        assert_eq!(
            summary(&vs),
            vec![(Subtype::ComputeStraggler, vec![5], vec![])]
        );
        assert!(
            vs[0].evidence.iter().any(|e| e.contains("waits least")),
            "{vs:#?}"
        );
        // Without: it creates its ops 2 ms after its peer, beyond its clock's offset (what it
        // shows at the ops nobody is late for).
        let vs = tp_pairs(false, Some((5, 2 * MS)));
        assert_eq!(
            summary(&vs),
            vec![(Subtype::ComputeStraggler, vec![5], vec![])]
        );
        assert!(vs[0].confidence < tp_pairs(true, Some((5, 2 * MS)))[0].confidence);
    }

    #[test]
    fn a_healthy_job_and_a_skewed_clock_raise_nothing() {
        assert!(tp_pairs(true, None).is_empty());
        assert!(tp_pairs(false, None).is_empty());
        // Rank 5's host clock runs 3 ms ahead: every creation it records is 3 ms late, which
        // its clock explains (it is as late at the ops it had no reason to be late for).
        let mut job = Job::new(false);
        job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &[4, 5]);
        job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &[6, 7]);
        job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &[0, 1]);
        for seq in 1..=80 {
            for g in [[0, 1], [4, 5], [6, 7]] {
                let t0 = seq * 5 * MS;
                let arrive: Vec<(Rank, u64)> = g
                    .iter()
                    .map(|&r| (r, t0 + jitter(r, seq) + if r == 5 { 3 * MS } else { 0 }))
                    .collect();
                job.coll("tp", seq, &arrive, MS / 5);
            }
        }
        assert!(job.verdicts().is_empty());
    }

    /// Two stages of four tensor-parallel ranks each (ranks 0-3 and 4-7), a pipeline per
    /// tensor-parallel rank ([0, 4], [1, 5], …): each step three TP all-reduces per stage, then
    /// stage 0 sends its activations to stage 1. `transfer(a, b)` is the time of the transfer
    /// between a and b; stage 1 posts its receive `recv_waits` before stage 0 sends (1F1B posts
    /// it before the activations are ready, and it waits for them); `late` ranks arrive 2 ms
    /// late at two of the three TP ops (they wait for data).
    fn pipeline(
        transfer: impl Fn(Rank, Rank) -> u64,
        recv_waits: u64,
        late: &[Rank],
    ) -> Vec<Verdict> {
        let mut job = Job::new(true);
        job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &[0, 1, 2, 3]);
        job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &[4, 5, 6, 7]);
        for r in 0..4 {
            job.group("pp", "PIPELINE_MODEL_PARALLEL_GROUP", &[r, r + 4]);
        }
        for step in 1..=16u64 {
            let t0 = step * 20 * MS;
            for stage in [[0, 1, 2, 3], [4, 5, 6, 7]] {
                for k in 0..3 {
                    let seq = 3 * step - 2 + k;
                    let arrive: Vec<(Rank, u64)> = stage
                        .iter()
                        .map(|&r| {
                            let l = if late.contains(&r) && k > 0 {
                                2 * MS
                            } else {
                                0
                            };
                            (r, t0 + k * 2 * MS + jitter(r, seq) + l)
                        })
                        .collect();
                    job.coll("tp", seq, &arrive, MS / 5);
                }
            }
            for r in 0..4 {
                let enq = t0 + 8 * MS;
                let end = enq + transfer(r, r + 4);
                job.op(r, "pp", step, Op::Send, Some(r + 4), enq, end);
                job.op(r + 4, "pp", step, Op::Recv, Some(r), enq - recv_waits, end);
            }
        }
        job.verdicts()
    }

    #[test]
    fn a_boundary_slow_at_both_ends_is_a_slow_link_not_its_ranks() {
        assert!(pipeline(|_, _| MS, 0, &[]).is_empty());
        let slow = |a, b| if (a, b) == (1, 5) { 5 * MS } else { MS };
        let vs = pipeline(slow, 0, &[]);
        assert_eq!(
            summary(&vs),
            vec![(Subtype::SlowLink, vec![], vec![(Some(1), Some(5))])]
        );
        // Rank 5 waits for its slow receive and then reaches its tensor-parallel ops late:
        // late because of the link, not a compute straggler.
        let vs = pipeline(slow, 0, &[5]);
        assert_eq!(
            summary(&vs),
            vec![(Subtype::SlowLink, vec![], vec![(Some(1), Some(5))])]
        );
    }

    #[test]
    fn a_link_adds_its_time_to_ops_that_mostly_wait_and_is_still_named() {
        // The receive waits 10 ms for stage 0's activations in every pipeline; the link between
        // 1 and 5 adds 1.5 ms to the transfer (0.5 ms elsewhere): 11.5 against 10.5 ms at the
        // receiving end, a ratio of 1.1 but the same excess as at the sending end.
        let transfer = |a, b| {
            if (a, b) == (1, 5) {
                2 * MS
            } else {
                MS / 2
            }
        };
        assert!(pipeline(|_, _| MS / 2, 10 * MS, &[]).is_empty());
        let vs = pipeline(transfer, 10 * MS, &[]);
        assert_eq!(
            summary(&vs),
            vec![(Subtype::SlowLink, vec![], vec![(Some(1), Some(5))])],
            "{vs:#?}"
        );
        // Half a millisecond more is within the margin: nothing.
        let vs = pipeline(
            |a, b| if (a, b) == (1, 5) { MS } else { MS / 2 },
            10 * MS,
            &[],
        );
        assert!(vs.is_empty(), "{vs:#?}");
    }

    /// Without timing: two stages of four tensor-parallel ranks, a pipeline per tensor-parallel
    /// rank; each step stage 0 sends to stage 1 (`transfer(a, b)`), and each rank creates its
    /// tensor-parallel all-reduce 3 ms after its transfer ended (its host follows its GPU), 2 ms
    /// later still for a `straggler`.
    fn untimed_pipeline(
        transfer: impl Fn(Rank, Rank) -> u64,
        straggler: Option<Rank>,
    ) -> Vec<Verdict> {
        let mut job = Job::new(false);
        job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &[0, 1, 2, 3]);
        job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &[4, 5, 6, 7]);
        for r in 0..4 {
            job.group("pp", "PIPELINE_MODEL_PARALLEL_GROUP", &[r, r + 4]);
        }
        for step in 1..=24u64 {
            let t0 = step * 20 * MS;
            let mut ended = [0u64; 8];
            for r in 0..4 {
                let enq = t0 + jitter(r, step);
                let end = enq + transfer(r, r + 4);
                job.op(r, "pp", step, Op::Send, Some(r + 4), enq, end);
                job.op(
                    r + 4,
                    "pp",
                    step,
                    Op::Recv,
                    Some(r),
                    t0 + jitter(r + 4, step),
                    end,
                );
                ended[r as usize] = end;
                ended[r as usize + 4] = end;
            }
            for stage in [[0, 1, 2, 3], [4, 5, 6, 7]] {
                let arrive: Vec<(Rank, u64)> = stage
                    .iter()
                    .map(|&r| {
                        let late = if straggler == Some(r) { 2 * MS } else { 0 };
                        (r, ended[r as usize] + 3 * MS + late)
                    })
                    .collect();
                job.coll("tp", step, &arrive, MS / 5);
            }
        }
        job.verdicts()
    }

    #[test]
    fn without_timing_a_link_is_named_against_pipelines_in_lockstep_and_a_straggler_is_not() {
        assert!(untimed_pipeline(|_, _| MS / 2, None).is_empty());
        // 1.5 ms more on [1, 5] at both ends: the pipelines share tensor-parallel groups, so
        // the compute in their spans is the same and the margin (1 ms) is enough.
        let slow = |a, b| if (a, b) == (1, 5) { 2 * MS } else { MS / 2 };
        let vs = untimed_pipeline(slow, None);
        assert_eq!(
            summary(&vs),
            vec![(Subtype::SlowLink, vec![], vec![(Some(1), Some(5))])],
            "{vs:#?}"
        );
        // A straggler lengthens its own spans only, not its peer's: no pair.
        let vs = untimed_pipeline(|_, _| MS / 2, Some(5));
        assert!(vs.iter().all(|v| v.subtype != Subtype::SlowLink), "{vs:#?}");
    }

    #[test]
    fn one_rank_behind_both_of_its_slow_boundaries_is_its_nic() {
        // Three stages: 0-3, 4-7, 8-11; rank 5's NIC slows its transfers with 1 and with 9.
        let mut job = Job::new(true);
        for stage in [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] {
            job.group("tp", "TENSOR_MODEL_PARALLEL_GROUP", &stage);
        }
        for r in 0..4 {
            job.group("pp", "PIPELINE_MODEL_PARALLEL_GROUP", &[r, r + 4, r + 8]);
        }
        let factor = |a: Rank, b: Rank| if a == 5 || b == 5 { 6 } else { 1 };
        for step in 1..=16u64 {
            let t0 = step * 40 * MS;
            for stage in [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] {
                for k in 0..3 {
                    let seq = 3 * step - 2 + k;
                    let arrive: Vec<(Rank, u64)> = stage
                        .iter()
                        .map(|&r| (r, t0 + k * 2 * MS + jitter(r, seq)))
                        .collect();
                    job.coll("tp", seq, &arrive, MS / 5);
                }
            }
            for r in 0..4 {
                // Stage 0 sends to stage 1 (its p2p #step), which receives (#2step-1) and
                // sends on to stage 2 (#2step), which receives (#step).
                let enq = t0 + 8 * MS;
                let end = enq + MS * factor(r, r + 4);
                job.op(r, "pp", step, Op::Send, Some(r + 4), enq, end);
                job.op(r + 4, "pp", 2 * step - 1, Op::Recv, Some(r), enq, end);
                let enq = end + MS;
                let end = enq + MS * factor(r + 4, r + 8);
                job.op(r + 4, "pp", 2 * step, Op::Send, Some(r + 8), enq, end);
                job.op(r + 8, "pp", step, Op::Recv, Some(r + 4), enq, end);
            }
        }
        let vs = job.verdicts();
        assert_eq!(
            summary(&vs),
            vec![(Subtype::SlowLink, vec![], vec![(Some(5), None)])],
            "{vs:#?}"
        );
        assert_eq!(vs[0].links[0].kind, LinkKind::Nic);
    }

    #[test]
    fn a_slow_group_with_no_pair_to_name_is_undecided_and_names_nobody() {
        // Four data-parallel pairs; [1, 5]'s all-reduce moves its data 5x slower than the
        // others' at every op, and no point-to-point traffic says through which NIC.
        let mut job = Job::new(true);
        for r in 0..4 {
            job.group("dp", "DATA_PARALLEL_GROUP", &[r, r + 4]);
        }
        for seq in 1..=16 {
            for r in 0..4 {
                let t0 = seq * 50 * MS;
                let transfer = if r == 1 { 10 * MS } else { 2 * MS };
                job.coll("dp", seq, &[(r, t0), (r + 4, t0 + MS / 10)], transfer);
            }
        }
        let vs = job.verdicts();
        assert_eq!(
            summary(&vs),
            vec![(Subtype::Undecided, vec![], vec![])],
            "{vs:#?}"
        );
        assert_eq!(vs[0].pg.as_ref().map(|p| p.ranks.clone()), Some(vec![1, 5]));
        assert!(vs[0].confidence < 0.45);
    }
}
