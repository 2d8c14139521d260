//! `gateway-forward`: end-to-end packet rate of small UDP datagrams from tenant A to tenant B
//! through one gateway host: (a) yard's XDP gateway, (b) the Linux kernel (bridge + VXLAN,
//! `cluster_tests::kernel_gw`), in interleaved rounds on one topology.
//!
//! Layout: host 1 runs a one-node yard cluster with the gateway (VIP 198.19.255.1, VNI 100);
//! host 2 is the kernel gateway (VIP 198.19.255.2, VNI 200); hosts 3 and 4 are compute hosts
//! with tenants A (198.19.x.3) and B (198.19.x.4) of each VNI. Each round, sender threads in
//! tenant A send as fast as they can for `--secs` and a receiver thread in tenant B counts:
//! offered pps is what A sent, delivered pps what B received. Everything (senders, receiver,
//! both gateways, softirqs) shares this machine's CPUs, so the CPU share of each round is
//! reported beside it.
//!
//! A benchmark, not a test: it prints figures (JSON on stdout, a table on stderr) and never
//! fails on a number; it fails when it cannot measure. With `--only kernel` the yard side is
//! skipped.

#[allow(dead_code)]
#[path = "../gateway/mod.rs"]
mod gateway;
#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};
use yard_cluster_tests::kernel_gw::KernelGateway;
use yard_cluster_tests::overlay::{Overlay, Tenant};
use yard_cluster_tests::yard::YardCluster;
use yard_cluster_tests::Topology;

use gateway::{CpuShare, CpuTimes, YardTimings};

const YARD_HOST: usize = 1;
const KERNEL_HOST: usize = 2;
const HOST_A: usize = 3;
const HOST_B: usize = 4;
const YARD_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const KERNEL_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
const YARD_VNI: u32 = 100;
const KERNEL_VNI: u32 = 200;
const PORT: u16 = 9200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Only {
    Both,
    Kernel,
    Xdp,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gateway-forward",
    about = "small-UDP packet rate through yard's XDP gateway vs the kernel (needs root)"
)]
struct Args {
    /// Rounds per data path, interleaved xdp, kernel, xdp, kernel, ...
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds each round sends.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Sender threads in tenant A.
    #[arg(long, default_value_t = 1)]
    senders: usize,
    /// UDP payload bytes (18: a 60-byte inner frame).
    #[arg(long, default_value_t = 18)]
    payload: usize,
    /// XDP attach mode of the yard gateway. Native mode on veth needs an XDP program on the
    /// fabric-side peer for XDP_TX to be delivered, which this harness does not attach.
    #[arg(long, default_value = "generic")]
    xdp_mode: String,
    /// Which data paths to measure.
    #[arg(long, value_enum, default_value_t = Only::Both)]
    only: Only,
    /// The yard binary; defaults to `yard` beside this program.
    #[arg(long)]
    yard_bin: Option<PathBuf>,
    /// Also write the JSON object to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway-forward: {e:#}");
            if std::env::var_os("YARD_KEEP_LOGS").is_none() {
                eprintln!("gateway-forward: run with YARD_KEEP_LOGS=1 to keep the hosts' logs");
            }
            ExitCode::FAILURE
        }
    }
}

fn progress(msg: &str) {
    eprintln!("gateway-forward: {msg}");
}

/// One round's figures.
#[derive(Debug, Clone)]
struct Round {
    path: &'static str,
    round: usize,
    sent: u64,
    received: u64,
    secs: f64,
    gateway_forwarded: Option<u64>,
    cpu: CpuShare,
}

impl Round {
    fn offered_pps(&self) -> f64 {
        self.sent as f64 / self.secs
    }
    fn delivered_pps(&self) -> f64 {
        self.received as f64 / self.secs
    }
    fn to_json(&self) -> Value {
        json!({
            "path": self.path,
            "round": self.round,
            "secs": self.secs,
            "sent": self.sent,
            "received": self.received,
            "offered_pps": self.offered_pps().round(),
            "delivered_pps": self.delivered_pps().round(),
            "delivered_share": self.received as f64 / self.sent.max(1) as f64,
            "gateway_forwarded_pps": self.gateway_forwarded.map(|f| (f as f64 / self.secs).round()),
            "cpu": self.cpu.to_json(),
        })
    }
}

fn run(args: &Args) -> Result<()> {
    if args.rounds == 0 || args.secs == 0 || args.senders == 0 || args.senders > 16 {
        bail!("--rounds and --secs must be at least 1, --senders 1..=16");
    }
    if !(16..=1400).contains(&args.payload) {
        bail!("--payload must be 16..=1400 bytes");
    }
    yard_cluster_tests::check_root()
        .context("gateway-forward makes network namespaces; run it as root")?;
    let want_xdp = args.only != Only::Kernel;
    let want_kernel = args.only != Only::Xdp;
    let yard_bin = if want_xdp {
        Some(gateway::yard_bin(args.yard_bin.clone())?)
    } else {
        None
    };
    let started = Instant::now();
    let topo = Topology::new(4).context("cannot make the test hosts")?;
    progress(&format!(
        "test hosts yd{}-1..4: yard gateway on {}, kernel gateway on {}, tenants on {} and {}",
        topo.run_id(),
        topo.addr(YARD_HOST),
        topo.addr(KERNEL_HOST),
        topo.addr(HOST_A),
        topo.addr(HOST_B)
    ));
    let mut ov = Overlay::new(&topo);
    let (ya, yb) = gateway::tenant_pair(&mut ov, (HOST_A, HOST_B), YARD_VNI, YARD_VIP)?;
    let (ka, kb) = gateway::tenant_pair(&mut ov, (HOST_A, HOST_B), KERNEL_VNI, KERNEL_VIP)?;

    let kernel = if want_kernel {
        let gw = KernelGateway::install(
            &topo,
            KERNEL_HOST,
            KERNEL_VIP,
            &[ka.clone(), kb.clone()],
            true,
        )?;
        ka.wait_reachable(kb.ip(), Duration::from_secs(10))
            .context("kernel gateway: tenant A cannot reach B")?;
        Some(gw)
    } else {
        None
    };
    let mut yard_error = None;
    let yard = if let Some(bin) = &yard_bin {
        progress("starting a one-node yard cluster with the gateway on host 1");
        match setup_yard(&topo, bin, &args.xdp_mode, &ya, &yb) {
            Ok(c) => Some(c),
            Err(e) => {
                progress(&format!("the XDP gateway could not be set up: {e:#}"));
                yard_error = Some(format!("{e:#}"));
                None
            }
        }
    } else {
        None
    };
    if yard.is_none() && kernel.is_none() {
        bail!("nothing to measure: {}", yard_error.unwrap_or_default());
    }

    let mut rounds = Vec::new();
    for r in 1..=args.rounds {
        if let Some(c) = &yard {
            c.check_running()?;
            let before = gateway::yard_forwarded(c, YARD_HOST).ok();
            let mut round = blast(args, "xdp", r, &ya, &yb)?;
            let after = gateway::yard_forwarded(c, YARD_HOST).ok();
            round.gateway_forwarded = before.zip(after).map(|(b, a)| a.saturating_sub(b));
            report_round(&round, args.rounds);
            rounds.push(round);
            std::thread::sleep(Duration::from_secs(1));
        }
        if let Some(gw) = &kernel {
            let before = gw.forwarded_packets().ok();
            let mut round = blast(args, "kernel", r, &ka, &kb)?;
            let after = gw.forwarded_packets().ok();
            round.gateway_forwarded = before.zip(after).map(|(b, a)| a.saturating_sub(b));
            report_round(&round, args.rounds);
            rounds.push(round);
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    let summary = |path: &str| {
        let d: Vec<f64> = rounds
            .iter()
            .filter(|r| r.path == path)
            .map(Round::delivered_pps)
            .collect();
        let o: Vec<f64> = rounds
            .iter()
            .filter(|r| r.path == path)
            .map(Round::offered_pps)
            .collect();
        let busy: Vec<f64> = rounds
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.cpu.busy_pct)
            .collect();
        (stats::median(&d), stats::median(&o), stats::median(&busy))
    };
    let (xd, xo, xb) = summary("xdp");
    let (kd, ko, kbusy) = summary("kernel");
    let ratio = stats::ratio(xd, kd);
    let report = json!({
        "benchmark": "gateway-forward",
        "run_id": topo.run_id(),
        "cpus": gateway::cpus(),
        "note": "senders, receiver, gateways and softirqs share these CPUs; delivered pps is bounded by the whole path, not the gateway alone",
        "args": {
            "rounds": args.rounds, "secs": args.secs, "senders": args.senders,
            "payload_bytes": args.payload, "xdp_mode": args.xdp_mode,
        },
        "yard_timings": YardTimings::DEFAULT.to_json(),
        "xdp_error": yard_error,
        "rounds": rounds.iter().map(Round::to_json).collect::<Vec<_>>(),
        "xdp": {"delivered_pps_median": xd.map(f64::round), "offered_pps_median": xo.map(f64::round), "cpu_busy_pct_median": xb.map(gateway::round1)},
        "kernel": {"delivered_pps_median": kd.map(f64::round), "offered_pps_median": ko.map(f64::round), "cpu_busy_pct_median": kbusy.map(gateway::round1)},
        "ratio_xdp_over_kernel": ratio,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    drop(yard);
    drop(ov);
    drop(topo);
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(p) = &args.json_out {
        std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    eprintln!();
    eprintln!(
        "{:<8} {:>14} {:>14} {:>8}",
        "path", "offered pps", "delivered pps", "cpu %"
    );
    for (name, d, o, b) in [("xdp", xd, xo, xb), ("kernel", kd, ko, kbusy)] {
        let f = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
        eprintln!("{name:<8} {:>14} {:>14} {:>8}", f(o), f(d), f(b));
    }
    eprintln!(
        "ratio xdp/kernel (median delivered pps): {}",
        ratio.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"))
    );
    if let Some(e) = report["xdp_error"].as_str() {
        bail!("the XDP side was not measured: {e}");
    }
    Ok(())
}

fn setup_yard<'t>(
    topo: &'t Topology,
    bin: &std::path::Path,
    xdp_mode: &str,
    a: &Tenant,
    b: &Tenant,
) -> Result<YardCluster<&'t Topology>> {
    let c = gateway::start_yard(topo, bin, 1, xdp_mode, YardTimings::DEFAULT)?;
    gateway::configure_yard_gateway(&c, HOST_A, YARD_VIP, &[a.clone(), b.clone()])?;
    let owner = gateway::wait_vip_owner(&c, HOST_A, None, YARD_VIP, Duration::from_secs(20))?;
    progress(&format!("VIP {YARD_VIP} owned by node {owner}"));
    a.wait_reachable(b.ip(), Duration::from_secs(15))
        .context("XDP gateway: tenant A cannot reach B")?;
    Ok(c)
}

fn report_round(r: &Round, of: usize) {
    progress(&format!(
        "round {}/{of} {:<6}: offered {:>9.0} pps, delivered {:>9.0} pps ({:.1}%), gateway forwarded {}, cpu busy {:.0}% (softirq {:.0}%, steal {:.0}%)",
        r.round,
        r.path,
        r.offered_pps(),
        r.delivered_pps(),
        r.received as f64 * 100.0 / r.sent.max(1) as f64,
        r.gateway_forwarded
            .map_or_else(|| "-".to_owned(), |f| format!("{:.0} pps", f as f64 / r.secs)),
        r.cpu.busy_pct,
        r.cpu.softirq_pct,
        r.cpu.steal_pct
    ));
}

/// Sends from `a` to `b` as fast as the sender threads can for `--secs`; counts what arrives.
fn blast(args: &Args, path: &'static str, round: usize, a: &Tenant, b: &Tenant) -> Result<Round> {
    let dst = SocketAddrV4::new(b.ip(), PORT);
    let stop_rx = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = {
        let (stop_rx, counting) = (Arc::clone(&stop_rx), Arc::clone(&counting));
        let limit = Duration::from_secs(args.secs + 30);
        b.thread(move || -> std::io::Result<u64> {
            let sock = UdpSocket::bind(dst);
            let sock = match sock {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_millis(20)))?;
                    let _ = ready_tx.send(true);
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(false);
                    return Err(e);
                }
            };
            let mut buf = [0u8; 2048];
            let mut n = 0u64;
            let t0 = Instant::now();
            while !stop_rx.load(Ordering::Relaxed) && t0.elapsed() < limit {
                if sock.recv(&mut buf).is_ok() && counting.load(Ordering::Relaxed) {
                    n += 1;
                }
            }
            Ok(n)
        })?
    };
    if !ready_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or(false)
    {
        stop_rx.store(true, Ordering::SeqCst);
        let r = receiver.join();
        bail!("the receiver in tenant B could not bind {dst}: {r:?}");
    }
    let sent = Arc::new(AtomicU64::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let stop_tx = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for _ in 0..args.senders {
        let (sent, go, stop_tx) = (Arc::clone(&sent), Arc::clone(&go), Arc::clone(&stop_tx));
        let (src, payload) = (a.ip(), args.payload);
        let limit = Duration::from_secs(args.secs + 30);
        senders.push(a.thread(move || {
            let Ok(sock) = UdpSocket::bind(SocketAddrV4::new(src, 0)) else {
                return;
            };
            let buf = vec![0x5au8; payload];
            let t0 = Instant::now();
            while !go.load(Ordering::Relaxed) && t0.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut n = 0u64;
            while !stop_tx.load(Ordering::Relaxed) && t0.elapsed() < limit {
                // Refused sends (a full queue) are not counted as offered.
                if sock.send_to(&buf, dst).is_ok() {
                    n += 1;
                }
            }
            sent.fetch_add(n, Ordering::Relaxed);
        })?);
    }
    counting.store(true, Ordering::SeqCst);
    let cpu0 = CpuTimes::now();
    let t0 = Instant::now();
    go.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(args.secs));
    stop_tx.store(true, Ordering::SeqCst);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = CpuTimes::now().since(&cpu0);
    for s in senders {
        let _ = s.join();
    }
    // Datagrams still in flight arrive within the drain; count them (they were offered inside
    // the window).
    std::thread::sleep(Duration::from_millis(300));
    stop_rx.store(true, Ordering::SeqCst);
    let received = match receiver.join() {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => bail!("the receiver failed: {e}"),
        Err(_) => bail!("the receiver panicked"),
    };
    Ok(Round {
        path,
        round,
        sent: sent.load(Ordering::Relaxed),
        received,
        secs,
        gateway_forwarded: None,
        cpu,
    })
}
