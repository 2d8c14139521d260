//! `yard sim ccl`: simulated training jobs with injected faults, for trying the analyzer without
//! GPUs — one scenario written out (event stream, Flight Recorder dumps, ground-truth label) and
//! analyzed, or the whole labelled catalogue scored.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use yard_diagnosis::analyzer::Config as AnalyzerConfig;
use yard_diagnosis::score::{self, Scale};
use yard_diagnosis::sim::{self, Algo, Fault, SimSpec};

use super::output::Out;

#[derive(Debug, Subcommand)]
pub enum SimCmd {
    /// Collective communication of a simulated TP×PP×DP training job.
    Ccl(CclArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ScaleArg {
    /// 16 ranks, two seeds.
    Smoke,
    /// 64 ranks, three seeds.
    Small,
    /// 1,024 ranks.
    Medium,
    /// 16,384 ranks, clean variant only.
    Large,
}

impl From<ScaleArg> for Scale {
    fn from(s: ScaleArg) -> Scale {
        match s {
            ScaleArg::Smoke => Scale::Smoke,
            ScaleArg::Small => Scale::Small,
            ScaleArg::Medium => Scale::Medium,
            ScaleArg::Large => Scale::Large,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AlgoArg {
    Ring,
    Tree,
}

#[derive(Debug, Args)]
pub struct CclArgs {
    /// List the labelled scenarios' names: the fault catalogue at --scale, then the job kinds
    /// (pipeline, HSDP, TP with sequence parallelism, DiLoCo).
    #[arg(long, conflicts_with_all = ["score", "scenario"])]
    list: bool,
    /// Run the whole catalogue through the analyzer and print the scorecard.
    #[arg(long, conflicts_with = "scenario")]
    score: bool,
    /// With --score: score the job kinds instead of the fault catalogue (live, and offline from
    /// their Flight Recorder dumps where a dump can show the fault).
    #[arg(long, requires = "score", conflicts_with = "offline")]
    kinds: bool,
    /// Also score the Flight Recorder (offline) path.
    #[arg(long, requires = "score")]
    offline: bool,
    /// One scenario of the catalogue, e.g. `skip_collective-s1-clean` (see --list).
    #[arg(long)]
    scenario: Option<String>,
    /// The catalogue's size.
    #[arg(long, value_enum, default_value = "smoke")]
    scale: ScaleArg,
    /// Write the event stream, label, spec and Flight Recorder dumps here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// A custom job instead of a catalogue scenario: nodes.
    #[arg(long, conflicts_with_all = ["scenario", "score", "list"])]
    nodes: Option<u32>,
    /// GPUs (ranks) per node.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Tensor-parallel group size (inside a node).
    #[arg(long, default_value_t = 2)]
    tp: u32,
    /// Pipeline stages.
    #[arg(long, default_value_t = 2)]
    pp: u32,
    #[arg(long, value_enum, default_value = "ring")]
    algo: AlgoArg,
    #[arg(long, default_value_t = 20)]
    steps: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The fault, as JSON, e.g. `{"fault":"process_freeze","rank":3,"onset_ns":2000000000}`.
    #[arg(long, value_name = "JSON")]
    fault: Option<String>,
    /// Hosts' clocks are off by up to ± this many milliseconds.
    #[arg(long, default_value_t = 0)]
    clock_skew_ms: u64,
    /// Ranks (chosen by seed) whose Flight Recorder dump is missing.
    #[arg(long, default_value_t = 0)]
    missing_dumps: u32,
    /// Flight Recorder ring-buffer entries per rank (0 keeps all).
    #[arg(long, default_value_t = 0)]
    fr_buffer: usize,
    /// Fraction of probe reports lost on the way to the analyzer.
    #[arg(long, default_value_t = 0.0)]
    drop: f64,
}

pub fn run(cmd: &SimCmd, out: Out) -> anyhow::Result<ExitCode> {
    let SimCmd::Ccl(args) = cmd;
    let cfg = AnalyzerConfig::default();
    let scale: Scale = args.scale.into();
    if args.list {
        for (catalogue, name, spec) in scenarios(scale)? {
            out.line(
                json!({"scenario": name, "catalogue": catalogue, "ranks": spec.world()}),
                || name,
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.score {
        let outcomes = if args.kinds {
            score::run_kinds(KIND_SEEDS, &cfg)?
        } else {
            score::run_catalogue(scale, &cfg, args.offline)?
        };
        let card = score::score(&outcomes);
        out.line(serde_json::to_value(&card)?, || card.to_table());
        return Ok(ExitCode::SUCCESS);
    }
    let spec = match (&args.scenario, args.nodes) {
        (Some(name), _) => scenarios(scale)?
            .into_iter()
            .find(|(_, n, _)| n == name)
            .map(|(_, _, s)| s)
            .with_context(|| format!("no scenario {name} in the catalogue; see --list"))?,
        (None, Some(nodes)) => custom(args, nodes)?,
        (None, None) => bail!("give --scenario NAME, --nodes N (a custom job), --list or --score"),
    };
    if let Some(dir) = &args.out {
        let simulation = sim::simulate(&spec)?;
        sim::write_outputs(&simulation, &spec, dir)?;
    }
    let live = score::run_scenario(&spec, &cfg)?;
    let secs = |ns: Option<u64>| ns.map(|n| n as f64 / 1e9);
    out.line(
        json!({
            "scenario": spec.job,
            "ranks": spec.world(),
            "label": live.label,
            "verdicts": live.final_verdicts,
            "top1_correct": live.top1_correct,
            "detect_s": secs(live.detect_ns),
            "locate_s": secs(live.locate_ns),
            "false_alarms": live.false_alarms,
            "out": args.out,
        }),
        || {
            let mut t = format!(
                "{}: {} ranks, truth {}",
                spec.job,
                spec.world(),
                live.category
            );
            if !live.label.culprits.is_empty() {
                t.push_str(&format!(" culprits {:?}", live.label.culprits));
            }
            t.push_str(&format!(
                "\nanalyzer: {}{} (detected {}, located {})",
                live.predicted,
                live.final_verdicts
                    .first()
                    .map(|v| format!(" culprits {:?}", v.culprits))
                    .unwrap_or_default(),
                secs(live.detect_ns).map_or("never".into(), |s| format!("after {s:.2} s")),
                secs(live.locate_ns).map_or("never".into(), |s| format!("after {s:.2} s")),
            ));
            t.push_str(if live.top1_correct {
                "  — correct"
            } else {
                "  — WRONG"
            });
            if let Some(dir) = &args.out {
                t.push_str(&format!(
                    "\nwrote {0}/events.jsonl, {0}/label.json and Flight Recorder dumps in {0}/fr (try: yard diagnose --fr-dumps {0}/fr)",
                    dir.display()
                ));
            }
            t
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// Seeds of the job-kinds catalogue (`sim_kinds` tests the same two).
const KIND_SEEDS: u64 = 2;

/// Every named scenario: (catalogue, name, spec), the fault catalogue at `scale` first.
fn scenarios(scale: Scale) -> anyhow::Result<Vec<(&'static str, String, SimSpec)>> {
    let mut all: Vec<(&'static str, String, SimSpec)> = score::catalogue(scale)
        .into_iter()
        .map(|(name, spec)| ("faults", name, spec))
        .collect();
    all.extend(
        score::kinds_catalogue(KIND_SEEDS)?
            .into_iter()
            .map(|k| ("kinds", k.name, k.spec)),
    );
    Ok(all)
}

fn custom(args: &CclArgs, nodes: u32) -> anyhow::Result<SimSpec> {
    if !(0.0..1.0).contains(&args.drop) {
        bail!("--drop must be at least 0 and below 1");
    }
    let mut spec = SimSpec::new(nodes, args.gpus, args.tp, args.pp);
    spec.algo = match args.algo {
        AlgoArg::Ring => Algo::Ring,
        AlgoArg::Tree => Algo::Tree,
    };
    spec.steps = args.steps;
    spec.seed = args.seed;
    spec.clock_skew_ns = args.clock_skew_ms * 1_000_000;
    spec.noise.missing_dumps = args.missing_dumps;
    spec.noise.fr_buffer = args.fr_buffer;
    spec.noise.dropped_events = args.drop;
    spec.job = format!("sim-{nodes}x{}", args.gpus);
    if let Some(text) = &args.fault {
        let fault: Fault = serde_json::from_str(text)
            .with_context(|| format!("--fault is not a fault description: {text}"))?;
        spec.fault = Some(fault);
    }
    // Checks the shape and the fault against the topology before anything runs.
    let topo = sim::Topology::new(&spec)?;
    if let Some(f) = &spec.fault {
        f.validate(&topo)?;
    }
    Ok(spec)
}
