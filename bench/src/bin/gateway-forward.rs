//! `gateway-forward`: small UDP datagrams from tenant A to tenant B through one gateway host:
//! (a) yard's XDP gateway, (b) the Linux kernel (bridge + VXLAN + hairpin,
//! `cluster_tests::kernel_gw`), and (c) as a floor, no gateway at all (the compute hosts'
//! tunnels point at each other), in interleaved rounds on one topology.
//!
//! Layout: host 1 runs a one-node yard cluster with the gateway (VIP 198.19.255.1, VNI 100);
//! host 2 is the kernel gateway (VIP 198.19.255.2, VNI 200); hosts 3 and 4 are compute hosts
//! with tenants A (198.19.x.3) and B (198.19.x.4) of each VNI; VNI 300 tunnels host 3 straight
//! to host 4 (each host carries a /32 alias 198.19.254.<host> as its tunnel end).
//!
//! Phases, each interleaving the data paths round by round:
//!
//! 1. `saturation`: the sender sends as fast as it can; offered and delivered pps. Everything
//!    (sender, receiver, VXLAN encap/decap, bridges, veths, the gateway) shares this machine's
//!    CPUs, so this measures the whole chain, of which the gateway is a small part.
//! 2. `cost-unsteered`: a fixed offered rate (`--rate`) that every path delivers without loss;
//!    CPU time per delivered packet of the network chain (irq+softirq time of all CPUs, see
//!    below). The chain is the same on every path except the gateway host and one more fabric
//!    hop, so path minus floor is the gateway's cost (plus that hop, charged to both gateways).
//! 3. `cost`: the same rate with the gateway's work steered onto CPU 1 and everything else
//!    onto CPU 0: RPS on the fabric port of host A (`h3`) sends the underlay hop and whatever
//!    the gateway host does with the frame to CPU 1; RPS on the gateway hosts' fabric ports
//!    (`h1`, `h2`) and on host B's `eth0` sends the rest back to CPU 0, where the sender and
//!    receiver threads are pinned. The floor path runs the same first fabric hop on CPU 1 and
//!    no gateway, so CPU 1's µs/packet minus the floor's, round by round, is the gateway host's
//!    own cost per forwarded packet (receive, XDP program or kernel bridge+VXLAN, transmit).
//! 4. `steered-saturation`: the same steering, sender flat out. CPU 0 (sender, receiver, both
//!    compute hosts) saturates first on every path, so this does not compare the gateways; it
//!    shows that a fast gateway hands packets back to CPU 0 one by one (more IPIs and softirq
//!    runs per packet) where the kernel gateway, busier, returns them in batches.
//!
//! CPU time: per CPU, busy = wall − idle − iowait − steal from /proc/stat (the nohz idle clock
//! is exact); irq+softirq = busy − tick-sampled user and system time. That keeps softirqs run
//! from idle (which the tick never samples) and leaves out other programs on this shared
//! machine (in expectation). /proc/softirqs (NET_RX) and /proc/interrupts (CAL) show where the
//! receive work ran.
//!
//! With `--xdp-mode native`, XDP_TX on a veth needs an XDP program on the peer: the bench loads
//! a second, unconfigured copy of yard's gateway program (which passes every frame when it has
//! no configuration) on the fabric-side peer `h1`, in native mode. Its cost (building an skb
//! for every frame the gateway sends) is charged to the XDP path; a real NIC has no such peer.
//! On veth, native mode measured costlier than generic (veth builds skbs either way).
//!
//! A benchmark, not a test: it prints figures (JSON on stdout, tables on stderr) and never
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
use yard_cluster_tests::overlay::{tenant_mac, Overlay, Tenant};
use yard_cluster_tests::yard::YardCluster;
use yard_cluster_tests::Topology;

use gateway::{CpuShare, CpuTimes, CpuWork, PerCpuSnapshot, RpsSteering, YardTimings};

const YARD_HOST: usize = 1;
const KERNEL_HOST: usize = 2;
const HOST_A: usize = 3;
const HOST_B: usize = 4;
const YARD_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const KERNEL_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
const YARD_VNI: u32 = 100;
const KERNEL_VNI: u32 = 200;
const DIRECT_VNI: u32 = 300;
const PORT: u16 = 9200;
/// CPU masks for RPS: CPU 0 runs sender, receiver and compute hosts; CPU 1 the gateway hop.
const CPU0_MASK: &str = "1";
const CPU1_MASK: &str = "2";
const GW_CPU: usize = 1;
const APP_CPU: usize = 0;

/// A compute host's tunnel end for the floor path: `198.19.254.<host>`.
fn direct_alias(host: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 254, host as u8)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Only {
    Both,
    Kernel,
    Xdp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Generic,
    Native,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Generic => "generic",
            Mode::Native => "native",
        }
    }
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gateway-forward",
    about = "small-UDP forwarding through yard's XDP gateway vs the kernel: delivered pps and CPU per packet (needs root)"
)]
struct Args {
    /// Saturation rounds per data path (phase 1), interleaved xdp, kernel, direct, ...
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds each saturation round sends (phases 1 and 4).
    #[arg(long, default_value_t = 4)]
    secs: u64,
    /// Sender threads in tenant A in the saturation phases.
    #[arg(long, default_value_t = 1)]
    senders: usize,
    /// UDP payload bytes (18: a 60-byte inner frame).
    #[arg(long, default_value_t = 18)]
    payload: usize,
    /// Offered pps of the CPU-cost phases (2 and 3): low enough that every path delivers it all.
    #[arg(long, default_value_t = 30_000)]
    rate: u64,
    /// CPU-cost rounds per data path and phase (0 skips phases 2 and 3).
    #[arg(long, default_value_t = 4)]
    cost_rounds: usize,
    /// Seconds each CPU-cost round sends.
    #[arg(long, default_value_t = 4)]
    cost_secs: u64,
    /// Steered saturation rounds per gateway path (0 skips phase 4).
    #[arg(long, default_value_t = 2)]
    steered_rounds: usize,
    /// Run phase 2: the fixed rate without steering (the chain's CPU per packet wherever the
    /// scheduler places things).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    unsteered_cost: bool,
    /// Do not steer with RPS or pin threads (phases 3 and 4 then run on the scheduler's CPUs).
    #[arg(long)]
    no_steer: bool,
    /// Skip the no-gateway floor path.
    #[arg(long)]
    no_direct: bool,
    /// XDP attach mode of the yard gateway. `native` also attaches a pass program to the
    /// fabric-side peer of the gateway's veth, without which XDP_TX frames are lost.
    #[arg(long, value_enum, default_value_t = Mode::Generic)]
    xdp_mode: Mode,
    /// Which gateway paths to measure.
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
    gateway::exit_code("gateway-forward", run(&Args::parse()))
}

fn progress(msg: &str) {
    eprintln!("gateway-forward: {msg}");
}

/// How one round sends.
#[derive(Debug, Clone, Copy)]
struct Blast {
    phase: &'static str,
    secs: u64,
    senders: usize,
    payload: usize,
    /// Total offered pps, or as fast as possible.
    rate: Option<u64>,
    /// Pin sender and receiver threads to this CPU.
    pin: Option<usize>,
}

/// One round's figures.
#[derive(Debug, Clone)]
struct Round {
    phase: &'static str,
    path: &'static str,
    round: usize,
    target_pps: Option<u64>,
    sent: u64,
    received: u64,
    secs: f64,
    gateway_forwarded: Option<u64>,
    cpu: CpuShare,
    cpus: Vec<CpuWork>,
    /// CPU time of this process (sender and receiver threads), seconds.
    self_s: f64,
    /// Whether sender and receiver were pinned to CPU 0 (steered phases).
    pinned: bool,
}

/// A round counts as quiet when other programs used less than this share of the CPUs that
/// carry the figure.
const QUIET_SHARE: f64 = 0.10;

impl Round {
    fn offered_pps(&self) -> f64 {
        self.sent as f64 / self.secs
    }
    fn delivered_pps(&self) -> f64 {
        self.received as f64 / self.secs
    }
    fn delivered_share(&self) -> f64 {
        self.received as f64 / self.sent.max(1) as f64
    }
    /// µs of CPU `cpu`'s busy time per delivered packet.
    fn cpu_us(&self, cpu: usize) -> Option<f64> {
        let w = self.cpus.get(cpu)?;
        (self.received > 0).then(|| w.busy_s * 1e6 / self.received as f64)
    }
    /// µs of CPU `cpu`'s (tick-sampled) softirq time per delivered packet.
    fn cpu_softirq_us(&self, cpu: usize) -> Option<f64> {
        let w = self.cpus.get(cpu)?;
        (self.received > 0).then(|| w.softirq_s * 1e6 / self.received as f64)
    }
    /// µs of CPU `cpu`'s interrupt and softirq time per delivered packet.
    fn cpu_kernel_us(&self, cpu: usize) -> Option<f64> {
        let w = self.cpus.get(cpu)?;
        (self.received > 0).then(|| w.kernel_s * 1e6 / self.received as f64)
    }
    /// µs per delivered packet of the network chain: every CPU's interrupt and softirq time
    /// (all the forwarding, encap, decap, bridging and veth work, also when it runs inline in
    /// the sender's syscall). Left out: the sender's and receiver's own syscall and user time
    /// (the same on every path) and other programs on this shared machine. This process's
    /// CPU time is not added: without IRQ_TIME_ACCOUNTING a task's stime also holds the
    /// softirqs run in its context, which would count them twice.
    fn chain_us(&self) -> Option<f64> {
        let k: f64 = self.cpus.iter().map(|w| w.kernel_s).sum();
        (self.received > 0 && !self.cpus.is_empty()).then(|| k * 1e6 / self.received as f64)
    }
    /// Function-call IPIs (RPS wake-ups) CPU `cpu` received per delivered packet.
    fn ipis_per_packet(&self, cpu: usize) -> Option<f64> {
        let w = self.cpus.get(cpu)?;
        (self.received > 0).then(|| w.call_ipis as f64 / self.received as f64)
    }
    /// Share of the measured CPUs other programs used (tick-sampled user and system time):
    /// steered rounds, CPU 1, where none of this process's threads run; otherwise all CPUs, less
    /// this process's own time (which over-subtracts the softirqs run in its threads).
    fn others_share(&self) -> f64 {
        let task = |w: &CpuWork| w.user_s + w.system_s;
        let share = if self.pinned {
            self.cpus.get(1).map_or(0.0, |w| task(w) / self.secs)
        } else {
            let all: f64 = self.cpus.iter().map(task).sum();
            (all - self.self_s) / (self.secs * self.cpus.len().max(1) as f64)
        };
        share.max(0.0)
    }
    fn quiet(&self) -> bool {
        self.others_share() < QUIET_SHARE
    }
    /// µs of all CPUs' busy time per delivered packet.
    fn total_us(&self) -> Option<f64> {
        let busy: f64 = self.cpus.iter().map(|w| w.busy_s).sum();
        (self.received > 0 && !self.cpus.is_empty()).then(|| busy * 1e6 / self.received as f64)
    }
    fn to_json(&self) -> Value {
        let r2 = |x: Option<f64>| x.map(round2);
        json!({
            "phase": self.phase,
            "path": self.path,
            "round": self.round,
            "target_pps": self.target_pps,
            "secs": gateway::round3(self.secs),
            "sent": self.sent,
            "received": self.received,
            "offered_pps": self.offered_pps().round(),
            "delivered_pps": self.delivered_pps().round(),
            "delivered_share": gateway::round3(self.delivered_share()),
            "gateway_forwarded_pps": self.gateway_forwarded.map(|f| (f as f64 / self.secs).round()),
            "cpu": self.cpu.to_json(),
            "per_cpu": self.cpus.iter().map(|w| w.to_json(self.secs)).collect::<Vec<_>>(),
            "self_cpu_s": gateway::round3(self.self_s),
            "other_programs_cpu_share": gateway::round3(self.others_share()),
            "quiet": self.quiet(),
            "us_per_packet": {
                "chain": r2(self.chain_us()),
                "cpu0_irq_softirq": r2(self.cpu_kernel_us(0)),
                "cpu1_irq_softirq": r2(self.cpu_kernel_us(1)),
                "all_cpus_busy": r2(self.total_us()),
                "cpu0_busy": r2(self.cpu_us(0)),
                "cpu1_busy": r2(self.cpu_us(1)),
                "cpu1_softirq_sampled": r2(self.cpu_softirq_us(1)),
            },
        })
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A data path under test.
struct PathUnder<'a> {
    name: &'static str,
    a: &'a Tenant,
    b: &'a Tenant,
    counter: Box<dyn Fn() -> Option<u64> + 'a>,
}

fn run(args: &Args) -> Result<()> {
    if args.rounds == 0 || args.secs == 0 || args.senders == 0 || args.senders > 16 {
        bail!("--rounds and --secs must be at least 1, --senders 1..=16");
    }
    if !(16..=1400).contains(&args.payload) {
        bail!("--payload must be 16..=1400 bytes");
    }
    if args.cost_rounds > 0 && (args.cost_secs == 0 || !(100..=1_000_000).contains(&args.rate)) {
        bail!("--cost-secs must be at least 1 and --rate 100..=1000000");
    }
    if args.rounds + args.cost_rounds + args.steered_rounds > 40
        || args.secs > 60
        || args.cost_secs > 60
    {
        bail!("at most 40 rounds in all and 60 s a round");
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
    let cpus = gateway::cpus();
    let steer = !args.no_steer && cpus >= 2;
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
    let direct = if args.no_direct {
        None
    } else {
        Some(direct_pair(&topo, &mut ov)?)
    };

    // Native XDP_TX into a veth needs a program on the peer: an unconfigured gateway program
    // passes everything. Attached before yard, so the gateway's first ARP replies get through.
    let _peer_pass = if want_xdp && args.xdp_mode == Mode::Native {
        Some(attach_peer_pass(&topo, YARD_HOST)?)
    } else {
        None
    };

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
        progress(&format!(
            "starting a one-node yard cluster with the gateway on host 1 ({} XDP)",
            args.xdp_mode.name()
        ));
        match setup_yard(&topo, bin, args.xdp_mode.name(), &ya, &yb) {
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
    if let Some((a, b)) = &direct {
        a.wait_reachable(b.ip(), Duration::from_secs(10))
            .context("floor path: tenant A cannot reach B")?;
    }

    let mut paths: Vec<PathUnder<'_>> = Vec::new();
    if let Some(c) = &yard {
        paths.push(PathUnder {
            name: "xdp",
            a: &ya,
            b: &yb,
            counter: Box::new(move || gateway::yard_forwarded(c, YARD_HOST).ok()),
        });
    }
    if let Some(gw) = &kernel {
        paths.push(PathUnder {
            name: "kernel",
            a: &ka,
            b: &kb,
            counter: Box::new(move || gw.forwarded_packets().ok()),
        });
    }
    if let Some((a, b)) = &direct {
        paths.push(PathUnder {
            name: "direct",
            a,
            b,
            counter: Box::new(|| None),
        });
    }
    let check = || -> Result<()> {
        if let Some(c) = &yard {
            c.check_running()?;
        }
        Ok(())
    };

    let mut rounds = Vec::new();
    // Phase 1: flat out, unsteered (the scheduler places everything).
    progress("phase 1/4 saturation: sender flat out, no steering");
    let sat = Blast {
        phase: "saturation",
        secs: args.secs,
        senders: args.senders,
        payload: args.payload,
        rate: None,
        pin: None,
    };
    run_phase(&mut rounds, &paths, &sat, args.rounds, &check)?;

    if args.cost_rounds > 0 && args.unsteered_cost {
        progress(&format!(
            "phase 2/4 cost-unsteered: {} pps offered, no steering, CPU time per delivered packet",
            args.rate
        ));
        let ucost = Blast {
            phase: "cost-unsteered",
            secs: args.cost_secs,
            senders: 1,
            payload: args.payload,
            rate: Some(args.rate),
            pin: None,
        };
        run_phase(&mut rounds, &paths, &ucost, args.cost_rounds, &check)?;
    }

    let mut steering = RpsSteering::default();
    if steer && (args.cost_rounds > 0 || args.steered_rounds > 0) {
        apply_steering(&topo, &mut steering)?;
        progress(&format!(
            "steering: receive work of the underlay hop from host {HOST_A} and of the gateway hosts on CPU {GW_CPU}; sender, receiver and compute hosts on CPU {APP_CPU}"
        ));
    } else if !steer {
        progress("no steering (--no-steer or a single CPU)");
    }
    let pin = steer.then_some(APP_CPU);
    if args.cost_rounds > 0 {
        progress(&format!(
            "phase 3/4 cost: {} pps offered, CPU time per delivered packet",
            args.rate
        ));
        let cost = Blast {
            phase: "cost",
            secs: args.cost_secs,
            senders: 1,
            payload: args.payload,
            rate: Some(args.rate),
            pin,
        };
        run_phase(&mut rounds, &paths, &cost, args.cost_rounds, &check)?;
    }
    if args.steered_rounds > 0 && steer {
        progress("phase 4/4 steered saturation: sender flat out on CPU 0, gateway hop on CPU 1");
        let gw_paths: Vec<PathUnder<'_>> = paths
            .iter()
            .filter(|p| p.name != "direct")
            .map(|p| PathUnder {
                name: p.name,
                a: p.a,
                b: p.b,
                counter: Box::new(|| (p.counter)()),
            })
            .collect();
        let ss = Blast {
            phase: "steered-saturation",
            secs: args.secs,
            senders: args.senders,
            payload: args.payload,
            rate: None,
            pin,
        };
        run_phase(&mut rounds, &gw_paths, &ss, args.steered_rounds, &check)?;
    }
    let steering_json = steering.to_json();
    steering.restore();

    let report = summarize(
        args,
        &topo,
        &rounds,
        cpus,
        steer,
        steering_json,
        &yard_error,
    );
    report_tables(&report);
    drop(paths);
    drop(yard);
    drop(ov);
    drop(topo);
    let mut report = report;
    report["elapsed_s"] = json!(gateway::round1(started.elapsed().as_secs_f64()));
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(p) = &args.json_out {
        std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(e) = report["xdp_error"].as_str() {
        bail!("the XDP side was not measured: {e}");
    }
    Ok(())
}

/// Interleaves `n` rounds of every path.
fn run_phase(
    rounds: &mut Vec<Round>,
    paths: &[PathUnder<'_>],
    spec: &Blast,
    n: usize,
    check: &dyn Fn() -> Result<()>,
) -> Result<()> {
    for r in 1..=n {
        for p in paths {
            check()?;
            let before = (p.counter)();
            let mut round = blast(spec, p.name, r, p.a, p.b)?;
            let after = (p.counter)();
            round.gateway_forwarded = before.zip(after).map(|(b, a)| a.saturating_sub(b));
            report_round(&round, n);
            rounds.push(round);
            std::thread::sleep(Duration::from_millis(700));
        }
    }
    Ok(())
}

/// The floor path: VNI 300 from host A straight to host B, each tunnel's remote a /32 alias
/// (198.19.254.<host>) on the other compute host's `eth0`.
fn direct_pair(topo: &Topology, ov: &mut Overlay<'_>) -> Result<(Tenant, Tenant)> {
    for h in [HOST_A, HOST_B] {
        let out = topo.exec(
            h,
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/32", direct_alias(h)),
                "dev",
                "eth0",
            ],
        )?;
        if !out.status.success() {
            bail!(
                "cannot add {} to host {h}: {}",
                direct_alias(h),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    let ip = |h: usize| Ipv4Addr::new(198, 19, (DIRECT_VNI / 100) as u8, h as u8);
    let a = ov.add_tenant(
        HOST_A,
        DIRECT_VNI,
        ip(HOST_A),
        tenant_mac(DIRECT_VNI, HOST_A as u8),
        direct_alias(HOST_B),
    )?;
    let b = ov.add_tenant(
        HOST_B,
        DIRECT_VNI,
        ip(HOST_B),
        tenant_mac(DIRECT_VNI, HOST_B as u8),
        direct_alias(HOST_A),
    )?;
    Ok((a, b))
}

/// Loads an unconfigured copy of yard's gateway program (it returns XDP_PASS for every frame
/// while its config map is empty) and attaches it in native mode to the fabric-side peer of
/// host `host`'s `eth0`. The attachment lasts as long as the returned value.
fn attach_peer_pass(topo: &Topology, host: usize) -> Result<yard_ebpf::Gateway> {
    let port = format!("h{host}");
    let handle = yard_cluster_tests::thread_in_namespace(
        &topo.fabric_ns(),
        "peer-pass".into(),
        move || -> std::result::Result<yard_ebpf::Gateway, yard_ebpf::EbpfError> {
            let mut g = yard_ebpf::Gateway::load()?;
            g.attach(&port, yard_ebpf::XdpMode::Native)?;
            Ok(g)
        },
    )?;
    let g = handle
        .join()
        .map_err(|_| anyhow::anyhow!("the peer-pass thread panicked"))?
        .context("cannot attach a pass program to the gateway's fabric-side peer")?;
    progress(&format!(
        "native mode: an unconfigured (pass-everything) gateway program on h{host} in the fabric"
    ));
    Ok(g)
}

/// RPS steering for phases 2 and 3; see the module docs.
fn apply_steering(topo: &Topology, s: &mut RpsSteering) -> Result<()> {
    let fabric = topo.fabric_ns();
    s.set(&fabric, &format!("h{HOST_A}"), CPU1_MASK)?;
    s.set(&fabric, &format!("h{YARD_HOST}"), CPU0_MASK)?;
    s.set(&fabric, &format!("h{KERNEL_HOST}"), CPU0_MASK)?;
    s.set(&topo.ns_name(HOST_B), "eth0", CPU0_MASK)?;
    Ok(())
}

fn setup_yard<'t>(
    topo: &'t Topology,
    bin: &std::path::Path,
    xdp_mode: &str,
    a: &Tenant,
    b: &Tenant,
) -> Result<YardCluster<&'t Topology>> {
    let c = gateway::start_yard(topo, bin, 1, xdp_mode, YardTimings::DEFAULT, "")?;
    gateway::configure_yard_gateway(&c, HOST_A, YARD_VIP, &[a.clone(), b.clone()])?;
    let owner = gateway::wait_vip_owner(&c, HOST_A, None, YARD_VIP, Duration::from_secs(20))?;
    progress(&format!("VIP {YARD_VIP} owned by node {owner}"));
    a.wait_reachable(b.ip(), Duration::from_secs(15))
        .context("XDP gateway: tenant A cannot reach B")?;
    Ok(c)
}

fn report_round(r: &Round, of: usize) {
    let us = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    progress(&format!(
        "{} {}/{of} {:<6}: offered {:>7.0} pps, delivered {:>7.0} pps ({:.1}%), gw fwd {}, busy {:.0}% (cpu0 {:.0}%, cpu1 {:.0}%), µs/pkt chain {} cpu1 irq+softirq {}",
        r.phase,
        r.round,
        r.path,
        r.offered_pps(),
        r.delivered_pps(),
        r.delivered_share() * 100.0,
        r.gateway_forwarded
            .map_or_else(|| "-".to_owned(), |f| format!("{:.0} pps", f as f64 / r.secs)),
        r.cpu.busy_pct,
        r.cpus.first().map_or(0.0, |w| w.busy_s * 100.0 / r.secs),
        r.cpus.get(1).map_or(0.0, |w| w.busy_s * 100.0 / r.secs),
        us(r.chain_us()),
        us(r.cpu_kernel_us(1)),
    ));
}

/// Sends from `a` to `b` for `spec.secs`, flat out or paced; counts what arrives.
fn blast(spec: &Blast, path: &'static str, round: usize, a: &Tenant, b: &Tenant) -> Result<Round> {
    let dst = SocketAddrV4::new(b.ip(), PORT);
    let stop_rx = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let pin = spec.pin;
    let receiver = {
        let (stop_rx, counting) = (Arc::clone(&stop_rx), Arc::clone(&counting));
        let limit = Duration::from_secs(spec.secs + 30);
        b.thread(move || -> std::io::Result<u64> {
            if let Some(cpu) = pin {
                gateway::pin_this_thread(cpu).map_err(std::io::Error::other)?;
            }
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
    let (ready_s_tx, ready_s_rx) = std::sync::mpsc::channel::<()>();
    let mut senders = Vec::new();
    let per_sender_rate = spec.rate.map(|r| r as f64 / spec.senders as f64);
    for _ in 0..spec.senders {
        let (sent, go, stop_tx) = (Arc::clone(&sent), Arc::clone(&go), Arc::clone(&stop_tx));
        let (src, payload) = (a.ip(), spec.payload);
        let limit = Duration::from_secs(spec.secs + 30);
        let ready = ready_s_tx.clone();
        senders.push(a.thread(move || {
            if let Some(cpu) = pin {
                let _ = gateway::pin_this_thread(cpu);
            }
            let sock = UdpSocket::bind(SocketAddrV4::new(src, 0));
            let _ = ready.send(());
            let Ok(sock) = sock else {
                return;
            };
            let buf = vec![0x5au8; payload];
            let t0 = Instant::now();
            while !go.load(Ordering::Relaxed) && t0.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut n = 0u64;
            match per_sender_rate {
                None => {
                    while !stop_tx.load(Ordering::Relaxed) && t0.elapsed() < limit {
                        // Refused sends (a full queue) are not counted as offered.
                        if sock.send_to(&buf, dst).is_ok() {
                            n += 1;
                        }
                    }
                }
                Some(rate) => {
                    // Paced: catch up to rate × elapsed, then sleep a little; attempts count
                    // toward the schedule whether or not the kernel took them.
                    let start = Instant::now();
                    let mut attempts = 0u64;
                    while !stop_tx.load(Ordering::Relaxed) && t0.elapsed() < limit {
                        let due = (start.elapsed().as_secs_f64() * rate) as u64;
                        while attempts < due {
                            attempts += 1;
                            if sock.send_to(&buf, dst).is_ok() {
                                n += 1;
                            }
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
            sent.fetch_add(n, Ordering::Relaxed);
        })?);
    }
    drop(ready_s_tx);
    for _ in 0..spec.senders {
        let _ = ready_s_rx.recv_timeout(Duration::from_secs(10));
    }
    counting.store(true, Ordering::SeqCst);
    let cpu0 = CpuTimes::now();
    let self0 = gateway::self_cpu_s();
    let per0 = PerCpuSnapshot::now();
    let t0 = Instant::now();
    go.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(spec.secs));
    stop_tx.store(true, Ordering::SeqCst);
    let secs = t0.elapsed().as_secs_f64();
    let cpus = PerCpuSnapshot::now().since(&per0);
    let self_s = gateway::self_cpu_s() - self0;
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
        phase: spec.phase,
        path,
        round,
        target_pps: spec.rate,
        sent: sent.load(Ordering::Relaxed),
        received,
        secs,
        gateway_forwarded: None,
        cpu,
        cpus,
        self_s,
        pinned: pin.is_some(),
    })
}

fn med(
    rounds: &[Round],
    phase: &str,
    path: &str,
    f: impl Fn(&Round) -> Option<f64>,
) -> Option<f64> {
    let v: Vec<f64> = rounds
        .iter()
        .filter(|r| r.phase == phase && r.path == path)
        .filter_map(f)
        .collect();
    stats::median(&v)
}

/// Median over rounds of (path's figure − the floor's figure in the same round number).
/// Only pairs where both rounds were quiet count, unless there are none.
fn med_minus_floor(
    rounds: &[Round],
    phase: &str,
    path: &str,
    f: impl Fn(&Round) -> Option<f64>,
) -> Option<f64> {
    let pairs: Vec<(&Round, &Round)> = rounds
        .iter()
        .filter(|r| r.phase == phase && r.path == path)
        .filter_map(|r| {
            let floor = rounds
                .iter()
                .find(|d| d.phase == phase && d.path == "direct" && d.round == r.round)?;
            Some((r, floor))
        })
        .collect();
    let quiet: Vec<(&Round, &Round)> = pairs
        .iter()
        .copied()
        .filter(|(r, d)| r.quiet() && d.quiet())
        .collect();
    let use_pairs = if quiet.is_empty() { pairs } else { quiet };
    let v: Vec<f64> = use_pairs
        .iter()
        .filter_map(|(r, d)| Some(f(r)? - f(d)?))
        .collect();
    stats::median(&v)
}

/// How many round pairs (path, floor) were both quiet.
fn quiet_pairs(rounds: &[Round], phase: &str, path: &str) -> usize {
    rounds
        .iter()
        .filter(|r| r.phase == phase && r.path == path && r.quiet())
        .filter(|r| {
            rounds
                .iter()
                .any(|d| d.phase == phase && d.path == "direct" && d.round == r.round && d.quiet())
        })
        .count()
}

fn opt(x: Option<f64>, f: fn(f64) -> f64) -> Value {
    x.map_or(Value::Null, |v| json!(f(v)))
}

fn summarize(
    args: &Args,
    topo: &Topology,
    rounds: &[Round],
    cpus: usize,
    steer: bool,
    steering: Value,
    yard_error: &Option<String>,
) -> Value {
    let names = ["xdp", "kernel", "direct"];
    // Phase 1.
    let mut sat = serde_json::Map::new();
    for p in names {
        let d = med(rounds, "saturation", p, |r| Some(r.delivered_pps()));
        if d.is_none() {
            continue;
        }
        sat.insert(
            p.into(),
            json!({
                "delivered_pps_median": opt(d, f64::round),
                "offered_pps_median": opt(med(rounds, "saturation", p, |r| Some(r.offered_pps())), f64::round),
                "delivered_share_median": opt(med(rounds, "saturation", p, |r| Some(r.delivered_share())), gateway::round3),
                "cpu_busy_pct_median": opt(med(rounds, "saturation", p, |r| Some(r.cpu.busy_pct)), gateway::round1),
                "us_per_packet_chain_median": opt(med(rounds, "saturation", p, Round::chain_us), round2),
                "us_per_packet_all_cpus_busy_median": opt(med(rounds, "saturation", p, Round::total_us), round2),
            }),
        );
    }
    let sat_ratio = stats::ratio(
        med(rounds, "saturation", "xdp", |r| Some(r.delivered_pps())),
        med(rounds, "saturation", "kernel", |r| Some(r.delivered_pps())),
    );

    // Phase 2 (steered) and its unsteered twin.
    let (cost, cost_ratios, capacity) = cost_summary(rounds, "cost");
    let (ucost, ucost_ratios, _) = cost_summary(rounds, "cost-unsteered");

    // Phase 3.
    let mut ssat = serde_json::Map::new();
    for p in ["xdp", "kernel"] {
        let ph = "steered-saturation";
        if med(rounds, ph, p, |r| Some(r.delivered_pps())).is_none() {
            continue;
        }
        ssat.insert(
            p.into(),
            json!({
                "delivered_pps_median": opt(med(rounds, ph, p, |r| Some(r.delivered_pps())), f64::round),
                "offered_pps_median": opt(med(rounds, ph, p, |r| Some(r.offered_pps())), f64::round),
                "cpu0_busy_pct_median": opt(med(rounds, ph, p, |r| r.cpus.first().map(|w| w.busy_s * 100.0 / r.secs)), gateway::round1),
                "cpu1_busy_pct_median": opt(med(rounds, ph, p, |r| r.cpus.get(1).map(|w| w.busy_s * 100.0 / r.secs)), gateway::round1),
                "cpu1_irq_softirq_us_per_packet_median": opt(med(rounds, ph, p, |r| r.cpu_kernel_us(1)), round2),
                "chain_us_per_packet_median": opt(med(rounds, ph, p, Round::chain_us), round2),
            }),
        );
    }
    let ssat_ratio = stats::ratio(
        med(rounds, "steered-saturation", "xdp", |r| {
            Some(r.delivered_pps())
        }),
        med(rounds, "steered-saturation", "kernel", |r| {
            Some(r.delivered_pps())
        }),
    );

    json!({
        "benchmark": "gateway-forward",
        "run_id": topo.run_id(),
        "cpus": cpus,
        "args": {
            "rounds": args.rounds, "secs": args.secs, "senders": args.senders,
            "payload_bytes": args.payload, "xdp_mode": args.xdp_mode.name(),
            "rate": args.rate, "cost_rounds": args.cost_rounds, "cost_secs": args.cost_secs,
            "steered_rounds": args.steered_rounds, "unsteered_cost": args.unsteered_cost, "steer": steer, "direct_floor": !args.no_direct,
        },
        "notes": [
            "saturation: everything shares the CPUs; delivered pps is bounded by the whole chain (sender, encap, bridges, veths, gateway, decap, receiver), not by the gateway",
            "cost: fixed offered rate; with steering, CPU 1 runs the underlay hop from host A plus whatever the gateway host does; 'direct' runs the same hop with no gateway, so cpu1_minus_floor is the gateway host's own CPU per packet",
            "busy = wall - idle - iowait - steal per CPU (nohz idle clock: exact to 10 ms); irq_softirq = busy - tick-sampled user and system time: it keeps softirqs run from idle (never tick-sampled) and drops other programs' work on this shared machine; chain = irq_softirq of all CPUs (all packet processing; the sender's and receiver's syscalls and user time, equal on every path, are left out)",
            "steered-saturation: CPU 0 saturates on every path, so delivered pps there measures CPU 0, not the gateway; a fast gateway also hands packets back to CPU 0 one at a time (more IPIs and NET_RX runs per packet, see per_cpu call_ipis and net_rx_softirqs) where a slow one returns them in batches, which makes the XDP path's CPU 0 work per packet higher",
            "the gateway figure that answers 'XDP vs kernel forwarding' is cost.*.gateway_us_per_packet.cpu1_irq_softirq_minus_floor and its ratio cost_ratios_kernel_over_xdp.gateway_share_cpu1",
            "busy-based figures include other programs on this shared machine and are given for completeness only",
        ],
        "yard_timings": YardTimings::DEFAULT.to_json(),
        "xdp_error": yard_error,
        "steering": steering,
        "rounds": rounds.iter().map(Round::to_json).collect::<Vec<_>>(),
        "saturation": sat,
        "ratio_xdp_over_kernel_delivered_pps": opt(sat_ratio, gateway::round3),
        "cost": cost,
        "cost_ratios_kernel_over_xdp": cost_ratios,
        "cost_unsteered": ucost,
        "cost_unsteered_ratios_kernel_over_xdp": ucost_ratios,
        "one_core_forwarding_capacity_estimate": capacity,
        "steered_saturation": ssat,
        "ratio_xdp_over_kernel_steered_delivered_pps": opt(ssat_ratio, gateway::round3),
    })
}

/// Min over rounds (noise from other programs only ever adds CPU time).
fn min_of(
    rounds: &[Round],
    phase: &str,
    path: &str,
    f: impl Fn(&Round) -> Option<f64>,
) -> Option<f64> {
    rounds
        .iter()
        .filter(|r| r.phase == phase && r.path == path)
        .filter_map(f)
        .reduce(f64::min)
}

/// Per path figures, kernel/xdp ratios and the one-core capacity estimate of a fixed-rate phase.
fn cost_summary(rounds: &[Round], ph: &str) -> (Value, Value, Value) {
    let mut cost = serde_json::Map::new();
    for p in ["xdp", "kernel", "direct"] {
        if med(rounds, ph, p, |r| Some(r.delivered_pps())).is_none() {
            continue;
        }
        let c = |f: fn(&Round) -> Option<f64>| opt(med(rounds, ph, p, f), round2);
        let mut o = json!({
            "offered_pps_median": opt(med(rounds, ph, p, |r| Some(r.offered_pps())), f64::round),
            "delivered_pps_median": opt(med(rounds, ph, p, |r| Some(r.delivered_pps())), f64::round),
            "delivered_share_min": min_of(rounds, ph, p, |r| Some(r.delivered_share())).map(gateway::round3),
            "quiet_rounds": rounds.iter().filter(|r| r.phase == ph && r.path == p && r.quiet()).count(),
            "us_per_packet_median": {
                "chain": c(Round::chain_us),
                "cpu0_irq_softirq": c(|r| r.cpu_kernel_us(0)),
                "cpu1_irq_softirq": c(|r| r.cpu_kernel_us(1)),
                "all_cpus_busy": c(Round::total_us),
                "cpu0_busy": c(|r| r.cpu_us(0)),
                "cpu1_busy": c(|r| r.cpu_us(1)),
                "cpu1_softirq_sampled": c(|r| r.cpu_softirq_us(1)),
            },
            "us_per_packet_min": {
                "chain": opt(min_of(rounds, ph, p, Round::chain_us), round2),
                "cpu1_irq_softirq": opt(min_of(rounds, ph, p, |r| r.cpu_kernel_us(1)), round2),
            },
            "ipis_per_packet_median": {
                "cpu0": opt(med(rounds, ph, p, |r| r.ipis_per_packet(0)), gateway::round3),
                "cpu1": opt(med(rounds, ph, p, |r| r.ipis_per_packet(1)), gateway::round3),
            },
            "cpu1_net_rx_share_median": opt(med(rounds, ph, p, |r| {
                let total: u64 = r.cpus.iter().map(|w| w.net_rx_softirqs).sum();
                r.cpus.get(1).map(|w| w.net_rx_softirqs as f64 / total.max(1) as f64)
            }), gateway::round3),
        });
        if p != "direct" {
            let mm = |f: fn(&Round) -> Option<f64>| {
                min_of(rounds, ph, p, f)
                    .zip(min_of(rounds, ph, "direct", f))
                    .map(|(a, b)| a - b)
            };
            o["gateway_us_per_packet"] = json!({
                "quiet_round_pairs": quiet_pairs(rounds, ph, p),
                "note": "medians over round pairs where other programs used < 10% of the measured CPUs (all pairs if none)",
                "cpu1_irq_softirq_minus_floor": opt(med_minus_floor(rounds, ph, p, |r| r.cpu_kernel_us(1)), round2),
                "cpu1_irq_softirq_min_minus_floor_min": opt(mm(|r| r.cpu_kernel_us(1)), round2),
                "chain_minus_floor": opt(med_minus_floor(rounds, ph, p, Round::chain_us), round2),
                "chain_min_minus_floor_min": opt(mm(Round::chain_us), round2),
                "cpu1_busy_minus_floor": opt(med_minus_floor(rounds, ph, p, |r| r.cpu_us(1)), round2),
                "all_cpus_busy_minus_floor": opt(med_minus_floor(rounds, ph, p, Round::total_us), round2),
            });
        }
        cost.insert(p.into(), o);
    }
    // Shares only from quiet round pairs: under contention the floor subtraction is noise.
    let share = |p: &str, f: fn(&Round) -> Option<f64>| {
        med_minus_floor(rounds, ph, p, f).filter(|_| quiet_pairs(rounds, ph, p) > 0)
    };
    // Below 0.05 µs per packet a share is under this method's resolution.
    let pos = |x: Option<f64>| x.filter(|v| *v >= 0.05);
    let xs = pos(share("xdp", |r| r.cpu_kernel_us(1)));
    let ks = pos(share("kernel", |r| r.cpu_kernel_us(1)));
    let xs_all = pos(share("xdp", Round::chain_us));
    let ks_all = pos(share("kernel", Round::chain_us));
    let minshare = |p: &str, f: fn(&Round) -> Option<f64>| {
        pos(min_of(rounds, ph, p, f)
            .zip(min_of(rounds, ph, "direct", f))
            .map(|(a, b)| a - b))
    };
    let ratios = json!({
        "note": "kernel cost / xdp cost: >1 means the XDP gateway spends less CPU per forwarded packet; 'gateway_share' figures subtract the no-gateway floor (median: over quiet round pairs, null when none was quiet; min: min over all rounds of each)",
        "chain_per_packet": opt(stats::ratio(med(rounds, ph, "kernel", Round::chain_us), med(rounds, ph, "xdp", Round::chain_us)), round2),
        "cpu1_irq_softirq_per_packet": opt(stats::ratio(med(rounds, ph, "kernel", |r| r.cpu_kernel_us(1)), med(rounds, ph, "xdp", |r| r.cpu_kernel_us(1))), round2),
        "all_cpus_busy_per_packet": opt(stats::ratio(med(rounds, ph, "kernel", Round::total_us), med(rounds, ph, "xdp", Round::total_us)), round2),
        "gateway_share_cpu1": opt(stats::ratio(ks, xs), round2),
        "gateway_share_cpu1_min": opt(stats::ratio(minshare("kernel", |r| r.cpu_kernel_us(1)), minshare("xdp", |r| r.cpu_kernel_us(1))), round2),
        "gateway_share_chain": opt(stats::ratio(ks_all, xs_all), round2),
        "gateway_share_chain_min": opt(stats::ratio(minshare("kernel", Round::chain_us), minshare("xdp", Round::chain_us)), round2),
    });
    let capacity = json!({
        "note": "1e6 / gateway µs per packet (CPU 1 irq+softirq minus floor, medians): packets one CPU could forward doing nothing else, assuming cost per packet stays flat up to saturation; not measured (CPU 0 cannot offer that much), and batching at high load would make both real figures higher",
        "xdp_pps": opt(xs.map(|v| 1e6 / v), f64::round),
        "kernel_pps": opt(ks.map(|v| 1e6 / v), f64::round),
    });
    (Value::Object(cost), ratios, capacity)
}

fn report_tables(r: &Value) {
    let f0 = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.0}"))
    };
    let f2 = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"))
    };
    eprintln!();
    eprintln!("saturation (unsteered, medians)");
    eprintln!(
        "{:<8} {:>12} {:>14} {:>8} {:>12}",
        "path", "offered pps", "delivered pps", "cpu %", "chain µs"
    );
    for p in ["xdp", "kernel", "direct"] {
        let s = &r["saturation"][p];
        if s.is_null() {
            continue;
        }
        eprintln!(
            "{p:<8} {:>12} {:>14} {:>8} {:>12}",
            f0(&s["offered_pps_median"]),
            f0(&s["delivered_pps_median"]),
            f0(&s["cpu_busy_pct_median"]),
            f2(&s["us_per_packet_chain_median"])
        );
    }
    eprintln!(
        "ratio xdp/kernel delivered pps: {}",
        f2(&r["ratio_xdp_over_kernel_delivered_pps"])
    );
    for (key, ratios, title) in [
        (
            "cost_unsteered",
            "cost_unsteered_ratios_kernel_over_xdp",
            "unsteered",
        ),
        (
            "cost",
            "cost_ratios_kernel_over_xdp",
            "steered: gateway hop on CPU 1",
        ),
    ] {
        if r[key].as_object().is_none_or(|o| o.is_empty()) {
            continue;
        }
        eprintln!();
        eprintln!(
            "cost at {} pps offered, {title} (medians; µs of CPU per delivered packet; k = irq+softirq)",
            r["args"]["rate"]
        );
        eprintln!(
            "{:<8} {:>10} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10}",
            "path",
            "delivered",
            "chain",
            "cpu0 k",
            "cpu1 k",
            "cpu1 busy",
            "cpu1 ipi",
            "gw(cpu1)",
            "gw(chain)"
        );
        for p in ["xdp", "kernel", "direct"] {
            let c = &r[key][p];
            if c.is_null() {
                continue;
            }
            let u = &c["us_per_packet_median"];
            let g = &c["gateway_us_per_packet"];
            eprintln!(
                "{p:<8} {:>10} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10}",
                f0(&c["delivered_pps_median"]),
                f2(&u["chain"]),
                f2(&u["cpu0_irq_softirq"]),
                f2(&u["cpu1_irq_softirq"]),
                f2(&u["cpu1_busy"]),
                f2(&c["ipis_per_packet_median"]["cpu1"]),
                f2(&g["cpu1_irq_softirq_minus_floor"]),
                f2(&g["chain_minus_floor"]),
            );
        }
        let cr = &r[ratios];
        eprintln!(
            "kernel/xdp cost per packet: chain {}, CPU 1 k {}; gateway share (− floor): CPU 1 k {} (mins {}), chain {} (mins {}); quiet round pairs xdp {}, kernel {}",
            f2(&cr["chain_per_packet"]),
            f2(&cr["cpu1_irq_softirq_per_packet"]),
            f2(&cr["gateway_share_cpu1"]),
            f2(&cr["gateway_share_cpu1_min"]),
            f2(&cr["gateway_share_chain"]),
            f2(&cr["gateway_share_chain_min"]),
            r[key]["xdp"]["gateway_us_per_packet"]["quiet_round_pairs"],
            r[key]["kernel"]["gateway_us_per_packet"]["quiet_round_pairs"]
        );
        if key == "cost" {
            let cap = &r["one_core_forwarding_capacity_estimate"];
            eprintln!(
                "one-core forwarding capacity estimate (extrapolated, not measured): xdp {} pps, kernel {} pps",
                f0(&cap["xdp_pps"]),
                f0(&cap["kernel_pps"])
            );
        }
    }
    if r["steered_saturation"]
        .as_object()
        .is_some_and(|o| !o.is_empty())
    {
        eprintln!();
        eprintln!("steered saturation (medians)");
        eprintln!(
            "{:<8} {:>12} {:>14} {:>8} {:>8} {:>10}",
            "path", "offered pps", "delivered pps", "cpu0 %", "cpu1 %", "cpu1 k µs"
        );
        for p in ["xdp", "kernel"] {
            let s = &r["steered_saturation"][p];
            if s.is_null() {
                continue;
            }
            eprintln!(
                "{p:<8} {:>12} {:>14} {:>8} {:>8} {:>10}",
                f0(&s["offered_pps_median"]),
                f0(&s["delivered_pps_median"]),
                f0(&s["cpu0_busy_pct_median"]),
                f0(&s["cpu1_busy_pct_median"]),
                f2(&s["cpu1_irq_softirq_us_per_packet_median"])
            );
        }
        eprintln!(
            "ratio xdp/kernel delivered pps (steered): {}",
            f2(&r["ratio_xdp_over_kernel_steered_delivered_pps"])
        );
    }
}
