//! Worker grouping for the aggregator (after ALEPH, IEEE/ACM ToN 2024): which aggregator host
//! each worker of a job sends to, forming a two-level tree, so that heterogeneous links are
//! used to the full. Pure and deterministic: no I/O, no clock, no randomness.
//!
//! # Model
//!
//! A job of `N` workers sends `M` bytes per worker and round (and receives as many back).
//! Hosts `0..H` can aggregate; host `h` carries `capacity_h` bytes/s in each direction (the
//! smaller of its link and its CPU budget, the caller's figure), and `b(w, h)` is the measured
//! bandwidth between worker `w` and host `h` (0: `h` may not serve `w`).
//!
//! A grouping is a root `r` and an assignment `a(w)` of every worker to a host; `C_h` are the
//! workers of `h`, `A = a(W) ∪ {r}` the active hosts. Each cluster host sums its workers'
//! chunks and sends one partial sum up to the root; the root's result comes back down. With
//! chunks pipelined, a round takes as long as its most loaded link, in streams of `M` bytes:
//! a cluster host carries `|C_h| + 1` (its workers' and its uplink; it receives `|C_h|`
//! contributions and one result, and sends as many), the root `|C_r| + |A| − 1`. So
//!
//! `T = max( max_w M / b(w, a(w)),  max_{h ∈ A} load_h · M / capacity_h )`.
//!
//! Host-to-host links are taken to be limited by the hosts' capacities only. Minimise `T`.
//! One host with everybody on it is flat aggregation (a parameter server): `[flat]`.
//!
//! # Algorithm
//!
//! Feasibility of a round time `T` is monotone in `T`, and the optimum is one of the
//! breakpoints `M / b(w, h)` and `j · M / capacity_h` (j = 1..=N+H), so a binary search over
//! them finds the least feasible one. At `T`, host `h` carries `k_h = ⌊T · capacity_h / M⌋`
//! streams and worker `w` may use the hosts `E_w = {h : M / b(w, h) ≤ T}`.
//!
//! - **Uniform case** (every `E_w` the same set `S`, which bandwidth limited at the endpoints,
//!   `b(w, h) = min(up_w, down_h)`, gives once every worker is eligible somewhere): exact. With
//!   root `r ∈ S`, opening a cluster host `h` gives `k_h − 1` worker slots and takes one of the
//!   root's `k_r`, so with open set `O` (|O| ≤ k_r) the workers that fit are
//!   `k_r − |O| + Σ_{h∈O} (k_h − 1)`. *Exactness*: every grouping with root `r` and cluster
//!   hosts `O` fits at most that many workers at `T` (its loads are within the `k`s); the sum
//!   is largest for the `|O|` hosts of largest `k_h`, and adding a host with `k_h ≥ 2` never
//!   lowers it; so `T` is feasible iff for some `r` the best `O` reaches `N`, and the search
//!   returns the optimum (approximation ratio 1, checked against brute force).
//! - **General case** (per-pair bottlenecks make the `E_w` differ): whether the workers fit a
//!   root and a set of cluster hosts is a max-flow (workers → eligible hosts of the set, the
//!   root's capacity `k_r − |O|`, a cluster host's `k_h − 1`). Up to
//!   [`GroupOptions::exact_hosts`] hosts every set is tried: exact. Above, a greedy (the most
//!   constrained worker first, to the open host with most room, opening the largest eligible
//!   host when none has room) keeps a thousand workers on a hundred hosts in milliseconds. The case contains set cover (hosts
//!   as the sets of workers they may serve, the root's capacity as the cover's size), so the
//!   greedy claims no constant bound; the tests report its worst ratio to brute force on a
//!   seeded family.
//!
//! Clusters come out sized to their hosts' capacities: "clusters of different sizes" (ALEPH).
//! A regrouping replaces a grouping only when it shortens the round by a margin (`[regroup]`).

use thiserror::Error;

use crate::flow::Flow;

/// One job's grouping problem.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupingInput {
    /// `M`: bytes each worker sends per round.
    pub gradient_bytes: u64,
    /// `N`: workers, indices `0..N`.
    pub workers: usize,
    /// Each host's capacity, bytes/s.
    pub capacity_bps: Vec<f64>,
    /// `bandwidth[w][h]`: bytes/s between worker `w` and host `h`; 0 if `h` may not serve `w`.
    pub bandwidth: Vec<Vec<f64>>,
}

/// One aggregator of a grouping and the workers that send to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub host: usize,
    /// Ascending worker indices.
    pub members: Vec<usize>,
}

/// A two-level tree: `clusters` lists every active host with its workers, the root's among
/// them (possibly with none: it then only sums the partial sums).
#[derive(Debug, Clone, PartialEq)]
pub struct Grouping {
    pub root: usize,
    pub clusters: Vec<Cluster>,
    /// The model's round time, s.
    pub round_time_s: f64,
}

/// Why an input cannot be grouped.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GroupingError {
    #[error("a job with no worker cannot be grouped")]
    NoWorkers,
    #[error("there is no aggregating host")]
    NoHosts,
    #[error("{field} must be positive and finite")]
    BadFigure { field: String },
    #[error("the bandwidth table has {rows} rows of {cols}, not {workers} of {hosts}")]
    Shape {
        rows: usize,
        cols: usize,
        workers: usize,
        hosts: usize,
    },
    #[error("no host may serve worker {0}")]
    Unserved(usize),
}

/// When a new grouping replaces a running one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegroupPolicy {
    /// The least drop of the round time worth moving for, a fraction of the current one.
    pub min_gain: f64,
}

impl Default for RegroupPolicy {
    /// 15%: bandwidth probes of a shared link vary by several percent from one to the next,
    /// and a regrouping costs a round's resend; a tree has to be clearly better to be worth it.
    fn default() -> Self {
        RegroupPolicy { min_gain: 0.15 }
    }
}

fn check(input: &GroupingInput) -> Result<(), GroupingError> {
    let (n, h) = (input.workers, input.capacity_bps.len());
    if n == 0 {
        return Err(GroupingError::NoWorkers);
    }
    if h == 0 {
        return Err(GroupingError::NoHosts);
    }
    if input.gradient_bytes == 0 {
        return Err(GroupingError::BadFigure {
            field: "gradient_bytes".into(),
        });
    }
    if let Some(k) = input
        .capacity_bps
        .iter()
        .position(|c| !c.is_finite() || *c <= 0.0)
    {
        return Err(GroupingError::BadFigure {
            field: format!("capacity_bps[{k}]"),
        });
    }
    if input.bandwidth.len() != n || input.bandwidth.iter().any(|r| r.len() != h) {
        return Err(GroupingError::Shape {
            rows: input.bandwidth.len(),
            cols: input.bandwidth.first().map_or(0, Vec::len),
            workers: n,
            hosts: h,
        });
    }
    for (w, row) in input.bandwidth.iter().enumerate() {
        if let Some(k) = row.iter().position(|b| !b.is_finite() || *b < 0.0) {
            return Err(GroupingError::BadFigure {
                field: format!("bandwidth[{w}][{k}]"),
            });
        }
        if row.iter().all(|b| *b == 0.0) {
            return Err(GroupingError::Unserved(w));
        }
    }
    Ok(())
}

/// The model's round time of `g` (s); infinite if a worker sends to a host that may not serve
/// it, or if `g` leaves a worker out or places one twice.
pub fn round_time(input: &GroupingInput, g: &Grouping) -> f64 {
    let m = input.gradient_bytes as f64;
    let mut seen = vec![false; input.workers];
    let mut t: f64 = 0.0;
    let children = g
        .clusters
        .iter()
        .filter(|c| c.host != g.root && !c.members.is_empty())
        .count();
    let mut root_members = 0;
    for c in &g.clusters {
        let Some(cap) = input.capacity_bps.get(c.host) else {
            return f64::INFINITY;
        };
        for w in &c.members {
            let Some(b) = input.bandwidth.get(*w).and_then(|r| r.get(c.host)) else {
                return f64::INFINITY;
            };
            if *b <= 0.0 || seen[*w] {
                return f64::INFINITY;
            }
            seen[*w] = true;
            t = t.max(m / b);
        }
        if c.host == g.root {
            root_members += c.members.len();
        } else if !c.members.is_empty() {
            t = t.max((c.members.len() + 1) as f64 * m / cap);
        }
    }
    if seen.iter().any(|s| !s) {
        return f64::INFINITY;
    }
    let Some(cap) = input.capacity_bps.get(g.root) else {
        return f64::INFINITY;
    };
    t.max((root_members + children) as f64 * m / cap)
}

/// Relative slack of the comparisons at a breakpoint: `j · M / capacity` must count as
/// carrying `j` streams despite rounding.
const EPS: f64 = 1e-9;

/// Streams `cap` carries in `t` seconds of `m`-byte streams.
fn streams(t: f64, cap: f64, m: f64) -> usize {
    ((t * cap / m) * (1.0 + EPS)).floor() as usize
}

/// `k_h` at round time `t`: the streams each host carries.
fn stream_counts(input: &GroupingInput, t: f64) -> Vec<usize> {
    let m = input.gradient_bytes as f64;
    input
        .capacity_bps
        .iter()
        .map(|c| streams(t, *c, m))
        .collect()
}

fn eligible(input: &GroupingInput, t: f64) -> Vec<Vec<usize>> {
    let m = input.gradient_bytes as f64;
    input
        .bandwidth
        .iter()
        .map(|row| {
            (0..row.len())
                .filter(|h| row[*h] > 0.0 && m / row[*h] <= t * (1.0 + EPS))
                .collect()
        })
        .collect()
}

/// How the general (per-pair) case is searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupOptions {
    /// Up to this many hosts every set of cluster hosts is tried (exact); above it, greedy.
    pub exact_hosts: usize,
}

impl Default for GroupOptions {
    /// Six hosts: 32 sets of cluster hosts per root and round-time candidate, a few ms for a
    /// job of 64 workers; a leader re-decides on every tick.
    fn default() -> Self {
        GroupOptions { exact_hosts: 6 }
    }
}

/// The best two-level tree (see the module's doc).
pub fn group(input: &GroupingInput) -> Result<Grouping, GroupingError> {
    group_with(input, GroupOptions::default())
}

/// [`group`] with the general case searched as `opts` says.
pub fn group_with(input: &GroupingInput, opts: GroupOptions) -> Result<Grouping, GroupingError> {
    search(input, |i, t| feasible(i, t, opts))
}

/// The best single host with every worker on it (a parameter server).
pub fn flat(input: &GroupingInput) -> Result<Grouping, GroupingError> {
    check(input)?;
    let mut best: Option<Grouping> = None;
    for h in 0..input.capacity_bps.len() {
        let g = Grouping {
            root: h,
            clusters: vec![Cluster {
                host: h,
                members: (0..input.workers).collect(),
            }],
            round_time_s: 0.0,
        };
        let t = round_time(input, &g);
        if t.is_finite() && best.as_ref().is_none_or(|b| t < b.round_time_s) {
            best = Some(Grouping {
                round_time_s: t,
                ..g
            });
        }
    }
    best.ok_or(GroupingError::Unserved(
        (0..input.workers)
            .find(|w| input.bandwidth[*w].contains(&0.0))
            .unwrap_or(0),
    ))
}

/// Ring all-reduce among the workers themselves in the same model: every worker sends and
/// receives `2 (N − 1) / N · M`, at the pace of the slowest, whose bandwidth is taken to be its
/// best measured figure (its own link).
pub fn ring_time(input: &GroupingInput) -> f64 {
    let n = input.workers as f64;
    let slowest = input
        .bandwidth
        .iter()
        .map(|r| r.iter().copied().fold(0.0, f64::max))
        .fold(f64::INFINITY, f64::min);
    if input.workers < 2 {
        return 0.0;
    }
    2.0 * (n - 1.0) / n * input.gradient_bytes as f64 / slowest
}

/// A new grouping for a job grouped as `current`, if it should move: at once when `current`
/// is no longer valid for `input` (a host or worker gone or added), else only when the best
/// grouping's round time is at most `(1 − min_gain)` times `current`'s.
pub fn regroup(
    input: &GroupingInput,
    current: &Grouping,
    policy: &RegroupPolicy,
) -> Option<Grouping> {
    let best = group(input).ok()?;
    let now = round_time(input, current);
    if !now.is_finite() || best.round_time_s <= (1.0 - policy.min_gain) * now {
        Some(best)
    } else {
        None
    }
}

/// The least feasible breakpoint's grouping.
fn search(
    input: &GroupingInput,
    feasible: impl Fn(&GroupingInput, f64) -> Option<Grouping>,
) -> Result<Grouping, GroupingError> {
    check(input)?;
    let m = input.gradient_bytes as f64;
    let (n, hosts) = (input.workers, input.capacity_bps.len());
    let mut cands: Vec<f64> = input
        .bandwidth
        .iter()
        .flatten()
        .filter(|b| **b > 0.0)
        .map(|b| m / b)
        .collect();
    for cap in &input.capacity_bps {
        cands.extend((1..=n + hosts).map(|j| j as f64 * m / cap));
    }
    cands.sort_by(f64::total_cmp);
    cands.dedup();
    // At the largest breakpoint every worker is eligible somewhere and any host carries all
    // N + H streams, so a grouping exists there.
    let (mut lo, mut hi) = (0usize, cands.len() - 1);
    let mut best = feasible(input, cands[hi]);
    if best.is_none() {
        return Err(GroupingError::Unserved(0));
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        match feasible(input, cands[mid]) {
            Some(g) => {
                best = Some(g);
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    let mut g = best.expect("the largest breakpoint is feasible");
    g.round_time_s = round_time(input, &g);
    Ok(g)
}

/// A grouping within `t`, if there is one (uniform eligibility, or few hosts: exact;
/// otherwise greedy).
fn feasible(input: &GroupingInput, t: f64, opts: GroupOptions) -> Option<Grouping> {
    let e = eligible(input, t);
    if e.iter().any(Vec::is_empty) {
        return None;
    }
    if e.iter().all(|s| *s == e[0]) {
        uniform(input, t, &e[0])
    } else if input.capacity_bps.len() <= opts.exact_hosts {
        every_set(input, t, &e)
    } else {
        general(input, t, &e)
    }
}

/// Per-pair eligibility on few hosts: every root and every set of cluster hosts it can take,
/// fewest hosts first, by max-flow. Exact.
fn every_set(input: &GroupingInput, t: f64, e: &[Vec<usize>]) -> Option<Grouping> {
    let hosts = input.capacity_bps.len();
    let n = input.workers;
    let k = stream_counts(input, t);
    let mut best: Option<(usize, Vec<usize>, Vec<usize>)> = None;
    for r in 0..hosts {
        for mask in 0u32..(1 << hosts) {
            if mask & (1 << r) != 0 {
                continue;
            }
            let open: Vec<usize> = (0..hosts).filter(|h| mask & (1 << h) != 0).collect();
            if open.len() > k[r] || best.as_ref().is_some_and(|(_, o, _)| o.len() <= open.len()) {
                continue;
            }
            let (fit, assign) = max_flow(e, &k, r, &open, n, hosts);
            if fit == n {
                best = Some((r, open, assign));
            }
        }
    }
    let (root, open, assign) = best?;
    Some(from_assignment(root, &open, &assign))
}

/// The grouping a flow's assignment gives (cluster hosts left without a worker dropped).
fn from_assignment(root: usize, open: &[usize], assign: &[usize]) -> Grouping {
    let mut clusters = vec![Cluster {
        host: root,
        members: Vec::new(),
    }];
    clusters.extend(open.iter().map(|h| Cluster {
        host: *h,
        members: Vec::new(),
    }));
    for (w, h) in assign.iter().enumerate() {
        if let Some(c) = clusters.iter_mut().find(|c| c.host == *h) {
            c.members.push(w);
        }
    }
    clusters.retain(|c| c.host == root || !c.members.is_empty());
    Grouping {
        root,
        clusters,
        round_time_s: 0.0,
    }
}

/// Uniform eligibility: every worker may use the hosts `s`.
fn uniform(input: &GroupingInput, t: f64, s: &[usize]) -> Option<Grouping> {
    let k = stream_counts(input, t);
    let n = input.workers;
    // The root that fits everybody with the fewest cluster hosts (ties: the lower index).
    let mut best: Option<(usize, Vec<usize>)> = None;
    for &r in s {
        // A host of k streams gives k - 1 worker slots for one of the root's: only k >= 3 gains.
        let mut others: Vec<usize> = s
            .iter()
            .copied()
            .filter(|h| *h != r && k[*h] >= 3)
            .collect();
        others.sort_by(|a, b| k[*b].cmp(&k[*a]).then(a.cmp(b)));
        let mut open = Vec::new();
        let mut fits = k[r];
        for h in others {
            if fits >= n || open.len() >= k[r] {
                break;
            }
            open.push(h);
            fits += k[h] - 2;
        }
        if fits >= n && best.as_ref().is_none_or(|(_, o)| open.len() < o.len()) {
            best = Some((r, open));
        }
    }
    let (root, open) = best?;
    // Fill the clusters to their capacity, largest first, the rest on the root; a cluster host
    // left without a worker is not opened (it would only take a root slot).
    let mut left: Vec<usize> = (0..n).collect();
    let mut clusters = Vec::new();
    for h in &open {
        let take = (k[*h] - 1).min(left.len());
        let members: Vec<usize> = left.drain(..take).collect();
        if !members.is_empty() {
            clusters.push(Cluster { host: *h, members });
        }
    }
    if left.len() + clusters.len() > k[root] {
        return None;
    }
    clusters.insert(
        0,
        Cluster {
            host: root,
            members: left,
        },
    );
    Some(Grouping {
        root,
        clusters,
        round_time_s: 0.0,
    })
}

/// Roots the greedy tries: the hosts of most streams.
const GREEDY_ROOTS: usize = 8;

/// Per-pair eligibility on many hosts, greedy: for each of the [`GREEDY_ROOTS`] hosts of most
/// streams as the root, workers with the fewest eligible hosts first each go to the eligible
/// open host (the root included) with the most room left, and when none has room, open the
/// eligible host of most streams (it takes one of the root's). `O(R · N · H)` per round time,
/// no flow: fast enough for a thousand workers on a hundred hosts.
fn general(input: &GroupingInput, t: f64, e: &[Vec<usize>]) -> Option<Grouping> {
    let hosts = input.capacity_bps.len();
    let n = input.workers;
    let k = stream_counts(input, t);
    let mut roots: Vec<usize> = (0..hosts).filter(|h| k[*h] > 0).collect();
    roots.sort_by(|a, b| k[*b].cmp(&k[*a]).then(a.cmp(b)));
    roots.truncate(GREEDY_ROOTS);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|w| (e[*w].len(), *w));
    let mut best: Option<(usize, Vec<usize>, Vec<usize>)> = None;
    'roots: for r in roots {
        let mut open: Vec<usize> = Vec::new();
        let mut is_open = vec![false; hosts];
        let mut used = vec![0usize; hosts];
        let mut assign = vec![usize::MAX; n];
        for &w in &order {
            // Room left: the root's streams minus its workers and children; a cluster's k - 1.
            let room = |h: usize, used: &[usize], open: &[usize]| -> usize {
                if h == r {
                    k[r].saturating_sub(used[r] + open.len())
                } else {
                    (k[h] - 1).saturating_sub(used[h])
                }
            };
            let pick = e[w]
                .iter()
                .copied()
                .filter(|h| *h == r || is_open[*h])
                .filter(|h| room(*h, &used, &open) > 0)
                .max_by_key(|h| (room(*h, &used, &open), std::cmp::Reverse(*h)));
            let h = match pick {
                Some(h) => h,
                None => {
                    let fresh = e[w]
                        .iter()
                        .copied()
                        .filter(|h| *h != r && !is_open[*h] && k[*h] >= 2)
                        .max_by_key(|h| (k[*h], std::cmp::Reverse(*h)));
                    match fresh {
                        Some(h) if used[r] + open.len() < k[r] => {
                            open.push(h);
                            is_open[h] = true;
                            h
                        }
                        _ => continue 'roots,
                    }
                }
            };
            used[h] += 1;
            assign[w] = h;
        }
        if best.as_ref().is_none_or(|(_, o, _)| open.len() < o.len()) {
            best = Some((r, open, assign));
        }
    }
    let (root, open, assign) = best?;
    Some(from_assignment(root, &open, &assign))
}

/// Workers that fit with root `r` and cluster hosts `open`, and where each goes (unfitted:
/// `usize::MAX`).
fn max_flow(
    e: &[Vec<usize>],
    k: &[usize],
    r: usize,
    open: &[usize],
    n: usize,
    hosts: usize,
) -> (usize, Vec<usize>) {
    // 0 source, 1..=n workers, n+1..=n+hosts hosts, n+hosts+1 sink.
    let (src, sink) = (0, n + hosts + 1);
    let mut f = Flow::new(n + hosts + 2);
    let mut edges = Vec::new();
    for (w, hs) in e.iter().enumerate() {
        f.add(src, 1 + w, 1);
        for h in hs {
            if *h == r || open.contains(h) {
                edges.push((w, *h, f.add(1 + w, 1 + n + h, 1)));
            }
        }
    }
    let root_cap = k[r].saturating_sub(open.len());
    f.add(1 + n + r, sink, root_cap as i64);
    for h in open {
        f.add(1 + n + h, sink, k[*h].saturating_sub(1) as i64);
    }
    let fit = f.max_flow(src, sink) as usize;
    let mut assign = vec![usize::MAX; n];
    for (w, h, edge) in edges {
        if f.flow(edge) > 0 {
            assign[w] = h;
        }
    }
    (fit, assign)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(up: &[f64], cap: &[f64]) -> GroupingInput {
        GroupingInput {
            gradient_bytes: 1_000_000,
            workers: up.len(),
            capacity_bps: cap.to_vec(),
            bandwidth: up
                .iter()
                .map(|u| cap.iter().map(|c| u.min(*c)).collect())
                .collect(),
        }
    }

    #[test]
    fn two_slow_workers_set_the_floor_and_three_hosts_beat_one() {
        // 8 workers, two at a quarter; three hosts as fast as the fast workers.
        let mut up = vec![1e8; 8];
        up[6] = 2.5e7;
        up[7] = 2.5e7;
        let i = input(&up, &[1e8, 1e8, 1e8]);
        let g = group(&i).unwrap();
        let f = flat(&i).unwrap();
        // Flat: 8 streams on one host, 80 ms; the floor is the slow workers' 40 ms.
        assert!((f.round_time_s - 0.08).abs() < 1e-9);
        assert!((g.round_time_s - 0.04).abs() < 1e-9, "{g:?}");
        assert!(ring_time(&i) > 0.06);
    }

    #[test]
    fn bad_inputs_are_refused_in_one_sentence() {
        let mut i = input(&[1e8, 1e8], &[1e8]);
        i.bandwidth[1][0] = 0.0;
        assert_eq!(
            group(&i).unwrap_err().to_string(),
            "no host may serve worker 1"
        );
        let i = input(&[], &[1e8]);
        assert_eq!(group(&i), Err(GroupingError::NoWorkers));
        let mut i = input(&[1e8], &[1e8]);
        i.capacity_bps[0] = f64::NAN;
        assert_eq!(
            group(&i).unwrap_err().to_string(),
            "capacity_bps[0] must be positive and finite"
        );
    }

    #[test]
    fn a_small_wobble_does_not_regroup_and_a_lost_host_does() {
        let i = input(&[1e8; 6], &[1e8, 1e8, 1e8]);
        let g = group(&i).unwrap();
        let p = RegroupPolicy::default();
        assert_eq!(regroup(&i, &g, &p), None, "its own optimum");
        let mut wobble = i.clone();
        wobble.capacity_bps[0] *= 1.05;
        assert_eq!(regroup(&wobble, &g, &p), None);
        // A host of the grouping gone: the input has only the others, so it is invalid.
        let mut lost = input(&[1e8; 6], &[1e8, 1e8]);
        lost.capacity_bps.truncate(2);
        let moved = if g.clusters.iter().any(|c| c.host == 2) {
            regroup(&lost, &g, &p)
        } else {
            Some(group(&lost).unwrap())
        };
        assert!(moved.is_some());
    }
}
