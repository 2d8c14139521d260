//! Evaluation of a placement under failures: what the survivors carry and how much demand is
//! still served.
//!
//! Loads here are the true two-dimensional ones, `max(Σ bps / capacity_bps, Σ pps /
//! capacity_pps)` per node, not the planner's conservative scalar. When nodes fail, their
//! units move by the placement's [`Failover`] rule, the same for every strategy that shares
//! it, and nothing else moves (the fast path; a re-plan comes later). A node over its capacity
//! serves the fraction `1/load` of what it carries (drops are proportional); a unit is lost
//! only when every node is down.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::model::Instance;

/// Where a failed node's units go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Failover {
    /// Largest unit first, each to the surviving node of its tenant's set with the least
    /// resulting load; if the whole set is down, to the least-loaded survivor of all (every
    /// gateway holds every tenant's tables, so a set is a preference, not a wall).
    WithinSet,
    /// Today's gateway rule (placement.rs rule 2): units in VIP order, each to the surviving
    /// node owning the fewest VIPs, ties to the lowest id; any node may take any VIP.
    FewestVips,
}

/// A complete placement: each tenant's node set and each unit's owner.
#[derive(Debug, Clone)]
pub struct Placement {
    pub sets: Vec<Vec<usize>>,
    pub owner: Vec<Vec<usize>>,
    pub failover: Failover,
}

/// One scenario's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Outcome {
    /// Max two-dimensional normalised load over the surviving nodes.
    pub max_load: f64,
    /// Fraction of the total bytes/s still served.
    pub served: f64,
}

/// Summary over scenarios.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub nominal: Outcome,
    /// Worst case over every set of exactly `f` failed nodes (max of max load, min of served:
    /// the two worsts may come from different scenarios), for f = 1, 2, … as asked.
    pub worst: Vec<Worst>,
    pub monte_carlo: MonteCarlo,
}

/// The worst case over all (or, above a limit, a seeded sample of) `failures`-node failures.
#[derive(Debug, Clone, Serialize)]
pub struct Worst {
    pub failures: usize,
    pub max_load: f64,
    pub served: f64,
    /// Scenarios looked at, and whether they were all of them.
    pub scenarios: usize,
    pub exhaustive: bool,
}

/// Independent failures with each node's probability, seeded.
#[derive(Debug, Clone, Serialize)]
pub struct MonteCarlo {
    pub trials: usize,
    pub mean_served: f64,
    /// 5th percentile of served demand (the bad tail).
    pub p5_served: f64,
    pub mean_max_load: f64,
}

/// Per-node two-dimensional loads after `failed` nodes are gone, and which units were lost.
pub fn loads_after(
    inst: &Instance,
    p: &Placement,
    failed: &[bool],
) -> (Vec<f64>, Vec<Vec<Option<usize>>>) {
    let nn = inst.nodes.len();
    let mut bps = vec![0.0; nn];
    let mut pps = vec![0.0; nn];
    let mut count = vec![0usize; nn];
    let mut owner: Vec<Vec<Option<usize>>> = p
        .owner
        .iter()
        .map(|o| o.iter().map(|&n| Some(n)).collect())
        .collect();
    let mut orphans = Vec::new();
    for (t, units) in p.owner.iter().enumerate() {
        for (u, &n) in units.iter().enumerate() {
            if failed[n] {
                orphans.push((t, u));
                owner[t][u] = None;
            } else {
                let unit = &inst.tenants[t].units[u];
                bps[n] += unit.bps;
                pps[n] += unit.pps;
                count[n] += 1;
            }
        }
    }
    let norm = |n: usize, b: f64, q: f64| {
        (b / inst.nodes[n].capacity_bps).max(q / inst.nodes[n].capacity_pps)
    };
    match p.failover {
        Failover::WithinSet => {
            orphans.sort_by(|a, b| inst.size[b.0][b.1].total_cmp(&inst.size[a.0][a.1]));
            for (t, u) in orphans {
                let unit = &inst.tenants[t].units[u];
                let best = p.sets[t]
                    .iter()
                    .copied()
                    .filter(|&n| !failed[n])
                    .min_by(|&a, &b| {
                        norm(a, bps[a] + unit.bps, pps[a] + unit.pps)
                            .total_cmp(&norm(b, bps[b] + unit.bps, pps[b] + unit.pps))
                            .then(a.cmp(&b))
                    });
                let best = best.or_else(|| {
                    (0..nn).filter(|&n| !failed[n]).min_by(|&a, &b| {
                        norm(a, bps[a] + unit.bps, pps[a] + unit.pps)
                            .total_cmp(&norm(b, bps[b] + unit.bps, pps[b] + unit.pps))
                            .then(a.cmp(&b))
                    })
                });
                if let Some(n) = best {
                    bps[n] += unit.bps;
                    pps[n] += unit.pps;
                    owner[t][u] = Some(n);
                }
            }
        }
        Failover::FewestVips => {
            for (t, u) in orphans {
                let unit = &inst.tenants[t].units[u];
                let best = (0..nn)
                    .filter(|&n| !failed[n])
                    .min_by_key(|&n| (count[n], n));
                if let Some(n) = best {
                    bps[n] += unit.bps;
                    pps[n] += unit.pps;
                    count[n] += 1;
                    owner[t][u] = Some(n);
                }
            }
        }
    }
    let load = (0..nn)
        .map(|n| {
            if failed[n] {
                0.0
            } else {
                norm(n, bps[n], pps[n])
            }
        })
        .collect();
    (load, owner)
}

/// The outcome of one failure scenario.
pub fn outcome(inst: &Instance, p: &Placement, failed: &[bool]) -> Outcome {
    let (load, owner) = loads_after(inst, p, failed);
    let total: f64 = inst
        .tenants
        .iter()
        .flat_map(|t| &t.units)
        .map(|u| u.bps)
        .sum();
    let mut served = 0.0;
    for (t, units) in owner.iter().enumerate() {
        for (u, n) in units.iter().enumerate() {
            if let Some(n) = n {
                served += inst.tenants[t].units[u].bps * (1.0 / load[*n].max(1.0));
            }
        }
    }
    Outcome {
        max_load: load.iter().copied().fold(0.0, f64::max),
        served: if total > 0.0 { served / total } else { 1.0 },
    }
}

/// Scenarios beyond which the worst case is taken over a seeded sample.
pub const EXHAUSTIVE_LIMIT: usize = 20_000;

fn binomial(n: usize, k: usize) -> usize {
    let mut r: u128 = 1;
    for i in 0..k {
        r = r * (n - i) as u128 / (i + 1) as u128;
        if r > usize::MAX as u128 {
            return usize::MAX;
        }
    }
    r as usize
}

/// Worst case over sets of exactly `f` failed nodes.
pub fn worst(inst: &Instance, p: &Placement, f: usize, seed: u64) -> Worst {
    let nn = inst.nodes.len();
    let f = f.min(nn);
    let mut w = Worst {
        failures: f,
        max_load: 0.0,
        served: 1.0,
        scenarios: 0,
        exhaustive: true,
    };
    let look = |failed: &[bool], w: &mut Worst| {
        let o = outcome(inst, p, failed);
        w.max_load = w.max_load.max(o.max_load);
        w.served = w.served.min(o.served);
        w.scenarios += 1;
    };
    if binomial(nn, f) <= EXHAUSTIVE_LIMIT {
        // Lexicographic combinations.
        let mut c: Vec<usize> = (0..f).collect();
        loop {
            let mut failed = vec![false; nn];
            c.iter().for_each(|&i| failed[i] = true);
            look(&failed, &mut w);
            let Some(i) = (0..f).rev().find(|&i| c[i] < nn - f + i) else {
                return w;
            };
            c[i] += 1;
            for j in i + 1..f {
                c[j] = c[j - 1] + 1;
            }
        }
    }
    w.exhaustive = false;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..EXHAUSTIVE_LIMIT {
        let mut idx: Vec<usize> = (0..nn).collect();
        for i in 0..f {
            let j = rng.gen_range(i..nn);
            idx.swap(i, j);
        }
        let mut failed = vec![false; nn];
        idx[..f].iter().for_each(|&i| failed[i] = true);
        look(&failed, &mut w);
    }
    w
}

/// Monte Carlo over independent failures.
pub fn monte_carlo(inst: &Instance, p: &Placement, trials: usize, seed: u64) -> MonteCarlo {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut served = Vec::with_capacity(trials);
    let mut load = 0.0;
    for _ in 0..trials {
        let failed: Vec<bool> = inst
            .nodes
            .iter()
            .map(|n| rng.gen::<f64>() < n.fail_prob)
            .collect();
        let o = outcome(inst, p, &failed);
        served.push(o.served);
        load += o.max_load;
    }
    served.sort_by(f64::total_cmp);
    let n = trials.max(1) as f64;
    MonteCarlo {
        trials,
        mean_served: served.iter().sum::<f64>() / n,
        p5_served: served.get(trials / 20).copied().unwrap_or(1.0),
        mean_max_load: load / n,
    }
}

/// Nominal, worst case for 1..=`max_failures` failed nodes, and Monte Carlo.
pub fn report(
    inst: &Instance,
    p: &Placement,
    max_failures: usize,
    trials: usize,
    seed: u64,
) -> Report {
    let none = vec![false; inst.nodes.len()];
    Report {
        nominal: outcome(inst, p, &none),
        worst: (1..=max_failures.min(inst.nodes.len()))
            .map(|f| worst(inst, p, f, seed))
            .collect(),
        monte_carlo: monte_carlo(inst, p, trials, seed),
    }
}
