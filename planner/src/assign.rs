//! Assignment (the slow timescale): which `k_t` nodes may serve each tenant.
//!
//! RSMP's approach, as reconstructed in the anchors note (Part B3):
//! 1. **Relaxation.** `min λ` over fractional `x_tn ∈ [0, 1]` with `Σ_n x_tn = k_t`, the
//!    availability cover `Σ_n x_tn·(−ln p_n) ≥ −ln(1 − A_t)` (a tenant is up while any of its
//!    nodes is, so `1 − Π p_n ≥ A_t` is this linear inequality), and robust load
//!    `Σ_t x_tn·d_t/(k_t − 1) ≤ λ·C_n` (see [`Instance::reserve`]). Solved exactly by the
//!    simplex ([`crate::lp::assignment`]) up to [`AssignOptions::exact_lp_limit`] variables;
//!    above that, a dense simplex over `tenants × nodes` variables does not finish in time, so
//!    the relaxation is approximated by sequential best responses averaged over passes
//!    (fictitious play: each pass, each tenant re-chooses its `k_t` least-loaded nodes that
//!    meet its cover, and its fractional row moves `1/(pass+1)` of the way there). That
//!    approximate λ is not a lower bound.
//! 2. **Seeded randomized rounding.** Each tenant draws `k_t` distinct nodes with marginals
//!    `x_tn` (systematic sampling: one uniform offset, points `u, u+1, …` on the cumulative
//!    row). A draw that misses the cover swaps its least reliable node for a cheap node that
//!    completes it (or the most reliable one). Several draws are made; the best after repair is
//!    kept. Deterministic for a seed.
//! 3. **Knapsack repair.** On each node over `λ_relax·(1 + slack)` an exact 0/1 knapsack (DP on
//!    capacity scaled to 2,000 steps) keeps the tenants that fill it most; the others move to
//!    the node where they add the least load, if that is lower than where they were and the
//!    cover still holds.
//!
//!    A greedy draw (largest tenant first onto its least-loaded nodes that meet its cover)
//!    competes with the random ones, so the result is never worse than that greedy.
//! 4. **Local search**: a tenant on the most loaded node swaps it for a node that stays below
//!    that load, while one exists (bounded number of swaps). On small instances (the exact-LP
//!    path) every draw gets it, with ejection chains of two; on large ones only the kept draw,
//!    single swaps only (a chain scans tenants × nodes twice per step).
//!
//! **No constant bound is claimed for this step.** Before repair, Chernoff bounds give the
//! usual `O(log N / log log N)` factor on the LP's load; the benchmark reports the measured
//! ratio to the exact ILP on small instances.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::{Instance, PlanError};

/// How the assignment is computed.
#[derive(Debug, Clone)]
pub struct AssignOptions {
    pub seed: u64,
    /// Reserve for a failure and honour availability (the planner); `false` is the non-robust
    /// variant: nominal shares `d/k` and no cover (same `k_t`).
    pub robust: bool,
    /// Rounding draws.
    pub samples: usize,
    /// Largest `tenants × nodes` for which the relaxation is solved exactly.
    pub exact_lp_limit: usize,
    /// Repair target above the relaxation's λ.
    pub slack: f64,
    /// Passes of the approximate relaxation.
    pub passes: usize,
    /// Most swaps of the final local search.
    pub local_moves: usize,
}

impl Default for AssignOptions {
    fn default() -> AssignOptions {
        AssignOptions {
            seed: 1,
            robust: true,
            samples: 8,
            exact_lp_limit: 2_000,
            slack: 0.05,
            passes: 6,
            local_moves: 2_000,
        }
    }
}

/// Each tenant's node set (sorted node indices) and how it was reached.
#[derive(Debug, Clone)]
pub struct Assignment {
    pub sets: Vec<Vec<usize>>,
    /// λ of the relaxation used (exact LP: a lower bound on the ILP optimum).
    pub relaxed: f64,
    /// Whether the relaxation was the exact LP.
    pub exact_lp: bool,
    /// Max robust load factor of `sets`.
    pub lambda: f64,
}

/// Each node's load factor when every tenant reserves [`Instance::reserve`] on each node of
/// its set.
pub fn reserved_load(inst: &Instance, sets: &[Vec<usize>], robust: bool) -> Vec<f64> {
    let mut load = vec![0.0; inst.nodes.len()];
    for (t, set) in sets.iter().enumerate() {
        let r = inst.reserve(t, robust);
        for &n in set {
            load[n] += r / inst.cap[n];
        }
    }
    load
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// Makes `set` meet tenant `t`'s cover by swapping its least reliable nodes, preferring a node
/// of low `cost` that completes the cover at once, else the most reliable one.
pub(crate) fn fix_cover(inst: &Instance, t: usize, set: &mut [usize], cost: impl Fn(usize) -> f64) {
    let mut guard = inst.nodes.len() + 1;
    while !inst.covers(t, set) && guard > 0 {
        guard -= 1;
        let Some((pos, &worst)) = set.iter().enumerate().min_by(|a, b| {
            inst.weight[*a.1]
                .total_cmp(&inst.weight[*b.1])
                .then(a.1.cmp(b.1))
        }) else {
            return;
        };
        let have: f64 = set.iter().map(|&n| inst.weight[n]).sum();
        let gap = inst.need[t] * (1.0 - 1e-9) - (have - inst.weight[worst]);
        let outside = (0..inst.nodes.len()).filter(|n| !set.contains(n));
        let completing = outside
            .clone()
            .filter(|&n| inst.weight[n] >= gap)
            .min_by(|&a, &b| cost(a).total_cmp(&cost(b)).then(a.cmp(&b)));
        let pick = completing.or_else(|| {
            outside.max_by(|&a, &b| inst.weight[a].total_cmp(&inst.weight[b]).then(b.cmp(&a)))
        });
        match pick {
            Some(n) if inst.weight[n] > inst.weight[worst] => set[pos] = n,
            _ => return,
        }
    }
}

/// The `k` nodes with the least `load + add/C`, then fixed to meet the cover when `robust`.
fn best_response(inst: &Instance, t: usize, load: &[f64], robust: bool) -> Vec<usize> {
    let r = inst.reserve(t, robust);
    let cost = |n: usize| load[n] + r / inst.cap[n];
    let k = inst.k[t];
    let mut idx: Vec<usize> = (0..inst.nodes.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| cost(a).total_cmp(&cost(b)).then(a.cmp(&b)));
        idx.truncate(k);
    }
    if robust {
        fix_cover(inst, t, &mut idx, cost);
    }
    idx.sort_unstable();
    idx
}

/// The approximate relaxation for large instances (see the module docs).
fn relax_by_best_response(
    inst: &Instance,
    robust: bool,
    passes: usize,
) -> (Vec<Vec<(usize, f64)>>, f64) {
    let nt = inst.tenants.len();
    let mut order: Vec<usize> = (0..nt).collect();
    order.sort_by(|&a, &b| inst.demand[b].total_cmp(&inst.demand[a]).then(a.cmp(&b)));
    let mut load = vec![0.0; inst.nodes.len()];
    let mut x: Vec<Vec<(usize, f64)>> = vec![Vec::new(); nt];
    for pass in 0..passes.max(1) {
        let eta = 1.0 / (pass + 1) as f64;
        for &t in &order {
            let r = inst.reserve(t, robust);
            for &(n, v) in &x[t] {
                load[n] -= v * r / inst.cap[n];
            }
            let br = best_response(inst, t, &load, robust);
            let mut row: Vec<(usize, f64)> =
                x[t].iter().map(|&(n, v)| (n, v * (1.0 - eta))).collect();
            for n in br {
                match row.iter_mut().find(|e| e.0 == n) {
                    Some(e) => e.1 += eta,
                    None => row.push((n, eta)),
                }
            }
            row.retain(|e| e.1 > 1e-12);
            row.sort_unstable_by_key(|e| e.0);
            for &(n, v) in &row {
                load[n] += v * r / inst.cap[n];
            }
            x[t] = row;
        }
    }
    let lambda = max_of(&load);
    (x, lambda)
}

/// Largest tenant first, each onto its `k` least-loaded nodes (after adding its reserve)
/// that meet its cover.
fn greedy_sets(inst: &Instance, robust: bool) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..inst.tenants.len()).collect();
    order.sort_by(|&a, &b| inst.demand[b].total_cmp(&inst.demand[a]).then(a.cmp(&b)));
    let mut load = vec![0.0; inst.nodes.len()];
    let mut sets = vec![Vec::new(); inst.tenants.len()];
    for t in order {
        let set = best_response(inst, t, &load, robust);
        let r = inst.reserve(t, robust);
        set.iter().for_each(|&n| load[n] += r / inst.cap[n]);
        sets[t] = set;
    }
    sets
}

/// Systematic sampling of `k` distinct indices with marginals `row` (each ≤ 1, sum `k`).
fn draw(row: &[(usize, f64)], k: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let u: f64 = rng.gen();
    let mut picked = Vec::with_capacity(k);
    let mut c = 0.0;
    for &(n, v) in row {
        let before = (c - u).floor();
        c += v;
        if (c - u).floor() > before && picked.len() < k {
            picked.push(n);
        }
    }
    // Rounding error can lose a point: top up with the largest remaining marginals.
    if picked.len() < k {
        let mut rest: Vec<&(usize, f64)> = row.iter().filter(|e| !picked.contains(&e.0)).collect();
        rest.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        picked.extend(rest.iter().take(k - picked.len()).map(|e| e.0));
    }
    picked
}

/// Which of `items` (weights) to keep within `cap` so that the kept weight is largest: 0/1
/// knapsack by DP over the capacity scaled to `steps`. Weights are rounded up, so the kept set
/// always fits, and the DP is optimal for the rounded weights, so it keeps at least as much as
/// any subset that fits in `cap·(1 − items/steps)`: the FPTAS's trade of precision for time.
pub fn knapsack_keep(items: &[f64], cap: f64, steps: usize) -> Vec<bool> {
    let mut keep = vec![false; items.len()];
    if cap <= 0.0 || items.is_empty() {
        return keep;
    }
    let w: Vec<usize> = items
        .iter()
        .map(|&x| ((x / cap) * steps as f64).ceil() as usize)
        .collect();
    let mut best = vec![0.0f64; steps + 1];
    let mut took = vec![vec![false; steps + 1]; items.len()];
    for (i, &wi) in w.iter().enumerate() {
        if wi > steps {
            continue;
        }
        for c in (wi..=steps).rev() {
            let with = best[c - wi] + items[i];
            if with > best[c] {
                best[c] = with;
                took[i][c] = true;
            }
        }
    }
    let mut c = steps;
    for i in (0..items.len()).rev() {
        if took[i][c] {
            keep[i] = true;
            c -= w[i];
        }
    }
    keep
}

/// Whether tenant `t`'s `set` with node `out` replaced by `into` still meets its cover.
fn covers_swapped(inst: &Instance, t: usize, set: &[usize], out: usize, into: usize) -> bool {
    let have: f64 = set.iter().map(|&n| inst.weight[n]).sum();
    have - inst.weight[out] + inst.weight[into] >= inst.need[t] * (1.0 - 1e-9)
}

/// One local-search step: tenant `.0` moves from the top node to `.1`, then optionally tenant
/// `.2.0` from `.1` to `.2.1`; `.3` is the worst load of the nodes touched, after.
type Step = (usize, usize, Option<(usize, usize)>, f64);

/// Local search on the rounded sets. While possible, one tenant on the most loaded node `n`
/// (load `L`) swaps `n` for a node `m` that stays below `L`; or, with `chains`, for a node `m`
/// that would go over but is relieved below `L` by moving another of its tenants on to a
/// third node that also stays below `L` (an ejection chain of two). The cover is kept; every
/// node touched ends below `L` and no other changes, so the max robust load never rises and
/// each step lowers it or the number of nodes at it; it stops after `moves` steps at most.
fn descend(inst: &Instance, sets: &mut [Vec<usize>], robust: bool, moves: usize, chains: bool) {
    let nn = inst.nodes.len();
    let mut load = reserved_load(inst, sets, robust);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); nn];
    for (t, set) in sets.iter().enumerate() {
        set.iter().for_each(|&n| members[n].push(t));
    }
    let w = |t: usize, n: usize| inst.reserve(t, robust) / inst.cap[n];
    for _ in 0..moves {
        let Some(n) = (0..nn).max_by(|&a, &b| load[a].total_cmp(&load[b]).then(b.cmp(&a))) else {
            return;
        };
        let top = load[n] * (1.0 - 1e-9);
        let mut best: Option<Step> = None;
        for &t in &members[n] {
            for m in 0..nn {
                if sets[t].contains(&m) || (robust && !covers_swapped(inst, t, &sets[t], n, m)) {
                    continue;
                }
                let after = load[m] + w(t, m);
                if after < top {
                    let worst = after.max(load[n] - w(t, n));
                    if best.is_none_or(|b| worst < b.3) {
                        best = Some((t, m, None, worst));
                    }
                    continue;
                }
                if !chains {
                    continue;
                }
                for &u in &members[m] {
                    if u == t || after - w(u, m) >= top {
                        continue;
                    }
                    for m2 in 0..nn {
                        if m2 == m
                            || sets[u].contains(&m2)
                            || (robust && !covers_swapped(inst, u, &sets[u], m, m2))
                        {
                            continue;
                        }
                        let base = if m2 == n { load[n] - w(t, n) } else { load[m2] };
                        let after2 = base + w(u, m2);
                        if after2 >= top {
                            continue;
                        }
                        let worst = (after - w(u, m)).max(after2).max(load[n] - w(t, n));
                        if best.is_none_or(|b| worst < b.3) {
                            best = Some((t, m, Some((u, m2)), worst));
                        }
                    }
                }
            }
        }
        let Some((t, m, chain, _)) = best else { return };
        let mut swap = |t: usize, from: usize, to: usize, load: &mut Vec<f64>| {
            load[from] -= w(t, from);
            load[to] += w(t, to);
            for x in sets[t].iter_mut() {
                if *x == from {
                    *x = to;
                }
            }
            sets[t].sort_unstable();
            members[from].retain(|&y| y != t);
            members[to].push(t);
        };
        swap(t, n, m, &mut load);
        if let Some((u, m2)) = chain {
            swap(u, m, m2, &mut load);
        }
    }
}

fn repair(inst: &Instance, sets: &mut [Vec<usize>], robust: bool, target: f64) {
    let nn = inst.nodes.len();
    let mut load = reserved_load(inst, sets, robust);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); nn];
    for (t, set) in sets.iter().enumerate() {
        set.iter().for_each(|&n| members[n].push(t));
    }
    for _round in 0..8 {
        let mut over: Vec<usize> = (0..nn)
            .filter(|&n| load[n] > target * (1.0 + 1e-9))
            .collect();
        if over.is_empty() {
            return;
        }
        over.sort_by(|&a, &b| load[b].total_cmp(&load[a]).then(a.cmp(&b)));
        let mut moved = false;
        for n in over {
            let items: Vec<f64> = members[n]
                .iter()
                .map(|&t| inst.reserve(t, robust) / inst.cap[n])
                .collect();
            let keep = knapsack_keep(&items, target, 2_000);
            let mut evict: Vec<usize> = members[n]
                .iter()
                .zip(&keep)
                .filter(|(_, k)| !**k)
                .map(|(&t, _)| t)
                .collect();
            evict.sort_by(|&a, &b| inst.demand[b].total_cmp(&inst.demand[a]).then(a.cmp(&b)));
            for t in evict {
                let r = inst.reserve(t, robust);
                let here = load[n];
                let best = (0..nn)
                    .filter(|m| !sets[t].contains(m))
                    .filter(|&m| !robust || covers_swapped(inst, t, &sets[t], n, m))
                    .map(|m| (m, load[m] + r / inst.cap[m]))
                    .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                if let Some((m, after)) = best {
                    if after < here * (1.0 - 1e-9) {
                        load[n] -= r / inst.cap[n];
                        load[m] = after;
                        for x in sets[t].iter_mut() {
                            if *x == n {
                                *x = m;
                            }
                        }
                        sets[t].sort_unstable();
                        members[n].retain(|&y| y != t);
                        members[m].push(t);
                        moved = true;
                    }
                }
            }
        }
        if !moved {
            return;
        }
    }
}

/// The assignment step (see the module docs).
pub fn assign(inst: &Instance, opts: &AssignOptions) -> Result<Assignment, PlanError> {
    let nt = inst.tenants.len();
    let exact = nt * inst.nodes.len() <= opts.exact_lp_limit;
    let (rows, relaxed) = if exact {
        let (x, lambda) = crate::lp::assignment(inst, opts.robust, false)?;
        let rows = x
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .enumerate()
                    .filter(|e| e.1 > 1e-9)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>();
        (rows, lambda)
    } else {
        relax_by_best_response(inst, opts.robust, opts.passes)
    };
    let target = relaxed * (1.0 + opts.slack);
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut best: Option<(f64, Vec<Vec<usize>>)> = None;
    for _ in 0..opts.samples.max(1) {
        let load = vec![0.0; inst.nodes.len()];
        let mut sets: Vec<Vec<usize>> = (0..nt)
            .map(|t| {
                let mut s = draw(&rows[t], inst.k[t], &mut rng);
                if s.len() < inst.k[t] {
                    // The row had fewer than k non-zeros (solver tolerance): fill greedily.
                    s = best_response(inst, t, &load, false);
                }
                if opts.robust {
                    let r = inst.reserve(t, true);
                    fix_cover(inst, t, &mut s, |n| r / inst.cap[n]);
                }
                s.sort_unstable();
                s
            })
            .collect();
        repair(inst, &mut sets, opts.robust, target);
        if exact {
            // Small instances: every draw gets its local search (cheap here), since the best
            // draw before it is not always the best after.
            descend(inst, &mut sets, opts.robust, opts.local_moves, true);
        }
        let lambda = max_of(&reserved_load(inst, &sets, opts.robust));
        if best.as_ref().is_none_or(|b| lambda < b.0) {
            best = Some((lambda, sets));
        }
    }
    // One more candidate: the greedy (largest tenant first onto its least-loaded nodes that
    // meet its cover), so the result is never worse than that baseline's robust variant.
    let mut greedy = greedy_sets(inst, opts.robust);
    repair(inst, &mut greedy, opts.robust, target);
    if exact {
        descend(inst, &mut greedy, opts.robust, opts.local_moves, true);
    }
    let lambda = max_of(&reserved_load(inst, &greedy, opts.robust));
    if best.as_ref().is_none_or(|b| lambda < b.0) {
        best = Some((lambda, greedy));
    }
    let (_, mut sets) = best.unwrap_or_default();
    if !exact {
        descend(inst, &mut sets, opts.robust, opts.local_moves, false);
    }
    let lambda = max_of(&reserved_load(inst, &sets, opts.robust));
    Ok(Assignment {
        sets,
        relaxed,
        exact_lp: exact,
        lambda,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::{instance, Family, Shape};

    fn shape(tenants: usize, nodes: usize) -> Shape {
        Shape {
            tenants,
            nodes,
            units: 3,
            utilisation: 0.3,
        }
    }

    #[test]
    fn the_result_is_never_worse_than_the_greedy_draw() {
        for f in Family::ALL {
            for seed in 0..10 {
                let inst = instance(f, shape(10, 5), seed);
                let a = assign(&inst, &AssignOptions::default()).unwrap();
                let g = max_of(&reserved_load(&inst, &greedy_sets(&inst, true), true));
                assert!(
                    a.lambda <= g * (1.0 + 1e-9),
                    "{f:?} {seed}: {} > {g}",
                    a.lambda
                );
            }
        }
    }

    #[test]
    fn local_search_never_raises_the_max_and_keeps_the_cover() {
        for f in Family::ALL {
            for seed in 0..10 {
                let inst = instance(f, shape(30, 8), seed);
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let nodes: Vec<usize> = (0..inst.nodes.len()).collect();
                let mut sets: Vec<Vec<usize>> = (0..inst.tenants.len())
                    .map(|t| {
                        use rand::seq::SliceRandom;
                        let mut s: Vec<usize> = nodes
                            .choose_multiple(&mut rng, inst.k[t])
                            .copied()
                            .collect();
                        fix_cover(&inst, t, &mut s, |_| 0.0);
                        s.sort_unstable();
                        s
                    })
                    .collect();
                let before = max_of(&reserved_load(&inst, &sets, true));
                descend(&inst, &mut sets, true, 10_000, seed % 2 == 0);
                let after = max_of(&reserved_load(&inst, &sets, true));
                assert!(after <= before * (1.0 + 1e-12), "{f:?} {seed}");
                for (t, s) in sets.iter().enumerate() {
                    assert!(inst.covers(t, s));
                    assert_eq!(s.len(), inst.k[t]);
                    assert!(s.windows(2).all(|w| w[0] < w[1]));
                }
            }
        }
    }
}
