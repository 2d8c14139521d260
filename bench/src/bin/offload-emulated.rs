//! `offload-emulated`: the gateway's forwarding function whole on the host against split
//! between an emulated NIC and the host (issue 15), on one topology in interleaved rounds.
//!
//! Layout: host 1 is the gateway, with an emulated NIC in front of its `eth0`
//! (`Topology::emulate_nic`: wire port `nicw0`, host port `nicp0`); host 2 sends VXLAN frames
//! to VIP 198.19.255.1 (VNI 100, inner UDP to an endpoint that lives on host 3) from a raw packet
//! socket, flat out; host 3 receives what the gateway forwards (and drops it: no VXLAN device).
//! Every round runs one of two configurations, both with the same hops:
//!
//! - `whole`: the emulated NIC passes every frame through (`EmulatedNic::open_passthrough`),
//!   the whole gateway program runs on `eth0`;
//! - `split`: the NIC part of the nfp cut runs on `nicw0`, the host part on `eth0`.
//!
//! The NIC's receive work runs on its own CPU: threaded NAPI on `nicw0` and `nicp0`, their
//! kernel threads pinned to CPU 1; the host's (`eth0`'s NAPI thread) and the sender are pinned
//! to CPU 0. Figures per round: offered and delivered pps (delivered: frames the fabric port
//! of host 3 transmitted), host CPU per delivered packet (CPU time of `eth0`'s NAPI thread,
//! from /proc/<pid>/schedstat: the host's receive path with its XDP program), NIC CPU per
//! packet (the two NIC threads), and the XDP programs' own ns per run (kernel BPF run
//! statistics, enabled for the run and restored after). Medians over the rounds of each
//! configuration and split/whole ratios go to stdout as JSON and to stderr as a table.
//!
//! A benchmark, not a test: it prints figures and never fails on a number; it fails when it
//! cannot measure (no root, no threaded NAPI, nothing delivered).

#[allow(dead_code)]
#[path = "../gateway/mod.rs"]
mod gateway;
#[allow(dead_code)]
#[path = "../hostcpu.rs"]
mod hostcpu;
#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use hostcpu::kthreads;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_actors::gateway::announce::PacketSender;
use yard_cluster_tests::Topology;
use yard_ebpf::frames::{Inner, VxlanFrame};
use yard_ebpf::{
    Counter, EmulatedNic, Endpoint, Gateway, GatewayConfig, GatewayImage, VipMode, XdpMode,
};

use stats::median;

#[derive(Parser, Debug)]
#[command(about = "the gateway whole against split on an emulated NIC: pps and CPU per packet")]
struct Args {
    /// Rounds of each configuration (interleaved).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Measured seconds per round.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Inner UDP payload bytes.
    #[arg(long, default_value_t = 64)]
    payload: usize,
}

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const TENANT_SRC: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 2);
const TENANT_DST: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 3);
const VNI: u32 = 100;
const WIRE: &str = "nicw0";
const PORT: &str = "nicp0";
const CONFIGS: [&str; 2] = ["whole", "split"];

fn mac_bytes(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("bad mac {s}"))?;
    parts.try_into().map_err(|_| anyhow::anyhow!("bad mac {s}"))
}

/// `ip -n ns -s -j link show dev` as JSON: the one link's object.
fn link_json(ns: &str, dev: &str) -> Result<Value> {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", "dev", dev])
        .output()
        .context("cannot run ip")?;
    if !out.status.success() {
        bail!(
            "ip link show {dev} in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    Ok(v[0].clone())
}

fn tx_packets(ns: &str, dev: &str) -> Result<u64> {
    link_json(ns, dev)?["stats64"]["tx"]["packets"]
        .as_u64()
        .with_context(|| format!("no tx packets for {dev} in {ns}"))
}

/// Turns on threaded NAPI for `dev` in `ns` and returns its new NAPI thread(s), pinned to
/// `cpu`.
fn thread_napi(ns: &str, dev: &str, cpu: usize) -> Result<Vec<u32>> {
    let prefix = format!("napi/{dev}-");
    let before = kthreads(&prefix);
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c"])
        .arg(format!("echo 1 > /sys/class/net/{dev}/threaded"))
        .output()
        .context("cannot run ip netns exec")?;
    if !out.status.success() {
        bail!(
            "threaded NAPI on {dev} refused: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let new = loop {
        let new: Vec<u32> = kthreads(&prefix)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        if !new.is_empty() || Instant::now() >= deadline {
            break new;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if new.is_empty() {
        bail!("no NAPI thread appeared for {dev}");
    }
    for pid in &new {
        let ok = std::process::Command::new("taskset")
            .args(["-p", "-c", &cpu.to_string(), &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .status()
            .context("cannot run taskset")?
            .success();
        if !ok {
            bail!("cannot pin NAPI thread {pid} of {dev} to CPU {cpu}");
        }
    }
    Ok(new)
}

/// CPU time (ns) the threads have run, from /proc/<pid>/schedstat.
fn runtime_ns(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// Restores `kernel.bpf_stats_enabled` on drop.
struct BpfStats(String);

impl BpfStats {
    fn enable() -> Result<Self> {
        let path = "/proc/sys/kernel/bpf_stats_enabled";
        let old = std::fs::read_to_string(path).context("cannot read bpf_stats_enabled")?;
        std::fs::write(path, "1").context("cannot enable bpf_stats_enabled")?;
        Ok(Self(old.trim().to_owned()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

/// The data plane of one configuration, held for its rounds.
struct Plane {
    gw: Gateway,
    nic: EmulatedNic,
}

impl Plane {
    /// Switches host 1 to `config`. Split: host part first (it forwards unshimmed frames as
    /// the whole program does), then the NIC part; whole: the other way round.
    fn open(pin: &Path, config: &str) -> Result<Self> {
        let host = |image| -> Result<Gateway> {
            let (mut gw, _) = Gateway::open_pinned_image(pin, image)?;
            gw.attach("eth0", XdpMode::Native)?;
            Ok(gw)
        };
        Ok(if config == "split" {
            let gw = host(GatewayImage::SplitHost)?;
            let nic = EmulatedNic::open(pin, WIRE, PORT, XdpMode::Native)?;
            Self { gw, nic }
        } else {
            let nic = EmulatedNic::open_passthrough(pin, WIRE, PORT, XdpMode::Native)?;
            let gw = host(GatewayImage::Whole)?;
            Self { gw, nic }
        })
    }

    fn forwarded(&self) -> Result<u64> {
        let idx = Counter::Forwarded as usize;
        Ok(self.gw.counters()?[idx].1.packets + self.nic.counters()?[idx].1.packets)
    }

    /// (host program ns, runs), (wire program ns, runs).
    fn run_stats(&self) -> Result<((u64, u64), (u64, u64))> {
        let (h, hn) = self.gw.run_stats()?;
        let (w, wn) = self.nic.wire_run_stats()?;
        Ok(((h.as_nanos() as u64, hn), (w.as_nanos() as u64, wn)))
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    at: Option<Instant>,
    sent: u64,
    delivered: u64,
    forwarded: u64,
    host_ns: u64,
    nic_ns: u64,
    host_prog: (u64, u64),
    wire_prog: (u64, u64),
}

struct Probe<'a> {
    fabric: String,
    sent: &'a AtomicU64,
    host_threads: Vec<u32>,
    nic_threads: Vec<u32>,
}

impl Probe<'_> {
    fn snap(&self, plane: &Plane) -> Result<Snap> {
        let (host_prog, wire_prog) = plane.run_stats()?;
        Ok(Snap {
            at: Some(Instant::now()),
            sent: self.sent.load(Ordering::Relaxed),
            delivered: tx_packets(&self.fabric, "h3")?,
            forwarded: plane.forwarded()?,
            host_ns: runtime_ns(&self.host_threads),
            nic_ns: runtime_ns(&self.nic_threads),
            host_prog,
            wire_prog,
        })
    }
}

fn per(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

/// One round's figures.
fn figures(a: &Snap, b: &Snap) -> Value {
    let secs =
        b.at.zip(a.at)
            .map_or(f64::NAN, |(b, a)| (b - a).as_secs_f64());
    let delivered = b.delivered - a.delivered;
    let host_prog = (b.host_prog.0 - a.host_prog.0, b.host_prog.1 - a.host_prog.1);
    let wire_prog = (b.wire_prog.0 - a.wire_prog.0, b.wire_prog.1 - a.wire_prog.1);
    json!({
        "offered_pps": (b.sent - a.sent) as f64 / secs,
        "delivered_pps": delivered as f64 / secs,
        "forwarded": b.forwarded - a.forwarded,
        "delivered": delivered,
        "host_cpu_ns_per_packet": per(b.host_ns - a.host_ns, delivered),
        "nic_cpu_ns_per_packet": per(b.nic_ns - a.nic_ns, delivered),
        "host_xdp_ns_per_run": per(host_prog.0, host_prog.1),
        "wire_xdp_ns_per_run": per(wire_prog.0, wire_prog.1),
    })
}

fn run(args: &Args) -> Result<()> {
    yard_cluster_tests::require_root();
    let topo = Topology::new(3)?;
    let pin: PathBuf = topo.bpffs(1)?.join("gateway");
    let (wire, port) = topo.emulate_nic(1)?;
    anyhow::ensure!(
        wire == WIRE && port == PORT,
        "unexpected emulated NIC names"
    );
    let fabric = topo.fabric_ns();
    let (gw_mac, sender_mac, rx_mac) = (
        mac_bytes(&topo.mac(1))?,
        mac_bytes(&topo.mac(2))?,
        mac_bytes(&topo.mac(3))?,
    );
    // Static forwarding entries: a bridge that forgot a MAC would flood host 3 with frames
    // meant for the gateway and count them as delivered.
    for (mac, dev) in [(topo.mac(1), "h1"), (topo.mac(3), "h3")] {
        let ok = std::process::Command::new("bridge")
            .args([
                "-n", &fabric, "fdb", "replace", &mac, "dev", dev, "master", "static",
            ])
            .status()
            .context("cannot run bridge")?
            .success();
        anyhow::ensure!(ok, "cannot add a static fdb entry for {mac}");
    }
    let frame = VxlanFrame::new(
        sender_mac,
        gw_mac,
        topo.addr(2),
        VIP,
        VNI,
        Inner::udp(
            [2, 0, 0, 0, 1, 2],
            [2, 0, 0, 0, 1, 3],
            TENANT_SRC,
            TENANT_DST,
            &vec![0x5a; args.payload],
        ),
    )
    .build();
    let sender_ifindex = link_json(&topo.ns_name(2), "eth0")?["ifindex"]
        .as_u64()
        .context("no ifindex for host 2's eth0")? as u32;
    let _bpf_stats = BpfStats::enable()?;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let sender = {
        let (stop, sent) = (stop.clone(), sent.clone());
        topo.thread_in_host(2, move || -> Result<()> {
            gateway::pin_this_thread(0)?;
            let s = PacketSender::open(sender_ifindex).context("cannot open a packet socket")?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // ENOBUFS when the queue is full: offered, not sent; try again.
                if s.send(&frame).is_ok() {
                    n += 1;
                    if n.is_multiple_of(256) {
                        sent.store(n, Ordering::Relaxed);
                    }
                }
            }
            sent.store(n, Ordering::Relaxed);
            Ok(())
        })?
    };

    let rx_host = topo.addr(3);
    let sender_addr = topo.addr(2);
    let (ns1, rounds, secs) = (topo.ns_name(1), args.rounds.max(1), args.secs);
    let sent_c = sent.clone();
    let controller = topo.thread_in_host(1, move || -> Result<(Value, Vec<Value>)> {
        let mut plane = Plane::open(&pin, "whole")?;
        plane.gw.set_config(&GatewayConfig {
            mac: gw_mac,
            mtu: 1500,
        })?;
        plane
            .gw
            .set_lease_deadline(yard_ebpf::ktime_now_ns() + 3_600_000_000_000)?;
        plane.gw.put_vip(VIP, VipMode::Owned)?;
        plane.gw.put_endpoint(&Endpoint {
            vni: VNI,
            ip: TENANT_DST,
            mac: [2, 0, 0, 0, 1, 3],
            host: rx_host,
        })?;
        plane.gw.put_host(rx_host, rx_mac)?;
        plane.gw.put_source(VNI, sender_addr)?;
        // Both ends of the emulated NIC run XDP now, so they have NAPI to thread.
        let mut nic_threads = thread_napi(&ns1, WIRE, 1)?;
        nic_threads.extend(thread_napi(&ns1, PORT, 1)?);
        let host_threads = thread_napi(&ns1, "eth0", 0)?;
        let placement = json!({
            "nic_napi_threads_cpu1": nic_threads,
            "host_napi_threads_cpu0": host_threads,
            "sender_cpu": 0,
        });
        let probe = Probe {
            fabric,
            sent: &sent_c,
            host_threads,
            nic_threads,
        };
        let mut out = Vec::new();
        for round in 0..rounds {
            for config in CONFIGS {
                plane = Plane::open(&pin, config)?;
                std::thread::sleep(Duration::from_millis(200));
                let a = probe.snap(&plane)?;
                std::thread::sleep(Duration::from_secs_f64(secs));
                let b = probe.snap(&plane)?;
                let mut f = figures(&a, &b);
                f["config"] = json!(config);
                f["round"] = json!(round);
                out.push(f);
            }
        }
        Ok((placement, out))
    })?;
    let result = controller.join();
    stop.store(true, Ordering::Relaxed);
    let sender_result = sender.join();
    let (placement, rounds_out) =
        result.map_err(|_| anyhow::anyhow!("the controller thread panicked"))??;
    sender_result.map_err(|_| anyhow::anyhow!("the sender thread panicked"))??;
    yard_ebpf::Gateway::remove_pinned(&topo.bpffs(1)?.join("gateway"))?;

    let keys = [
        "offered_pps",
        "delivered_pps",
        "host_cpu_ns_per_packet",
        "nic_cpu_ns_per_packet",
        "host_xdp_ns_per_run",
        "wire_xdp_ns_per_run",
    ];
    let mut medians = serde_json::Map::new();
    for config in CONFIGS {
        let mut m = serde_json::Map::new();
        for key in keys {
            let v: Vec<f64> = rounds_out
                .iter()
                .filter(|r| r["config"] == config)
                .filter_map(|r| r[key].as_f64())
                .collect();
            m.insert(key.into(), json!(median(&v).map(gateway::round1)));
        }
        medians.insert(config.into(), Value::Object(m));
    }
    let delivered: u64 = rounds_out
        .iter()
        .filter_map(|r| r["delivered"].as_u64())
        .sum();
    anyhow::ensure!(delivered > 0, "nothing was delivered: {rounds_out:?}");
    let ratio = |key: &str| {
        stats::ratio(
            medians["split"][key].as_f64(),
            medians["whole"][key].as_f64(),
        )
        .map(gateway::round3)
    };
    let report = json!({
        "rounds": rounds,
        "secs_per_round": secs,
        "frame_bytes": 14 + 20 + 8 + 8 + 14 + 20 + 8 + args.payload,
        "cut": "the nfp plan's cut (yard_offload::gateway::default_cut)",
        "placement": placement,
        "median": medians,
        "split_vs_whole": {
            "delivered_pps": ratio("delivered_pps"),
            "host_cpu_ns_per_packet": ratio("host_cpu_ns_per_packet"),
            "host_xdp_ns_per_run": ratio("host_xdp_ns_per_run"),
        },
        "per_round": rounds_out,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    eprintln!(
        "{:<7} {:>12} {:>14} {:>16} {:>15} {:>15} {:>15}",
        "config",
        "offered pps",
        "delivered pps",
        "host ns/packet",
        "NIC ns/packet",
        "host XDP ns",
        "wire XDP ns"
    );
    for config in CONFIGS {
        let m = &medians[config];
        let f = |k: &str| m[k].as_f64().map_or("-".to_owned(), |v| format!("{v:.1}"));
        eprintln!(
            "{:<7} {:>12} {:>14} {:>16} {:>15} {:>15} {:>15}",
            config,
            f("offered_pps"),
            f("delivered_pps"),
            f("host_cpu_ns_per_packet"),
            f("nic_cpu_ns_per_packet"),
            f("host_xdp_ns_per_run"),
            f("wire_xdp_ns_per_run")
        );
    }
    eprintln!("split/whole: {}", report["split_vs_whole"]);
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    gateway::exit_code("offload-emulated", run(&args))
}
