//! `planner`: the service planner (yard-planner) against every baseline and the exact ILP, and
//! how fast it plans.
//!
//! - Quality, on small seeded instances of three families (uniform, heavy-tailed demands,
//!   heterogeneous reliability): the robust load factor the assignment reserves (and its ratio
//!   to the exact ILP of the same model), the max normalised load and the served demand with no
//!   failure, under the worst single and the worst double failure, and the mean served demand
//!   over independent Monte Carlo failures. Every figure is the mean over the seeds (max for
//!   the ILP ratio as well). Failed nodes' VIPs move by each strategy's own fast path (within
//!   the tenant's set; today's rule for the even spread).
//! - Speed, on one core (the planner is single-threaded): planning 10,000 tenants × 1,000
//!   nodes, and re-planning 1,000 VIPs after one node's death, beside the even spread and the
//!   greedy baseline timed in the same run. Medians of the rounds.
//!
//! A benchmark: figures only (JSON on stdout, a table on stderr), never fails on a number.

#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use serde_json::{json, Value};
use yard_planner::assign::reserved_load;
use yard_planner::family::{instance, Family, Shape};
use yard_planner::{
    baseline, eval, exact, plan, replan, Failover, Instance, Placement, PlanOptions,
};

#[derive(Debug, Parser)]
#[command(about = "service planner quality against baselines and the exact ILP, and its speed")]
struct Args {
    /// Seeds per family for the quality table.
    #[arg(long, default_value_t = 20)]
    seeds: u64,
    /// Tenants in a small (quality) instance.
    #[arg(long, default_value_t = 8)]
    small_tenants: usize,
    /// Nodes in a small (quality) instance.
    #[arg(long, default_value_t = 5)]
    small_nodes: usize,
    /// Total bytes/s over total capacity in every instance. With two nodes per tenant the
    /// robust reserve doubles it, so above about 0.4 no plan survives a failure unharmed.
    #[arg(long, default_value_t = 0.3)]
    utilisation: f64,
    /// Monte Carlo trials per instance.
    #[arg(long, default_value_t = 2_000)]
    trials: usize,
    /// Tenants of the speed instance.
    #[arg(long, default_value_t = 10_000)]
    tenants: usize,
    /// Nodes of the speed instance.
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// Rounds of each timing (medians reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Skip the quality part.
    #[arg(long)]
    speed_only: bool,
    /// Skip the speed part.
    #[arg(long)]
    quality_only: bool,
}

const STRATEGIES: [&str; 8] = [
    "planner",
    "exact ILP",
    "non-robust planner",
    "round robin",
    "random",
    "least-loaded (LPT)",
    "reliability-first",
    "even spread (today)",
];

fn placements(inst: &Instance, seed: u64) -> Result<Vec<Placement>> {
    let mut opts = PlanOptions::default();
    opts.assign.seed = seed;
    let planner = plan(inst, &opts)?.placement;
    let ilp = exact(inst, true, opts.epsilon)?.placement;
    opts.assign.robust = false;
    let non_robust = plan(inst, &opts)?.placement;
    Ok(vec![
        planner,
        ilp,
        non_robust,
        baseline::round_robin(inst),
        baseline::random(inst, seed),
        baseline::least_loaded(inst),
        baseline::reliability_first(inst),
        baseline::even_spread(inst),
    ])
}

#[derive(Debug, Default, Clone)]
struct Sums {
    n: f64,
    reserve: f64,
    ratio: f64,
    ratio_max: f64,
    nominal: f64,
    n1_load: f64,
    n1_served: f64,
    n2_load: f64,
    n2_served: f64,
    mc_served: f64,
    mc_p5: f64,
    met: f64,
}

fn quality(args: &Args) -> Result<(Value, String)> {
    let shape = Shape {
        tenants: args.small_tenants,
        nodes: args.small_nodes,
        units: 3,
        utilisation: args.utilisation,
    };
    let mut out = Vec::new();
    let mut table = String::new();
    for family in Family::ALL {
        let mut sums = vec![Sums::default(); STRATEGIES.len()];
        for seed in 0..args.seeds {
            let inst = instance(family, shape, seed);
            let ps = placements(&inst, seed)?;
            let reserves: Vec<f64> = ps
                .iter()
                .map(|p| {
                    // Today's spread reserves nothing: it has no sets (n/a in the table).
                    if p.failover == Failover::FewestVips {
                        return f64::NAN;
                    }
                    reserved_load(&inst, &p.sets, true)
                        .into_iter()
                        .fold(0.0, f64::max)
                })
                .collect();
            let ilp = reserves[1];
            for (i, p) in ps.iter().enumerate() {
                let r = eval::report(&inst, p, 2, args.trials, seed);
                let met = (0..inst.tenants.len())
                    .filter(|&t| {
                        inst.availability(&p.sets[t]) >= inst.tenants[t].availability - 1e-12
                    })
                    .count() as f64
                    / inst.tenants.len() as f64;
                let s = &mut sums[i];
                let ratio = if ilp > 0.0 { reserves[i] / ilp } else { 1.0 };
                s.n += 1.0;
                s.reserve += reserves[i];
                s.ratio += ratio;
                s.ratio_max = if ratio.is_nan() {
                    ratio
                } else {
                    s.ratio_max.max(ratio)
                };
                s.nominal += r.nominal.max_load;
                s.n1_load += r.worst[0].max_load;
                s.n1_served += r.worst[0].served;
                s.n2_load += r.worst[1].max_load;
                s.n2_served += r.worst[1].served;
                s.mc_served += r.monte_carlo.mean_served;
                s.mc_p5 += r.monte_carlo.p5_served;
                s.met += met;
            }
        }
        let _ = writeln!(
            table,
            "\n{} ({} seeds, {} tenants x {} nodes, 1-3 VIPs each, {:.0}% of capacity in bytes/s; means over seeds)",
            family.name(),
            args.seeds,
            shape.tenants,
            shape.nodes,
            100.0 * args.utilisation
        );
        let _ = writeln!(
            table,
            "{:<20} {:>8} {:>13} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9} {:>8} {:>7}",
            "strategy",
            "reserve",
            "vs ILP mean/max",
            "load",
            "N-1 load",
            "N-1 srv%",
            "N-2 load",
            "N-2 srv%",
            "MC srv%",
            "MC p5%",
            "avail%"
        );
        let planner_n1 = sums[0].n1_load / sums[0].n;
        let mut rows = Vec::new();
        for (i, s) in sums.iter().enumerate() {
            let m = |x: f64| x / s.n;
            let na = |x: f64, w: usize| {
                if x.is_nan() {
                    format!("{:>w$}", "n/a")
                } else {
                    format!("{x:>w$.3}")
                }
            };
            let _ = writeln!(
                table,
                "{:<20} {:>8} {:>6}/{:<6} {:>8.3} {:>8.3} {:>9.2} {:>8.3} {:>9.2} {:>9.3} {:>8.2} {:>7.1}",
                STRATEGIES[i],
                na(m(s.reserve), 8),
                na(m(s.ratio), 6),
                na(s.ratio_max, 6),
                m(s.nominal),
                m(s.n1_load),
                100.0 * m(s.n1_served),
                m(s.n2_load),
                100.0 * m(s.n2_served),
                100.0 * m(s.mc_served),
                100.0 * m(s.mc_p5),
                100.0 * m(s.met)
            );
            rows.push(json!({
                "strategy": STRATEGIES[i],
                "reserved_load_factor": m(s.reserve),
                "reserve_vs_ilp_mean": m(s.ratio),
                "reserve_vs_ilp_max": s.ratio_max,
                "max_load": m(s.nominal),
                "n1_max_load": m(s.n1_load),
                "n1_served": m(s.n1_served),
                "n2_max_load": m(s.n2_load),
                "n2_served": m(s.n2_served),
                "mc_mean_served": m(s.mc_served),
                "mc_p5_served": m(s.mc_p5),
                "availability_met": m(s.met),
                "n1_load_vs_planner": m(s.n1_load) / planner_n1,
            }));
        }
        out.push(json!({"family": family.name(), "seeds": args.seeds, "statistic": "mean over seeds", "rows": rows}));
    }
    Ok((Value::Array(out), table))
}

/// The median of the rounds (`stats.rs`, as the other benches); there is always one round.
fn median(v: Vec<f64>) -> f64 {
    stats::median(&v).unwrap_or(f64::NAN)
}

fn time<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let t = Instant::now();
    let x = f();
    (t.elapsed().as_secs_f64(), x)
}

fn speed(args: &Args) -> Result<(Value, String)> {
    let big = instance(
        Family::HeavyTailed,
        Shape {
            tenants: args.tenants,
            nodes: args.nodes,
            units: 3,
            utilisation: args.utilisation,
        },
        1,
    );
    let vips = big.unit_count();
    let (mut t_plan, mut t_even, mut t_lpt) = (Vec::new(), Vec::new(), Vec::new());
    let mut lambda = 0.0;
    for _ in 0..args.rounds.max(1) {
        let (s, p) = time(|| plan(&big, &PlanOptions::default()));
        t_plan.push(s);
        lambda = p?.assignment.lambda;
        t_even.push(time(|| baseline::even_spread(&big)).0);
        t_lpt.push(time(|| baseline::least_loaded(&big)).0);
    }
    // Re-plan: about 1,000 VIPs (410 tenants, 1–4 VIPs each) on 20 nodes, one dies.
    let small = instance(
        Family::HeavyTailed,
        Shape {
            tenants: 410,
            nodes: 20,
            units: 4,
            utilisation: args.utilisation,
        },
        2,
    );
    let p = plan(&small, &PlanOptions::default())?;
    let mut alive = vec![true; small.nodes.len()];
    alive[0] = false;
    let (mut t_replan, mut t_failover) = (Vec::new(), Vec::new());
    for _ in 0..(5 * args.rounds.max(1)) {
        t_replan.push(time(|| replan(&small, &p.assignment.sets, &alive, 0.01)).0);
        t_failover.push(
            time(|| {
                eval::loads_after(
                    &small,
                    &p.placement,
                    &alive.iter().map(|a| !a).collect::<Vec<_>>(),
                )
            })
            .0,
        );
    }
    let (plan_s, even_s, lpt_s) = (median(t_plan), median(t_even), median(t_lpt));
    let (replan_s, failover_s) = (median(t_replan), median(t_failover));
    let mut table = String::new();
    let _ = writeln!(table, "\nspeed (one core, median of rounds)");
    let _ = writeln!(
        table,
        "plan {} tenants x {} nodes ({} VIPs): {:.3} s (target < 10 s); even spread {:.3} s, LPT greedy {:.3} s; planner/LPT {:.1}x; robust load factor {:.3}",
        args.tenants, args.nodes, vips, plan_s, even_s, lpt_s, plan_s / lpt_s, lambda
    );
    let _ = writeln!(
        table,
        "re-plan {} VIPs after one node's death: {:.2} ms (target < 100 ms); fast-path failover alone {:.3} ms",
        small.unit_count(),
        1e3 * replan_s,
        1e3 * failover_s
    );
    Ok((
        json!({
            "statistic": "median of rounds",
            "plan": {"tenants": args.tenants, "nodes": args.nodes, "vips": vips, "seconds": plan_s,
                     "even_spread_seconds": even_s, "lpt_seconds": lpt_s, "robust_load_factor": lambda},
            "replan": {"vips": small.unit_count(), "nodes": small.nodes.len(), "milliseconds": 1e3 * replan_s,
                       "fast_path_failover_milliseconds": 1e3 * failover_s},
        }),
        table,
    ))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut report = serde_json::Map::new();
    let mut table = String::new();
    if !args.speed_only {
        let (v, t) = quality(&args)?;
        report.insert("quality".into(), v);
        table.push_str(&t);
    }
    if !args.quality_only {
        let (v, t) = speed(&args)?;
        report.insert("speed".into(), v);
        table.push_str(&t);
    }
    eprintln!("{table}");
    println!("{}", Value::Object(report));
    Ok(())
}
