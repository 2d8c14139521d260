//! Scheduling (the fast timescale): given each tenant's node set and which nodes are alive,
//! where does the traffic go.
//!
//! - [`splittable`]: a tenant's demand may be split over its nodes in any proportion. The
//!   least load factor λ is found by binary search over a max-flow feasibility test (source →
//!   tenant with its demand, tenant → its alive nodes, node → sink with `λ·C_n`).
//!   **Bound:** the returned λ is at most `(1 + ε)·λ*`, λ* the optimum of the splittable LP
//!   ([`crate::lp::schedule_splittable`]): the search keeps an infeasible (or lower-bound)
//!   `lo` and a feasible `hi` and stops when `hi ≤ (1 + ε)·lo`.
//! - [`unsplittable`]: a unit (a VIP) is owned by exactly one node. This is makespan on
//!   restricted related machines; we follow Lenstra–Shmoys–Tardos. For a guess `T`, the
//!   fractional problem that only lets unit `u` use node `n` when `s_u ≤ T·C_n` is again a
//!   max-flow; the least feasible `T` (to within `1 + ε`, by binary search) is at most the
//!   integral optimum OPT. The flow is made a forest by cancelling cycles (loads and unit sums
//!   do not change), then every fractionally split unit is matched to a distinct node of its
//!   tree (a leaf node is always available). A node then carries at most `T·C_n` of whole units
//!   plus one matched unit of size at most `T·C_n`. **Bound:** λ ≤ `2·(1 + ε)·OPT`, i.e.
//!   2 + 2ε. We return the better of that rounding and a greedy (largest unit first onto the
//!   least-loaded allowed node), which keeps the bound, then even out the nodes under the
//!   maximum by moves that never raise it.
//!
//! Sizes are quantised up onto integers (about 2⁴⁰ quanta for the whole demand) and capacities
//! down, so a flow that fits is a schedule that fits; the error this adds to λ is below 10⁻⁹
//! relative.

use crate::flow::Flow;
use crate::lp::allowed;
use crate::model::Instance;

/// Each unit's node, per tenant (`None`: no live node of its set).
pub type Owners = Vec<Vec<Option<usize>>>;

/// A splittable schedule.
#[derive(Debug, Clone)]
pub struct Splittable {
    /// Max scalar load factor.
    pub lambda: f64,
    /// For each tenant, the fraction of its demand on each node.
    pub share: Vec<Vec<(usize, f64)>>,
}

/// An unsplittable schedule.
#[derive(Debug, Clone)]
pub struct Unsplittable {
    /// Max scalar load factor.
    pub lambda: f64,
    /// Each unit's node (`None` when no node of its tenant's set is alive).
    pub owner: Vec<Vec<Option<usize>>>,
    /// The least feasible fractional `T` found: a lower bound on OPT up to `1 + ε`.
    pub fractional: f64,
}

const QUANTA: f64 = (1u64 << 40) as f64;
const BIG: i64 = i64::MAX / 8;

fn quantum(total: f64) -> f64 {
    if total > 0.0 {
        total / QUANTA
    } else {
        1.0
    }
}

fn up(x: f64, q: f64) -> i64 {
    ((x / q).ceil() as i64).min(BIG)
}

fn down(x: f64, q: f64) -> i64 {
    ((x / q).floor() as i64).min(BIG)
}

/// Scalar load factor of each node under `owner`.
pub fn scalar_loads(inst: &Instance, owner: &[Vec<Option<usize>>]) -> Vec<f64> {
    let mut load = vec![0.0; inst.nodes.len()];
    for (t, units) in owner.iter().enumerate() {
        for (u, n) in units.iter().enumerate() {
            if let Some(n) = n {
                load[*n] += inst.size[t][u];
            }
        }
    }
    load.iter().zip(&inst.cap).map(|(l, c)| l / c).collect()
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// Splittable schedule within `(1 + eps)` of the LP optimum (see the module docs).
pub fn splittable(inst: &Instance, sets: &[Vec<usize>], alive: &[bool], eps: f64) -> Splittable {
    let nt = inst.tenants.len();
    let nn = inst.nodes.len();
    let ok: Vec<Vec<usize>> = (0..nt).map(|t| allowed(sets, alive, t)).collect();
    let active: Vec<usize> = (0..nt)
        .filter(|&t| !ok[t].is_empty() && inst.demand[t] > 0.0)
        .collect();
    let mut share: Vec<Vec<(usize, f64)>> = vec![Vec::new(); nt];
    if active.is_empty() {
        return Splittable { lambda: 0.0, share };
    }
    let total: f64 = active.iter().map(|&t| inst.demand[t]).sum();
    let q = quantum(total);
    // Lower bounds: all demand over all usable capacity; each tenant over its own nodes.
    let mut used = vec![false; nn];
    let mut lo: f64 = 0.0;
    for &t in &active {
        let c: f64 = ok[t].iter().map(|&n| inst.cap[n]).sum();
        lo = lo.max(inst.demand[t] / c);
        ok[t].iter().for_each(|&n| used[n] = true);
    }
    let usable: f64 = (0..nn).filter(|&n| used[n]).map(|n| inst.cap[n]).sum();
    lo = lo.max(total / usable);
    // Feasible: each tenant split in proportion to its nodes' capacities.
    let mut prop = vec![0.0; nn];
    for &t in &active {
        let c: f64 = ok[t].iter().map(|&n| inst.cap[n]).sum();
        ok[t].iter().for_each(|&n| prop[n] += inst.demand[t] / c);
    }
    let hi = max_of(&prop).max(lo);
    let test = |lambda: f64| -> Option<Vec<Vec<(usize, f64)>>> {
        let (src, sink) = (0, 1 + nt + nn);
        let mut f = Flow::new(sink + 1);
        let mut want = 0;
        let mut edges = Vec::new();
        for &t in &active {
            let d = up(inst.demand[t], q);
            want += d;
            f.add(src, 1 + t, d);
            for &n in &ok[t] {
                edges.push((t, n, f.add(1 + t, 1 + nt + n, d)));
            }
        }
        for (n, &c) in inst.cap.iter().enumerate() {
            if used[n] {
                f.add(1 + nt + n, sink, down(lambda * c, q));
            }
        }
        if f.max_flow(src, sink) < want {
            return None;
        }
        let mut share = vec![Vec::new(); nt];
        for (t, n, e) in edges {
            let x = f.flow(e) as f64 / up(inst.demand[t], q) as f64;
            if x > 0.0 {
                share[t].push((n, x));
            }
        }
        Some(share)
    };
    let (_, best) = least_feasible(lo, hi, eps, test);
    share = best;
    let mut load = vec![0.0; nn];
    for (t, s) in share.iter().enumerate() {
        for &(n, x) in s {
            load[n] += x * inst.demand[t] / inst.cap[n];
        }
    }
    Splittable {
        lambda: max_of(&load),
        share,
    }
}

/// Largest unit first onto the allowed node with the least resulting load (ties: lowest
/// index). Deterministic.
pub fn greedy(inst: &Instance, sets: &[Vec<usize>], alive: &[bool]) -> Vec<Vec<Option<usize>>> {
    let nt = inst.tenants.len();
    let ok: Vec<Vec<usize>> = (0..nt).map(|t| allowed(sets, alive, t)).collect();
    let mut order: Vec<(usize, usize)> = (0..nt)
        .flat_map(|t| (0..inst.size[t].len()).map(move |u| (t, u)))
        .collect();
    order.sort_by(|a, b| inst.size[b.0][b.1].total_cmp(&inst.size[a.0][a.1]));
    let mut load = vec![0.0; inst.nodes.len()];
    let mut owner: Vec<Vec<Option<usize>>> =
        inst.size.iter().map(|s| vec![None; s.len()]).collect();
    for (t, u) in order {
        let s = inst.size[t][u];
        let best = ok[t].iter().copied().min_by(|&a, &b| {
            ((load[a] + s) / inst.cap[a])
                .total_cmp(&((load[b] + s) / inst.cap[b]))
                .then(a.cmp(&b))
        });
        if let Some(n) = best {
            load[n] += s;
            owner[t][u] = Some(n);
        }
    }
    owner
}

/// One positive flow edge of a split unit.
#[derive(Debug, Clone, Copy)]
struct Split {
    unit: usize,
    node: usize,
    flow: i64,
}

/// Cancels cycles in the bipartite support of `edges` (vertex ids: units, then nodes) until it
/// is a forest. Each cancel pushes ±δ alternately round a cycle, which keeps every unit's and
/// every node's total, and empties at least one edge.
fn cancel_cycles(edges: &mut Vec<Split>, units: usize, nodes: usize) {
    loop {
        edges.retain(|e| e.flow > 0);
        let v = units + nodes;
        let mut dsu: Vec<usize> = (0..v).collect();
        fn find(d: &mut [usize], mut x: usize) -> usize {
            while d[x] != x {
                d[x] = d[d[x]];
                x = d[x];
            }
            x
        }
        let mut adj: Vec<Vec<(usize, usize)>> = vec![Vec::new(); v];
        let mut closing = None;
        for (i, e) in edges.iter().enumerate() {
            let (a, b) = (e.unit, units + e.node);
            let (ra, rb) = (find(&mut dsu, a), find(&mut dsu, b));
            if ra == rb {
                closing = Some(i);
                break;
            }
            dsu[ra] = rb;
            adj[a].push((b, i));
            adj[b].push((a, i));
        }
        let Some(c) = closing else { return };
        // Tree path from the closing edge's node end back to its unit end.
        let (a, b) = (edges[c].unit, units + edges[c].node);
        let mut prev: Vec<Option<(usize, usize)>> = vec![None; v];
        let mut seen = vec![false; v];
        let mut queue = std::collections::VecDeque::from([b]);
        seen[b] = true;
        while let Some(x) = queue.pop_front() {
            if x == a {
                break;
            }
            for &(y, i) in &adj[x] {
                if !seen[y] {
                    seen[y] = true;
                    prev[y] = Some((x, i));
                    queue.push_back(y);
                }
            }
        }
        // Walk: a -(c)- b, then the tree path b … a, listed from a's side.
        let mut cycle = vec![c];
        let mut path = Vec::new();
        let mut x = a;
        while let Some((p, i)) = prev[x] {
            path.push(i);
            x = p;
        }
        path.reverse();
        cycle.extend(path);
        let delta = cycle
            .iter()
            .skip(1)
            .step_by(2)
            .map(|&i| edges[i].flow)
            .min()
            .unwrap_or(0);
        for (j, &i) in cycle.iter().enumerate() {
            if j % 2 == 0 {
                edges[i].flow += delta;
            } else {
                edges[i].flow -= delta;
            }
        }
    }
}

/// Unsplittable schedule within `2·(1 + eps)` of the optimum (see the module docs).
pub fn unsplittable(
    inst: &Instance,
    sets: &[Vec<usize>],
    alive: &[bool],
    eps: f64,
) -> Unsplittable {
    let nt = inst.tenants.len();
    let nn = inst.nodes.len();
    let ok: Vec<Vec<usize>> = (0..nt).map(|t| allowed(sets, alive, t)).collect();
    let greedy_owner = greedy(inst, sets, alive);
    let greedy_lambda = max_of(&scalar_loads(inst, &greedy_owner));
    // Units that can be placed and carry something, flattened.
    let units: Vec<(usize, usize)> = (0..nt)
        .filter(|&t| !ok[t].is_empty())
        .flat_map(|t| (0..inst.size[t].len()).map(move |u| (t, u)))
        .filter(|&(t, u)| inst.size[t][u] > 0.0)
        .collect();
    if units.is_empty() || greedy_lambda <= 0.0 {
        return Unsplittable {
            lambda: greedy_lambda,
            owner: greedy_owner,
            fractional: 0.0,
        };
    }
    let total: f64 = units.iter().map(|&(t, u)| inst.size[t][u]).sum();
    let q = quantum(total);
    let mut used = vec![false; nn];
    let mut lo: f64 = 0.0;
    for &(t, u) in &units {
        let s = inst.size[t][u];
        let m = ok[t]
            .iter()
            .map(|&n| s / inst.cap[n])
            .fold(f64::INFINITY, f64::min);
        lo = lo.max(m);
        ok[t].iter().for_each(|&n| used[n] = true);
    }
    let usable: f64 = (0..nn).filter(|&n| used[n]).map(|n| inst.cap[n]).sum();
    lo = lo.max(total / usable);
    let test = |big_t: f64| -> Option<Vec<Split>> {
        let nu = units.len();
        let (src, sink) = (0, 1 + nu + nn);
        let mut f = Flow::new(sink + 1);
        let mut want = 0;
        let mut edges = Vec::new();
        for (i, &(t, u)) in units.iter().enumerate() {
            let s = inst.size[t][u];
            let sq = up(s, q);
            want += sq;
            f.add(src, 1 + i, sq);
            for &n in &ok[t] {
                if s <= big_t * inst.cap[n] {
                    edges.push((i, n, f.add(1 + i, 1 + nu + n, sq)));
                }
            }
        }
        for (n, &c) in inst.cap.iter().enumerate() {
            if used[n] {
                f.add(1 + nu + n, sink, down(big_t * c, q));
            }
        }
        if f.max_flow(src, sink) < want {
            return None;
        }
        Some(
            edges
                .into_iter()
                .map(|(unit, node, e)| Split {
                    unit,
                    node,
                    flow: f.flow(e),
                })
                .filter(|s| s.flow > 0)
                .collect(),
        )
    };
    let (hi, flow) = least_feasible(lo, greedy_lambda.max(lo), eps, test);
    // Whole units first; the rest (split over two or more nodes) form the fractional graph.
    let mut parts = vec![0usize; units.len()];
    flow.iter().for_each(|s| parts[s.unit] += 1);
    let mut assigned: Vec<Option<usize>> = vec![None; units.len()];
    let mut split: Vec<Split> = Vec::new();
    for s in flow {
        if parts[s.unit] == 1 {
            assigned[s.unit] = Some(s.node);
        } else {
            split.push(s);
        }
    }
    cancel_cycles(&mut split, units.len(), nn);
    let mut parts = vec![0usize; units.len()];
    split.iter().for_each(|s| parts[s.unit] += 1);
    let mut deg = vec![0usize; nn];
    let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); nn];
    let mut by_unit: Vec<Vec<usize>> = vec![Vec::new(); units.len()];
    for (i, s) in split.iter().enumerate() {
        if parts[s.unit] == 1 {
            assigned[s.unit] = Some(s.node);
        } else {
            deg[s.node] += 1;
            by_node[s.node].push(i);
            by_unit[s.unit].push(i);
        }
    }
    let mut queue: Vec<usize> = (0..nn).filter(|&n| deg[n] == 1).collect();
    while let Some(n) = queue.pop() {
        if deg[n] != 1 {
            continue;
        }
        let Some(u) = by_node[n]
            .iter()
            .map(|&i| split[i].unit)
            .find(|&u| assigned[u].is_none())
        else {
            continue;
        };
        assigned[u] = Some(n);
        deg[n] = 0;
        for &i in &by_unit[u] {
            let m = split[i].node;
            if m != n && deg[m] > 0 {
                deg[m] -= 1;
                if deg[m] == 1 {
                    queue.push(m);
                }
            }
        }
    }
    // A forest always leaves a leaf node for every split unit; this is only a guard.
    for (u, a) in assigned.iter_mut().enumerate() {
        if a.is_none() {
            *a = by_unit[u]
                .iter()
                .max_by_key(|&&i| split[i].flow)
                .map(|&i| split[i].node);
        }
    }
    let mut owner: Vec<Vec<Option<usize>>> =
        inst.size.iter().map(|s| vec![None; s.len()]).collect();
    // Zero-size units go where the greedy put them.
    for t in 0..nt {
        for u in 0..inst.size[t].len() {
            owner[t][u] = greedy_owner[t][u];
        }
    }
    for (i, &(t, u)) in units.iter().enumerate() {
        owner[t][u] = assigned[i];
    }
    let lambda = max_of(&scalar_loads(inst, &owner));
    let mut owner = if greedy_lambda <= lambda {
        greedy_owner
    } else {
        owner
    };
    polish(inst, &ok, &mut owner);
    Unsplittable {
        lambda: max_of(&scalar_loads(inst, &owner)),
        owner,
        fractional: hi,
    }
}

/// Evens out the nodes below the maximum, which the bound says nothing about: a unit moves
/// from `n` to another allowed node `m` when `m`'s load after the move stays below `n`'s load
/// before it. No node ends above the larger of the two, so the max (and the bound) cannot get
/// worse, and the sum of squared loads falls with every move, so it ends.
fn polish(inst: &Instance, ok: &[Vec<usize>], owner: &mut Owners) {
    let mut load = scalar_loads(inst, owner);
    let mut order: Vec<(usize, usize)> = (0..owner.len())
        .flat_map(|t| (0..owner[t].len()).map(move |u| (t, u)))
        .collect();
    order.sort_by(|a, b| inst.size[b.0][b.1].total_cmp(&inst.size[a.0][a.1]));
    for _pass in 0..8 {
        let mut moved = false;
        for &(t, u) in &order {
            let Some(n) = owner[t][u] else { continue };
            let s = inst.size[t][u];
            let best = ok[t]
                .iter()
                .copied()
                .filter(|&m| m != n)
                .map(|m| (m, load[m] + s / inst.cap[m]))
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            if let Some((m, after)) = best {
                if after < load[n] * (1.0 - 1e-9) {
                    load[n] -= s / inst.cap[n];
                    load[m] = after;
                    owner[t][u] = Some(m);
                    moved = true;
                }
            }
        }
        if !moved {
            return;
        }
    }
}

/// Binary search on a load factor, geometric so the answer is within a factor `1 + eps`: the
/// least feasible factor found and what `test` returned for it. `lo` is a lower bound (need
/// not be feasible) and `hi` a first guess, grown by `1 + eps` until `test` succeeds, so a guess
/// below the optimum only costs steps.
fn least_feasible<T>(
    mut lo: f64,
    mut hi: f64,
    eps: f64,
    mut test: impl FnMut(f64) -> Option<T>,
) -> (f64, T) {
    let mut best = loop {
        if let Some(s) = test(hi) {
            break s;
        }
        hi *= 1.0 + eps;
    };
    while hi > lo * (1.0 + eps) {
        let mid = (lo * hi).sqrt();
        match test(mid) {
            Some(s) => {
                hi = mid;
                best = s;
            }
            None => lo = mid,
        }
    }
    (hi, best)
}
