//! The grouping (ALEPH) against brute force on every instance of up to 9 workers of two seeded
//! families, and its properties under proptest.
//!
//! - Endpoint family: bandwidth limited at the endpoints, `b(w, h) = min(up_w, down_h)`, links
//!   from a few speed classes, some hosts CPU-limited below their link. The grouping is exact
//!   there (the module's proof): the ratio to brute force must be 1.
//! - Per-pair family: the same, with some pairs cut to a fraction or to nothing (racks,
//!   oversubscribed paths). No bound is claimed; the worst ratio seen is printed (`--nocapture`)
//!   and held to the figure observed when this test was written, as a regression check.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use yard_planner::grouping::{
    flat, group, group_with, regroup, ring_time, round_time, Cluster, GroupOptions, Grouping,
    GroupingInput, RegroupPolicy,
};

const BASE: f64 = 1.25e8; // 1 Gbit/s in bytes/s

fn endpoint(rng: &mut ChaCha8Rng, n: usize, h: usize) -> GroupingInput {
    let up: Vec<f64> = (0..n)
        .map(|_| BASE * [1.0, 0.5, 0.25][rng.gen_range(0..3)])
        .collect();
    let down: Vec<f64> = (0..h)
        .map(|_| BASE * [2.0, 1.0, 0.5][rng.gen_range(0..3)])
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
    }
}

fn per_pair(rng: &mut ChaCha8Rng, n: usize, h: usize) -> GroupingInput {
    let mut i = endpoint(rng, n, h);
    for row in &mut i.bandwidth {
        for b in row.iter_mut() {
            if rng.gen_bool(0.2) {
                *b = 0.0;
            } else if rng.gen_bool(0.4) {
                *b *= rng.gen_range(0.1..0.9);
            }
        }
        if row.iter().all(|b| *b == 0.0) {
            row[0] = BASE / 4.0;
        }
    }
    i
}

/// The optimum by enumeration of every root and every assignment.
fn brute(i: &GroupingInput) -> f64 {
    let (n, h) = (i.workers, i.capacity_bps.len());
    let mut best = f64::INFINITY;
    let mut a = vec![0usize; n];
    loop {
        for root in 0..h {
            let mut clusters: Vec<Cluster> = (0..h)
                .map(|host| Cluster {
                    host,
                    members: Vec::new(),
                })
                .collect();
            for (w, host) in a.iter().enumerate() {
                clusters[*host].members.push(w);
            }
            clusters.retain(|c| c.host == root || !c.members.is_empty());
            let g = Grouping {
                root,
                clusters,
                round_time_s: 0.0,
            };
            best = best.min(round_time(i, &g));
        }
        // next assignment
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

fn valid(i: &GroupingInput, g: &Grouping) {
    let mut seen = vec![0; i.workers];
    for c in &g.clusters {
        for w in &c.members {
            seen[*w] += 1;
            assert!(
                i.bandwidth[*w][c.host] > 0.0,
                "worker {w} on a host that may not serve it"
            );
        }
        assert!(c.members.windows(2).all(|p| p[0] < p[1]), "members ascend");
    }
    assert!(
        seen.iter().all(|s| *s == 1),
        "every worker in exactly one cluster: {g:?}"
    );
    assert!(
        g.clusters.iter().any(|c| c.host == g.root),
        "the root is listed"
    );
    assert!((round_time(i, g) - g.round_time_s).abs() <= 1e-12 * g.round_time_s.max(1.0));
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

#[test]
fn the_endpoint_family_is_grouped_optimally() {
    let mut count = 0;
    for (n, h) in shapes() {
        for seed in 0..3 {
            let mut rng = ChaCha8Rng::seed_from_u64(1000 * n as u64 + 10 * h as u64 + seed);
            let i = endpoint(&mut rng, n, h);
            let g = group(&i).unwrap();
            valid(&i, &g);
            let opt = brute(&i);
            assert!(
                (g.round_time_s - opt).abs() <= 1e-9 * opt,
                "n {n} h {h} seed {seed}: {} vs the optimum {opt}: {g:?}",
                g.round_time_s
            );
            count += 1;
        }
    }
    println!("endpoint family: {count} instances, ratio 1 on every one");
}

/// Runs the per-pair family through `grouper` against brute force: (worst ratio, where).
fn per_pair_worst(grouper: impl Fn(&GroupingInput) -> Grouping) -> (f64, String, usize) {
    let mut worst = (1.0f64, String::new());
    let mut count = 0;
    for (n, h) in shapes() {
        for seed in 0..SEEDS {
            let mut rng = ChaCha8Rng::seed_from_u64(7 + 1000 * n as u64 + 10 * h as u64 + seed);
            let i = per_pair(&mut rng, n, h);
            let g = grouper(&i);
            valid(&i, &g);
            let opt = brute(&i);
            let ratio = g.round_time_s / opt;
            assert!(ratio >= 1.0 - 1e-9, "better than the optimum? {ratio}");
            if ratio > worst.0 {
                worst = (ratio, format!("n {n} h {h} seed {seed}"));
            }
            count += 1;
        }
    }
    (worst.0, worst.1, count)
}

#[test]
fn the_per_pair_family_is_grouped_optimally_on_few_hosts() {
    let (worst, at, count) = per_pair_worst(|i| group(i).unwrap());
    println!("per-pair family, default (every set up to 6 hosts): {count} instances, worst ratio {worst:.4} {at}");
    assert!(worst <= 1.0 + 1e-9, "worst ratio {worst:.4} ({at})");
}

#[test]
fn the_greedy_stays_near_brute_force_on_the_per_pair_family() {
    let greedy = GroupOptions { exact_hosts: 0 };
    let (worst, at, count) = per_pair_worst(|i| group_with(i, greedy).unwrap());
    println!(
        "per-pair family, greedy: {count} instances, worst ratio to brute force {worst:.4} ({at})"
    );
    // An observation of this seeded family, not a bound (see the module's doc).
    assert!(worst <= OBSERVED_WORST, "worst ratio {worst:.4} ({at})");
}

/// Instances per shape of the per-pair family.
const SEEDS: u64 = 10;

/// The worst per-pair ratio seen when the test was written, rounded up.
const OBSERVED_WORST: f64 = 1.5;

fn arb_input() -> impl Strategy<Value = GroupingInput> {
    (1usize..12, 1usize..5).prop_flat_map(|(n, h)| {
        (
            prop::collection::vec(prop::sample::select(vec![0.25, 0.5, 1.0]), n),
            prop::collection::vec(prop::sample::select(vec![0.5, 1.0, 2.0]), h),
        )
            .prop_map(move |(up, down)| GroupingInput {
                gradient_bytes: 1 << 20,
                workers: n,
                capacity_bps: down.iter().map(|d| d * BASE).collect(),
                bandwidth: up
                    .iter()
                    .map(|u: &f64| down.iter().map(|d: &f64| BASE * u.min(*d)).collect())
                    .collect(),
            })
    })
}

proptest! {
    #[test]
    fn groupings_are_valid_beat_flat_and_capacity_never_hurts(i in arb_input(), extra in 1.0f64..4.0) {
        let g = group(&i).unwrap();
        valid(&i, &g);
        let f = flat(&i).unwrap();
        prop_assert!(g.round_time_s <= f.round_time_s * (1.0 + 1e-12));
        // More capacity on a host never lengthens the round.
        let mut more = i.clone();
        more.capacity_bps[0] *= extra;
        prop_assert!(group(&more).unwrap().round_time_s <= g.round_time_s * (1.0 + 1e-12));
        // Fed back with the same input, a grouping is never regrouped.
        prop_assert_eq!(regroup(&i, &g, &RegroupPolicy::default()), None);
        prop_assert!(ring_time(&i) >= 0.0);
    }
}
