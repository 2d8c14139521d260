//! `gateway-planner-live`: the service planner on the live gateway against today's even spread
//! (VIPs placed by count), on the namespace topology with skewed traffic. Each run starts a
//! three-gateway cluster, puts two heavy streams through the two VIPs the count spread placed
//! on one node and two light streams through the VIPs of another node, lets the placement
//! settle (the planner re-plans from the measured counters; the even spread stays), kills one
//! non-leader gateway, waits for the failover (and the re-plan) to settle, and measures each
//! survivor's forwarded packets per second from its own XDP counters (`yard gateway stats`).
//! Both modes run every non-leader failure; the figure compared is the peak survivor load.
//!
//! A benchmark: figures only (JSON on stdout, a table on stderr), never fails on a number,
//! every wait bounded.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_cluster_tests::overlay::{tenant_mac, Overlay};
use yard_cluster_tests::probe::ProbeStream;
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::Topology;

#[derive(Debug, Parser)]
#[command(about = "peak gateway load after a failure: the live planner against the even spread")]
struct Args {
    /// The yard binary.
    #[arg(long, default_value = "target/release/yard")]
    yard_bin: PathBuf,
    /// Packets per second of each heavy and each light stream.
    #[arg(long, default_value_t = 1200)]
    heavy_pps: u32,
    #[arg(long, default_value_t = 200)]
    light_pps: u32,
    /// Each gateway's capacity in packets per second (the planner's and the load's unit).
    #[arg(long, default_value_t = 2000.0)]
    capacity_pps: f64,
    /// How long each survivor's forwarding rate is measured.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Give up waiting for a placement after this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// A VIP, its owner and its handoff target.
type VipRow = (Ipv4Addr, Option<u64>, Option<u64>);

fn vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 255, n)
}

fn cli_json(c: &YardCluster<&Topology>, i: usize, args: &[&str]) -> Result<Value> {
    let mut full = args.to_vec();
    full.push("--json");
    let out = c.cli(i, &full)?;
    if !out.status.success() {
        bail!(
            "yard {} on node {i}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// VIP → (owner, handoff target) through node `i`.
fn owners(c: &YardCluster<&Topology>, i: usize) -> Result<Vec<VipRow>> {
    Ok(cli_json(c, i, &["gateway", "vip", "list"])?
        .as_array()
        .context("vip list is not an array")?
        .iter()
        .filter_map(|r| {
            Some((
                r["vip"].as_str()?.parse().ok()?,
                r["owner"].as_u64(),
                r["handoff_to"].as_u64(),
            ))
        })
        .collect())
}

/// Waits until every VIP has an owner, none is in a handoff, and `ok` holds.
fn wait_owners(
    c: &YardCluster<&Topology>,
    i: usize,
    timeout: Duration,
    ok: impl Fn(&[VipRow]) -> bool,
) -> Result<Vec<VipRow>> {
    let start = Instant::now();
    loop {
        let o = owners(c, i)?;
        if o.iter().all(|r| r.1.is_some() && r.2.is_none()) && ok(&o) {
            return Ok(o);
        }
        if start.elapsed() > timeout {
            bail!("the placement did not settle: {o:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the leader's latest re-plan moved nothing and planned on `nodes`.
fn wait_plan(
    c: &YardCluster<&Topology>,
    i: usize,
    nodes: &[u64],
    timeout: Duration,
) -> Result<Value> {
    let start = Instant::now();
    loop {
        let plan = cli_json(c, i, &["plan", "show"])?;
        let report = &plan["latest"]["report"];
        let planned: Vec<u64> = report["nodes"]
            .as_array()
            .map(|a| a.iter().filter_map(|n| n["node"].as_u64()).collect())
            .unwrap_or_default();
        if report["moves"].as_array().is_some_and(Vec::is_empty) && planned == nodes {
            return Ok(plan);
        }
        if start.elapsed() > timeout {
            bail!("the plan did not settle: {plan}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn forwarded(c: &YardCluster<&Topology>, i: usize) -> Result<u64> {
    let s = cli_json(c, i, &["gateway", "stats"])?;
    Ok(s["counters"]["forwarded"]["packets"].as_u64().unwrap_or(0))
}

/// One run: `planner` on or off, gateway `kill` (0: the first non-leader, 1: the second).
fn run(args: &Args, yard_bin: &Path, planner: bool, kill: usize) -> Result<Value> {
    let topo = Topology::new(5)?;
    for i in 1..=3 {
        topo.bpffs(i)?;
    }
    let planner_cfg = if planner {
        format!(
            "[planner]\nenabled = true\ninterval_ms = 1000\nreport_ms = 250\nsmoothing = 0.5\nmax_moves = 2\ncapacity_bps = 1e10\ncapacity_pps = {}\n",
            args.capacity_pps
        )
    } else {
        String::new()
    };
    // The failover benchmark's lease, lengthened as in the namespace tests: three daemons,
    // compute hosts and four streams share the machine's cores.
    let config = format!(
        "[gateway]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"generic\"\npin_dir = \"{}/bpffs-@HOST@/gateway\"\nleader_holds_vips = true\n[liveness]\ninterval_ms = 25\nlease_ms = 250\n{planner_cfg}",
        topo.dir().display()
    );
    let mut c = YardCluster::start_on(
        &topo,
        yard_bin,
        3,
        &ClusterOptions {
            extra_config: config,
            ..Default::default()
        },
    )?;
    let pool: Vec<String> = (1..=6).map(|n| vip(n).to_string()).collect();
    let mut add = vec!["gateway", "vip", "add"];
    add.extend(pool.iter().map(String::as_str));
    cli_json(&c, 1, &add)?;
    let placed = wait_owners(&c, 1, args.timeout, |o| {
        [1, 2, 3]
            .iter()
            .all(|n| o.iter().filter(|r| r.1 == Some(*n)).count() == 2)
    })?;
    let leader = c.wait_leader(1)? as u64;
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != leader).collect();
    let on = |n: u64| -> Vec<Ipv4Addr> {
        placed
            .iter()
            .filter(|r| r.1 == Some(n))
            .map(|r| r.0)
            .collect()
    };
    // Heavy through the two VIPs of one node, light through those of another.
    let (heavy, light) = (on(others[0]), on(others[1]));
    let mut ov = Overlay::new(&topo);
    let mut tenants = Vec::new();
    for (k, (vni, vips)) in [(100u32, &heavy), (200u32, &light)].into_iter().enumerate() {
        let a = ov.add_tenant(
            4,
            vni,
            Ipv4Addr::new(198, 19, 1 + k as u8, 1),
            tenant_mac(vni, 1),
            vips[0],
        )?;
        let b = ov.add_tenant(
            5,
            vni,
            Ipv4Addr::new(198, 19, 1 + k as u8, 2),
            tenant_mac(vni, 2),
            vips[1],
        )?;
        tenants.push((a, b));
    }
    for (a, b) in &tenants {
        for t in [a, b] {
            let line = t.endpoint_add_args();
            let out = c.cli(1, &line.iter().map(String::as_str).collect::<Vec<_>>())?;
            if !out.status.success() {
                bail!("endpoint add: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
    for (a, b) in &tenants {
        a.wait_reachable(b.ip(), Duration::from_secs(10))?;
        b.wait_reachable(a.ip(), Duration::from_secs(10))?;
    }
    let mut streams = Vec::new();
    for (k, (a, b)) in tenants.iter().enumerate() {
        let pps = if k == 0 {
            args.heavy_pps
        } else {
            args.light_pps
        };
        let port = 9700 + 2 * k as u16;
        streams.push(ProbeStream::start(a, b, port, pps)?);
        streams.push(ProbeStream::start(b, a, port + 1, pps)?);
    }
    // Let the rates be measured and the planner act (the even spread has nothing to do).
    std::thread::sleep(Duration::from_secs(3));
    if planner {
        wait_plan(&c, leader as usize, &[1, 2, 3], args.timeout)?;
        wait_owners(&c, leader as usize, args.timeout, |_| true)?;
    }
    let before = owners(&c, leader as usize)?;
    let k = others[kill];
    c.kill9(k as usize)?;
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != k).collect();
    let failed_at = Instant::now();
    wait_owners(&c, leader as usize, args.timeout, |o| {
        o.iter().all(|r| r.1 != Some(k))
    })?;
    if planner {
        wait_plan(&c, leader as usize, &survivors, args.timeout)?;
        wait_owners(&c, leader as usize, args.timeout, |_| true)?;
    }
    let settled_ms = failed_at.elapsed().as_secs_f64() * 1e3;
    // Past the linger time: the survivors carry everything now.
    std::thread::sleep(Duration::from_millis(3500));
    let start: Vec<u64> = survivors
        .iter()
        .map(|n| forwarded(&c, *n as usize))
        .collect::<Result<_>>()?;
    let t0 = Instant::now();
    std::thread::sleep(args.window);
    let end: Vec<u64> = survivors
        .iter()
        .map(|n| forwarded(&c, *n as usize))
        .collect::<Result<_>>()?;
    let secs = t0.elapsed().as_secs_f64();
    let after = owners(&c, leader as usize)?;
    let mut lost = 0;
    for s in streams {
        lost += s.stop().lost;
    }
    let pps: Vec<f64> = start
        .iter()
        .zip(&end)
        .map(|(a, b)| b.saturating_sub(*a) as f64 / secs)
        .collect();
    let peak = pps.iter().copied().fold(0.0, f64::max);
    Ok(json!({
        "mode": if planner { "planner" } else { "even" },
        "killed": k,
        "survivors": survivors,
        "survivor_pps": pps,
        "peak_pps": peak,
        "peak_load": peak / args.capacity_pps,
        "settled_ms": settled_ms,
        "lost_packets": lost,
        "placement_before": before.iter().map(|r| json!([r.0.to_string(), r.1])).collect::<Vec<_>>(),
        "placement_after": after.iter().map(|r| json!([r.0.to_string(), r.1])).collect::<Vec<_>>(),
        "heavy_vips": heavy.iter().map(ToString::to_string).collect::<Vec<_>>(),
    }))
}

fn main() -> Result<()> {
    let args = Args::parse();
    yard_cluster_tests::check_root().context("gateway-planner-live needs root")?;
    let yard_bin = std::fs::canonicalize(&args.yard_bin)
        .with_context(|| format!("no yard binary at {}", args.yard_bin.display()))?;
    let mut runs = Vec::new();
    eprintln!(
        "{:<8} {:<7} {:<22} {:<10} {:<10} {:<11} lost",
        "mode", "killed", "survivor pps", "peak pps", "peak load", "settled ms"
    );
    for kill in 0..2 {
        for planner in [false, true] {
            let r = run(&args, &yard_bin, planner, kill)?;
            eprintln!(
                "{:<8} {:<7} {:<22} {:<10.0} {:<10.3} {:<11.0} {}",
                r["mode"].as_str().unwrap_or(""),
                r["killed"],
                r["survivor_pps"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .map(|v| format!("{:.0}", v.as_f64().unwrap_or(0.0)))
                        .collect::<Vec<_>>()
                        .join(","))
                    .unwrap_or_default(),
                r["peak_pps"].as_f64().unwrap_or(0.0),
                r["peak_load"].as_f64().unwrap_or(0.0),
                r["settled_ms"].as_f64().unwrap_or(0.0),
                r["lost_packets"]
            );
            runs.push(r);
        }
    }
    let worst = |mode: &str| {
        runs.iter()
            .filter(|r| r["mode"] == mode)
            .filter_map(|r| r["peak_load"].as_f64())
            .fold(0.0, f64::max)
    };
    let (even, planned) = (worst("even"), worst("planner"));
    eprintln!(
        "worst peak load after a failure: even spread {even:.3}, planner {planned:.3} (planner/even {:.2})",
        if even > 0.0 { planned / even } else { 0.0 }
    );
    println!(
        "{}",
        json!({"benchmark": "gateway-planner-live", "heavy_pps": args.heavy_pps,
               "light_pps": args.light_pps, "capacity_pps": args.capacity_pps,
               "worst_peak_load": {"even": even, "planner": planned},
               "planner_over_even": if even > 0.0 { planned / even } else { 0.0 },
               "runs": runs})
    );
    Ok(())
}
