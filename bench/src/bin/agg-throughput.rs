//! `agg-throughput`: gradient aggregation throughput, the XDP aggregator (`yard_agg`) against a
//! user-space UDP aggregator on the same protocol (the reference state machine,
//! `yard_agg::model`, behind one socket), side by side in one run on namespace hosts: host 1
//! aggregates, hosts 2..=N+1 run one worker each (`yard_agg::worker`, the same client for
//! both), every result checked bit-exact against the int32 sum.
//!
//! Rounds alternate XDP, UDP, XDP, UDP, ... for `--reps` repetitions of `--rounds` rounds each;
//! the figures are medians over repetitions:
//! - aggregation throughput: N x gradient bytes / round time (the input the aggregator sums);
//! - bytes summed per CPU-second: the same bytes over the machine's busy CPU time during the
//!   rounds (/proc/stat: every CPU, softirq included). The workers run on the same two cores
//!   and cost the same in both modes, so this is a lower bound on the aggregator-side ratio;
//!   the UDP aggregator thread's own CPU is reported beside it.
//!
//! Not yet here: the TCP parameter-server baseline and the heterogeneity run (issue 12). A
//! benchmark, not a test: it prints figures and fails only if it cannot set up (needs root).

#[allow(dead_code)]
#[path = "../gateway/mod.rs"]
mod gateway;
#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_agg::model::{Action, Aggregator as Model, JobSpec};
use yard_agg::wire::{Dtype, Geometry};
use yard_agg::worker::{Membership, Tuning, Worker};
use yard_cluster_tests::Topology;
use yard_ebpf::{AggJobEntry, Aggregator, XdpMode};

#[derive(Debug, Parser)]
#[command(
    name = "agg-throughput",
    about = "XDP aggregation against a user-space UDP aggregator (needs root)"
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
    /// Repetitions (each: XDP, then UDP).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// XDP attach mode on the aggregator's eth0.
    #[arg(long, default_value = "generic")]
    xdp_mode: String,
    #[arg(long)]
    json: bool,
}

const PORT: u16 = yard_agg::wire::PORT;
const CHUNK: u16 = 360;

fn gradient(rank: usize, round: u32, values: u32) -> Vec<i32> {
    (0..values)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ (rank as u32 * 7919) ^ round) as i32)
        .collect()
}

/// CPU seconds of the calling thread so far (/proc/thread-self/stat utime + stime).
fn thread_cpu_s() -> f64 {
    let text = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let after = text.rsplit_once(')').map_or("", |(_, r)| r);
    // After the comm: state (field 3 of proc(5)) is index 0, so utime (14) and stime (15) are
    // 11 and 12. By position: tpgid is often -1, so parsing first would shift them.
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

struct Sample {
    mode: &'static str,
    workers: usize,
    secs: f64,
    machine_cpu_s: f64,
    agg_thread_cpu_s: Option<f64>,
    bytes: f64,
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

fn run(args: &Args) -> Result<()> {
    let mode = match args.xdp_mode.as_str() {
        "native" => XdpMode::Native,
        "generic" => XdpMode::Generic,
        other => return Err(anyhow!("--xdp-mode is native or generic, not {other}")),
    };
    let mut samples = Vec::new();
    for &n in &args.workers {
        let topo =
            Arc::new(Topology::new(n + 1).context("cannot make the namespace hosts (needs root)")?);
        let agg_addr = SocketAddrV4::new(topo.addr(1), PORT);
        let members: Vec<SocketAddrV4> = (0..n)
            .map(|w| SocketAddrV4::new(topo.addr(w + 2), 40000))
            .collect();
        let geometry = Geometry {
            values: args.values,
            chunk_values: CHUNK,
        };
        let spec = JobSpec {
            id: 1,
            epoch: 1,
            geometry,
            dtype: Dtype::I32,
            members: members.clone(),
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
        let exact = Arc::new(exact);
        for rep in 0..args.reps {
            for which in ["xdp", "udp"] {
                // The aggregator side, in host 1.
                let stop = Arc::new(AtomicBool::new(false));
                let ready = Arc::new(Barrier::new(2));
                let (spec2, stop2, ready2) = (spec.clone(), stop.clone(), ready.clone());
                let agg = topo.thread_in_host(1, move || -> Result<Option<f64>> {
                    if which == "xdp" {
                        let mut a = Aggregator::load(geometry.chunks() * 2)?;
                        a.attach("eth0", mode)?;
                        a.set_job(&AggJobEntry {
                            id: 1,
                            epoch: 1,
                            base: 0,
                            geometry,
                            dtype: Dtype::I32,
                            members: spec2.members.clone(),
                            self_ip: *agg_addr.ip(),
                        })?;
                        ready2.wait();
                        while !stop2.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Ok(None)
                    } else {
                        let sock = UdpSocket::bind(agg_addr)?;
                        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
                        let mut model = Model::new();
                        model.set_job(spec2);
                        ready2.wait();
                        let cpu0 = thread_cpu_s();
                        let mut buf = vec![0u8; 65536];
                        while !stop2.load(Ordering::Relaxed) {
                            let (len, from) = match sock.recv_from(&mut buf) {
                                Ok(r) => r,
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                                    ) =>
                                {
                                    continue
                                }
                                Err(e) => return Err(e.into()),
                            };
                            let std::net::SocketAddr::V4(from) = from else {
                                continue;
                            };
                            match model.receive(from, &buf[..len]).action {
                                Action::Drop => {}
                                Action::Reply(b) => {
                                    sock.send_to(&b, from)?;
                                }
                                Action::Fanout(b) => {
                                    for m in model.members(1).to_vec() {
                                        sock.send_to(&b, m)?;
                                    }
                                }
                            }
                        }
                        Ok(Some(thread_cpu_s() - cpu0))
                    }
                })?;
                ready.wait();
                // The workers, one per host, started together.
                let start = Arc::new(Barrier::new(n + 1));
                let mut threads = Vec::new();
                for (w, &addr) in members.iter().enumerate() {
                    let (start, exact) = (start.clone(), exact.clone());
                    let (rounds, values) = (args.rounds, args.values);
                    threads.push(topo.thread_in_host(w + 2, move || -> Result<()> {
                        let sock = UdpSocket::bind(addr)?;
                        let m = Membership {
                            job: 1,
                            epoch: 1,
                            worker: u16::try_from(w)?,
                            workers: u16::try_from(n)?,
                            aggregator: agg_addr,
                            geometry,
                            dtype: Dtype::I32,
                        };
                        let mut worker = Worker::new(sock, m, Tuning::default());
                        start.wait();
                        for r in 0..rounds {
                            let mut g = gradient(w, r, values);
                            worker.all_reduce_i32(&mut g)?;
                            if g != exact[r as usize] {
                                return Err(anyhow!("worker {w} round {r}: not the exact sum"));
                            }
                        }
                        Ok(())
                    })?);
                }
                let busy0 = gateway::CpuTimes::now();
                let t0 = Instant::now();
                start.wait();
                let mut failed = None;
                for t in threads {
                    if let Err(e) = t.join().map_err(|_| anyhow!("a worker panicked"))? {
                        failed = Some(e);
                    }
                }
                let secs = t0.elapsed().as_secs_f64();
                let cpu = gateway::CpuTimes::now().busy_s_since(&busy0);
                stop.store(true, Ordering::Relaxed);
                let agg_cpu = agg
                    .join()
                    .map_err(|_| anyhow!("the aggregator panicked"))??;
                if let Some(e) = failed {
                    eprintln!("{which} n={n} rep {rep}: failed: {e:#}");
                    continue;
                }
                let bytes = n as f64 * f64::from(args.values) * 4.0 * f64::from(args.rounds);
                samples.push(Sample {
                    mode: which,
                    workers: n,
                    secs,
                    machine_cpu_s: cpu,
                    agg_thread_cpu_s: agg_cpu,
                    bytes,
                });
            }
        }
    }
    report(args, &samples);
    Ok(())
}

fn report(args: &Args, samples: &[Sample]) {
    println!(
        "{:<5} {:>7} {:>5} {:>12} {:>16} {:>14} {:>10}",
        "mode", "workers", "runs", "Gbit/s", "GB/CPU-second", "agg thread s", "vs udp"
    );
    let mut out = Vec::new();
    for &n in &args.workers {
        let pick = |mode: &str| -> Vec<&Sample> {
            samples
                .iter()
                .filter(|s| s.mode == mode && s.workers == n)
                .collect()
        };
        let med = |v: &[&Sample], f: &dyn Fn(&Sample) -> f64| {
            stats::median(&v.iter().map(|s| f(s)).collect::<Vec<_>>())
        };
        let gbps = |s: &Sample| s.bytes * 8.0 / s.secs / 1e9;
        let per_cpu = |s: &Sample| s.bytes / s.machine_cpu_s.max(0.01) / 1e9;
        let (x, u) = (pick("xdp"), pick("udp"));
        let (xg, ug) = (med(&x, &gbps), med(&u, &gbps));
        let (xc, uc) = (med(&x, &per_cpu), med(&u, &per_cpu));
        let ua = med(&u, &|s| s.agg_thread_cpu_s.unwrap_or(0.0));
        for (mode, v, g, c, a, ratio) in [
            ("xdp", &x, xg, xc, None, stats::ratio(xc, uc)),
            ("udp", &u, ug, uc, ua, Some(1.0)),
        ] {
            println!(
                "{:<5} {:>7} {:>5} {:>12.3} {:>16.3} {:>14} {:>10}",
                mode,
                n,
                v.len(),
                g.unwrap_or(f64::NAN),
                c.unwrap_or(f64::NAN),
                a.map_or("-".into(), |a| format!("{a:.2}")),
                ratio.map_or("-".into(), |r| format!("{r:.2}x"))
            );
            out.push(
                json!({"mode": mode, "workers": n, "runs": v.len(), "gbps_median": g,
                            "gb_per_machine_cpu_s_median": c, "agg_thread_cpu_s_median": a,
                            "per_cpu_ratio_vs_udp": ratio}),
            );
        }
    }
    println!(
        "statistic: median of {} repetitions of {} rounds of {} int32 values per worker, XDP and UDP interleaved; every result bit-exact; CPU = the whole machine's busy time",
        args.reps, args.rounds, args.values
    );
    if args.json {
        println!("{}", Value::Array(out));
    }
}
