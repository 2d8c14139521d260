//! The aggregator part of the main job (`deploy/demo.sh`): seven `yard` nodes in namespaces,
//! three of them summing in XDP, and a real PyTorch DDP job of four ranks (one per worker host,
//! Debian's torch 1.13 on gloo for DDP's own broadcasts) whose gradients go through
//! `yard_agg.hook`; the aggregating node is killed with -9 mid-training, the job moves in one
//! Raft command and training completes. Then each rank's parameters are compared with the same
//! training on gloo's all-reduce, and across ranks bit for bit. Every figure printed is measured.
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
            extra: &[],
        },
    )
    .map_err(|e| e.to_string())?;
    // Once the ranks are summing, the aggregating node dies.
    let began = Instant::now();
    let (node, epoch) = loop {
        let j = job(&c)?;
        if j["running"] == true && began.elapsed() > Duration::from_secs(3) {
            break (
                j["aggregator_node"].as_u64().unwrap_or(0) as usize,
                j["epoch"].as_u64().unwrap_or(0),
            );
        }
        if began.elapsed() > Duration::from_secs(120) {
            return Err("the job never ran".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("{}", cli(&c, 1, &["agg", "job", "show", "demo-ddp"])?);
    println!("agg demo: kill -9 of node {node}, which sums the job (epoch {epoch})");
    c.kill9(node).map_err(|e| e.to_string())?;
    let killed = Instant::now();
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
    let j = job(&c)?;
    let now = j["aggregator_node"].as_u64().unwrap_or(0) as usize;
    println!(
        "agg demo: the job moved to node {now} at epoch {} in one Raft command",
        j["epoch"]
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
