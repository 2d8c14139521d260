//! `diagnosis`: the analyzer's figures on simulated jobs.
//!
//! - **scale**: time from fault onset to a correct verdict at 64 … 16,384 ranks, and what the
//!   analyzer's work costs per 100 ms summary window (it must stay well under the window to keep
//!   up); the simulated clock gives the decision time, the wall clock the processing time.
//! - **throughput**: events/s through `ingest` on one core, and with `evaluate` every window.
//! - **accuracy**: the labelled catalogue scored live and from Flight Recorder dumps, beside a
//!   baseline in the same run: PyTorch's `fr_trace` matching rules applied to the same dumps.
//!
//! A benchmark: figures only (JSON on stdout, tables on stderr); never fails on a number.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};
use yard_diagnosis::analyzer::{Config, JobAnalyzer};
use yard_diagnosis::event::{Event, Rank};
use yard_diagnosis::import::fr::{to_trace, FrDump};
use yard_diagnosis::score::{self, Scale};
use yard_diagnosis::sim::{self, Fault, GroupKind, SimSpec, Topology};
use yard_diagnosis::verdict::{Class, Verdict};

/// The analyzer's evaluation period, as on the leader (`analyzer.evaluate_ms`).
const WINDOW_NS: u64 = 100_000_000;
/// Per-step compute of the scale jobs (before pipelining).
const STEP_COMPUTE_NS: u64 = 100_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    Scale,
    Throughput,
    Accuracy,
}

#[derive(Debug, Parser)]
#[command(about = "the analyzer: time to locate by scale, events/s, accuracy vs PyTorch's rules")]
struct Args {
    /// What to run (all by default).
    #[arg(long, value_enum)]
    only: Vec<Part>,
    /// Rank counts for the scale part (each a multiple of 64).
    #[arg(long, value_delimiter = ',', default_values_t = [64u32, 1024, 4096, 16384])]
    ranks: Vec<u32>,
    /// Largest job that also gets the slowdown scenario (it needs 40+ simulated steps).
    #[arg(long, default_value_t = 4096)]
    slow_max_ranks: u32,
    /// Catalogue size for the accuracy part.
    #[arg(long, value_enum, default_value = "small")]
    accuracy_scale: ScaleArg,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ScaleArg {
    Smoke,
    Small,
    Medium,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let want = |p: Part| args.only.is_empty() || args.only.contains(&p);
    let cfg = Config::default();
    let mut report = serde_json::Map::new();
    if want(Part::Scale) {
        report.insert("scale".into(), scale_part(&args, &cfg)?);
    }
    if want(Part::Throughput) {
        report.insert("throughput".into(), throughput_part(&cfg)?);
    }
    if want(Part::Accuracy) {
        let scale = match args.accuracy_scale {
            ScaleArg::Smoke => Scale::Smoke,
            ScaleArg::Small => Scale::Small,
            ScaleArg::Medium => Scale::Medium,
        };
        report.insert("accuracy".into(), accuracy_part(scale, &cfg)?);
    }
    println!("{}", serde_json::to_string_pretty(&Value::Object(report))?);
    Ok(())
}

/// A Megatron-like shape for `ranks` (8 GPUs per node, TP 8 inside a node, PP 4; small jobs
/// TP 4 × PP 2).
fn shape(ranks: u32) -> SimSpec {
    let nodes = (ranks / 8).max(1);
    let (tp, pp) = if ranks <= 64 { (4, 2) } else { (8, 4) };
    let mut spec = SimSpec::new(nodes, 8, tp, pp);
    spec.step_compute_ns = STEP_COMPUTE_NS;
    spec.links.nodes_per_tor = 4;
    spec
}

/// The simulated time at which step `step` is half done.
fn at_step(spec: &SimSpec, step: u32) -> u64 {
    let step_ns = u64::from(spec.pp) * spec.step_compute_ns;
    u64::from(step) * step_ns + step_ns / 2
}

/// The scale part's scenarios for one job shape.
fn scenarios(spec: &SimSpec, topo: &Topology, slow: bool) -> Vec<(&'static str, Fault, u32)> {
    let culprit: Rank = topo.world / 3 + 1;
    let dp_group = topo
        .groups
        .iter()
        .find(|g| g.kind == GroupKind::Dp && g.ranks.contains(&culprit))
        .map(|g| g.name.to_string())
        .unwrap_or_else(|| "world".into());
    let mut out = vec![
        (
            "process_freeze",
            Fault::ProcessFreeze {
                rank: culprit,
                onset_ns: at_step(spec, 3),
            },
            8,
        ),
        (
            "skip_collective",
            Fault::SkipCollective {
                rank: culprit,
                pg: dp_group,
                seq: 4,
            },
            8,
        ),
    ];
    if slow {
        out.push((
            "slow_nic",
            Fault::SlowNic {
                node: topo.world / topo.gpus_per_node / 2,
                factor: 4.0,
                onset_ns: at_step(spec, 24),
            },
            44,
        ));
    }
    out
}

/// Streams one scenario into an analyzer window by window, timing the analyzer's work. The
/// label is only known once the stream ends (a fault's onset is when it fires), so the top
/// verdict's changes are kept and judged afterwards.
fn run_timed(spec: &SimSpec, cfg: &Config) -> Result<Value> {
    let topo = Topology::new(spec)?;
    let mut analyzer = JobAnalyzer::new(spec.job.clone(), cfg.clone());
    let mut window: Vec<(u64, Event)> = Vec::new();
    let mut next_eval = spec.epoch_ns + WINDOW_NS;
    let mut window_ms: Vec<f64> = Vec::new();
    // (time, top verdict) each time the top verdict changes.
    let mut tops: Vec<(u64, Option<Verdict>)> = Vec::new();
    let mut events = 0u64;
    let mut step = |window: &mut Vec<(u64, Event)>, now: u64, analyzer: &mut JobAnalyzer| {
        let t = Instant::now();
        for (recv, ev) in window.drain(..) {
            analyzer.ingest(&ev, recv);
        }
        let top = analyzer.evaluate(now).first().cloned();
        window_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if tops.last().is_none_or(|(_, last)| {
            last.as_ref().map(Verdict::key) != top.as_ref().map(Verdict::key)
        }) {
            tops.push((now, top));
        }
    };
    let summary = sim::simulate_into(spec, &mut |t, ev| {
        events += 1;
        while next_eval <= t {
            step(&mut window, next_eval, &mut analyzer);
            next_eval += WINDOW_NS;
        }
        window.push((t, ev.clone()));
    })?;
    while next_eval <= summary.end_ns + WINDOW_NS {
        step(&mut window, next_eval, &mut analyzer);
        next_eval += WINDOW_NS;
    }
    let l = summary.label;
    let first_verdict = tops
        .iter()
        .find(|(t, v)| v.is_some() && *t >= l.onset_ns)
        .map(|(t, _)| *t);
    let located = tops
        .iter()
        .find(|(t, v)| {
            *t >= l.onset_ns
                && v.as_ref()
                    .is_some_and(|v| score::matches_label(v, &l, &topo))
        })
        .map(|(t, _)| *t);
    let final_top = tops.last().and_then(|(_, v)| v.clone());
    let correct = final_top
        .as_ref()
        .is_some_and(|v| score::matches_label(v, &l, &topo));
    window_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| window_ms[((window_ms.len() - 1) as f64 * p) as usize];
    let since_onset = |t: Option<u64>| t.map(|t| t.saturating_sub(l.onset_ns) as f64 / 1e9);
    Ok(json!({
        "ranks": topo.world,
        "events": events,
        "simulated_s": summary.end_ns.saturating_sub(spec.epoch_ns) as f64 / 1e9,
        "truth": l.category(),
        "predicted": final_top.as_ref().map(|v| format!("{}/{}", v.class, v.subtype)),
        "correct": correct,
        "detect_s": since_onset(first_verdict),
        "locate_s": since_onset(located),
        "window_ms_p50": pct(0.5),
        "window_ms_p99": pct(0.99),
        "window_ms_max": pct(1.0),
        "retained_records": analyzer.retained_records(),
    }))
}

fn scale_part(args: &Args, cfg: &Config) -> Result<Value> {
    let mut rows = Vec::new();
    eprintln!("| ranks | scenario | truth | verdict | detect | locate | window p50 / p99 / max | events |");
    eprintln!("|---|---|---|---|---|---|---|---|");
    for &ranks in &args.ranks {
        let base = shape(ranks);
        let topo = Topology::new(&base)?;
        for (name, fault, steps) in scenarios(&base, &topo, ranks <= args.slow_max_ranks) {
            let mut spec = base.clone();
            spec.steps = steps;
            spec.fault = Some(fault);
            spec.job = format!("{name}-{ranks}");
            let wall = Instant::now();
            let mut row = run_timed(&spec, cfg)?;
            row["scenario"] = json!(name);
            row["wall_s"] = json!(wall.elapsed().as_secs_f64());
            let s = |k: &str| {
                row[k]
                    .as_f64()
                    .map_or("never".into(), |v| format!("{v:.2} s"))
            };
            let ms = |k: &str| row[k].as_f64().map_or("-".into(), |v| format!("{v:.1}"));
            eprintln!(
                "| {ranks} | {name} | {} | {}{} | {} | {} | {} / {} / {} ms | {} |",
                row["truth"].as_str().unwrap_or(""),
                row["predicted"].as_str().unwrap_or("none"),
                if row["correct"] == json!(true) {
                    " ✓"
                } else {
                    " ✗"
                },
                s("detect_s"),
                s("locate_s"),
                ms("window_ms_p50"),
                ms("window_ms_p99"),
                ms("window_ms_max"),
                row["events"],
            );
            rows.push(row);
        }
    }
    Ok(json!({ "window_ms": WINDOW_NS / 1_000_000, "runs": rows, "target_locate_s_at_4096": 5.0 }))
}

/// Events/s through `ingest` alone and with `evaluate` every window, on a healthy 4,096-rank
/// stream held in memory; beside the floor of merely walking the same events.
fn throughput_part(cfg: &Config) -> Result<Value> {
    let mut spec = shape(4096);
    spec.steps = 6;
    let simulation = sim::simulate(&spec)?;
    let events = &simulation.events;
    let n = events.len() as f64;
    let mut best_floor = f64::MAX;
    let mut best_ingest = f64::MAX;
    let mut best_both = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let mut sum = 0u64;
        for (recv, ev) in events {
            sum = sum.wrapping_add(*recv ^ u64::from(ev.rank().unwrap_or(0)));
        }
        std::hint::black_box(sum);
        best_floor = best_floor.min(t.elapsed().as_secs_f64());

        let mut a = JobAnalyzer::new("t", cfg.clone());
        let t = Instant::now();
        for (recv, ev) in events {
            a.ingest(ev, *recv);
        }
        best_ingest = best_ingest.min(t.elapsed().as_secs_f64());

        let mut a = JobAnalyzer::new("t", cfg.clone());
        let mut next = spec.epoch_ns + WINDOW_NS;
        let t = Instant::now();
        for (recv, ev) in events {
            while next <= *recv {
                std::hint::black_box(a.evaluate(next).len());
                next += WINDOW_NS;
            }
            a.ingest(ev, *recv);
        }
        best_both = best_both.min(t.elapsed().as_secs_f64());
    }
    let figures = json!({
        "ranks": 4096,
        "events": events.len(),
        "ingest_events_per_s": n / best_ingest,
        "ingest_and_evaluate_events_per_s": n / best_both,
        "floor_walk_events_per_s": n / best_floor,
        "ingest_ns_per_event": best_ingest * 1e9 / n,
        "target_events_per_s": 1_000_000,
    });
    eprintln!(
        "throughput (4,096 ranks, {} events, one core): ingest {:.2} M events/s, with evaluate every 100 ms {:.2} M/s (floor: walking the events {:.0} M/s)",
        events.len(),
        n / best_ingest / 1e6,
        n / best_both / 1e6,
        n / best_floor / 1e6
    );
    Ok(figures)
}

/// The catalogue live and offline, and PyTorch's matching rules on the same dumps.
fn accuracy_part(scale: Scale, cfg: &Config) -> Result<Value> {
    let outcomes = score::run_catalogue(scale, cfg, true)?;
    let (live, offline): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(|o| !o.offline);
    let live_card = score::score(&live);
    let offline_card = score::score(&offline);
    eprintln!("live (probe event stream):\n{}", live_card.to_table());
    eprintln!(
        "offline (Flight Recorder dumps):\n{}",
        offline_card.to_table()
    );

    // The baseline: PyTorch's rules on the very dumps the offline path read.
    let mut by_class: BTreeMap<String, (u32, u32, u32)> = BTreeMap::new();
    for (name, spec) in score::catalogue(scale) {
        let Some(ours) = offline.iter().find(|o| o.name == format!("{name}-offline")) else {
            continue;
        };
        let simulation = sim::simulate(&spec)?;
        let dumps = sim::fr_dumps(&simulation, &spec)?;
        let label = simulation.label;
        let ours = ours.top1_correct;
        let got = pytorch_rules(&dumps, &to_trace(&dumps).world);
        let theirs = match got {
            Some((class, culprits)) => Some(class) == label.class && culprits == label.culprits,
            None => label.class.is_none(),
        };
        let e = by_class.entry(label.category()).or_default();
        e.0 += 1;
        e.1 += u32::from(ours);
        e.2 += u32::from(theirs);
    }
    eprintln!("| class (offline, FR dumps) | n | yard top-1 | PyTorch fr_trace rules top-1 |");
    eprintln!("|---|---|---|---|");
    let mut rows = Vec::new();
    for (class, (n, ours, theirs)) in &by_class {
        let pct = |k: u32| 100.0 * f64::from(k) / f64::from(*n);
        eprintln!(
            "| {class} | {n} | {:.1}% | {:.1}% |",
            pct(*ours),
            pct(*theirs)
        );
        rows.push(json!({"class": class, "n": n, "yard_top1": pct(*ours) / 100.0, "pytorch_rules_top1": pct(*theirs) / 100.0}));
    }
    Ok(json!({
        "live": live_card,
        "offline": offline_card,
        "offline_vs_pytorch_rules": rows,
    }))
}

/// PyTorch's `fr_trace` decision, reimplemented from its documented rules for comparison
/// (collectives only; its coalesced and send/recv matching is left out): refuse when a member's
/// dump is missing; otherwise repeatedly take the first remaining entry of the first rank that
/// has any, and look for the same (group, seq) among every other member's remaining entries:
/// absent → "not all ranks joining" (the absent ranks, if the op never completed); a different
/// type, size or dtype → the *other* rank is the culprit; matched entries are consumed.
/// Returns (class, culprits) of the first finding it prints (what a reader acts on), `None` when
/// it finds nothing or refuses.
fn pytorch_rules(dumps: &[FrDump], world: &[Rank]) -> Option<(Class, Vec<Rank>)> {
    use std::collections::VecDeque;
    if world.iter().any(|r| !dumps.iter().any(|d| d.rank == *r)) {
        return None; // "Missing dump files from ranks …": cannot decide.
    }
    let mut queues: BTreeMap<Rank, VecDeque<&yard_diagnosis::import::fr::FrEntry>> = dumps
        .iter()
        .map(|d| {
            let q = d
                .entries
                .iter()
                .filter(|e| {
                    !e.is_p2p
                        && !e.profiling_name.contains("send")
                        && !e.profiling_name.contains("recv")
                })
                .collect();
            (d.rank, q)
        })
        .collect();
    loop {
        let (&first, _) = queues.iter().find(|(_, q)| !q.is_empty())?;
        let e = queues.get_mut(&first)?.pop_front()?;
        let Some(pg) = dumps
            .iter()
            .find_map(|d| d.pg_config.get(&e.process_group.0))
        else {
            continue;
        };
        let (mut missing, mut culprits) = (Vec::new(), Vec::new());
        for &o in pg.ranks.iter().filter(|&&o| o != first) {
            let Some(q) = queues.get_mut(&o) else {
                continue;
            };
            let at = q.iter().position(|x| {
                x.process_group.0 == e.process_group.0 && x.collective_seq_id == e.collective_seq_id
            });
            match at {
                None => missing.push(o),
                Some(i) => {
                    let x = q[i];
                    if x.profiling_name != e.profiling_name
                        || x.input_sizes != e.input_sizes
                        || x.input_dtypes != e.input_dtypes
                    {
                        culprits.push(o);
                    }
                    q.remove(i);
                }
            }
        }
        if !culprits.is_empty() {
            culprits.sort_unstable();
            return Some((Class::Mismatch, culprits));
        }
        if !missing.is_empty() && e.state != "completed" {
            missing.sort_unstable();
            return Some((Class::Hang, missing));
        }
    }
}
