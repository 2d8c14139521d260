//! The aggregator part of the main job (`deploy/demo.sh`): seven `yard` nodes in namespaces,
//! three of them summing in XDP, and a real PyTorch DDP job of four ranks (one per worker host,
//! Debian's torch 1.13 on gloo for DDP's own broadcasts) whose gradients go through
//! `yard_agg.hook`; the aggregating node is killed with -9 mid-training, the job moves and
//! training completes. Then each rank's parameters are compared with the same training on
//! gloo's all-reduce, and across ranks bit for bit. Every figure printed is measured and every
//! claim checked, or the demo fails: the kill lands while every rank still has steps to do
//! (their logs say which step each is at), the job's aggregator changes to a live node (one
//! Raft command is claimed only if the epoch moved by exactly one), and the new aggregator's
//! own counters show it completed every chunk of every round that began after the kill.
//! Needs root and torch; cleans up on exit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::Value;
use yard_cluster_tests::torch::{self, AggRanks};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};

const AGGREGATORS: usize = 3;
const WORKERS: usize = 4;
const STEPS: u32 = 40;
/// Simulated compute per step: 40 steps take at least 12 s, so the kill, after a few steps,
/// finds every rank mid-training (without it the ranks could finish before the job moved).
const STEP_SLEEP_MS: &str = "300";
/// Hook steps every rank has done when the aggregator is killed.
const STEPS_BEFORE_KILL: u32 = 3;

fn cli(c: &YardCluster, i: usize, args: &[&str]) -> Result<String, String> {
    let out = c
        .cli_to(i, &c.all_endpoints(), args)
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "yard {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn job(c: &YardCluster) -> Result<Value, String> {
    let text = cli(c, 1, &["agg", "job", "show", "demo-ddp", "--json"])?;
    serde_json::from_str(&text).map_err(|e| format!("job show: {e}"))
}

/// The hook steps rank `p` has logged (`hook step N` lines of `agg_torch_job.py`).
fn hook_steps(p: &yard_cluster_tests::Process) -> u32 {
    p.log_tail(usize::try_from(STEPS).unwrap_or(40) * 4)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("hook step ")?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Chunks of job `id` node `i`'s aggregator has completed (`yard agg stats`, asked of node
/// `i` alone: the stats are that node's own).
fn completed_on(c: &YardCluster, i: usize, id: u64) -> Result<u64, String> {
    let out = c
        .cli(i, &["agg", "stats", "--json"])
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "yard agg stats on node {i}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("agg stats: {e}"))?;
    Ok(v["jobs"]
        .as_array()
        .and_then(|js| js.iter().find(|j| j["id"].as_u64() == Some(id)))
        .and_then(|j| j["counters"]["completed"]["packets"].as_u64())
        .unwrap_or(0))
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|b| f32::from_bits(b as u32))
                .collect()
        })
        .unwrap_or_default()
}

fn run(bin: &Path) -> Result<(), String> {
    let python = torch::torch_python();
    let version = torch::torch_version(&python)?;
    let values = torch::agg_model_values(&python)?;
    let nodes = AGGREGATORS + WORKERS;
    // Relaxed liveness and Raft timing, as in the real-torch test (`torch::AGG_TORCH_TIMING` says why).
    let opts = ClusterOptions {
        extra_config: format!(
            "{}{}",
            yard_cluster_tests::yard::aggregator_config(32),
            torch::AGG_TORCH_TIMING
        ),
        ..Default::default()
    };
    let mut c = YardCluster::start(bin, nodes, nodes, &opts).map_err(|e| e.to_string())?;
    // The roles as the leader reports them: past three voters and two replicas, agents.
    let status = c.status(1).map_err(|e| e.to_string())?;
    let roles: Vec<String> = status["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| format!("n{} {}", m["id"], m["role"].as_str().unwrap_or("?")))
                .collect()
        })
        .unwrap_or_default();
    println!("agg demo: {nodes} hosts joined: {}", roles.join(", "));
    let size = (values * 4).to_string();
    cli(
        &c,
        1,
        &[
            "agg",
            "job",
            "create",
            "demo-ddp",
            "--grouping",
            "flat",
            "--workers",
            "4",
            "--size",
            &size,
            "--dtype",
            "f32",
        ],
    )?;
    println!("agg demo: torch {version}; job demo-ddp sums {values} float32 values a step");
    let hosts: Vec<usize> = (AGGREGATORS + 1..=nodes).collect();
    let out_dir = c.topology().dir().join("agg-demo");
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let ranks = torch::start_agg_ranks(
        &c,
        &python,
        &AggRanks {
            job: "demo-ddp",
            hosts: &hosts,
            nic: "eth0",
            steps: STEPS,
            out_dir: &out_dir,
            extra: &["--step-sleep-ms", STEP_SLEEP_MS],
        },
    )
    .map_err(|e| e.to_string())?;
    // Once every rank has summed a few steps through it, the aggregating node dies.
    let began = Instant::now();
    let (node, epoch, id) = loop {
        let j = job(&c)?;
        if j["running"] == true && ranks.iter().all(|p| hook_steps(p) >= STEPS_BEFORE_KILL) {
            break (
                j["aggregator_node"].as_u64().unwrap_or(0) as usize,
                j["epoch"].as_u64().unwrap_or(0),
                j["id"].as_u64().unwrap_or(0),
            );
        }
        if began.elapsed() > Duration::from_secs(120) {
            return Err("the job never ran".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("{}", cli(&c, 1, &["agg", "job", "show", "demo-ddp"])?);
    c.kill9(node).map_err(|e| e.to_string())?;
    let killed = Instant::now();
    let at_kill: Vec<u32> = ranks.iter().map(hook_steps).collect();
    if at_kill.iter().any(|s| *s >= STEPS) {
        return Err(format!(
            "a rank had finished its {STEPS} steps when node {node} was killed (steps {at_kill:?}): nothing was left to move"
        ));
    }
    println!(
        "agg demo: kill -9 of node {node}, which sums the job (epoch {epoch}), the ranks at hook steps {at_kill:?} of {STEPS}"
    );
    // The move, as the tables show it: another, live node sums the job at a newer epoch.
    let (now, moved_epoch) = loop {
        let j = job(&c)?;
        let at = j["aggregator_node"].as_u64().unwrap_or(0) as usize;
        let e = j["epoch"].as_u64().unwrap_or(0);
        if j["running"] == true && at != 0 && at != node && e > epoch {
            break (at, e);
        }
        if killed.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "the job did not move off node {node} within 120 s of the kill: {j}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let moved_after = killed.elapsed();
    let at_move: Vec<u32> = ranks.iter().map(hook_steps).collect();
    let how = if moved_epoch == epoch + 1 {
        "in one Raft command (epoch + 1)".to_owned()
    } else {
        format!("{} epochs later", moved_epoch - epoch)
    };
    println!(
        "agg demo: the job moved to node {now} at epoch {moved_epoch}, {how}, {:.1} s after the kill, the ranks at hook steps {at_move:?}",
        moved_after.as_secs_f64()
    );
    for (r, p) in ranks.iter().enumerate() {
        let left = Duration::from_secs(300).saturating_sub(killed.elapsed());
        match p.wait_exit(left) {
            Ok(s) if s.success() => {}
            other => {
                return Err(format!(
                    "rank {r} did not finish ({other:?}): {}",
                    p.log_tail(20)
                ))
            }
        }
    }
    println!(
        "agg demo: all {WORKERS} ranks finished {STEPS} steps, {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    // The steps after the kill were summed by the new aggregator: its own counters say so.
    let j = job(&c)?;
    if j["aggregator_node"].as_u64() != Some(now as u64) {
        return Err(format!(
            "the job moved again after node {now} took it: {}",
            j["aggregator_node"]
        ));
    }
    let summed = completed_on(&c, now, id)?;
    let chunks = j["chunks"].as_u64().unwrap_or(0);
    // Every step is one round of the whole gradient. The rank furthest ahead at the kill had
    // logged `ahead` steps; its next round may have completed on the dead node before it
    // logged it, but every round after that one can only have been summed on the new node.
    let ahead = at_kill.iter().copied().max().unwrap_or(0);
    let after_in_flight = u64::from(STEPS.saturating_sub(ahead + 1));
    let need = after_in_flight * chunks;
    if chunks == 0 || summed < need {
        return Err(format!(
            "node {now} completed {summed} chunks of the job, fewer than the {need} ({after_in_flight} rounds of {chunks} chunks) summed only after the kill"
        ));
    }
    println!(
        "agg demo: node {now} completed {summed} chunks of the job after the move, at least the {after_in_flight} rounds ({need} chunks) that began after the kill"
    );
    let reports: Vec<Value> = (0..WORKERS)
        .map(|r| {
            let path = out_dir.join(format!("rank{r}.json"));
            std::fs::read_to_string(&path)
                .map_err(|e| format!("rank {r} wrote no report: {e}"))
                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    let first = f32s(&reports[0]["hook"]);
    let differing: usize = reports[1..]
        .iter()
        .map(|r| {
            f32s(&r["hook"])
                .iter()
                .zip(&first)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count()
        })
        .sum();
    let worst = reports
        .iter()
        .flat_map(|r| {
            f32s(&r["hook"])
                .into_iter()
                .zip(f32s(&r["gloo"]))
                .map(|(h, g)| f64::from((h - g).abs()))
                .collect::<Vec<_>>()
        })
        .fold(0f64, f64::max);
    println!(
        "agg demo: {} parameters; {differing} differ in bits between ranks; largest |hook − gloo| {worst:.3e}",
        first.len()
    );
    println!("{}", cli(&c, now, &["agg", "stats"])?);
    if differing != 0 {
        return Err("the ranks' parameters differ".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let Some(yard) = std::env::args().nth(1) else {
        eprintln!("usage: agg-demo YARD_BIN");
        return ExitCode::from(2);
    };
    match run(&PathBuf::from(yard)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agg demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}
