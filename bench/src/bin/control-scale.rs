//! `control-scale`: the control plane at cluster size, real daemons in network namespaces.
//! For each host count, a cluster of that many `yard` nodes (joined one by one), then, on the
//! same topology shape, the same measurements:
//! - `up`: bootstrap to every host joined (the harness waits for each join to answer);
//! - `yard bench kv` from a client host against node 1 (puts/s, p99, p999);
//! - idle CPU of all daemons over `--idle` (sum over every thread, /proc/<pid>/task/*/schedstat),
//!   and per role: voters against the others;
//! - on clusters with agents: the agents' `yard_watch_visible_seconds` histograms (a tagged
//!   write's proposal on the leader to its apply on the agent, wall clocks of one machine)
//!   merged, with the p50/p99 bucket bounds.
//!
//! With `--baseline-bin` (an older `yard`, e.g. the commit before agents, where every host
//! votes) each host count runs with both binaries, interleaved, rounds alternating which goes
//! first. A benchmark: figures only (JSON on stdout, a table on stderr), never fails on a
//! number; a run that fails is kept in the table with its error.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::Topology;

#[derive(Debug, Parser)]
#[command(about = "the control plane with 3 voters and agents, against every host voting")]
struct Args {
    /// The yard binary under test (a release build).
    #[arg(long, default_value = "target/release/yard")]
    yard_bin: PathBuf,
    /// An older yard binary to compare with (every host a voter), run in the same rounds.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// Host counts, comma-separated.
    #[arg(long, default_value = "3,9,15,40", value_delimiter = ',')]
    hosts: Vec<usize>,
    /// Rounds per host count and binary.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// `yard bench kv --clients`.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// `yard bench kv --ops`.
    #[arg(long, default_value_t = 3000)]
    ops: usize,
    /// How long idle CPU is measured.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle: Duration,
    /// A second configuration of the binary under test, run beside its defaults: TOML lines
    /// added to every node's config (e.g. "[raft]\nreplicas = 0"), labelled "agents+extra".
    #[arg(long)]
    extra_config: Option<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    yard_cluster_tests::require_root();
    let mut bins: Vec<(&str, &Path, String)> =
        vec![("agents", args.yard_bin.as_path(), String::new())];
    if let Some(extra) = &args.extra_config {
        bins.push(("agents+extra", args.yard_bin.as_path(), extra.clone()));
    }
    if let Some(b) = &args.baseline_bin {
        bins.push(("all-voters", b.as_path(), String::new()));
    }
    let mut rows = Vec::new();
    for &hosts in &args.hosts {
        for round in 0..args.rounds {
            let mut order = bins.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for (label, bin, extra) in order {
                eprintln!("control-scale: {hosts} hosts, {label}, round {}", round + 1);
                let row = match run_one(bin, hosts, &args, &extra) {
                    Ok(v) => v,
                    Err(e) => json!({"error": format!("{e:#}")}),
                };
                let mut row = row;
                row["hosts"] = json!(hosts);
                row["binary"] = json!(label);
                row["round"] = json!(round + 1);
                eprintln!("{}", line(&row));
                rows.push(row);
            }
        }
    }
    eprintln!("\n{}", table(&rows));
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "benchmark": "control-scale",
            "extra_config": args.extra_config,
            "clients": args.clients,
            "ops": args.ops,
            "idle_s": args.idle.as_secs_f64(),
            "statistic": "one run per row (rounds listed separately)",
            "rows": rows,
        }))?
    );
    Ok(())
}

fn run_one(bin: &Path, hosts: usize, args: &Args, extra: &str) -> Result<Value> {
    let client = hosts + 1;
    let topo = Topology::new(client)?;
    let start = Instant::now();
    let opts = ClusterOptions {
        extra_config: extra.to_owned(),
        ..Default::default()
    };
    let c = YardCluster::start_on(topo, bin, hosts, &opts).context("the cluster did not form")?;
    let up_s = start.elapsed().as_secs_f64();
    let roles = roles(&c, hosts);
    // Settled: joins, the autopilot and the agents' first snapshots are done.
    std::thread::sleep(Duration::from_secs(3));
    let pids: Vec<(usize, u32)> = (1..=hosts)
        .filter_map(|i| c.process(i).map(|p| (i, p.pid())))
        .collect();
    let before: Vec<f64> = pids.iter().map(|(_, p)| cpu_s(*p)).collect::<Result<_>>()?;
    std::thread::sleep(args.idle);
    let after: Vec<f64> = pids.iter().map(|(_, p)| cpu_s(*p)).collect::<Result<_>>()?;
    let idle = args.idle.as_secs_f64();
    let pct = |pick: &dyn Fn(usize) -> bool| -> (f64, usize) {
        let mut sum = 0.0;
        let mut n = 0;
        for (k, (i, _)) in pids.iter().enumerate() {
            if pick(*i) {
                sum += after[k] - before[k];
                n += 1;
            }
        }
        (100.0 * sum / idle, n)
    };
    let (all_pct, _) = pct(&|_| true);
    let is_voter = |i: usize| roles.get(i - 1).is_some_and(|r| r == "voter");
    let (voters_pct, voters) = pct(&|i| is_voter(i));
    let (others_pct, others) = pct(&|i| !is_voter(i));
    // CPU during the benchmark's writes, per process: the leader's per write is the figure
    // that must not grow with the hosts; the agents' is what they pay to follow.
    let leader = c.leader(1).unwrap_or(1);
    let busy_before: Vec<f64> = pids.iter().map(|(_, p)| cpu_s(*p)).collect::<Result<_>>()?;
    let out = c.cli_to(
        client,
        &c.endpoint(1),
        &[
            "bench",
            "kv",
            "--clients",
            &args.clients.to_string(),
            "--ops",
            &args.ops.to_string(),
            "--json",
        ],
    )?;
    if !out.status.success() {
        bail!(
            "yard bench kv failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let bench: Value = serde_json::from_slice(&out.stdout).context("yard bench kv's json")?;
    let busy_after: Vec<f64> = pids.iter().map(|(_, p)| cpu_s(*p)).collect::<Result<_>>()?;
    let writes = bench["ops"].as_f64().unwrap_or(1.0).max(1.0);
    let per_write_us = |pick: &dyn Fn(usize) -> bool| -> f64 {
        let mut sum = 0.0;
        for (k, (i, _)) in pids.iter().enumerate() {
            if pick(*i) {
                sum += busy_after[k] - busy_before[k];
            }
        }
        1e6 * sum / writes
    };
    let leader_us = per_write_us(&|i| i == leader);
    let voters_us = per_write_us(&|i| is_voter(i));
    let others_us = per_write_us(&|i| !is_voter(i));
    // The agents' propagation histograms after the benchmark's writes.
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for i in (1..=hosts).filter(|i| roles.get(i - 1).is_some_and(|r| r == "agent")) {
        let body = c.metrics(i)?;
        merge_buckets(&mut buckets, &body, "yard_watch_visible_seconds_bucket");
    }
    let visible = if buckets.is_empty() {
        Value::Null
    } else {
        let total = buckets.last().map_or(0.0, |b| b.1);
        json!({
            "writes_seen_by_agents": total,
            "p50_le_ms": quantile_bound(&buckets, 0.5).map(|s| s * 1000.0),
            "p99_le_ms": quantile_bound(&buckets, 0.99).map(|s| s * 1000.0),
        })
    };
    Ok(json!({
        "roles": roles,
        "up_s": up_s,
        "puts_per_s": bench["throughput_ops_s"],
        "put_p50_us": bench["p50_us"],
        "put_p99_us": bench["p99_us"],
        "put_p999_us": bench["p999_us"],
        "put_errors": bench["errors"],
        "leader_cpu_us_per_write": leader_us,
        "voters_cpu_us_per_write": voters_us,
        "others_cpu_us_per_write": others_us,
        "idle_cpu_pct_all": all_pct,
        "idle_cpu_pct_per_voter": if voters > 0 { json!(voters_pct / voters as f64) } else { Value::Null },
        "idle_cpu_pct_per_other": if others > 0 { json!(others_pct / others as f64) } else { Value::Null },
        "write_visible_on_agents": visible,
    }))
}

/// Each host's role from `yard status` (index host - 1): "voter", "learner" or "agent".
fn roles(c: &YardCluster, hosts: usize) -> Vec<String> {
    let Ok(s) = c.status(1) else {
        return Vec::new();
    };
    (1..=hosts as u64)
        .map(|id| {
            s["members"]
                .as_array()
                .and_then(|ms| ms.iter().find(|m| m["id"] == id))
                .and_then(|m| m["role"].as_str())
                .unwrap_or("?")
                .to_owned()
        })
        .collect()
}

/// CPU seconds of every thread of `pid` (schedstat's run time, nanoseconds).
fn cpu_s(pid: u32) -> Result<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("process {pid} is gone"))?
    {
        let path = task?.path().join("schedstat");
        if let Ok(text) = std::fs::read_to_string(&path) {
            ns += text
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(ns as f64 / 1e9)
}

/// Adds one exposition's cumulative `name{le="…"} count` lines into `into` (by bound).
fn merge_buckets(into: &mut Vec<(f64, f64)>, body: &str, name: &str) {
    for line in body.lines().filter(|l| l.starts_with(name)) {
        let Some(le) = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            match le.parse() {
                Ok(b) => b,
                Err(_) => continue,
            }
        };
        let Some(count) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        match into.iter_mut().find(|(b, _)| *b == bound) {
            Some(b) => b.1 += count,
            None => into.push((bound, count)),
        }
    }
    into.sort_by(|a, b| a.0.total_cmp(&b.0));
}

/// The smallest bucket bound at or under which a share `q` of the observations fall.
fn quantile_bound(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(b, _)| *b)
}

fn line(r: &Value) -> String {
    if let Some(e) = r.get("error") {
        return format!("  failed: {e}");
    }
    format!(
        "  up {:.1} s, {:.0} puts/s, p99 {} us, p999 {} us, idle {:.1}% of a core",
        r["up_s"].as_f64().unwrap_or(0.0),
        r["puts_per_s"].as_f64().unwrap_or(0.0),
        r["put_p99_us"],
        r["put_p999_us"],
        r["idle_cpu_pct_all"].as_f64().unwrap_or(0.0)
    )
}

fn table(rows: &[Value]) -> String {
    let mut t = String::from(
        "hosts  binary       round  up(s)  puts/s  p99(ms)  p999(ms)  idle all(%)  per voter(%)  per other(%)  leader/voters/others CPU per write(us)  agents p50/p99 visible(ms)\n",
    );
    for r in rows {
        if let Some(e) = r.get("error") {
            t.push_str(&format!(
                "{:<6} {:<12} {:<6} failed: {e}\n",
                r["hosts"], r["binary"], r["round"]
            ));
            continue;
        }
        let ms = |k: &str| {
            r[k].as_f64()
                .map_or("-".into(), |v| format!("{:.1}", v / 1000.0))
        };
        let pct = |k: &str| r[k].as_f64().map_or("-".into(), |v| format!("{v:.2}"));
        let vis = &r["write_visible_on_agents"];
        t.push_str(&format!(
            "{:<6} {:<12} {:<6} {:<6.1} {:<7.0} {:<8} {:<9} {:<12} {:<13} {:<13} {:<39} {}\n",
            r["hosts"],
            r["binary"].as_str().unwrap_or(""),
            r["round"],
            r["up_s"].as_f64().unwrap_or(0.0),
            r["puts_per_s"].as_f64().unwrap_or(0.0),
            ms("put_p99_us"),
            ms("put_p999_us"),
            pct("idle_cpu_pct_all"),
            pct("idle_cpu_pct_per_voter"),
            pct("idle_cpu_pct_per_other"),
            format!(
                "{:.0} / {:.0} / {:.0}",
                r["leader_cpu_us_per_write"].as_f64().unwrap_or(0.0),
                r["voters_cpu_us_per_write"].as_f64().unwrap_or(0.0),
                r["others_cpu_us_per_write"].as_f64().unwrap_or(0.0)
            ),
            if vis.is_null() {
                "-".to_owned()
            } else {
                format!("<= {} / <= {}", vis["p50_le_ms"], vis["p99_le_ms"])
            },
        ));
    }
    t
}
