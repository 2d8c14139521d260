//! `agg-grouping`: how fast the ALEPH grouping (`yard_planner::grouping`) decides, on one core
//! (it is single-threaded, and this program runs it on its main thread only), and what its
//! model says of the tree against flat aggregation and a ring on the same inputs.
//!
//! - Grouping 1,000 workers over 24, 32 and 128 aggregating hosts, at most `--max-load` (64,
//!   the XDP program's bitmap) streams on one aggregator as the leader groups them (1,000
//!   workers need 17 hosts at least: 64 − 16 at the root and 63 under each of 16 clusters),
//!   two inputs:
//!   - endpoint: bandwidth limited at the endpoints, `b(w, h) = min(up_w, down_h)`, workers at
//!     1, 1/2 or 1/4 of the base (a quarter of them slow), hosts at 1 or 2, a third of them
//!     CPU-limited to 3/4 of their link: uniform eligibility, the exact closed form;
//!   - per-pair: the same hosts in racks of 8, workers spread
//!     over the racks; a pair across racks keeps a quarter of its endpoint figure
//!     (oversubscribed uplinks), one worker in ten sits on an aggregating host of its rack
//!     (bandwidth 0: not its own aggregator), one pair in twenty is cut to 10–50% (a congested
//!     path): eligibility differs per worker, the greedy by max-flow (more than six hosts).
//!
//!   The greedy is also timed on the endpoint input (`greedy ms`), where it must find the
//!   closed form's round time (`same T`).
//! - Regrouping after a death: the host serving the largest cluster other than the root's is
//!   removed, the old grouping renumbered onto the survivors (its dead host's cluster left
//!   pointing at a host that is gone) and `regroup` run on what is left: it must move.
//! - The model's round time of the tree, of flat aggregation on the best single host (without
//!   the aggregator's member limit: a parameter server over TCP), and of a ring among the
//!   workers, on the same inputs (ratios, same inputs on both sides).
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
use yard_planner::grouping::{
    flat, group, group_with, regroup, ring_time, GroupOptions, Grouping, GroupingInput,
    RegroupPolicy,
};

#[derive(Debug, Parser)]
#[command(about = "ALEPH grouping time for 1,000 workers, regrouping time, model round times")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    /// Runs per figure (the median is printed).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Most streams on one aggregator (0: no limit).
    #[arg(long, default_value_t = 64)]
    max_load: usize,
}

const BASE: f64 = 1.25e9; // 10 Gbit/s in bytes/s

fn endpoint(rng: &mut ChaCha8Rng, workers: usize, hosts: usize) -> GroupingInput {
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
    let capacity = down
        .iter()
        .map(|d| {
            if rng.gen_bool(1.0 / 3.0) {
                d * 0.75
            } else {
                *d
            }
        })
        .collect();
    GroupingInput {
        gradient_bytes: 100 << 20,
        workers,
        capacity_bps: capacity,
        bandwidth: up
            .iter()
            .map(|u| down.iter().map(|d| u.min(*d)).collect())
            .collect(),
        max_load: None,
    }
}

fn per_pair(rng: &mut ChaCha8Rng, workers: usize, hosts: usize) -> GroupingInput {
    let mut i = endpoint(rng, workers, hosts);
    let racks = (hosts / 8).max(2);
    let host_rack = |h: usize| h * racks / hosts;
    for (w, row) in i.bandwidth.iter_mut().enumerate() {
        let rack = w % racks;
        let home: Vec<usize> = (0..hosts).filter(|h| host_rack(*h) == rack).collect();
        let own = rng
            .gen_bool(0.1)
            .then(|| home[rng.gen_range(0..home.len())]);
        for (h, b) in row.iter_mut().enumerate() {
            if host_rack(h) != rack {
                *b *= 0.25;
            }
            if own == Some(h) {
                *b = 0.0;
            } else if rng.gen_bool(0.05) {
                *b *= rng.gen_range(0.1..0.5);
            }
        }
    }
    i
}

/// The median wall time of `rounds` runs of `f` (ms), and its last result.
fn time<T>(rounds: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut samples = Vec::new();
    let mut last = None;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        last = Some(f());
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    (
        stats::median(&samples).unwrap_or(0.0),
        last.expect("one round"),
    )
}

/// `input` without host `dead`, and `g` renumbered onto the survivors (a cluster on the dead
/// host keeps pointing past the last one: a host that is gone).
fn without(input: &GroupingInput, g: &Grouping, dead: usize) -> (GroupingInput, Grouping) {
    let mut after = input.clone();
    after.capacity_bps.remove(dead);
    for row in &mut after.bandwidth {
        row.remove(dead);
    }
    let gone = after.capacity_bps.len();
    let remap = |h: usize| match h.cmp(&dead) {
        std::cmp::Ordering::Less => h,
        std::cmp::Ordering::Equal => gone,
        std::cmp::Ordering::Greater => h - 1,
    };
    let mut old = g.clone();
    old.root = remap(old.root);
    for c in &mut old.clusters {
        c.host = remap(c.host);
    }
    (after, old)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = cpu_model();
    eprintln!(
        "one thread on a machine of {cpus} CPUs ({model}); medians of {} runs",
        args.rounds
    );
    let mut rows: Vec<Value> = Vec::new();
    eprintln!(
        "{:<9} {:>5} {:>8} {:>9} {:>10} {:>10} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "input",
        "hosts",
        "clusters",
        "group ms",
        "greedy ms",
        "regroup ms",
        "T tree",
        "T flat",
        "T ring",
        "flat/tree",
        "ring/tree",
        "same T"
    );
    let started = Instant::now();
    for per in [false, true] {
        for hosts in [24usize, 32, 128] {
            let mut rng = ChaCha8Rng::seed_from_u64(args.seed + hosts as u64);
            let mut i = if per {
                per_pair(&mut rng, args.workers, hosts)
            } else {
                endpoint(&mut rng, args.workers, hosts)
            };
            let unlimited = i.clone();
            i.max_load = (args.max_load > 0).then_some(args.max_load);
            let (group_ms, g) = time(args.rounds, || group(&i).expect("a grouping"));
            // The greedy on the endpoint input (the per-pair one takes it already).
            let (greedy_ms, same) = if per {
                (None, None)
            } else {
                let (ms, gg) = time(args.rounds, || {
                    group_with(&i, GroupOptions::greedy()).expect("a grouping")
                });
                let same = (gg.round_time_s - g.round_time_s).abs() <= 1e-9 * g.round_time_s;
                (Some(ms), Some(same))
            };
            let f = flat(&unlimited).ok();
            let ring = ring_time(&i);
            // The host of the largest cluster other than the root's dies.
            let dead = g
                .clusters
                .iter()
                .filter(|c| c.host != g.root)
                .max_by_key(|c| c.members.len())
                .map_or(g.root, |c| c.host);
            let (after, old) = without(&i, &g, dead);
            let (regroup_ms, moved) = time(args.rounds, || {
                regroup(&after, &old, &RegroupPolicy::default())
            });
            let name = if per { "per-pair" } else { "endpoint" };
            let t_flat = f.as_ref().map(|f| f.round_time_s);
            let fmt = |x: Option<f64>, p: usize| x.map_or("-".into(), |x| format!("{x:.p$}"));
            eprintln!(
                "{:<9} {:>5} {:>8} {:>9.2} {:>10} {:>10.2} {:>7.3}s {:>9} {:>8.3}s {:>9} {:>9.2} {:>7}",
                name,
                hosts,
                g.clusters.len(),
                group_ms,
                fmt(greedy_ms, 2),
                regroup_ms,
                g.round_time_s,
                t_flat.map_or("-".into(), |t| format!("{t:.3}s")),
                ring,
                fmt(t_flat.map(|t| t / g.round_time_s), 2),
                ring / g.round_time_s,
                same.map_or("-", |s| if s { "yes" } else { "NO" }),
            );
            rows.push(json!({
                "input": name, "workers": args.workers, "hosts": hosts, "max_load": i.max_load,
                "group_ms_median": group_ms,
                "greedy_ms_median": greedy_ms, "greedy_same_round_time": same,
                "regroup_ms_median": regroup_ms, "regrouped": moved.is_some(),
                "dead_host": dead,
                "round_s": {"tree": g.round_time_s, "flat": t_flat, "ring": ring},
                "ratio": {"flat_over_tree": t_flat.map(|t| t / g.round_time_s),
                          "ring_over_tree": ring / g.round_time_s},
                "round_s_after_death": moved.map(|m| m.round_time_s),
                "aggregators": g.clusters.len(),
            }));
        }
    }
    eprintln!(
        "statistic: median of {} runs each, one thread; model round times for a 100 MiB \
         gradient; whole run {:.1} s",
        args.rounds,
        started.elapsed().as_secs_f64()
    );
    println!(
        "{}",
        json!({
            "bench": "agg-grouping", "cpus": cpus, "cpu_model": model,
            "threads": 1, "rounds": args.rounds, "statistic": "median",
            "rows": rows,
        })
    );
    Ok(())
}
