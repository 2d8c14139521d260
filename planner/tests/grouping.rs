//! The grouping (ALEPH) against brute force on every instance of up to 9 workers of two seeded
//! families, against the exact search on more hosts, and its properties under proptest.
//!
//! - Endpoint family: bandwidth limited at the endpoints, `b(w, h) = min(up_w, down_h)`, links
//!   from a few speed classes (1, 1/2, 1/4 of a base), some hosts CPU-limited below their link.
//!   The grouping is exact there (the module's proof): the ratio to brute force must be 1, on
//!   the default path and on both greedies alike.
//! - Per-pair family: the same, in two racks (pairs across them cut to a fraction or to
//!   nothing) and with single pairs cut down or zeroed (a worker's own host, an oversubscribed
//!   path). The default path (every set of cluster hosts up to six hosts) is exact: ratio 1.
//!   The greedy claims no bound; its worst ratio seen is printed (`--nocapture`) with the
//!   instance, and held to the figure observed when this test was written, rounded up: an
//!   observation, not a bound. So is the plain greedy's (no zero-gain openings).
//! - Sparse family (each worker reaches one to three hosts): set-cover-like, against the exact
//!   search on 5 to 8 hosts with the per-pair family; a longer sweep is `--ignored`.
//!
//! Brute force: every root and every assignment, `H^N · H` groupings, through `round_time`.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use yard_planner::grouping::{
    flat, group, group_with, regroup, ring_time, round_time, Cluster, GroupOptions, Grouping,
    GroupingError, GroupingInput, RegroupPolicy,
};

const BASE: f64 = 1.25e8; // 1 Gbit/s in bytes/s

/// A seeded instance family: (rng, workers, hosts) → input.
type Family = fn(&mut ChaCha8Rng, usize, usize) -> GroupingInput;

fn endpoint(rng: &mut ChaCha8Rng, n: usize, h: usize) -> GroupingInput {
    let up: Vec<f64> = (0..n)
        .map(|_| BASE * [1.0, 0.5, 0.25][rng.gen_range(0..3)])
        .collect();
    let down: Vec<f64> = (0..h)
        .map(|_| BASE * [1.0, 0.5, 0.25][rng.gen_range(0..3)])
        .collect();
    let capacity: Vec<f64> = down
        .iter()
        .map(|d| {
            if rng.gen_bool(0.3) {
                d * [0.5, 0.75][rng.gen_range(0..2)] // CPU-limited
            } else {
                *d
            }
        })
        .collect();
    GroupingInput {
        gradient_bytes: 4 << 20,
        workers: n,
        capacity_bps: capacity,
        bandwidth: up
            .iter()
            .map(|u| down.iter().map(|d| u.min(*d)).collect())
            .collect(),
        max_load: None,
    }
}

fn per_pair(rng: &mut ChaCha8Rng, n: usize, h: usize) -> GroupingInput {
    let mut i = endpoint(rng, n, h);
    // Two racks; a pair across them keeps a fraction of its endpoint figure, or nothing.
    let cross = [1.0, 0.5, 0.25, 0.0][rng.gen_range(0..4)];
    let worker_rack: Vec<bool> = (0..n).map(|_| rng.gen_bool(0.5)).collect();
    let host_rack: Vec<bool> = (0..h).map(|_| rng.gen_bool(0.5)).collect();
    // Single pairs zeroed (a worker's own host, no route) or cut down (an oversubscribed
    // path), sparsely or densely.
    let zero = [0.1, 0.3, 0.5, 0.7][rng.gen_range(0..4)];
    for (w, row) in i.bandwidth.iter_mut().enumerate() {
        for (k, b) in row.iter_mut().enumerate() {
            if worker_rack[w] != host_rack[k] {
                *b *= cross;
            }
            if rng.gen_bool(zero) {
                *b = 0.0;
            } else if rng.gen_bool(0.25) {
                *b *= [0.5, 0.25, 0.1][rng.gen_range(0..3)];
            }
        }
        if row.iter().all(|b| *b == 0.0) {
            let k = rng.gen_range(0..h);
            row[k] = BASE / 4.0;
        }
    }
    i
}

/// Sparse eligibility: each worker reaches one to three hosts (the rest unreachable), hosts of
/// capacities from 1/2 to 4 times the base: set-cover-like instances.
fn sparse(rng: &mut ChaCha8Rng, n: usize, h: usize) -> GroupingInput {
    let capacity: Vec<f64> = (0..h)
        .map(|_| BASE * [0.5, 1.0, 1.5, 2.0, 4.0][rng.gen_range(0..5)])
        .collect();
    let bandwidth = (0..n)
        .map(|_| {
            let mut row = vec![0.0; h];
            for _ in 0..rng.gen_range(1..=3) {
                row[rng.gen_range(0..h)] = BASE * [1.0, 0.5][rng.gen_range(0..2)];
            }
            row
        })
        .collect();
    GroupingInput {
        gradient_bytes: 1 << 20,
        workers: n,
        capacity_bps: capacity,
        bandwidth,
        max_load: None,
    }
}

/// The optimum by enumeration of every root and every assignment.
fn brute(i: &GroupingInput) -> f64 {
    let (n, h) = (i.workers, i.capacity_bps.len());
    let mut best = f64::INFINITY;
    let mut a = vec![0usize; n];
    loop {
        let mut clusters: Vec<Cluster> = (0..h)
            .map(|host| Cluster {
                host,
                members: Vec::new(),
            })
            .collect();
        for (w, host) in a.iter().enumerate() {
            clusters[*host].members.push(w);
        }
        let mut g = Grouping {
            root: 0,
            clusters,
            round_time_s: 0.0,
        };
        for root in 0..h {
            g.root = root;
            best = best.min(round_time(i, &g));
        }
        // The next assignment.
        let mut k = 0;
        loop {
            if k == n {
                return best;
            }
            a[k] += 1;
            if a[k] < h {
                break;
            }
            a[k] = 0;
            k += 1;
        }
    }
}

/// Every worker in exactly one cluster, on a host that may serve it; the root listed first;
/// no other host listed twice or without a member; every load within its `k` at the returned
/// round time, which is `round_time`'s.
fn valid(i: &GroupingInput, g: &Grouping) -> Result<(), String> {
    let m = i.gradient_bytes as f64;
    let t = g.round_time_s * (1.0 + 1e-9);
    let mut seen = vec![0; i.workers];
    let mut hosts = Vec::new();
    for c in &g.clusters {
        if hosts.contains(&c.host) {
            return Err(format!("host {} listed twice: {g:?}", c.host));
        }
        hosts.push(c.host);
        if c.host != g.root && c.members.is_empty() {
            return Err(format!("cluster host {} without a member: {g:?}", c.host));
        }
        for w in &c.members {
            seen[*w] += 1;
            let b = i.bandwidth[*w][c.host];
            if b <= 0.0 || m / b > t {
                return Err(format!(
                    "worker {w} on host {} it may not use: {g:?}",
                    c.host
                ));
            }
        }
        if !c.members.windows(2).all(|p| p[0] < p[1]) {
            return Err(format!("members do not ascend: {g:?}"));
        }
        let load = if c.host == g.root {
            c.members.len() + g.clusters.len() - 1
        } else {
            c.members.len() + 1
        };
        if load as f64 * m / i.capacity_bps[c.host] > t || i.max_load.is_some_and(|l| load > l) {
            return Err(format!("host {} carries {load} streams: {g:?}", c.host));
        }
    }
    if !seen.iter().all(|s| *s == 1) {
        return Err(format!("not every worker in exactly one cluster: {g:?}"));
    }
    if g.clusters.first().map(|c| c.host) != Some(g.root) {
        return Err(format!("the root is not listed first: {g:?}"));
    }
    let rt = round_time(i, g);
    if (rt - g.round_time_s).abs() > 1e-12 * rt.max(1.0) {
        return Err(format!("round time {} vs the model's {rt}", g.round_time_s));
    }
    Ok(())
}

fn shapes() -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for n in 1..=9 {
        for h in 1..=3 {
            v.push((n, h));
        }
        if n <= 7 {
            v.push((n, 4));
        }
    }
    v
}

/// Instances per shape.
const ENDPOINT_SEEDS: u64 = 6;
const PER_PAIR_SEEDS: u64 = 40;

/// The worst ratios seen when these tests were written, rounded up (4 decimals): observations
/// of these seeded families, not bounds (the module's doc). Against brute force, per-pair
/// family, 1,360 instances: the greedy 1 (none above the optimum), the plain greedy 1.
const OBSERVED_WORST: f64 = 1.0;
const OBSERVED_WORST_PLAIN: f64 = 1.0;
/// Against the exact search, 8 to 24 workers on 5 to 7 hosts, 270 instances per family,
/// [greedy, plain greedy]: none above the optimum.
const OBSERVED_MORE_PER_PAIR: [f64; 2] = [1.0, 1.0];
const OBSERVED_MORE_SPARSE: [f64; 2] = [1.0, 1.0];
/// Instances per shape there.
const MORE_SEEDS: u64 = 30;
/// The longer sweep (ignored by default), 8 to 24 workers on 5 to 8 hosts, 1,200 instances per
/// family: per-pair, the greedy 1 (none above the optimum), the plain greedy 1.3333 (6
/// above); sparse, both 1.05 (1 above, the same instance).
const SWEEP_SEEDS: u64 = 100;
const SWEEP_PER_PAIR: [f64; 2] = [1.0, 1.3334];
const SWEEP_SPARSE: [f64; 2] = [1.05, 1.05];

/// The worst ratio to brute force (or to the exact search) of one grouper over a family.
#[derive(Debug)]
struct Worst {
    name: &'static str,
    ratio: f64,
    above: usize,
    at: String,
}

/// Runs `family` (`seeds` instances of every shape) through each grouper against the
/// optimum `oracle` gives.
fn worst_ratios(
    family: Family,
    salt: u64,
    shapes: &[(usize, usize)],
    seeds: u64,
    oracle: impl Fn(&GroupingInput) -> f64,
    groupers: &[(&'static str, GroupOptions)],
) -> (usize, Vec<Worst>) {
    let mut worst: Vec<Worst> = groupers
        .iter()
        .map(|(name, _)| Worst {
            name,
            ratio: 1.0,
            above: 0,
            at: "-".into(),
        })
        .collect();
    let mut count = 0;
    for &(n, h) in shapes {
        for seed in 0..seeds {
            let mut rng = ChaCha8Rng::seed_from_u64(salt + 1000 * n as u64 + 10 * h as u64 + seed);
            let i = family(&mut rng, n, h);
            let opt = oracle(&i);
            for ((_, opts), w) in groupers.iter().zip(&mut worst) {
                let g = group_with(&i, *opts).unwrap();
                if let Err(e) = valid(&i, &g) {
                    panic!("{}: n {n} h {h} seed {seed}: {e}", w.name);
                }
                let ratio = g.round_time_s / opt;
                assert!(
                    ratio >= 1.0 - 1e-9,
                    "better than the optimum? {ratio} (n {n} h {h} seed {seed})"
                );
                if ratio > 1.0 + 1e-9 {
                    w.above += 1;
                }
                if ratio > w.ratio + 1e-12 {
                    w.ratio = ratio;
                    w.at = format!("n {n} h {h} seed {seed}: {i:?}");
                }
            }
            count += 1;
        }
    }
    (count, worst)
}

/// The exact search over every root and every set of cluster hosts (the module's argument),
/// as an oracle where brute force is out of reach.
fn exact_search(i: &GroupingInput) -> f64 {
    let opts = GroupOptions {
        exact_hosts: 8,
        ..GroupOptions::default()
    };
    group_with(i, opts).unwrap().round_time_s
}

const GREEDIES: [(&str, GroupOptions); 2] = [
    (
        "greedy",
        GroupOptions {
            exact_hosts: 0,
            closed_form: false,
            zero_gain_openings: true,
        },
    ),
    (
        "plain greedy",
        GroupOptions {
            exact_hosts: 0,
            closed_form: false,
            zero_gain_openings: false,
        },
    ),
];

#[test]
fn the_endpoint_family_is_grouped_optimally() {
    let (count, worst) = worst_ratios(
        endpoint,
        0,
        &shapes(),
        ENDPOINT_SEEDS,
        brute,
        &[
            ("default", GroupOptions::default()),
            GREEDIES[0],
            GREEDIES[1],
        ],
    );
    for w in worst {
        println!(
            "endpoint family, {}: {count} instances, worst ratio {:.6}",
            w.name, w.ratio
        );
        assert!(
            w.ratio <= 1.0 + 1e-9,
            "{}: ratio {} at {}",
            w.name,
            w.ratio,
            w.at
        );
    }
}

#[test]
fn the_per_pair_family_is_exact_on_few_hosts_and_the_greedy_stays_near() {
    let (count, worst) = worst_ratios(
        per_pair,
        7,
        &shapes(),
        PER_PAIR_SEEDS,
        brute,
        &[
            ("default (every set up to 6 hosts)", GroupOptions::default()),
            GREEDIES[0],
            GREEDIES[1],
        ],
    );
    for w in &worst {
        println!(
            "per-pair family, {}: {count} instances, {} above the optimum, worst ratio {:.6} at {}",
            w.name, w.above, w.ratio, w.at
        );
    }
    assert!(worst[0].ratio <= 1.0 + 1e-9, "{:?}", worst[0]);
    // Observations of this seeded family, not bounds (see the module's doc).
    assert!(worst[1].ratio <= OBSERVED_WORST + 1e-9, "{:?}", worst[1]);
    assert!(
        worst[2].ratio <= OBSERVED_WORST_PLAIN + 1e-9,
        "{:?}",
        worst[2]
    );
}

/// The per-pair family with an aggregator's streams capped (`max_load` 2 to 4, as the XDP
/// program caps them at 64): every instance of up to 9 workers against brute force, which
/// counts a grouping over the cap as infinite. The default path must be exact, including when
/// no grouping fits (`Crowded` exactly when brute force finds none); the greedy's worst ratio
/// is printed and held to the figure observed when this test was written.
#[test]
fn with_a_cap_on_an_aggregator_s_streams_groupings_stay_exact_and_crowded_inputs_are_refused() {
    const OBSERVED_CAPPED: f64 = 1.0;
    let (mut count, mut crowded, mut greedy_worst) = (0, 0, 1.0f64);
    for (n, h) in shapes() {
        for seed in 0..PER_PAIR_SEEDS / 2 {
            let mut rng = ChaCha8Rng::seed_from_u64(31 + 1000 * n as u64 + 10 * h as u64 + seed);
            let mut i = per_pair(&mut rng, n, h);
            i.max_load = Some(rng.gen_range(2..=4));
            let opt = brute(&i);
            count += 1;
            match group(&i) {
                Err(GroupingError::Crowded { workers, max_load }) => {
                    assert!(opt.is_infinite(), "refused, brute force found {opt}: {i:?}");
                    assert_eq!((workers, Some(max_load)), (n, i.max_load));
                    assert!(group_with(&i, GroupOptions::greedy()).is_err());
                    crowded += 1;
                }
                Ok(g) => {
                    valid(&i, &g).unwrap_or_else(|e| panic!("{e}: {i:?}"));
                    let ratio = g.round_time_s / opt;
                    assert!((ratio - 1.0).abs() <= 1e-9, "ratio {ratio}: {i:?}");
                    if let Ok(g) = group_with(&i, GroupOptions::greedy()) {
                        valid(&i, &g).unwrap_or_else(|e| panic!("{e}: {i:?}"));
                        greedy_worst = greedy_worst.max(g.round_time_s / opt);
                    } else {
                        greedy_worst = f64::INFINITY;
                    }
                }
                Err(e) => panic!("{e}: {i:?}"),
            }
        }
    }
    println!(
        "capped per-pair family: {count} instances, {crowded} crowded, greedy worst ratio {greedy_worst:.6}"
    );
    assert!(crowded > 0 && crowded < count);
    assert!(greedy_worst <= OBSERVED_CAPPED + 1e-9, "{greedy_worst}");
}

/// A job past one aggregator's limit is spread over clusters of at most `L − 1` members under
/// a root of at most `L` streams, and refused in one sentence when the hosts cannot hold it.
#[test]
fn a_job_larger_than_one_aggregator_s_limit_is_spread_over_clusters() {
    let mut i = GroupingInput {
        gradient_bytes: 1 << 20,
        workers: 200,
        capacity_bps: vec![BASE; 4],
        bandwidth: vec![vec![BASE; 4]; 200],
        max_load: Some(64),
    };
    let g = group(&i).unwrap();
    valid(&i, &g).unwrap();
    assert!(g.clusters.len() == 4, "{g:?}");
    assert!(flat(&i).is_err(), "no single aggregator takes 200");
    // Four hosts hold at most 64 − 3 at the root and 63 in each of three clusters: 250.
    i.workers = 250;
    i.bandwidth = vec![vec![BASE; 4]; 250];
    valid(&i, &group(&i).unwrap()).unwrap();
    i.workers = 251;
    i.bandwidth = vec![vec![BASE; 4]; 251];
    let e = group(&i).unwrap_err();
    assert_eq!(
        e,
        GroupingError::Crowded {
            workers: 251,
            max_load: 64
        }
    );
    assert_eq!(
        e.to_string(),
        "251 workers do not fit a two-level tree of these hosts at 64 streams an aggregator"
    );
}

fn more_hosts(ns: &[usize], hs: std::ops::RangeInclusive<usize>) -> Vec<(usize, usize)> {
    ns.iter()
        .flat_map(|n| hs.clone().map(move |h| (*n, h)))
        .collect()
}

/// The greedy and the plain greedy against the exact search on the per-pair and sparse
/// families: prints each figure and checks it against `observed` ([greedy, plain greedy] per
/// family).
fn greedies_on_more_hosts(shapes: &[(usize, usize)], seeds: u64, observed: [[f64; 2]; 2]) {
    let families: [(&str, Family); 2] = [("per-pair", per_pair), ("sparse", sparse)];
    for ((name, family), bounds) in families.into_iter().zip(observed) {
        let (count, worst) = worst_ratios(family, 99, shapes, seeds, exact_search, &GREEDIES);
        for (w, bound) in worst.iter().zip(bounds) {
            println!(
                "{name} family, {} to {} workers on {} to {} hosts, {}: {count} instances, {} above the optimum, worst ratio {:.6} at {}",
                shapes[0].0,
                shapes[shapes.len() - 1].0,
                shapes[0].1,
                shapes[shapes.len() - 1].1,
                w.name,
                w.above,
                w.ratio,
                w.at
            );
            assert!(
                w.ratio <= bound + 1e-9,
                "{name}, {}: {:.6} at {}",
                w.name,
                w.ratio,
                w.at
            );
        }
    }
}

/// On more hosts than brute force reaches, the greedy against the exact search.
#[test]
fn the_greedy_against_the_exact_search_on_more_hosts() {
    greedies_on_more_hosts(
        &more_hosts(&[8, 16, 24], 5..=7),
        MORE_SEEDS,
        [OBSERVED_MORE_PER_PAIR, OBSERVED_MORE_SPARSE],
    );
}

/// The same on a longer sweep, up to 8 hosts (about a minute in a debug build; CI runs it).
#[test]
fn the_greedy_against_the_exact_search_on_a_longer_sweep() {
    greedies_on_more_hosts(
        &more_hosts(&[8, 16, 24], 5..=8),
        SWEEP_SEEDS,
        [SWEEP_PER_PAIR, SWEEP_SPARSE],
    );
}

#[test]
fn bad_inputs_are_refused_in_one_sentence() {
    let ok = GroupingInput {
        gradient_bytes: 1 << 20,
        workers: 2,
        capacity_bps: vec![BASE, BASE],
        bandwidth: vec![vec![BASE, BASE]; 2],
        max_load: None,
    };
    assert!(group(&ok).is_ok());
    let msg = |i: &GroupingInput| group(i).unwrap_err().to_string();
    let mut i = ok.clone();
    i.workers = 0;
    i.bandwidth.clear();
    assert_eq!(group(&i), Err(GroupingError::NoWorkers));
    assert_eq!(msg(&i), "a job with no worker cannot be grouped");
    let mut i = ok.clone();
    i.capacity_bps.clear();
    i.bandwidth = vec![vec![]; 2];
    assert_eq!(msg(&i), "there is no aggregating host");
    let mut i = ok.clone();
    i.bandwidth[1] = vec![0.0, 0.0];
    assert_eq!(msg(&i), "no host may serve worker 1");
    // A worker reaching only a host without capacity is not served either.
    let mut i = ok.clone();
    i.capacity_bps[1] = 0.0;
    i.bandwidth[0] = vec![0.0, BASE];
    assert_eq!(msg(&i), "no host may serve worker 0");
    let mut i = ok.clone();
    i.capacity_bps[1] = f64::NAN;
    assert_eq!(msg(&i), "capacity_bps[1] must be finite and not negative");
    let mut i = ok.clone();
    i.capacity_bps[0] = -1.0;
    assert_eq!(msg(&i), "capacity_bps[0] must be finite and not negative");
    let mut i = ok.clone();
    i.bandwidth[1][0] = f64::INFINITY;
    assert_eq!(msg(&i), "bandwidth[1][0] must be finite and not negative");
    let mut i = ok.clone();
    i.bandwidth[0][1] = -5.0;
    assert_eq!(msg(&i), "bandwidth[0][1] must be finite and not negative");
    let mut i = ok.clone();
    i.gradient_bytes = 0;
    assert_eq!(msg(&i), "gradient_bytes must be positive");
    let mut i = ok.clone();
    i.bandwidth[1].pop();
    assert_eq!(msg(&i), "the bandwidth table has 2 rows of 1, not 2 of 2");
    let mut i = ok.clone();
    i.bandwidth[0][0] = 0.0;
    i.bandwidth[1][1] = 0.0;
    assert_eq!(
        flat(&i).unwrap_err().to_string(),
        "no single host may serve every worker"
    );
    assert!(group(&i).is_ok());
}

#[test]
fn a_lost_host_or_worker_regroups_at_once() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let i = endpoint(&mut rng, 9, 3);
    let g = group(&i).unwrap();
    let p = RegroupPolicy::default();
    assert_eq!(regroup(&i, &g, &p), None, "its own optimum");
    // A worker added, or one removed: the old grouping is no longer one of the input.
    let mut more = i.clone();
    more.workers += 1;
    more.bandwidth.push(i.bandwidth[0].clone());
    assert!(regroup(&more, &g, &p).is_some());
    let mut fewer = i.clone();
    fewer.workers -= 1;
    fewer.bandwidth.pop();
    assert!(regroup(&fewer, &g, &p).is_some());
    // A host of the grouping may no longer serve one of its members.
    let c = g.clusters.iter().find(|c| !c.members.is_empty()).unwrap();
    let mut cut = i.clone();
    cut.bandwidth[c.members[0]][c.host] = 0.0;
    let moved = regroup(&cut, &g, &p).expect("regrouped");
    valid(&cut, &moved).unwrap();
    // A host gone: the survivors renumbered, the old grouping's host past the last one.
    let dead = g.clusters.last().unwrap().host;
    let mut gone = i.clone();
    gone.capacity_bps.remove(dead);
    gone.bandwidth.iter_mut().for_each(|r| {
        r.remove(dead);
    });
    let mut old = g.clone();
    let remap = |h: usize| match h.cmp(&dead) {
        std::cmp::Ordering::Less => h,
        std::cmp::Ordering::Equal => 2,
        std::cmp::Ordering::Greater => h - 1,
    };
    old.root = remap(old.root);
    old.clusters.iter_mut().for_each(|c| c.host = remap(c.host));
    let moved = regroup(&gone, &old, &p).expect("regrouped");
    valid(&gone, &moved).unwrap();
}

/// Inputs of 1..=8 workers on 1..=4 hosts: endpoint figures from the speed classes, some
/// hosts CPU-limited, and (if `pairs`) single pairs cut down or zeroed.
fn arb_input(pairs: bool) -> impl Strategy<Value = GroupingInput> {
    (1usize..9, 1usize..5).prop_flat_map(move |(n, h)| {
        let speed = || prop::sample::select(vec![0.25f64, 0.5, 1.0]);
        (
            prop::collection::vec(speed(), n),
            prop::collection::vec(speed(), h),
            prop::collection::vec(prop::sample::select(vec![1.0f64, 1.0, 0.75, 0.5]), h),
            prop::collection::vec(
                prop::sample::select(if pairs {
                    vec![1.0f64, 1.0, 1.0, 0.5, 0.1, 0.0]
                } else {
                    vec![1.0]
                }),
                n * h,
            ),
        )
            .prop_map(move |(up, down, cpu, cut)| {
                let mut bandwidth: Vec<Vec<f64>> = (0..n)
                    .map(|w| {
                        (0..h)
                            .map(|k| BASE * up[w].min(down[k]) * cut[w * h + k])
                            .collect()
                    })
                    .collect();
                for row in &mut bandwidth {
                    if row.iter().all(|b| *b == 0.0) {
                        row[0] = BASE * 0.25;
                    }
                }
                GroupingInput {
                    gradient_bytes: 1 << 20,
                    workers: n,
                    capacity_bps: (0..h).map(|k| BASE * down[k] * cpu[k]).collect(),
                    bandwidth,
                    max_load: None,
                }
            })
    })
}

/// `i` with every figure scaled by a factor in `[1 / (1 + d), 1 + d]` drawn from `seed`.
fn wobble(i: &GroupingInput, d: f64, seed: u64) -> GroupingInput {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut f = |x: &mut f64| *x *= (1.0 + d).powf(rng.gen_range(-1.0..=1.0));
    let mut out = i.clone();
    out.capacity_bps.iter_mut().for_each(&mut f);
    out.bandwidth.iter_mut().flatten().for_each(&mut f);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn groupings_are_valid_and_beat_flat(i in arb_input(true)) {
        for opts in [GroupOptions::default(), GroupOptions::greedy()] {
            let g = group_with(&i, opts).unwrap();
            prop_assert!(valid(&i, &g).is_ok(), "{:?}", valid(&i, &g));
            if let Ok(f) = flat(&i) {
                prop_assert!(g.round_time_s <= f.round_time_s * (1.0 + 1e-9));
            }
        }
        prop_assert!(ring_time(&i) >= 0.0);
    }

    #[test]
    fn more_capacity_never_lengthens_the_round(
        i in arb_input(true), host in 0usize..4, extra in 1.0f64..4.0,
    ) {
        let g = group(&i).unwrap();
        let mut more = i.clone();
        let k = host % more.capacity_bps.len();
        more.capacity_bps[k] *= extra;
        prop_assert!(group(&more).unwrap().round_time_s <= g.round_time_s * (1.0 + 1e-9));
    }

    #[test]
    fn one_host_is_flat_aggregation(i in arb_input(false)) {
        let mut one = i.clone();
        one.capacity_bps.truncate(1);
        one.bandwidth.iter_mut().for_each(|r| r.truncate(1));
        let m = one.gradient_bytes as f64;
        let min_b = one.bandwidth.iter().map(|r| r[0]).fold(f64::INFINITY, f64::min);
        let expect = (m / min_b).max(one.workers as f64 * m / one.capacity_bps[0]);
        let g = group(&one).unwrap();
        prop_assert!((g.round_time_s - expect).abs() <= 1e-9 * expect, "{} vs {expect}", g.round_time_s);
        prop_assert_eq!(g.clusters.len(), 1);
        prop_assert!((flat(&one).unwrap().round_time_s - expect).abs() <= 1e-9 * expect);
    }

    #[test]
    fn the_greedy_is_exact_on_uniform_eligibility(i in arb_input(false)) {
        let exact = group(&i).unwrap();
        let greedy = group_with(&i, GroupOptions::greedy()).unwrap();
        prop_assert!(
            (exact.round_time_s - greedy.round_time_s).abs() <= 1e-9 * exact.round_time_s,
            "closed form {} vs greedy {}", exact.round_time_s, greedy.round_time_s
        );
    }

    #[test]
    fn a_regrouping_is_not_undone_by_a_wobble(
        i in arb_input(true), d in 0.0f64..0.08, seed in 0u64..1000, start in 0usize..4,
    ) {
        let p = RegroupPolicy::default();
        // Fed back with the same input, a grouping is never regrouped.
        let g = group(&i).unwrap();
        prop_assert_eq!(regroup(&i, &g, &p), None);
        // Two readings of the same links, within 1 + d of each other (d < 8.5%), alternating,
        // from any valid start (every worker on a host of its own best link, some root):
        // at most one regrouping.
        let b = wobble(&i, d, seed);
        let hosts = i.capacity_bps.len();
        let assign: Vec<usize> = i
            .bandwidth
            .iter()
            .map(|r| (0..hosts).max_by(|x, y| r[*x].total_cmp(&r[*y])).unwrap())
            .collect();
        let mut members = vec![Vec::new(); hosts];
        for (w, h) in assign.iter().enumerate() {
            members[*h].push(w);
        }
        let root = start % hosts;
        let mut current = Grouping {
            root,
            clusters: std::iter::once(root)
                .chain((0..hosts).filter(|h| *h != root && !members[*h].is_empty()))
                .map(|h| Cluster { host: h, members: members[h].clone() })
                .collect(),
            round_time_s: 0.0,
        };
        let mut moves = 0;
        for step in 0..8 {
            let now = if step % 2 == 0 { &b } else { &i };
            if let Some(next) = regroup(now, &current, &p) {
                moves += 1;
                current = next;
            }
        }
        prop_assert!(moves <= 1, "{moves} regroupings");
    }
}
