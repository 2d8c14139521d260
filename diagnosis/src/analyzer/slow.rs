//! Slow rules, for streams that are not stuck. All of them compare the job with its own
//! history (baselines learned from its first completed ops), so an imbalance present from the
//! start raises nothing, and all need the condition in most of the last W ops, so one slow step
//! raises nothing either.
//!
//! - transfer time normal, a few ranks' compute gaps grown → compute straggler;
//! - transfer time grown, some pairs' throughput fallen → slow link (with the NIC when one
//!   host's traffic explains it) or congestion (several hosts under one switch);
//! - transfer time grown, no pair stands out → undecided.

use super::hang::pair_link;
use super::state::{KeyStats, Pg, State};
use super::{text, Config};
use crate::event::Rank;
use crate::verdict::{Class, Link, LinkKind, PgRef, Subtype, Verdict};
use std::collections::BTreeSet;

/// Slow verdicts of every stream not marked stuck.
pub(crate) fn evaluate(state: &State, cfg: &Config, stuck: &[bool]) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = Vec::new();
    for (i, pg) in state.pgs.iter().enumerate() {
        if pg.p2p || stuck.get(i).copied().unwrap_or(false) || pg.members.len() < 2 {
            continue;
        }
        let transfer = pg
            .keys
            .iter()
            .filter(|k| k.transfer_hits.active())
            .max_by_key(|k| k.transfer_hits.count());
        if let Some(ks) = transfer {
            out.push(link(state, pg, ks, cfg));
            continue;
        }
        let gaps = pg
            .keys
            .iter()
            .filter(|k| k.fired > 0)
            .max_by_key(|k| k.fired);
        if let Some(v) = gaps.and_then(|ks| straggler(pg, ks, cfg)) {
            // The same straggler shows in every group it is in: report it once.
            match out
                .iter_mut()
                .find(|o| o.subtype == Subtype::ComputeStraggler && o.culprits == v.culprits)
            {
                Some(o) => o.evidence.push(format!("also slow in {}", text::pg(pg))),
                None => out.push(v),
            }
        }
    }
    out
}

fn base_verdict(pg: &Pg, ks: &KeyStats, subtype: Subtype) -> Verdict {
    Verdict {
        class: Class::Slow,
        subtype,
        culprits: Vec::new(),
        links: Vec::new(),
        pg: Some(PgRef {
            name: pg.name.to_string(),
            ranks: pg.ranks(),
        }),
        seq: Some(ks.last_seq),
        op: Some(ks.op),
        evidence: Vec::new(),
        confidence: 0.0,
        detected_ns: 0,
    }
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

/// A few ranks' compute gaps grew while the transfer time did not.
fn straggler(pg: &Pg, ks: &KeyStats, cfg: &Config) -> Option<Verdict> {
    let n = pg.members.len();
    let fired: Vec<usize> = (0..n)
        .filter(|&m| ks.gaps.get(m).is_some_and(|g| g.hits.active()))
        .collect();
    // Everyone slower is not a straggler (a global slowdown, e.g. the input pipeline).
    if fired.is_empty() || fired.len() * 2 > n {
        return None;
    }
    let mut v = base_verdict(pg, ks, Subtype::ComputeStraggler);
    let w = cfg.slow_window;
    let mut min_hits = w;
    for &m in &fired {
        let g = &ks.gaps[m];
        min_hits = min_hits.min(g.hits.count());
        v.evidence.push(format!(
            "rank {} compute gap {} vs its baseline {} ({:.1}x) in {} of the last {w} {} ops of {}",
            pg.members[m],
            text::dur(f64::from(g.last_gap)),
            text::dur(f64::from(g.base.value().unwrap_or(0.0))),
            ratio(g.last_gap, g.base.value()),
            g.hits.count(),
            ks.op,
            text::pg(pg)
        ));
    }
    let others: Vec<f32> = (0..n)
        .filter(|m| !fired.contains(m))
        .filter_map(|m| ks.gaps.get(m))
        .map(|g| ratio(g.last_gap, g.base.value()))
        .collect();
    v.evidence.push(format!(
        "other ranks' gaps are {:.1}x their baselines; transfer time is {:.1}x its baseline",
        median(others),
        ratio(ks.last_transfer, ks.transfer.value())
    ));
    // The straggler arrives last, so it waits least inside the collective.
    let durations: Vec<(usize, u64)> = (0..n)
        .filter_map(|m| {
            pg.rec(m, ks.last_seq)
                .and_then(|r| r.duration())
                .map(|d| (m, d))
        })
        .collect();
    if let Some(&(m, d)) = durations.iter().min_by_key(|x| x.1) {
        if fired.contains(&m) {
            let med = median(durations.iter().map(|x| x.1 as f32).collect());
            v.evidence.push(format!(
                "rank {} waits least in {} #{}: {} vs a median of {}",
                pg.members[m],
                ks.op,
                ks.last_seq,
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

/// The transfer time grew: name the pairs whose own throughput fell, and what they share.
fn link(state: &State, pg: &Pg, ks: &KeyStats, cfg: &Config) -> Verdict {
    let w = cfg.slow_window;
    let hits = ks.transfer_hits.count();
    let mut v = base_verdict(pg, ks, Subtype::SlowLink);
    v.evidence.push(format!(
        "transfer time of {} in {} is {} vs a baseline of {} ({:.1}x) in {hits} of the last {w} ops",
        ks.op,
        text::pg(pg),
        text::dur(f64::from(ks.last_transfer)),
        text::dur(f64::from(ks.transfer.value().unwrap_or(0.0))),
        ratio(ks.last_transfer, ks.transfer.value())
    ));
    let mut slow: Vec<(Rank, Rank)> = pg
        .pairs
        .iter()
        .filter(|(_, p)| p.hits.active())
        .map(|(&k, _)| k)
        .collect();
    slow.sort_unstable();
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
                "{} throughput {:.2} GB/s vs its baseline {:.2} GB/s ({:.1}x slower)",
                pair_link(state, from, to).name,
                p.last_thr,
                base,
                if p.last_thr > 0.0 {
                    base / p.last_thr
                } else {
                    0.0
                }
            ));
        }
    }
    let host = |r: Rank| state.ranks.get(r as usize).map_or("", |s| s.host());
    let switch = |r: Rank| {
        state
            .ranks
            .get(r as usize)
            .and_then(|s| s.info.as_deref())
            .map_or("", |m| m.switch.as_str())
    };
    let carried: Vec<(Rank, Rank)> = pg
        .pairs
        .iter()
        .filter(|(_, p)| p.base.value().is_some())
        .map(|(&k, _)| k)
        .collect();

    // One NIC: every slow pair leaves (or enters) one host, and so does every other pair of
    // that host that carried traffic to another host.
    let nic = [true, false].into_iter().find_map(|leaving| {
        let end = |p: &(Rank, Rank)| if leaving { p.0 } else { p.1 };
        let other = |p: &(Rank, Rank)| if leaving { p.1 } else { p.0 };
        let h = host(end(&slow[0]));
        let inter = |p: &(Rank, Rank)| host(end(p)) == h && host(other(p)) != h;
        let all_slow_here = !h.is_empty() && slow.iter().all(inter);
        let all_here_slow = carried
            .iter()
            .filter(|p| inter(p))
            .all(|p| slow.contains(p));
        (all_slow_here && all_here_slow).then(|| (h.to_string(), end(&slow[0]), leaving))
    });
    let mut links = Vec::new();
    if let Some((h, rank, leaving)) = nic {
        let nic_name = state
            .ranks
            .get(rank as usize)
            .and_then(|s| s.info.as_deref())
            .map(|m| m.nic.as_str())
            .filter(|n| !n.is_empty())
            .unwrap_or("nic");
        links.push(Link {
            kind: LinkKind::Nic,
            name: format!("{h}/{nic_name}"),
            from: Some(rank),
            to: None,
        });
        v.evidence.push(format!(
            "every slow pair {} {h} and every pair of {h} to another host is slow",
            if leaving { "leaves" } else { "enters" }
        ));
    } else {
        // Congestion: slow pairs from and to several hosts, all under one switch, and no slow
        // pair elsewhere.
        let senders: BTreeSet<&str> = slow.iter().map(|p| host(p.0)).collect();
        let receivers: BTreeSet<&str> = slow.iter().map(|p| host(p.1)).collect();
        let candidates = [switch(slow[0].0), switch(slow[0].1)];
        let common = candidates
            .into_iter()
            .find(|s| !s.is_empty() && slow.iter().all(|p| switch(p.0) == *s || switch(p.1) == *s));
        if let (Some(sw), true) = (common, senders.len() >= 2 && receivers.len() >= 2) {
            v.subtype = Subtype::Congestion;
            links.push(Link {
                kind: LinkKind::Switch,
                name: sw.to_string(),
                from: None,
                to: None,
            });
            let hosts: BTreeSet<&str> = senders.union(&receivers).copied().collect();
            v.evidence.push(format!(
                "{} slow pairs on {} hosts all pass through switch {sw}; pairs elsewhere are not slow",
                slow.len(),
                hosts.len()
            ));
        }
    }
    links.extend(slow.iter().map(|&(f, t)| pair_link(state, f, t)));
    v.links = links;

    // eBPF counters of the slow pairs' hosts, when there are any.
    let addr = |r: Rank| {
        state
            .ranks
            .get(r as usize)
            .and_then(|s| s.info.as_deref())
            .map_or("", |m| m.addr.as_str())
    };
    for &(from, to) in &slow {
        let key = (addr(from).to_string(), addr(to).to_string());
        if let Some(c) = state.counters.get(&key) {
            if let Some(base) = c.base.value() {
                v.evidence.push(format!(
                    "counters: {} -> {} tx rate {:.2} GB/s vs {:.2} GB/s before",
                    host(from),
                    host(to),
                    c.rate,
                    base
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
