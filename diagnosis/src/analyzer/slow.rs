//! Slow rules, for streams that are not stuck. Two comparisons:
//!
//! - against the job's own history (baselines learned from its first completed ops), which
//!   needs the condition in most of the last W ops, so one slow step raises nothing and an
//!   imbalance present from the start is learned as normal;
//! - against peers in the same step, as CCL-D does, which needs no history, so a rank or a NIC
//!   slow from the job's first step, or turning slow seconds in, is named within a step or two.
//!
//! The rules:
//!
//! - transfer time normal, a few ranks' compute gaps grown against their group's at the same
//!   seq (against their own usual share, or live against their peers' median alone) → compute
//!   straggler;
//! - live, a member still computing long after its peers entered the group's next op →
//!   compute straggler, before that op ends ([`late`]);
//! - transfer time grown, some pairs' throughput fallen → slow link (with the NIC when one
//!   host's traffic explains it) or congestion (several hosts under one switch), decided over
//!   every group's paths ([`paths`](super::paths));
//! - no path named that way, some inter-host paths' throughput below their peers' of the same
//!   size → the same slow link, NIC or congestion verdict ([`peer_links`]);
//! - transfer time grown, no pair stands out → undecided.

use super::hang::pair_link;
use super::paths::{host, Component, Paths};
use super::state::{KeyStats, PairState, Pg, State};
use super::{text, Config};
use crate::event::{Op, Rank};
use crate::verdict::{Class, Link, LinkKind, Subtype, Verdict};

/// Slow verdicts of every stream not marked stuck. The same cause seen in several groups (a
/// straggler is in a TP, a DP and a PP group; a NIC carries several DP rings) is reported once.
pub(crate) fn evaluate(state: &State, cfg: &Config, stuck: &[bool], now: u64) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = Vec::new();
    let mut paths: Option<(Paths, Component)> = None;
    for (i, pg) in state.pgs.iter().enumerate() {
        if pg.p2p || stuck.get(i).copied().unwrap_or(false) || pg.members.len() < 2 {
            continue;
        }
        let transfer = pg
            .keys
            .iter()
            .filter(|k| k.transfer_hits.active())
            .max_by_key(|k| k.transfer_hits.count());
        let v = match transfer {
            Some(ks) => {
                let (paths, component) = paths.get_or_insert_with(|| {
                    let p = Paths::collect(state);
                    let c = p.component(state);
                    (p, c)
                });
                Some(link(state, pg, ks, cfg, paths, component))
            }
            None if pg.stragglers > 0 => straggler(pg, cfg).or_else(|| late(state, pg, cfg, now)),
            None if !state.offline => late(state, pg, cfg, now),
            // Only point-to-point traffic: no collective of its own ever completed. Where
            // collectives run, their transfer time decides (with the paths and counters
            // evidence of `link`), however early some pair looks slow.
            None if pg.keys.is_empty() && state.has_p2p_twin(pg) => p2p_link(state, pg, cfg),
            None => None,
        };
        if let Some(v) = v {
            merge(&mut out, v, pg);
        }
    }
    // Against the job's own history nothing (yet) names a path: compare each path with its
    // peers now. Stuck streams' pairs are left out, their stall is the hang rules' finding.
    let named = out.iter().any(|v| {
        matches!(v.subtype, Subtype::SlowLink | Subtype::Congestion) && !v.links.is_empty()
    });
    if !named {
        if let Some(v) = peer_links(state, cfg, stuck) {
            // The paths named explain the grown transfer times the history rules could not.
            out.retain(|o| o.subtype != Subtype::Undecided);
            out.push(v);
        }
    }
    out
}

/// Fewest paths of one kind and size for the peer comparison of paths: with fewer, the median
/// may be one of the slow paths.
pub(crate) const PEER_MIN_PATHS: usize = 4;

/// One inter-host path's latest transfer, for the comparison with its peers.
struct PathObs {
    key: (Rank, Rank),
    /// When it was reported (the analyzer's clock).
    at: u64,
    bytes: u64,
    busy: u64,
    thr: f32,
    /// Throughput of the transfer before it, if any.
    prev: Option<f32>,
    /// Throughput by the sender's report alone, and by the receiver's, where each reported.
    sent: Option<f32>,
    received: Option<f32>,
}

/// Slow paths against their peers in the same step, CCL-D's comparison: no history is needed,
/// so a bad NIC or link present from the job's first step (a restart onto a bad node) or
/// striking a few seconds in is named as soon as two transfers over it completed.
///
/// The peers of a path are the job's other inter-host paths whose latest transfer had the same
/// size bucket (a DP ring's chunks with each other, pipeline activations with each other), so
/// latency-bound small transfers are never compared with bandwidth-bound large ones. Within a
/// set of at least [`PEER_MIN_PATHS`], the pace is the upper quartile of their throughputs
/// (faults only slow paths down), and a path is slow when its throughput is below the pace by
/// the slow factor, it was busy at least `slow_min_delta_ns` longer than the pace would take,
/// it lies [`PEER_MAD_K`](super::state::PEER_MAD_K) robust standard deviations (1.4826 × the
/// median absolute deviation of the upper half from the pace) below it, and the transfer
/// before it was slow by the factor too (or this one [`PEER_STRONG`](super::state::PEER_STRONG)
/// times slower). The slow paths then
/// point at a NIC, a switch or themselves exactly as the history rules' do
/// ([`paths`](super::paths)).
fn peer_links(state: &State, cfg: &Config, stuck: &[bool]) -> Option<Verdict> {
    use super::state::{bucket, PEER_MAD_K, PEER_STRONG};
    use std::collections::BTreeMap;
    let mut sets: BTreeMap<u8, Vec<PathObs>> = BTreeMap::new();
    for (i, pg) in state.pgs.iter().enumerate() {
        if stuck.get(i).copied().unwrap_or(false) {
            continue;
        }
        for (&key, p) in &pg.pairs {
            let (a, b) = (host(state, key.0), host(state, key.1));
            if a.is_empty() || b.is_empty() || a == b {
                continue;
            }
            let bytes = p.send.bytes.max(p.recv.bytes);
            let busy = p.send.busy.max(p.recv.busy);
            if bytes == 0 || busy == 0 {
                continue;
            }
            let b = bucket(bytes);
            sets.entry(b).or_default().push(PathObs {
                key,
                at: p.seen_ns,
                bytes,
                busy,
                thr: bytes as f32 / busy as f32,
                prev: (p.last_thr > 0.0).then_some(p.last_thr),
                sent: side_thr(&p.send),
                received: side_thr(&p.recv),
            });
        }
    }
    let factor = cfg.slow_factor as f32;
    let mut paths = Paths::default();
    let mut slow: Vec<(PathObs, f32)> = Vec::new();
    let mut normal: Vec<((Rank, Rank), u64)> = Vec::new();
    let mut strict = false;
    for (_, obs) in sets {
        if obs.len() < PEER_MIN_PATHS {
            continue;
        }
        let mut thr: Vec<f32> = obs.iter().map(|o| o.thr).collect();
        thr.sort_unstable_by(f32::total_cmp);
        // The pace: no fault makes a path faster than it runs healthy, so the faster paths set
        // it. The upper quartile rather than the median keeps it right when up to three
        // quarters of the paths are slow (a congested switch above half of a small job's
        // hosts), and the spread is taken over the upper half alone for the same reason.
        let pace = thr[(thr.len() - 1) * 3 / 4];
        let mid = thr[thr.len() / 2];
        let mut dev: Vec<f32> = thr
            .iter()
            .filter(|&&t| t >= mid)
            .map(|t| (t - pace).abs())
            .collect();
        let mad = super::baseline::median(&mut dev);
        if pace <= 0.0 {
            continue;
        }
        let median = pace;
        for o in obs {
            let below = o.thr * factor <= median;
            let late = o.busy as f32 - o.bytes as f32 / median >= cfg.slow_min_delta_ns as f32;
            let outside = median - o.thr > PEER_MAD_K * 1.4826 * mad;
            let confirmed =
                o.prev.is_some_and(|p| p * factor <= median) || o.thr * PEER_STRONG <= median;
            if below && outside && confirmed {
                // Slow by the ratio alone (a small transfer a few times slower loses less
                // than the absolute margin) raises nothing, but says which paths share the
                // slowdown, as the history rules' relatively slow pairs do.
                paths.slow.insert(o.key);
                if o.sent.is_some_and(|t| t * factor <= median) {
                    paths.sent_slow.insert(o.key);
                }
                if o.received.is_some_and(|t| t * factor <= median) {
                    paths.received_slow.insert(o.key);
                }
                strict |= late;
                slow.push((o, median));
            } else if !below {
                normal.push((o.key, o.at));
            }
        }
    }
    if !strict {
        return None;
    }
    let first_slow = slow.iter().map(|(o, _)| o.at).min()?;
    // A path is evidence of a healthy NIC or switch only if it moved data at the pace of its
    // peers since the slow paths were slow: the start-up barrier's paths, normal before the
    // onset, say nothing about a NIC that failed later.
    paths.normal = normal
        .into_iter()
        .filter(|&(k, at)| at >= first_slow && !paths.slow.contains(&k))
        .map(|(k, _)| k)
        .collect();
    let component = paths.component(state);
    slow.sort_unstable_by_key(|(o, _)| o.key);
    slow.dedup_by_key(|(o, _)| o.key);
    let mut v = Verdict {
        class: Class::Slow,
        subtype: Subtype::SlowLink,
        culprits: Vec::new(),
        links: Vec::new(),
        pg: None,
        seq: None,
        op: None,
        evidence: Vec::new(),
        confidence: 0.0,
        detected_ns: 0,
    };
    const SHOWN: usize = 8;
    for (o, median) in slow.iter().take(SHOWN) {
        v.evidence.push(format!(
            "{} throughput {} is {:.1}x below the pace {} of the job's inter-host paths of its size in the same step (their upper quartile){}",
            pair_link(state, o.key.0, o.key.1).name,
            text::rate(f64::from(o.thr)),
            median / o.thr,
            text::rate(f64::from(*median)),
            if o.prev.is_some_and(|p| p * factor <= *median) {
                ", and so was its transfer before"
            } else {
                ""
            }
        ));
    }
    if slow.len() > SHOWN {
        v.evidence
            .push(format!("{} more paths are as slow", slow.len() - SHOWN));
    }
    v.evidence.push(format!(
        "{} inter-host paths move at their peers' pace (compared with peers, not with the job's own history)",
        paths.normal.len()
    ));
    v.confidence = 0.75;
    match &component {
        Component::Nic {
            host: h,
            rank,
            touch,
        } => {
            let nic = nic_name(state, *rank);
            v.links.push(Link {
                kind: LinkKind::Nic,
                name: format!("{h}/{nic}"),
                from: Some(*rank),
                to: None,
            });
            v.evidence.insert(
                0,
                format!(
                    "every slow path {} {h} ({} paths) and no path of {h} to another host is normal",
                    touch.verb(),
                    paths.slow.len()
                ),
            );
        }
        Component::Switch { name, hosts } => {
            v.subtype = Subtype::Congestion;
            v.links.push(Link {
                kind: LinkKind::Switch,
                name: name.clone(),
                from: None,
                to: None,
            });
            v.evidence.insert(
                0,
                format!(
                    "{} slow paths on {hosts} hosts share no host but all pass through switch {name}",
                    paths.slow.len()
                ),
            );
        }
        Component::Paths => {
            v.links
                .extend(slow.iter().map(|(o, _)| pair_link(state, o.key.0, o.key.1)));
        }
    }
    Some(v)
}

/// One side's throughput of a pair's current op (bytes per ns), if it reported any.
fn side_thr(side: &super::state::Side) -> Option<f32> {
    (side.seen && side.bytes > 0 && side.busy > 0).then(|| side.bytes as f32 / side.busy as f32)
}

/// The NIC name rank `rank` reported, or "nic" when it reported none.
fn nic_name(state: &State, rank: Rank) -> &str {
    state
        .ranks
        .get(rank)
        .and_then(|s| s.info.as_deref())
        .map(|m| m.nic.as_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("nic")
}

/// Adds a verdict, or folds it into an earlier one naming the same ranks or component.
fn merge(out: &mut Vec<Verdict>, v: Verdict, pg: &Pg) {
    let component = |v: &Verdict| {
        v.links
            .first()
            .filter(|l| l.kind != LinkKind::Pair)
            .cloned()
    };
    let same = out.iter_mut().find(|o| {
        o.subtype == v.subtype
            && match v.subtype {
                Subtype::ComputeStraggler => o.culprits == v.culprits,
                _ => component(o).is_some() && component(o) == component(&v),
            }
    });
    match same {
        Some(o) => {
            o.evidence.push(format!("also slow in {}", text::pg(pg)));
            for l in v.links {
                if !o.links.contains(&l) {
                    o.links.push(l);
                }
            }
        }
        None => out.push(v),
    }
}

fn base_verdict(pg: &Pg, seq: u64, op: Op, subtype: Subtype) -> Verdict {
    pg.verdict(Class::Slow, subtype, seq, Some(op))
}

fn ratio(x: f32, base: Option<f32>) -> f32 {
    match base {
        Some(b) if b > 0.0 => x / b,
        _ => 1.0,
    }
}

fn median(mut v: Vec<f32>) -> f32 {
    super::baseline::median(&mut v)
}

/// A few ranks' compute gaps grew against their group's at the same seqs, beyond their own
/// usual ratio, while the others' did not.
fn straggler(pg: &Pg, cfg: &Config) -> Option<Verdict> {
    let n = pg.members.len();
    let fired: Vec<usize> = (0..n)
        .filter(|&m| pg.compute.get(m).is_some_and(|c| c.slow()))
        .collect();
    // Everyone slower is not a straggler (a global slowdown, e.g. the input pipeline).
    if fired.is_empty() || fired.len() * 2 > n {
        return None;
    }
    // Against peers alone (no history) a few ranks slower than the rest are a straggler (one
    // in a group of fewer than eight); more than a quarter slower together is a pattern of
    // the job (an uneven split), not a fault.
    let by_history = fired.iter().any(|&m| pg.compute[m].hits.active());
    if !by_history && fired.len() > (n / 4).max(1) {
        return None;
    }
    let seq = pg.gap_seq;
    let op = (0..n)
        .find_map(|m| pg.rec(m, seq))
        .map_or(Op::Other, |r| r.sig.op);
    let mut v = base_verdict(pg, seq, op, Subtype::ComputeStraggler);
    let w = cfg.slow_window;
    let mut min_hits = w;
    for &m in &fired {
        let c = &pg.compute[m];
        if !c.hits.active() {
            // Its peers alone say so, over a short window: as sure as half a full window.
            min_hits = min_hits.min(w / 2);
            v.evidence.push(format!(
                "rank {} compute gap {} is {:.1}x the median of its {} peers at the same seq{} in {} (compared with its peers, not its own history)",
                pg.members[m],
                text::dur(f64::from(c.last_gap)),
                c.last_ratio,
                n - 1,
                if c.peer.active() {
                    format!(" in {} of its last ops", c.peer.count())
                } else {
                    format!(" (at least {}x is enough alone)", super::state::PEER_STRONG)
                },
                text::pg(pg)
            ));
            continue;
        }
        min_hits = min_hits.min(c.hits.count());
        v.evidence.push(format!(
            "rank {} compute gap {} is {:.1}x the group's median of {} (usually {:.1}x) in {} of the last {w} ops of {}",
            pg.members[m],
            text::dur(f64::from(c.last_gap)),
            c.last_ratio,
            text::dur(f64::from(pg.gap_median)),
            c.base.value().unwrap_or(1.0),
            c.hits.count(),
            text::pg(pg)
        ));
    }
    let others: Vec<f32> = (0..n)
        .filter(|m| !fired.contains(m))
        .filter_map(|m| pg.compute.get(m))
        .map(|c| ratio(c.last_ratio, c.base.value()))
        .collect();
    v.evidence.push(format!(
        "other ranks' gaps are {:.1}x their usual share; transfer times are normal",
        median(others)
    ));
    // The straggler arrives last, so it waits least inside the collective.
    let durations: Vec<(usize, u64)> = (0..n)
        .filter_map(|m| pg.rec(m, seq).and_then(|r| r.duration()).map(|d| (m, d)))
        .collect();
    if let Some(&(m, d)) = durations.iter().min_by_key(|x| x.1) {
        if fired.contains(&m) {
            let med = median(durations.iter().map(|x| x.1 as f32).collect());
            v.evidence.push(format!(
                "rank {} waits least in {op} #{seq} (it arrives last): {} vs a median of {}",
                pg.members[m],
                text::dur(d as f64),
                text::dur(f64::from(med))
            ));
        }
    }
    v.culprits = fired.iter().map(|&m| pg.members[m]).collect();
    v.culprits.sort_unstable();
    v.confidence = 0.6 + 0.35 * f64::from(min_hits) / f64::from(w.max(1));
    Some(v)
}

/// The shortest time a member must have been computing, by the analyzer's receive clock, to be
/// late by [`late`]: its reports and its peers' arrive in batches (every 100 ms from the
/// simulator's and the clients' probes), so a few hundred milliseconds of apparent lateness
/// can be delivery alone. Half a second stays well inside the 3 s target.
pub(crate) const LATE_FLOOR_NS: u64 = 500_000_000;

/// A member still computing long after its peers entered the group's next op, CCL-D's
/// arrival comparison made while the op is in flight: at a 6-20x slowdown one compute phase
/// lasts seconds, and waiting for it to end before comparing gaps would name the straggler
/// only after the 3 s target.
///
/// The group's members run the same compute (see [`PEER_MIN_MEMBERS`](super::state::PEER_MIN_MEMBERS));
/// at least half of them entered its newest op; a member that did not has no op in flight in
/// any group (it is computing, not waiting on someone else) and has been at it for at least
/// [`PEER_STRONG`](super::state::PEER_STRONG) times the group's median gap (and by
/// `slow_min_delta_ns`, and at least [`LATE_FLOOR_NS`]) since its last op ended: it is a
/// straggler now. Live only: an offline
/// record has no receive clock to measure "still computing" with.
fn late(state: &State, pg: &Pg, cfg: &Config, now: u64) -> Option<Verdict> {
    use super::state::{PEER_MIN_MEMBERS, PEER_STRONG};
    let n = pg.members.len();
    if pg.p2p || n < PEER_MIN_MEMBERS || pg.gap_median <= 0.0 || !state.peer_comparable(pg) {
        return None;
    }
    let newest = pg.state.iter().filter_map(|m| m.last_enq).max()?;
    let entered = pg
        .state
        .iter()
        .filter(|m| m.last_enq == Some(newest))
        .count();
    if entered * 2 < n || entered == n {
        return None;
    }
    let threshold = (pg.gap_median * PEER_STRONG)
        .max(pg.gap_median + cfg.slow_min_delta_ns as f32)
        .max(LATE_FLOOR_NS as f32);
    let computing = |rank: Rank| -> Option<u64> {
        let rs = state.ranks.get(rank)?;
        let busy = rs
            .pgs
            .iter()
            .any(|&(p, m)| state.pgs[p as usize].state[m as usize].in_flight);
        (!busy && rs.end_recv_ns > 0).then(|| now.saturating_sub(rs.end_recv_ns))
    };
    let late: Vec<(usize, u64)> = (0..n)
        .filter(|&m| pg.state[m].last_enq < Some(newest))
        .filter_map(|m| computing(pg.members[m]).map(|t| (m, t)))
        .filter(|&(_, t)| t as f32 >= threshold)
        .collect();
    if late.is_empty() || late.len() > (n / 4).max(1) {
        return None;
    }
    let op = (0..n)
        .find_map(|m| pg.rec(m, newest))
        .map_or(Op::Other, |r| r.sig.op);
    let mut v = base_verdict(pg, newest, op, Subtype::ComputeStraggler);
    for &(m, t) in &late {
        v.evidence.push(format!(
            "rank {} has been computing for {} since its last op ended, {:.1}x the group's median gap of {}, while {entered} of its {} peers entered {op} #{newest} of {} and wait for it",
            pg.members[m],
            text::dur(t as f64),
            t as f32 / pg.gap_median,
            text::dur(f64::from(pg.gap_median)),
            n - 1,
            text::pg(pg)
        ));
    }
    v.culprits = late.iter().map(|&(m, _)| pg.members[m]).collect();
    v.culprits.sort_unstable();
    v.confidence = 0.7;
    Some(v)
}

/// Slow pairs in a group that carries only point-to-point traffic, which has no group-wide
/// transfer time (each end numbers its own ops; its per-peer progress is kept with the group's
/// pairs), so the pairs speak for themselves. A pair whose throughput fell by the
/// factor, and by enough busy time, in most of its last transfers is a slow link: this is how
/// a pipeline boundary shows whose link carries only the stages' activations and gradients.
/// Pairs slower by ratio alone raise nothing here.
fn p2p_link(state: &State, pg: &Pg, cfg: &Config) -> Option<Verdict> {
    let mut slow: Vec<(&(Rank, Rank), &PairState)> =
        pg.pairs.iter().filter(|(_, p)| p.hits.active()).collect();
    if slow.is_empty() {
        return None;
    }
    slow.sort_unstable_by_key(|(k, _)| **k);
    let w = cfg.slow_window;
    let seq = slow.iter().map(|(_, p)| p.cur_seq).max().unwrap_or(0);
    let mut v = base_verdict(pg, seq, Op::Send, Subtype::SlowLink);
    let mut min_hits = w;
    for (&(from, to), p) in &slow {
        let base = p.base.value().unwrap_or(0.0);
        min_hits = min_hits.min(p.hits.count());
        v.evidence.push(format!(
            "{} throughput {} vs its baseline {} ({:.1}x slower) in {} of the last {w} transfers of {}",
            pair_link(state, from, to).name,
            text::rate(f64::from(p.last_thr)),
            text::rate(f64::from(base)),
            if p.last_thr > 0.0 { base / p.last_thr } else { 0.0 },
            p.hits.count(),
            text::pg(pg)
        ));
        v.links.push(pair_link(state, from, to));
    }
    let others = pg.pairs.len() - slow.len();
    if others > 0 {
        v.evidence.push(format!(
            "the stream's other {others} pairs move at their usual throughput"
        ));
    }
    v.confidence = 0.55 + 0.3 * f64::from(min_hits) / f64::from(w.max(1));
    Some(v)
}

/// The transfer time grew: name the pairs whose own throughput fell, and what they share.
fn link(
    state: &State,
    pg: &Pg,
    ks: &KeyStats,
    cfg: &Config,
    paths: &Paths,
    component: &Component,
) -> Verdict {
    let w = cfg.slow_window;
    let hits = ks.transfer_hits.count();
    let mut v = base_verdict(pg, ks.last_seq, ks.op, Subtype::SlowLink);
    v.evidence.push(format!(
        "transfer time of {} in {} is {} vs a baseline of {} ({:.1}x) in {hits} of the last {w} ops",
        ks.op,
        text::pg(pg),
        text::dur(f64::from(ks.last_transfer)),
        text::dur(f64::from(ks.transfer.value().unwrap_or(0.0))),
        ratio(ks.last_transfer, ks.transfer.value())
    ));
    // This group's slow pairs: strictly slow ones, else those slow by ratio alone.
    let pick = |strict: bool| -> Vec<(Rank, Rank)> {
        let mut v: Vec<(Rank, Rank)> = pg
            .pairs
            .iter()
            .filter(|(_, p)| {
                if strict {
                    p.hits.active()
                } else {
                    p.rel_hits.active()
                }
            })
            .map(|(&k, _)| k)
            .collect();
        v.sort_unstable();
        v
    };
    let mut slow = pick(true);
    if slow.is_empty() {
        slow = pick(false);
    }
    let mut confidence = 0.55 + 0.3 * f64::from(hits) / f64::from(w.max(1));
    if slow.is_empty() {
        v.subtype = Subtype::Undecided;
        v.evidence.push(if pg.pairs.is_empty() {
            "no per-peer progress was reported, so no pair can be named".to_string()
        } else {
            format!(
                "none of the {} pairs' throughput fell below its own baseline",
                pg.pairs.len()
            )
        });
        v.confidence = 0.4;
        return v;
    }
    for &(from, to) in &slow {
        if let Some(p) = pg.pairs.get(&(from, to)) {
            let base = p.base.value().unwrap_or(0.0);
            v.evidence.push(format!(
                "{} throughput {} vs its baseline {} ({:.1}x slower)",
                pair_link(state, from, to).name,
                text::rate(f64::from(p.last_thr)),
                text::rate(f64::from(base)),
                if p.last_thr > 0.0 {
                    base / p.last_thr
                } else {
                    0.0
                }
            ));
        }
    }
    let mut links = Vec::new();
    let touches_pg = |h: &str| {
        slow.iter()
            .any(|&(f, t)| host(state, f) == h || host(state, t) == h)
    };
    match component {
        Component::Nic {
            host: h,
            rank,
            touch,
        } if touches_pg(h) => {
            let nic = nic_name(state, *rank);
            links.push(Link {
                kind: LinkKind::Nic,
                name: format!("{h}/{nic}"),
                from: Some(*rank),
                to: None,
            });
            v.evidence.push(format!(
                "every slow path in the job {} {h} ({} paths) and no path of {h} to another host is normal",
                touch.verb(),
                paths.slow.len()
            ));
        }
        Component::Switch { name, hosts } => {
            v.subtype = Subtype::Congestion;
            links.push(Link {
                kind: LinkKind::Switch,
                name: name.clone(),
                from: None,
                to: None,
            });
            v.evidence.push(format!(
                "{} slow paths on {hosts} hosts share no host but all pass through switch {name}",
                paths.slow.len()
            ));
        }
        _ => {}
    }
    // A named NIC or switch is the answer; the pairs through it are its symptoms and stay in
    // the evidence above, so `links` lists what to fix rather than every path it slowed.
    if links.is_empty() {
        links.extend(slow.iter().map(|&(f, t)| pair_link(state, f, t)));
    }
    v.links = links;

    // eBPF counters of the slow pairs' hosts, when there are any.
    let addr = |r: Rank| {
        state
            .ranks
            .get(r)
            .and_then(|s| s.info.as_deref())
            .map_or("", |m| m.addr.as_str())
    };
    for &(from, to) in &slow {
        let key = (addr(from).to_string(), addr(to).to_string());
        if let Some(c) = state.counters.get(&key) {
            if let Some(base) = c.base.value() {
                v.evidence.push(format!(
                    "counters: {} -> {} tx rate {} vs {} before",
                    host(state, from),
                    host(state, to),
                    text::rate(f64::from(c.rate)),
                    text::rate(f64::from(base))
                ));
                if c.rate * cfg.slow_factor as f32 <= base {
                    confidence += 0.1;
                }
            }
        }
    }
    v.confidence = confidence.min(0.95);
    v
}
