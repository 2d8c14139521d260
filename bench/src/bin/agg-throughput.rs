//! `agg-throughput`: gradient aggregation throughput of the XDP aggregator (`yard_agg`)
//! against a user-space UDP aggregator on the same protocol and against a TCP parameter server,
//! side by side in one run on namespace hosts (issue 12): host 1 aggregates, hosts 2..=N+1 run
//! one worker each, every result of every round checked bit-exact against the int32 sum.
//!
//! Modes, run interleaved (xdp, udp, tcp, tcp-c, xdp, udp, ...) for `--reps` repetitions of
//! `--rounds` rounds each:
//! - `xdp`: the XDP program on host 1's eth0 (`yard_ebpf::Aggregator`), workers on
//!   `yard_agg::worker`;
//! - `udp`: the reference state machine (`yard_agg::model`) behind one UDP socket with
//!   `recvmmsg`/`sendmmsg` batching (`mmsg_agg`), the same workers;
//! - `tcp`: a TCP parameter server in Rust (`tcp_ps`: one thread, edge-triggered epoll, full
//!   duplex, `TCP_NODELAY`, 4 MiB buffers, summing as bytes arrive); workers stream the
//!   gradient and read the sum back concurrently;
//! - `tcp-c`: the same server written in plain C (`bench/c/tcp_sum_server.c`, compiled with `cc
//!   -O3` by this program), the same workers: the Rust server must match it.
//!
//! What is counted as the aggregator host's CPU: all hosts share this machine's CPUs (and, on
//! a shared machine, so do other people's jobs), so /proc/stat cannot tell the aggregator's
//! work from the workers'. Every veth of the topology (hosts' eth0 and the fabric's bridge
//! ports) therefore runs threaded NAPI (`hostcpu`), so each interface's receive path, softirq
//! work included (the XDP program and TC fan-out, or the UDP/TCP stack up to the socket), runs
//! in a kernel thread of its own instead of in whichever task raised the softirq. The
//! aggregator host's CPU is its eth0 NAPI thread plus its aggregator threads (the UDP or TCP
//! server thread, the C server process; the XDP mode's control thread only sleeps), each from
//! `/proc/…/schedstat` (this kernel has no IRQ time accounting, so softirq work that interrupts
//! one of these tasks is charged to it). Sending into the fabric is charged to the sender, as on a real NIC;
//! the bridge's threads are reported apart as the "switch". The machine-wide busy time is
//! printed beside it, for reference: it also counts the workers, the bridge and other load.
//!
//! Offloads: every veth runs with TX checksum offload, and so TSO, off (the topology's
//! default for hosts, which native XDP needs; the bench does the same on the bridge ports).
//! A veth hands a frame to the receiver's NAPI thread only when the sending veth has no TSO,
//! so this is also what keeps each host's receive work in its own thread. TCP still sends 64 KB
//! segments (software GSO cuts them to the MTU on the sender, with the checksum, which a NIC
//! would do in hardware: charged to the aggregator for its sends), and the aggregator merges
//! what it receives with GRO, as a NIC's host does. `--tcp-tso on` gives the TCP runs TSO on
//! the hosts' eth0 instead: the aggregator's 64 KB sends then cross the bridge and are cut
//! to the MTU at the far port in the aggregator's own softirq, which charges it for the
//! switch's work (shown for comparison, not the fair figure).
//!
//! Figures: gradient bytes summed (N x gradient x rounds) per second, as Gbit/s, and per
//! CPU-second of the aggregator host; ratios XDP/other per aggregator CPU-second, the median
//! of the per-repetition ratios (each repetition's modes run back to back). Raw Gbit/s on one
//! machine depends as much on the workers' and the bridge's share of the two CPUs as on the
//! aggregator (and veth moves TCP's 64 KB segments within a host for the price of one frame),
//! so the figure per CPU-second is the fair one and Gbit/s goes beside it. Failed
//! repetitions stay in the per-run table. A benchmark, not a test: it prints figures and fails
//! only if it cannot set up (needs root, ethtool, threaded NAPI, and cc for `tcp-c`).

#[path = "../bpfstats.rs"]
mod bpfstats;
#[allow(dead_code)]
#[path = "../gateway/mod.rs"]
mod gateway;
#[path = "../hostcpu.rs"]
mod hostcpu;
#[path = "../mmsg_agg.rs"]
mod mmsg_agg;
#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;
#[path = "../tcp_ps.rs"]
mod tcp_ps;

use std::net::{SocketAddrV4, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_agg::model::{Aggregator as Model, JobSpec};
use yard_agg::wire::{Dtype, Geometry};
use yard_agg::worker::{Membership, Tuning, Worker};
use yard_cluster_tests::Topology;
use yard_ebpf::{AggJobEntry, Aggregator, XdpMode};

#[derive(Debug, Parser)]
#[command(
    name = "agg-throughput",
    about = "XDP aggregation against a user-space UDP aggregator and a TCP parameter server (needs root)"
)]
struct Args {
    /// Worker counts to measure, e.g. 2,4,8.
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8])]
    workers: Vec<usize>,
    /// Values (int32) of each worker's gradient.
    #[arg(long, default_value_t = 1 << 20)]
    values: u32,
    /// Rounds per repetition and mode.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Repetitions (each: every mode once, in the order given).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Modes, run in this order in every repetition: xdp, udp, tcp, tcp-c.
    #[arg(long, value_delimiter = ',', default_values_t = ["xdp".to_string(), "udp".into(), "tcp".into(), "tcp-c".into()])]
    modes: Vec<String>,
    /// XDP attach mode on the aggregator's eth0.
    /// (Native: the bridge port h1 gets a pass-through XDP program during XDP runs, because a
    /// veth delivers native XDP_TX only to a peer that runs XDP.)
    #[arg(long, default_value = "native")]
    xdp_mode: String,
    /// TSO for the TCP modes (TX checksum offload on every host's eth0 during their runs):
    /// see the module doc for why off is the fair setting.
    #[arg(long, default_value = "off")]
    tcp_tso: String,
    /// MTU of every veth and the bridge; the chunk is the most values a frame of it carries
    /// (360 at 1500, 768 at 9000: jumbo frames).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Also read the kernel's run statistics of the XDP and TC programs (kernel.bpf_stats_enabled
    /// for the run: two clock reads more per program run).
    #[arg(long)]
    bpf_stats: bool,
    #[arg(long)]
    json: bool,
}

const PORT: u16 = yard_agg::wire::PORT;
const TCP_PORT: u16 = 7482;
/// UDP socket buffers of the workers, both UDP modes.
const WORKER_SOCKBUF: i32 = 4 << 20;
const C_SERVER: &str = include_str!("../../c/tcp_sum_server.c");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Xdp,
    Udp,
    Tcp,
    TcpC,
}

impl Mode {
    fn parse(s: &str) -> Result<Mode> {
        Ok(match s {
            "xdp" => Mode::Xdp,
            "udp" => Mode::Udp,
            "tcp" => Mode::Tcp,
            "tcp-c" => Mode::TcpC,
            other => bail!("a mode is xdp, udp, tcp or tcp-c, not {other}"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Xdp => "xdp",
            Mode::Udp => "udp",
            Mode::Tcp => "tcp",
            Mode::TcpC => "tcp-c",
        }
    }

    fn is_tcp(self) -> bool {
        matches!(self, Mode::Tcp | Mode::TcpC)
    }
}

fn gradient(rank: usize, round: u32, values: u32) -> Vec<i32> {
    (0..values)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ (rank as u32 * 7919) ^ round) as i32)
        .collect()
}

/// What one repetition of one mode measured.
#[derive(Clone, Debug, Default)]
struct Figures {
    secs: f64,
    /// The aggregator host's eth0 NAPI thread.
    agg_kernel_s: f64,
    /// The aggregator's own threads (server thread or process).
    agg_user_s: f64,
    /// The bridge ports' NAPI threads: the switch.
    switch_s: f64,
    /// The whole machine's busy time (/proc/stat), everything included.
    machine_s: f64,
    bytes: f64,
    /// Chunks the workers resent (UDP modes): loss or late results.
    resent: u64,
    /// Frames dropped in the fabric and in the hosts (interfaces' drops, UDP input errors).
    lost: (u64, u64),
    /// The UDP aggregator's batching: frames per recvmmsg and model time.
    udp: Option<mmsg_agg::Served>,
    /// XDP mode with `--bpf-stats`: (program, run time ns, runs) over the window.
    bpf: Vec<(String, u64, u64)>,
}

impl Figures {
    fn agg_s(&self) -> f64 {
        self.agg_kernel_s + self.agg_user_s
    }
    fn gbps(&self) -> f64 {
        self.bytes * 8.0 / self.secs / 1e9
    }
    fn gb_per_agg_cpu_s(&self) -> f64 {
        self.bytes / self.agg_s().max(1e-6) / 1e9
    }
    fn gb_per_machine_cpu_s(&self) -> f64 {
        self.bytes / self.machine_s.max(0.01) / 1e9
    }
}

struct Sample {
    mode: Mode,
    workers: usize,
    rep: usize,
    outcome: Result<Figures, String>,
}

/// One topology of `n` workers, ready to measure.
struct Bench<'a> {
    args: &'a Args,
    topo: Topology,
    n: usize,
    agg_addr: SocketAddrV4,
    members: Vec<SocketAddrV4>,
    geometry: Geometry,
    exact: Arc<Vec<Vec<i32>>>,
    agg_napi: Vec<u32>,
    switch_napi: Vec<u32>,
    xdp_mode: XdpMode,
    c_server: Option<PathBuf>,
    tx_on: bool,
}

/// A member's frame token in this bench's jobs (`agg_hdr.token`; the daemon draws real ones
/// from the job's secret, `yard_actors::aggregator::auth`): what the program compares per frame.
fn bench_token(job: u32, aggregator: usize, worker: usize) -> u32 {
    0x6265_0000 ^ job << 24 ^ (aggregator as u32) << 12 ^ worker as u32
}

/// An aggregator's result token in this bench's jobs.
fn bench_result_token(job: u32, aggregator: usize) -> u32 {
    bench_token(job, aggregator, 0xfff)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agg-throughput: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Compiles the C server into `dir`.
fn compile_c_server(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let src = dir.join("tcp_sum_server.c");
    let bin = dir.join("tcp_sum_server");
    std::fs::write(&src, C_SERVER).with_context(|| format!("cannot write {}", src.display()))?;
    let out = std::process::Command::new("cc")
        .args(["-O3", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .context("cannot run cc, which the tcp-c mode needs to build bench/c/tcp_sum_server.c")?;
    if !out.status.success() {
        bail!(
            "cc failed on tcp_sum_server.c: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(bin)
}

fn run(args: &Args) -> Result<()> {
    let xdp_mode = match args.xdp_mode.as_str() {
        "native" => XdpMode::Native,
        "generic" => XdpMode::Generic,
        other => return Err(anyhow!("--xdp-mode is native or generic, not {other}")),
    };
    if !matches!(args.tcp_tso.as_str(), "on" | "off") {
        bail!("--tcp-tso is on or off, not {}", args.tcp_tso);
    }
    let modes: Vec<Mode> = args
        .modes
        .iter()
        .map(|m| Mode::parse(m))
        .collect::<Result<_>>()?;
    let tmp = std::env::temp_dir().join(format!("agg-throughput-{}", std::process::id()));
    let c_server = if modes.contains(&Mode::TcpC) {
        Some(compile_c_server(&tmp)?)
    } else {
        None
    };
    let _stats = if args.bpf_stats {
        Some(bpfstats::enable()?)
    } else {
        None
    };
    let mut samples = Vec::new();
    let result = (|| -> Result<()> {
        for &n in &args.workers {
            let mut bench = Bench::new(args, n, xdp_mode, c_server.clone())?;
            for rep in 0..args.reps {
                for &mode in &modes {
                    let outcome = bench.measure(mode).map_err(|e| format!("{e:#}"));
                    if let Err(e) = &outcome {
                        eprintln!("{} n={n} rep {rep}: failed: {e}", mode.name());
                    }
                    samples.push(Sample {
                        mode,
                        workers: n,
                        rep,
                        outcome,
                    });
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    report(args, &modes, &samples);
    Ok(())
}

impl<'a> Bench<'a> {
    fn new(args: &'a Args, n: usize, xdp_mode: XdpMode, c_server: Option<PathBuf>) -> Result<Self> {
        let topo = Topology::new(n + 1).context("cannot make the namespace hosts (needs root)")?;
        // The aggregator's eth0 first: NAPI threads of equally named devices are told apart
        // by appearing.
        let agg_napi = hostcpu::thread_napi(&topo.ns_name(1), "eth0")?;
        for i in 2..=n + 1 {
            hostcpu::thread_napi(&topo.ns_name(i), "eth0")?;
        }
        let mut switch_napi = Vec::new();
        for i in 1..=n + 1 {
            let port = format!("h{i}");
            switch_napi.extend(hostcpu::thread_napi(&topo.fabric_ns(), &port)?);
            // veth hands a frame to the receiver's NAPI thread only if the sending veth has no
            // TSO (veth_skb_is_eligible_for_gro); otherwise the receive path runs in the
            // sender's context, the switch's here, and the aggregator would look free. Without
            // TSO on the bridge ports a 64 KB TCP segment is cut to the MTU there (the wire's
            // work) and the receiving host merges it again with GRO, as a NIC's host does.
            hostcpu::tx_offload(&topo.fabric_ns(), &port, false)?;
        }
        if args.mtu != 1500 {
            let mtu = args.mtu.to_string();
            let ip = |ns: &str, dev: &str| -> Result<()> {
                let out = std::process::Command::new("ip")
                    .args(["-n", ns, "link", "set", dev, "mtu", &mtu])
                    .output()
                    .context("cannot run ip")?;
                if !out.status.success() {
                    bail!(
                        "cannot set MTU {mtu} on {dev} in {ns}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                Ok(())
            };
            for i in 1..=n + 1 {
                ip(&topo.fabric_ns(), &format!("h{i}"))?;
                ip(&topo.ns_name(i), "eth0")?;
            }
            ip(&topo.fabric_ns(), "br0")?;
        }
        let agg_addr = SocketAddrV4::new(topo.addr(1), PORT);
        let members: Vec<SocketAddrV4> = (0..n)
            .map(|w| SocketAddrV4::new(topo.addr(w + 2), 40000))
            .collect();
        let geometry = Geometry {
            values: args.values,
            chunk_values: Geometry::chunk_values_for_mtu(args.mtu)
                .with_context(|| format!("an MTU of {} carries no chunk", args.mtu))?,
        };
        let exact: Vec<Vec<i32>> = (0..args.rounds)
            .map(|r| {
                let mut s = vec![0i32; args.values as usize];
                for w in 0..n {
                    for (a, b) in s.iter_mut().zip(gradient(w, r, args.values)) {
                        *a = a.wrapping_add(b);
                    }
                }
                s
            })
            .collect();
        Ok(Bench {
            args,
            topo,
            n,
            agg_addr,
            members,
            geometry,
            exact: Arc::new(exact),
            agg_napi,
            switch_napi,
            xdp_mode,
            c_server,
            tx_on: false,
        })
    }

    /// TX checksum offload (and TSO) on or off on every host's eth0.
    fn set_tx(&mut self, on: bool) -> Result<()> {
        if self.tx_on != on {
            for i in 1..=self.n + 1 {
                hostcpu::tx_offload(&self.topo.ns_name(i), "eth0", on)?;
            }
            self.tx_on = on;
        }
        Ok(())
    }

    /// One repetition of `mode`: the aggregator started, the workers' rounds timed, every
    /// result checked.
    fn measure(&mut self, mode: Mode) -> Result<Figures> {
        self.set_tx(mode.is_tcp() && self.args.tcp_tso == "on")?;
        let lost0 = self.drops()?;
        let n = self.n;
        let stop = Arc::new(AtomicBool::new(false));
        // The aggregator side: a thread in host 1 (or the C server process), which reports
        // the task whose CPU is the aggregator's once it serves.
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(u32, Vec<u32>)>>();
        let mut agg_thread = None;
        let mut c_process = None;
        let (geometry, agg_addr, values) = (self.geometry, self.agg_addr, self.args.values);
        let spec = JobSpec {
            id: 1,
            epoch: 1,
            geometry,
            dtype: Dtype::I32,
            members: self.members.clone(),
            tokens: (0..self.members.len())
                .map(|w| bench_token(1, 0, w))
                .collect(),
            result_token: bench_result_token(1, 0),
            parent: None,
        };
        let xdp_mode = self.xdp_mode;
        // Native XDP_TX (the answer to a resend for a finished chunk) reaches the bridge only
        // if its port runs XDP itself: a job-less aggregator there passes every frame on.
        let mut peer_thread = None;
        if mode == Mode::Xdp && xdp_mode == XdpMode::Native {
            let (tx, rx) = mpsc::channel::<Result<()>>();
            let stop2 = stop.clone();
            peer_thread = Some(yard_cluster_tests::thread_in_namespace(
                &self.topo.fabric_ns(),
                "h1-pass".into(),
                move || {
                    let a = Aggregator::load(2).and_then(|mut a| {
                        a.attach("h1", XdpMode::Native)?;
                        Ok(a)
                    });
                    let _ = tx.send(a.as_ref().map(|_| ()).map_err(|e| anyhow!("{e}")));
                    while !stop2.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    drop(a);
                },
            )?);
            rx.recv_timeout(Duration::from_secs(10))
                .context("the bridge port's pass program did not start")?
                .context("cannot attach a pass program to the bridge port h1")?;
        }
        match mode {
            Mode::TcpC => {
                let bin = self
                    .c_server
                    .clone()
                    .context("the C server was not built")?;
                let p = self.topo.spawn(
                    1,
                    &bin,
                    &[
                        agg_addr.ip().to_string(),
                        TCP_PORT.to_string(),
                        n.to_string(),
                        values.to_string(),
                    ],
                    &[],
                    "tcp_sum_server.log",
                )?;
                let _ = ready_tx.send(Ok((p.pid(), Vec::new())));
                c_process = Some(p);
            }
            _ => {
                let stop2 = stop.clone();
                agg_thread = Some(self.topo.thread_in_host(
                    1,
                    move || -> Result<Option<mmsg_agg::Served>> {
                        let tid = hostcpu::this_tid();
                        match mode {
                            Mode::Xdp => {
                                let before = bpfstats::ids_named(&[
                                    "yard_agg",
                                    "yard_agg_frags",
                                    "yard_agg_fanout",
                                ]);
                                let setup = (|| -> Result<Aggregator> {
                                    let mut a = Aggregator::load(geometry.chunks() * 2)?;
                                    a.attach("eth0", xdp_mode)?;
                                    a.set_job(&AggJobEntry {
                                        id: 1,
                                        epoch: 1,
                                        base: 0,
                                        geometry,
                                        dtype: Dtype::I32,
                                        members: spec.members.clone(),
                                        tokens: spec.tokens.clone(),
                                        result_token: spec.result_token,
                                        self_ip: *agg_addr.ip(),
                                        parent: None,
                                    })?;
                                    Ok(a)
                                })();
                                let a = match setup {
                                    Ok(a) => a,
                                    Err(e) => {
                                        let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                                        return Err(e);
                                    }
                                };
                                let ours: Vec<u32> = bpfstats::ids_named(&[
                                    "yard_agg",
                                    "yard_agg_frags",
                                    "yard_agg_fanout",
                                ])
                                .into_iter()
                                .filter(|id| !before.contains(id))
                                .collect();
                                let _ = ready_tx.send(Ok((tid, ours)));
                                while !stop2.load(Ordering::Relaxed) {
                                    std::thread::sleep(Duration::from_millis(20));
                                }
                                drop(a);
                                Ok(None)
                            }
                            Mode::Udp => {
                                let sock = match UdpSocket::bind(agg_addr) {
                                    Ok(s) => s,
                                    Err(e) => {
                                        let _ = ready_tx.send(Err(anyhow!("bind {agg_addr}: {e}")));
                                        return Err(e.into());
                                    }
                                };
                                let mut model = Model::new();
                                model.set_job(spec);
                                let _ = ready_tx.send(Ok((tid, Vec::new())));
                                Ok(Some(mmsg_agg::serve(&sock, &mut model, &stop2)?))
                            }
                            _ => {
                                let addr = SocketAddrV4::new(*agg_addr.ip(), TCP_PORT);
                                let l = match TcpListener::bind(addr) {
                                    Ok(l) => l,
                                    Err(e) => {
                                        let _ = ready_tx.send(Err(anyhow!("bind {addr}: {e}")));
                                        return Err(e.into());
                                    }
                                };
                                let _ = ready_tx.send(Ok((tid, Vec::new())));
                                let served = tcp_ps::serve(&l, n, values as usize, &stop2);
                                // The server ends when the workers hang up, which they may do
                                // before the window's CPU is read: the thread stays until then.
                                while !stop2.load(Ordering::Relaxed) {
                                    std::thread::sleep(Duration::from_millis(5));
                                }
                                served?;
                                Ok(None)
                            }
                        }
                    },
                )?);
            }
        }
        let result = self.drive(mode, &ready_rx);
        stop.store(true, Ordering::Relaxed);
        let served = match agg_thread {
            Some(t) => t.join().map_err(|_| anyhow!("the aggregator panicked"))?,
            None => Ok(None),
        };
        if let Some(t) = peer_thread {
            let _ = t.join();
        }
        if let Some(p) = c_process {
            match p.wait_exit(Duration::from_secs(5)) {
                Ok(status) if status.success() => {}
                Ok(status) => bail!("the C server exited with {status}: {}", p.log_tail(5)),
                Err(e) => {
                    let _ = p.kill9();
                    bail!("the C server did not exit: {e}");
                }
            }
        }
        let mut figures = result?;
        figures.udp = served?;
        let lost1 = self.drops()?;
        figures.lost = (lost1.0 - lost0.0, lost1.1 - lost0.1);
        Ok(figures)
    }

    /// Frames dropped so far in the fabric (the bridge's ports: a veth counts a frame its
    /// full peer could not take as the sender's TX drop) and in the hosts.
    fn drops(&self) -> Result<(u64, u64)> {
        let fabric = hostcpu::drops(&self.topo.fabric_ns())?;
        let mut hosts = 0;
        for i in 1..=self.n + 1 {
            hosts += hostcpu::drops(&self.topo.ns_name(i))?;
        }
        Ok((fabric, hosts))
    }

    /// Runs the workers once the aggregator is ready and measures the window they run in.
    fn drive(
        &self,
        mode: Mode,
        ready: &mpsc::Receiver<Result<(u32, Vec<u32>)>>,
    ) -> Result<Figures> {
        let (agg_task, prog_ids) = ready
            .recv_timeout(Duration::from_secs(10))
            .context("the aggregator did not start within 10 s")??;
        let n = self.n;
        let start = Arc::new(Barrier::new(n + 1));
        let end = Arc::new(Barrier::new(n + 1));
        let mut threads = Vec::new();
        for (w, &addr) in self.members.iter().enumerate() {
            let (start, end, exact) = (start.clone(), end.clone(), self.exact.clone());
            let (rounds, values, geometry, agg_addr) = (
                self.args.rounds,
                self.args.values,
                self.geometry,
                self.agg_addr,
            );
            threads.push(self.topo.thread_in_host(w + 2, move || -> Result<u64> {
                let check = |r: u32, g: &[i32]| -> Result<()> {
                    if g != exact[r as usize].as_slice() {
                        bail!("worker {w} round {r}: not the exact sum");
                    }
                    Ok(())
                };
                let mut resent = 0;
                let result = if mode.is_tcp() {
                    let server = SocketAddrV4::new(*agg_addr.ip(), TCP_PORT);
                    let setup =
                        tcp_ps::TcpWorker::connect(*addr.ip(), server, Duration::from_secs(30))
                            .with_context(|| format!("worker {w}: cannot connect to {server}"));
                    start.wait();
                    let r = setup.and_then(|mut c| {
                        for r in 0..rounds {
                            let mut g = gradient(w, r, values);
                            c.all_reduce_i32(&mut g)
                                .with_context(|| format!("worker {w} round {r}"))?;
                            check(r, &g)?;
                        }
                        Ok(c)
                    });
                    end.wait();
                    r.map(drop)
                } else {
                    let setup =
                        UdpSocket::bind(addr)
                            .map_err(anyhow::Error::from)
                            .and_then(|sock| {
                                // Room for every worker's burst of results (the default 208 KiB
                                // overflows when results come back as fast as XDP sends them).
                                mmsg_agg::set_buffers(&sock, WORKER_SOCKBUF)?;
                                let m = Membership {
                                    job: 1,
                                    epoch: 1,
                                    worker: u16::try_from(w)?,
                                    workers: u16::try_from(n)?,
                                    aggregator: agg_addr,
                                    geometry,
                                    dtype: Dtype::I32,
                                    token: bench_token(1, 0, w),
                                    result_token: bench_result_token(1, 0),
                                };
                                Ok(Worker::new(sock, m, Tuning::default()))
                            });
                    start.wait();
                    let r = setup.and_then(|mut worker| {
                        for r in 0..rounds {
                            let mut g = gradient(w, r, values);
                            resent += worker.all_reduce_i32(&mut g)?.resent;
                            check(r, &g)?;
                        }
                        Ok(())
                    });
                    end.wait();
                    r
                };
                result.map(|()| resent)
            })?);
        }
        let agg_user = |t: u32| match mode {
            Mode::TcpC => hostcpu::pids_s(&[t]),
            _ => hostcpu::thread_s(t),
        };
        let (k0, u0, s0) = (
            hostcpu::pids_s(&self.agg_napi)?,
            agg_user(agg_task)?,
            hostcpu::pids_s(&self.switch_napi)?,
        );
        let bpf0 = bpfstats::stats(&prog_ids);
        let busy0 = gateway::CpuTimes::now();
        let t0 = Instant::now();
        start.wait();
        end.wait();
        let secs = t0.elapsed().as_secs_f64();
        let machine_s = gateway::CpuTimes::now().busy_s_since(&busy0);
        let bpf: Vec<(String, u64, u64)> = if self.args.bpf_stats {
            bpfstats::stats(&prog_ids)
                .into_iter()
                .zip(bpf0)
                .map(|((name, t1, c1), (_, t0, c0))| (name, t1 - t0, c1 - c0))
                .collect()
        } else {
            Vec::new()
        };
        let (k1, u1, s1) = (
            hostcpu::pids_s(&self.agg_napi)?,
            agg_user(agg_task)?,
            hostcpu::pids_s(&self.switch_napi)?,
        );
        let mut failed = None;
        let mut resent = 0;
        for t in threads {
            match t.join().map_err(|_| anyhow!("a worker panicked"))? {
                Ok(r) => resent += r,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(Figures {
            secs,
            agg_kernel_s: k1 - k0,
            agg_user_s: u1 - u0,
            switch_s: s1 - s0,
            machine_s,
            bytes: n as f64 * f64::from(self.args.values) * 4.0 * f64::from(self.args.rounds),
            resent,
            lost: (0, 0),
            udp: None,
            bpf,
        })
    }
}

fn fmt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.prec$}"))
}

fn report(args: &Args, modes: &[Mode], samples: &[Sample]) {
    println!("every repetition (failed ones included):");
    println!(
        "{:<6} {:>3} {:>3} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>7} {:>11}  note",
        "mode",
        "n",
        "rep",
        "secs",
        "Gbit/s",
        "agg k s",
        "agg u s",
        "GB/aggCPUs",
        "switch s",
        "machine s",
        "resent",
        "lost fab/host"
    );
    let mut runs = Vec::new();
    for s in samples {
        match &s.outcome {
            Ok(f) => {
                let mut note = f.udp.map_or(String::new(), |u| {
                    format!(
                        "{:.1} frames/recvmmsg, model {:.0}% of the thread",
                        u.frames as f64 / u.recv_calls.max(1) as f64,
                        100.0 * u.model_s / f.agg_user_s.max(1e-9)
                    )
                });
                for (name, ns, runs) in &f.bpf {
                    note.push_str(&format!(
                        "{name} {:.0} ns/run x {runs}; ",
                        *ns as f64 / (*runs).max(1) as f64
                    ));
                }
                println!(
                    "{:<6} {:>3} {:>3} {:>7.3} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>8.3} {:>9.2} {:>7} {:>11}  {note}",
                    s.mode.name(),
                    s.workers,
                    s.rep,
                    f.secs,
                    f.gbps(),
                    f.agg_kernel_s,
                    f.agg_user_s,
                    f.gb_per_agg_cpu_s(),
                    f.switch_s,
                    f.machine_s,
                    f.resent,
                    format!("{}/{}", f.lost.0, f.lost.1)
                );
                runs.push(json!({"mode": s.mode.name(), "workers": s.workers, "rep": s.rep,
                    "ok": true, "secs": f.secs, "gbps": f.gbps(),
                    "agg_kernel_cpu_s": f.agg_kernel_s, "agg_user_cpu_s": f.agg_user_s,
                    "gb_per_agg_cpu_s": f.gb_per_agg_cpu_s(), "switch_cpu_s": f.switch_s,
                    "machine_cpu_s": f.machine_s, "gb_per_machine_cpu_s": f.gb_per_machine_cpu_s(),
                    "resent": f.resent, "lost_fabric": f.lost.0, "lost_hosts": f.lost.1,
                    "udp_frames_per_recvmmsg": f.udp.map(|u| u.frames as f64 / u.recv_calls.max(1) as f64),
                    "udp_model_s": f.udp.map(|u| u.model_s),
                    "bpf_programs": f.bpf.iter().map(|(n, ns, runs)| json!({"program": n, "run_ns": ns, "runs": runs})).collect::<Vec<_>>()}));
            }
            Err(e) => {
                println!(
                    "{:<6} {:>3} {:>3} FAILED: {e}",
                    s.mode.name(),
                    s.workers,
                    s.rep
                );
                runs.push(
                    json!({"mode": s.mode.name(), "workers": s.workers, "rep": s.rep,
                    "ok": false, "error": e}),
                );
            }
        }
    }
    println!();
    println!(
        "{:<6} {:>3} {:>5} {:>8} {:>11} {:>11} {:>10} {:>11} {:>11}",
        "mode",
        "n",
        "ok",
        "Gbit/s",
        "GB/aggCPUs",
        "agg kernel",
        "GB/machCPUs",
        "xdp/this cpu",
        "xdp/this tput"
    );
    let mut summary = Vec::new();
    for &n in &args.workers {
        let figs = |mode: Mode, rep: usize| -> Option<&Figures> {
            samples
                .iter()
                .find(|s| s.mode == mode && s.workers == n && s.rep == rep)
                .and_then(|s| s.outcome.as_ref().ok())
        };
        for &mode in modes {
            let ok: Vec<&Figures> = (0..args.reps).filter_map(|r| figs(mode, r)).collect();
            let med = |f: &dyn Fn(&Figures) -> f64| {
                stats::median(&ok.iter().map(|x| f(x)).collect::<Vec<_>>())
            };
            let paired = |f: &dyn Fn(&Figures) -> f64| {
                let v: Vec<f64> = (0..args.reps)
                    .filter_map(|r| Some(f(figs(Mode::Xdp, r)?) / f(figs(mode, r)?)))
                    .collect();
                stats::median(&v)
            };
            let gbps = med(&|f| f.gbps());
            let per_cpu = med(&|f| f.gb_per_agg_cpu_s());
            let kernel = med(&|f| f.agg_kernel_s / f.agg_s().max(1e-9));
            let per_mach = med(&|f| f.gb_per_machine_cpu_s());
            let r_cpu = paired(&|f| f.gb_per_agg_cpu_s());
            let r_tput = paired(&|f| f.gbps());
            println!(
                "{:<6} {:>3} {:>5} {:>8} {:>11} {:>11} {:>10} {:>11} {:>11}",
                mode.name(),
                n,
                format!("{}/{}", ok.len(), args.reps),
                fmt(gbps, 3),
                fmt(per_cpu, 3),
                kernel.map_or("-".into(), |k| format!("{:.0}%", k * 100.0)),
                fmt(per_mach, 3),
                r_cpu.map_or("-".into(), |r| format!("{r:.2}x")),
                r_tput.map_or("-".into(), |r| format!("{r:.2}x")),
            );
            summary.push(
                json!({"mode": mode.name(), "workers": n, "runs_ok": ok.len(),
                "runs": args.reps, "gbps_median": gbps, "gb_per_agg_cpu_s_median": per_cpu,
                "agg_kernel_share_median": kernel, "gb_per_machine_cpu_s_median": per_mach,
                "xdp_over_this_per_agg_cpu_s_median": r_cpu,
                "xdp_over_this_gbps_median": r_tput}),
            );
        }
        // Rust TCP against C TCP, the same pairing.
        let v: Vec<f64> = (0..args.reps)
            .filter_map(|r| {
                Some(
                    figs(Mode::Tcp, r)?.gb_per_agg_cpu_s()
                        / figs(Mode::TcpC, r)?.gb_per_agg_cpu_s(),
                )
            })
            .collect();
        if let Some(r) = stats::median(&v) {
            println!(
                "{:<6} {n:>3} rust tcp / c tcp per aggregator CPU-second: {r:.2}x",
                ""
            );
        }
    }
    println!(
        "statistic: median of {} interleaved repetitions ({}) of {} rounds of {} int32 values per worker; \
         ratios are medians of per-repetition ratios; every result checked bit-exact; \
         aggregator CPU = its eth0 NAPI thread (softirq work, XDP included) + its server threads; \
         MTU {}; XDP {} mode; TCP TSO {}; targets: xdp/tcp >= 3.3x, xdp/udp >= 2x per aggregator CPU-second",
        args.reps,
        modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "),
        args.rounds,
        args.values,
        args.mtu,
        args.xdp_mode,
        args.tcp_tso
    );
    if args.json {
        println!(
            "{}",
            json!({"runs": Value::Array(runs), "summary": Value::Array(summary)})
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C server, built as the benchmark builds it, sums exactly: three workers over
    /// loopback, three rounds.
    #[test]
    fn c_server_sums_exactly_over_loopback() {
        let dir = std::env::temp_dir().join(format!("agg-throughput-test-{}", std::process::id()));
        let bin = compile_c_server(&dir).expect("this test needs cc to build tcp_sum_server.c");
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut server = std::process::Command::new(&bin)
            .args(["127.0.0.1", &port.to_string(), "3", "100003"])
            .spawn()
            .unwrap();
        tcp_ps::exercise(
            SocketAddrV4::new([127, 0, 0, 1].into(), port),
            3,
            100_003,
            3,
        );
        let status = server.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(status.success(), "the C server exited with {status}");
    }
}
