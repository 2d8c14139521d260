//! `agg-grouping`: how fast the ALEPH grouping (`yard_planner::grouping`) decides, on one core
//! (it is single-threaded), and what its model says of the tree against flat aggregation and
//! a ring on the same inputs.
//!
//! - Grouping 1,000 workers over 8, 32 and 128 aggregating hosts, two inputs: endpoint-limited
//!   bandwidths (the exact path) and per-pair bottlenecks (the greedy path above six hosts).
//! - Regrouping after a death: the host that serves the largest cluster removed, `regroup`
//!   on what is left (it must move: the old grouping names a host that is gone).
//! - The model's round time of the tree, of flat aggregation on the best single host, and of a
//!   ring among the workers, on the same inputs (ratios, same inputs on both sides).
//!
//! Figures are medians of `--rounds` runs. A benchmark: figures only (JSON on stdout, a table
//! on stderr), never fails on a number.

#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use yard_planner::grouping::{flat, group, regroup, ring_time, GroupingInput, RegroupPolicy};

#[derive(Debug, Parser)]
#[command(about = "ALEPH grouping time for 1,000 workers, regrouping time, model round times")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

const BASE: f64 = 1.25e9; // 10 Gbit/s in bytes/s

/// Workers' links from three speed classes (a quarter of them at a quarter), hosts' from two;
/// per-pair: a fifth of the pairs cut to a fraction (an oversubscribed path).
fn input(rng: &mut ChaCha8Rng, workers: usize, hosts: usize, per_pair: bool) -> GroupingInput {
    let up: Vec<f64> = (0..workers)
        .map(|w| {
            BASE * if w % 4 == 3 {
                0.25
            } else {
                [1.0, 0.5][rng.gen_range(0..2)]
            }
        })
        .collect();
    let down: Vec<f64> = (0..hosts)
        .map(|_| BASE * [1.0, 2.0][rng.gen_range(0..2)])
        .collect();
    let mut bandwidth: Vec<Vec<f64>> = up
        .iter()
        .map(|u| down.iter().map(|d| u.min(*d)).collect())
        .collect();
    if per_pair {
        for row in &mut bandwidth {
            for b in row.iter_mut() {
                if rng.gen_bool(0.2) {
                    *b *= rng.gen_range(0.2..0.8);
                }
            }
        }
    }
    GroupingInput {
        gradient_bytes: 100 << 20,
        workers,
        capacity_bps: down,
        bandwidth,
    }
}

fn time<T>(rounds: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut samples = Vec::new();
    let mut last = None;
    for _ in 0..rounds {
        let t = Instant::now();
        last = Some(f());
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    (
        stats::median(&samples).unwrap_or(0.0),
        last.expect("one round"),
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut rows: Vec<Value> = Vec::new();
    eprintln!(
        "{:<9} {:>6} {:>6} {:>11} {:>13} {:>9} {:>10} {:>10} {:>8} {:>10} {:>9}",
        "input",
        "hosts",
        "tree",
        "group ms",
        "regroup ms",
        "T tree",
        "T flat",
        "T ring",
        "flat/T",
        "ring/T",
        "clusters"
    );
    for per_pair in [false, true] {
        for hosts in [8usize, 32, 128] {
            let mut rng = ChaCha8Rng::seed_from_u64(args.seed + hosts as u64);
            let i = input(&mut rng, args.workers, hosts, per_pair);
            let (group_ms, g) = time(args.rounds, || group(&i).expect("a grouping"));
            let f = flat(&i).expect("a flat grouping");
            let ring = ring_time(&i);
            // The host of the largest cluster dies: the others are the new input.
            let dead = g
                .clusters
                .iter()
                .max_by_key(|c| c.members.len())
                .map_or(g.root, |c| c.host);
            let mut after = i.clone();
            after.capacity_bps.remove(dead);
            for row in &mut after.bandwidth {
                row.remove(dead);
            }
            // The grouping in the new input's host indices: hosts past the dead one move down;
            // the dead one's cluster names a host that is no longer there.
            let mut old = g.clone();
            let remap = |h: usize| {
                if h == dead {
                    usize::MAX
                } else if h > dead {
                    h - 1
                } else {
                    h
                }
            };
            old.root = remap(old.root);
            for c in &mut old.clusters {
                c.host = remap(c.host);
            }
            let (regroup_ms, moved) = time(args.rounds, || {
                regroup(&after, &old, &RegroupPolicy::default()).is_some()
            });
            let name = if per_pair { "per-pair" } else { "endpoint" };
            eprintln!(
                "{:<9} {:>6} {:>6} {:>11.2} {:>13.2} {:>8.3}s {:>9.3}s {:>9.3}s {:>8.2} {:>10.2}",
                name,
                hosts,
                g.clusters.len(),
                group_ms,
                regroup_ms,
                g.round_time_s,
                f.round_time_s,
                ring,
                f.round_time_s / g.round_time_s,
                ring / g.round_time_s,
            );
            rows.push(json!({
                "input": name, "workers": args.workers, "hosts": hosts,
                "group_ms_median": group_ms, "regroup_ms_median": regroup_ms, "regrouped": moved,
                "round_s": {"tree": g.round_time_s, "flat": f.round_time_s, "ring": ring},
                "aggregators": g.clusters.len(),
            }));
        }
    }
    eprintln!(
        "statistic: median of {} runs on one core; model round times for a 100 MiB gradient",
        args.rounds
    );
    println!("{}", json!({"bench": "agg-grouping", "rows": rows}));
    Ok(())
}
