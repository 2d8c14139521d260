//! Slow rules, for streams that are not stuck. All of them compare the job with its own
//! history (baselines learned from its first completed ops), so an imbalance present from the
//! start raises nothing, and all need the condition in most of the last W ops, so one slow step
//! raises nothing either.
//!
//! - transfer time normal, a few ranks' compute gaps grown against their group's at the same
//!   seq → compute straggler;
//! - transfer time grown, some pairs' throughput fallen → slow link (with the NIC when one
//!   host's traffic explains it) or congestion (several hosts under one switch), decided over
//!   every group's paths ([`paths`](super::paths));
//! - transfer time grown, no pair stands out → undecided.

use super::hang::pair_link;
use super::paths::{host, Component, Paths};
use super::state::{KeyStats, PairState, Pg, State};
use super::{text, Config};
use crate::event::{Op, Rank};
use crate::verdict::{Class, Link, LinkKind, Subtype, Verdict};

/// Slow verdicts of every stream not marked stuck. The same cause seen in several groups (a
/// straggler is in a TP, a DP and a PP group; a NIC carries several DP rings) is reported once.
pub(crate) fn evaluate(state: &State, cfg: &Config, stuck: &[bool]) -> Vec<Verdict> {
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
            None if pg.stragglers > 0 => straggler(pg, cfg),
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
    out
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
        .filter(|&m| {
            pg.compute
                .get(m)
                .is_some_and(|c| c.hits.active() || c.peer.active())
        })
        .collect();
    // Everyone slower is not a straggler (a global slowdown, e.g. the input pipeline).
    if fired.is_empty() || fired.len() * 2 > n {
        return None;
    }
    // Against peers alone (no history) a few ranks slower than the rest are a straggler; a
    // quarter or more slower together is a pattern of the job (an uneven split), not a fault.
    let by_history = fired.iter().any(|&m| pg.compute[m].hits.active());
    if !by_history && fired.len() * 4 > n {
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
            min_hits = min_hits.min(c.peer.count());
            v.evidence.push(format!(
                "rank {} compute gap {} is {:.1}x the median of its {} peers at the same seq in {} of the last {w} ops of {} (compared with its peers, not its own history)",
                pg.members[m],
                text::dur(f64::from(c.last_gap)),
                c.last_ratio,
                n - 1,
                c.peer.count(),
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
            let nic = state
                .ranks
                .get(*rank)
                .and_then(|s| s.info.as_deref())
                .map(|m| m.nic.as_str())
                .filter(|n| !n.is_empty())
                .unwrap_or("nic");
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
