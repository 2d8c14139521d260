//! `host-liveness`: how agents' liveness behaves with real daemons in namespaces. Three voters
//! and `--agents` agents (no replicas); one agent's link loses `--loss` percent of what it sends
//! (TC-BPF, egress) for the whole run while `--kills` other agents are killed with -9 at even
//! intervals. From the members' JSON logs: every `HostLiveness` commit, hence the false
//! suspicions (a live host committed dead, the lossy one included) and, for each killed agent,
//! the time from its kill to the commit of its death (wall clocks of one machine).
//!
//! A benchmark: figures only (JSON on stdout, a table on stderr), never fails on a number.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::Topology;

#[derive(Debug, Parser)]
#[command(about = "agents' liveness: detection time of killed agents, false suspicions under loss")]
struct Args {
    #[arg(long, default_value = "target/release/yard")]
    yard_bin: PathBuf,
    #[arg(long, default_value_t = 20)]
    agents: usize,
    /// Percent of the lossy agent's packets dropped.
    #[arg(long, default_value_t = 30.0)]
    loss: f64,
    /// How long the lossy link lasts.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Agents killed with -9 over the run.
    #[arg(long, default_value_t = 5)]
    kills: usize,
}

const VOTERS: usize = 3;

fn main() -> Result<()> {
    let args = Args::parse();
    yard_cluster_tests::require_root();
    let hosts = VOTERS + args.agents;
    let topo = Topology::new(hosts)?;
    let opts = ClusterOptions {
        extra_config: "[raft]\nreplicas = 0\n[log]\nformat = \"json\"\n".into(),
        ..Default::default()
    };
    let mut c = YardCluster::start_on(topo, &args.yard_bin, hosts, &opts)
        .context("cluster did not form")?;
    std::thread::sleep(Duration::from_secs(3));
    let lossy = VOTERS + 1;
    c.topology().loss(lossy, args.loss)?;
    let started = SystemTime::now();
    eprintln!(
        "host-liveness: {} agents, host {lossy} at {}% loss for {:?}, {} kills",
        args.agents, args.loss, args.duration, args.kills
    );
    let mut killed: BTreeMap<u64, SystemTime> = BTreeMap::new();
    let step = args.duration / (args.kills as u32 + 1);
    for k in 0..args.kills {
        std::thread::sleep(step);
        let victim = hosts - k;
        c.kill9(victim)?;
        killed.insert(victim as u64, SystemTime::now());
        eprintln!("host-liveness: killed agent {victim}");
    }
    std::thread::sleep(step);
    let lossy_for = started.elapsed().unwrap_or_default();
    c.topology().clear_loss(lossy)?;
    // Every commit of a host's liveness, from every member's log (the leader logs its own).
    let mut commits: Vec<(SystemTime, u64, bool)> = Vec::new();
    for i in 1..=VOTERS {
        let log = std::fs::read_to_string(c.topology().dir().join(format!("n{i}.log")))
            .unwrap_or_default();
        for line in log
            .lines()
            .filter(|l| l.contains("host liveness committed"))
        {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let (Some(at), Some(host), Some(alive)) = (
                v["timestamp"]
                    .as_str()
                    .and_then(|t| humantime::parse_rfc3339_weak(t).ok()),
                v["fields"]["host"].as_u64(),
                v["fields"]["alive"].as_bool(),
            ) else {
                continue;
            };
            commits.push((at, host, alive));
        }
    }
    commits.sort();
    let false_dead: Vec<Value> = commits
        .iter()
        .filter(|(at, host, alive)| {
            !alive && *at >= started && killed.get(host).is_none_or(|k| at < k)
        })
        .map(|(_, host, _)| json!(host))
        .collect();
    let mut detection = Vec::new();
    for (host, at) in &killed {
        let found = commits
            .iter()
            .find(|(t, h, alive)| h == host && !alive && t >= at)
            .and_then(|(t, _, _)| t.duration_since(*at).ok());
        detection.push(json!({
            "host": host,
            "dead_after_ms": found.map(|d| d.as_millis() as u64),
        }));
    }
    let report = json!({
        "benchmark": "host-liveness",
        "agents": args.agents,
        "loss_pct": args.loss,
        "lossy_host": lossy,
        "lossy_for_s": lossy_for.as_secs_f64(),
        "false_suspicions": false_dead.len(),
        "false_suspicion_hosts": false_dead,
        "killed": detection,
        "settings": "liveness defaults: hold 250 ms, silent 1000 ms, reattach 1000 ms",
    });
    eprintln!(
        "host-liveness: {} false suspicions over {:.0} s of {}% loss on host {lossy}; kill -9 to committed dead (ms): {}",
        report["false_suspicions"],
        lossy_for.as_secs_f64(),
        args.loss,
        report["killed"]
            .as_array()
            .map(|a| a
                .iter()
                .map(|k| k["dead_after_ms"].to_string())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
