//! `gateway-scale`: 100k tenant endpoints (Zeta's evaluation size) replicated through Raft and
//! programmed into the XDP maps of every gateway node. Prints how long the import took to
//! commit, how long until each node's data plane held every endpoint, and each node's memory
//! (process RSS, and the kernel memory of its BPF maps from `/proc/<pid>/fdinfo`).
//!
//! A benchmark: figures only (JSON on stdout, a table on stderr), never fails on a number,
//! every wait bounded.

#[allow(dead_code)]
#[path = "../procfs.rs"]
mod procfs;

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::Topology;

#[derive(Debug, Parser)]
#[command(about = "100k endpoints replicated and programmed into every gateway node")]
struct Args {
    /// The yard binary (a release build).
    #[arg(long, default_value = "target/release/yard")]
    yard_bin: PathBuf,
    /// Gateway nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Endpoints to import.
    #[arg(long, default_value_t = 100_000)]
    endpoints: u32,
    /// Give up waiting for a node after this long.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// `count` endpoints over 100 VNIs, spread over 50 compute hosts (addresses only; nothing runs
/// there).
fn endpoint_file(count: u32) -> String {
    let mut out = String::with_capacity(count as usize * 48);
    for n in 0..count {
        let vni = 1 + n % 100;
        let k = n / 100;
        let ip = Ipv4Addr::new(198, 19, (k >> 8) as u8, k as u8);
        let host = Ipv4Addr::new(198, 18, 1, (1 + n % 50) as u8);
        let _ = writeln!(
            out,
            "{vni} {ip} 02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} {host}",
            (vni >> 8) as u8,
            vni as u8,
            (k >> 16) as u8,
            (k >> 8) as u8,
            k as u8
        );
    }
    out
}

/// Kernel memory charged to the BPF maps `pid` holds open (fdinfo `memlock`), in bytes.
fn bpf_map_bytes(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    let mut total = 0;
    for entry in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if !text.contains("map_type:") {
            continue;
        }
        total += text
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

fn stats(c: &YardCluster, i: usize) -> Result<Value> {
    let out = c.cli(i, &["gateway", "stats", "--json"])?;
    if !out.status.success() {
        bail!(
            "stats on node {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn main() -> Result<()> {
    let args = Args::parse();
    yard_cluster_tests::check_root().context("gateway-scale needs root")?;
    let yard_bin = std::fs::canonicalize(&args.yard_bin)
        .with_context(|| format!("no yard binary at {}", args.yard_bin.display()))?;
    let topo = Topology::new(args.nodes)?;
    for i in 1..=args.nodes {
        topo.bpffs(i)?;
    }
    let config = format!(
        "[gateway]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"generic\"\npin_dir = \"{}/bpffs-@HOST@/gateway\"\n",
        topo.dir().display()
    );
    let c = YardCluster::start_on(
        topo,
        &yard_bin,
        args.nodes,
        &ClusterOptions {
            extra_config: config,
            ..Default::default()
        },
    )?;
    let file = c.topology().dir().join("endpoints.txt");
    std::fs::write(&file, endpoint_file(args.endpoints))?;
    let rss_before: Vec<u64> = (1..=args.nodes)
        .map(|i| procfs::rss_kib(c.process(i).map_or(0, |p| p.pid())).unwrap_or(0))
        .collect();

    let start = Instant::now();
    let out = c.cli(
        1,
        &["gateway", "endpoint", "import", &file.display().to_string()],
    )?;
    if !out.status.success() {
        bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let committed = start.elapsed();
    let mut programmed = vec![None; args.nodes];
    while programmed.iter().any(Option::is_none) && start.elapsed() < args.timeout {
        for (i, slot) in programmed.iter_mut().enumerate() {
            if slot.is_none()
                && stats(&c, i + 1)?["endpoints"].as_u64() == Some(u64::from(args.endpoints))
            {
                *slot = Some(start.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut nodes = Vec::new();
    eprintln!(
        "{} endpoints: import committed in {:.0} ms",
        args.endpoints,
        committed.as_secs_f64() * 1e3
    );
    eprintln!("node  programmed (ms)  RSS before (MiB)  RSS after (MiB)  BPF maps (MiB)");
    for i in 1..=args.nodes {
        let pid = c.process(i).map_or(0, |p| p.pid());
        let rss = procfs::rss_kib(pid).unwrap_or(0);
        let maps = bpf_map_bytes(pid);
        let ms = programmed[i - 1].map(|d| d.as_secs_f64() * 1e3);
        eprintln!(
            "{i:<5} {:<16} {:<17.1} {:<16.1} {:.1}",
            ms.map_or("timeout".into(), |m| format!("{m:.0}")),
            rss_before[i - 1] as f64 / 1024.0,
            rss as f64 / 1024.0,
            maps as f64 / (1024.0 * 1024.0)
        );
        nodes.push(
            json!({"node": i, "programmed_ms": ms, "rss_before_kib": rss_before[i - 1],
                          "rss_after_kib": rss, "bpf_map_bytes": maps}),
        );
    }
    let worst = programmed
        .iter()
        .map(|p| p.map_or(f64::INFINITY, |d| d.as_secs_f64() * 1e3))
        .fold(0.0, f64::max);
    println!(
        "{}",
        json!({"benchmark": "gateway-scale", "endpoints": args.endpoints, "nodes": nodes,
               "import_committed_ms": committed.as_secs_f64() * 1e3,
               "all_programmed_ms": worst.is_finite().then_some(worst), "target_ms": 5000})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_file_lines_are_distinct_and_parse() {
        let text = endpoint_file(1000);
        let lines: std::collections::BTreeSet<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1000);
        let keys: std::collections::BTreeSet<(String, String)> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f[0].to_owned(), f[1].to_owned())
            })
            .collect();
        assert_eq!(keys.len(), 1000);
    }
}
