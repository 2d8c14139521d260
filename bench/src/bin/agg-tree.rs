//! `agg-tree`: iteration time of an all-reduce over heterogeneous links (issue 13's benchmark):
//! the ALEPH tree (`yard_agg` in XDP on three aggregating hosts, grouped by
//! `yard_planner::grouping`) against flat XDP aggregation on one of them, a TCP parameter server
//! on it (`tcp_ps`, the strongest simple TCP baseline) and ring all-reduce over TCP among the
//! workers themselves, side by side in one run, rounds alternating between the rows.
//!
//! Namespace hosts 1-3 aggregate; hosts 4.. run one worker each. Every link is limited with TBF
//! in both directions (the host's eth0 egress and its bridge port's egress toward it): the
//! aggregating hosts to `--host-mbit`, the workers to `--fast-mbit`, the last `--slow` of them
//! to a quarter of it. The tree is the planner's grouping of the configured rates (the daemon
//! measures them; here they are given, the same figures the TBF enforces). A round's time is
//! the slowest worker's all-reduce time, each row's figure the median over its rounds; every
//! result is checked bit-exact against the int32 sum and failed rounds are counted, not hidden.
//! Bandwidth utilisation: each worker's gradient bytes moved both ways over the round time, as
//! a share of its own link's rate, averaged over the workers.
//!
//! A benchmark, not a test: it prints figures and fails only if it cannot set up (needs root).

#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "../tcp_ps.rs"]
mod tcp_ps;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_agg::wire::{Dtype, Geometry};
use yard_agg::worker::{Membership, Tuning, Worker};
use yard_cluster_tests::Topology;
use yard_ebpf::{AggJobEntry, AggParent, Aggregator, XdpMode};
use yard_planner::grouping::{flat, group, ring_time, GroupingInput};

#[derive(Debug, Parser)]
#[command(
    name = "agg-tree",
    about = "ALEPH tree against flat XDP, a TCP parameter server and a TCP ring (needs root)"
)]
struct Args {
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Workers at a quarter of the fast rate (the last ones).
    #[arg(long, default_value_t = 2)]
    slow: usize,
    /// Values (int32) of each worker's gradient.
    #[arg(long, default_value_t = 1 << 18)]
    values: u32,
    /// Rounds per row.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    #[arg(long, default_value_t = 200)]
    fast_mbit: u32,
    #[arg(long, default_value_t = 200)]
    host_mbit: u32,
    #[arg(long)]
    json: bool,
}

const AGGS: usize = 3;
const CHUNK: u16 = 360;
const PORT: u16 = yard_agg::wire::PORT;
const PS_PORT: u16 = 7600;
const RING_PORT: u16 = 7601;
const ROWS: [&str; 4] = ["aleph tree (xdp)", "flat xdp", "tcp ps", "tcp ring"];

fn gradient(rank: usize, round: u32, values: u32) -> Vec<i32> {
    (0..values)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ (rank as u32 * 7919) ^ round) as i32)
        .collect()
}

/// Ring all-reduce over TCP: reduce-scatter then all-gather, N - 1 steps each, a segment to
/// the next worker while one comes from the previous.
struct Ring {
    next: TcpStream,
    prev: TcpStream,
    rank: usize,
    n: usize,
}

impl Ring {
    fn connect(rank: usize, addrs: &[Ipv4Addr]) -> Result<Ring> {
        let n = addrs.len();
        let listener = TcpListener::bind(SocketAddrV4::new(addrs[rank], RING_PORT))?;
        let to = SocketAddrV4::new(addrs[(rank + 1) % n], RING_PORT);
        let deadline = Instant::now() + Duration::from_secs(10);
        let accept = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let next = loop {
            match TcpStream::connect(to) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(e.into()),
            }
        };
        let prev = accept.join().map_err(|_| anyhow!("accept panicked"))??;
        for s in [&next, &prev] {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
        }
        Ok(Ring {
            next,
            prev,
            rank,
            n,
        })
    }

    fn segment(&self, len: usize, k: usize) -> std::ops::Range<usize> {
        let per = len.div_ceil(self.n);
        (k * per).min(len)..((k + 1) * per).min(len)
    }

    fn all_reduce(&mut self, g: &mut [i32]) -> Result<()> {
        let (n, r, len) = (self.n, self.rank, g.len());
        let mut buf = Vec::new();
        for phase in 0..2 {
            for s in 0..n - 1 {
                let (send_k, recv_k) = if phase == 0 {
                    ((r + n - s) % n, (r + n - s - 1) % n)
                } else {
                    ((r + 1 + n - s) % n, (r + n - s) % n)
                };
                let out: Vec<u8> = g[self.segment(len, send_k)]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                let want = self.segment(len, recv_k);
                buf.resize(want.len() * 4, 0);
                let mut next = &self.next;
                let prev = &mut self.prev;
                std::thread::scope(|sc| -> Result<()> {
                    let sender = sc.spawn(move || next.write_all(&out));
                    prev.read_exact(&mut buf)?;
                    sender
                        .join()
                        .map_err(|_| anyhow!("a ring send panicked"))??;
                    Ok(())
                })?;
                for (i, c) in want.zip(buf.chunks_exact(4)) {
                    let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    g[i] = if phase == 0 { g[i].wrapping_add(v) } else { v };
                }
            }
        }
        Ok(())
    }
}

/// One worker's round: its all-reduce time if the sum was exact, and the chunks it resent.
#[derive(Clone, Copy, Debug)]
struct Seen {
    secs: Option<f64>,
    resent: u64,
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
            eprintln!("agg-tree: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let n = args.workers;
    if n < 2 || args.slow >= n {
        return Err(anyhow!("--workers must be at least 2 and more than --slow"));
    }
    let slow_mbit = (args.fast_mbit / 4).max(1);
    let rate = |w: usize| {
        if w >= n - args.slow {
            slow_mbit
        } else {
            args.fast_mbit
        }
    };
    let topo =
        Arc::new(Topology::new(AGGS + n).context("cannot make the namespace hosts (needs root)")?);
    for h in 1..=AGGS {
        topo.rate_limit(h, args.host_mbit)?;
        topo.rate_limit_toward(h, args.host_mbit)?;
    }
    for w in 0..n {
        topo.rate_limit(AGGS + 1 + w, rate(w))?;
        topo.rate_limit_toward(AGGS + 1 + w, rate(w))?;
    }
    let geometry = Geometry {
        values: args.values,
        chunk_values: CHUNK,
    };
    let bytes = u64::from(args.values) * 4;
    // The grouping of the configured rates (bytes/s).
    let bps = |mbit: u32| f64::from(mbit) * 1e6 / 8.0;
    let input = GroupingInput {
        gradient_bytes: bytes,
        workers: n,
        capacity_bps: vec![bps(args.host_mbit); AGGS],
        bandwidth: (0..n)
            .map(|w| vec![bps(rate(w)).min(bps(args.host_mbit)); AGGS])
            .collect(),
        max_load: Some(64),
    };
    let tree = group(&input).map_err(|e| anyhow!("{e}"))?;
    let flat_model = flat(&input).map_err(|e| anyhow!("{e}"))?;
    let worker_addr = |w: usize| SocketAddrV4::new(topo.addr(AGGS + 1 + w), 40000);
    let agg_addr = |h: usize| SocketAddrV4::new(topo.addr(h + 1), PORT);
    // Per worker: (its aggregator in the tree, its index there).
    let mut seat = vec![(0usize, 0u16); n];
    let mut entries: Vec<Vec<AggJobEntry>> = vec![Vec::new(); AGGS];
    let children: Vec<usize> = tree
        .clusters
        .iter()
        .filter(|c| c.host != tree.root)
        .map(|c| c.host)
        .collect();
    let root_direct: Vec<usize> = tree
        .clusters
        .iter()
        .find(|c| c.host == tree.root)
        .map(|c| c.members.clone())
        .unwrap_or_default();
    let root_mac = yard_actors::neigh::parse_mac(&topo.mac(tree.root + 1))
        .ok_or_else(|| anyhow!("host {}'s MAC is unreadable", tree.root + 1))?;
    for c in &tree.clusters {
        for (i, w) in c.members.iter().enumerate() {
            seat[*w] = (c.host, u16::try_from(i)?);
        }
        let mut members: Vec<SocketAddrV4> = c.members.iter().map(|w| worker_addr(*w)).collect();
        let parent = if c.host == tree.root {
            members.extend(children.iter().map(|h| agg_addr(*h)));
            None
        } else {
            let up = root_direct.len() + children.iter().position(|h| *h == c.host).unwrap_or(0);
            Some(AggParent {
                addr: agg_addr(tree.root),
                worker: u16::try_from(up)?,
                mac: root_mac,
                token: bench_token(2, tree.root, up),
                result_token: bench_result_token(2, tree.root),
            })
        };
        entries[c.host].push(AggJobEntry {
            id: 2,
            epoch: 1,
            base: geometry.chunks() * 2,
            geometry,
            dtype: Dtype::I32,
            tokens: (0..members.len())
                .map(|i| bench_token(2, c.host, i))
                .collect(),
            result_token: bench_result_token(2, c.host),
            members,
            self_ip: *agg_addr(c.host).ip(),
            parent,
        });
    }
    // Flat: job 1 on host 1.
    entries[0].push(AggJobEntry {
        id: 1,
        epoch: 1,
        base: 0,
        geometry,
        dtype: Dtype::I32,
        members: (0..n).map(worker_addr).collect(),
        tokens: (0..n).map(|w| bench_token(1, 0, w)).collect(),
        result_token: bench_result_token(1, 0),
        self_ip: *agg_addr(0).ip(),
        parent: None,
    });
    let total = ROWS.len() * args.rounds;
    let exact: Arc<Vec<Vec<i32>>> = Arc::new(
        (0..total)
            .map(|g| {
                let mut s = vec![0i32; args.values as usize];
                for w in 0..n {
                    for (a, b) in s.iter_mut().zip(gradient(w, g as u32, args.values)) {
                        *a = a.wrapping_add(b);
                    }
                }
                s
            })
            .collect(),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(AGGS + 1));
    let mut aggs = Vec::new();
    for (h, jobs) in entries.into_iter().enumerate() {
        let (stop, ready) = (stop.clone(), ready.clone());
        let values = args.values as usize;
        aggs.push(topo.thread_in_host(h + 1, move || -> Result<()> {
            let mut a = Aggregator::load(geometry.chunks() * 4)?;
            a.attach("eth0", XdpMode::Generic)?;
            for j in &jobs {
                a.set_job(j)?;
            }
            let ps = if h == 0 {
                let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PS_PORT))?;
                let stop = stop.clone();
                Some(std::thread::spawn(move || {
                    tcp_ps::serve(&l, n, values, &stop)
                }))
            } else {
                None
            };
            ready.wait();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(ps) = ps {
                ps.join()
                    .map_err(|_| anyhow!("the TCP server panicked"))??;
            }
            Ok(())
        })?);
    }
    ready.wait();

    let start = Arc::new(Barrier::new(n));
    let worker_ips: Vec<Ipv4Addr> = (0..n).map(|w| *worker_addr(w).ip()).collect();
    let mut threads = Vec::new();
    for w in 0..n {
        let (start, exact, ips) = (start.clone(), exact.clone(), worker_ips.clone());
        let values = args.values;
        let (tree_host, tree_agg, tree_index) = (seat[w].0, agg_addr(seat[w].0), seat[w].1);
        let flat_agg = agg_addr(0);
        let ps_addr = SocketAddrV4::new(*agg_addr(0).ip(), PS_PORT);
        threads.push(
            topo.thread_in_host(AGGS + 1 + w, move || -> Result<Vec<Seen>> {
                let sock = UdpSocket::bind(SocketAddrV4::new(ips[w], 40000))?;
                let membership = |job, host: usize, aggregator, worker: u16| Membership {
                    job,
                    epoch: 1,
                    worker,
                    workers: u16::try_from(n).unwrap_or(u16::MAX),
                    aggregator,
                    geometry,
                    dtype: Dtype::I32,
                    token: bench_token(job, host, usize::from(worker)),
                    result_token: bench_result_token(job, host),
                };
                let tuning = Tuning::default();
                let mut tree_w = Worker::new(
                    sock.try_clone()?,
                    membership(2, tree_host, tree_agg, tree_index),
                    tuning,
                );
                let mut flat_w =
                    Worker::new(sock, membership(1, 0, flat_agg, u16::try_from(w)?), tuning);
                let mut ps = tcp_ps::TcpWorker::connect(ips[w], ps_addr, Duration::from_secs(30))?;
                let mut ring = Ring::connect(w, &ips)?;
                let mut seen = Vec::with_capacity(total);
                for g in 0..total {
                    let round = u32::try_from(g)?;
                    let mut grad = gradient(w, round, values);
                    start.wait();
                    let t0 = Instant::now();
                    // (summed, chunks resent: the XDP rows only)
                    let (ok, resent) = match g % ROWS.len() {
                        0 => {
                            tree_w.set_round(round);
                            tree_w
                                .all_reduce_i32(&mut grad)
                                .map_or((false, 0), |s| (true, s.resent))
                        }
                        1 => {
                            flat_w.set_round(round);
                            flat_w
                                .all_reduce_i32(&mut grad)
                                .map_or((false, 0), |s| (true, s.resent))
                        }
                        2 => (ps.all_reduce_i32(&mut grad).is_ok(), 0),
                        _ => (ring.all_reduce(&mut grad).is_ok(), 0),
                    };
                    let secs = t0.elapsed().as_secs_f64();
                    seen.push(Seen {
                        secs: (ok && grad == exact[g]).then_some(secs),
                        resent,
                    });
                }
                Ok(seen)
            })?,
        );
    }
    let mut per_worker = Vec::new();
    for t in threads {
        per_worker.push(t.join().map_err(|_| anyhow!("a worker panicked"))??);
    }
    stop.store(true, Ordering::Relaxed);
    for a in aggs {
        a.join().map_err(|_| anyhow!("an aggregator panicked"))??;
    }
    report(
        args,
        &per_worker,
        &tree,
        flat_model.round_time_s,
        ring_time(&input),
        &rate,
    );
    Ok(())
}

fn report(
    args: &Args,
    per_worker: &[Vec<Seen>],
    tree: &yard_planner::grouping::Grouping,
    flat_model: f64,
    ring_model: f64,
    rate: &dyn Fn(usize) -> u32,
) {
    let n = per_worker.len();
    let bytes = f64::from(args.values) * 4.0;
    let shape: Vec<String> = tree
        .clusters
        .iter()
        .map(|c| {
            format!(
                "host {}: {} workers{}",
                c.host + 1,
                c.members.len(),
                if c.host == tree.root { " (root)" } else { "" }
            )
        })
        .collect();
    println!(
        "{n} workers ({} at {} Mbit/s, {} at {} Mbit/s), 3 aggregating hosts at {} Mbit/s, TBF both ways; {} int32 values ({:.2} MiB) each",
        n - args.slow,
        args.fast_mbit,
        args.slow,
        (args.fast_mbit / 4).max(1),
        args.host_mbit,
        args.values,
        bytes / 1048576.0
    );
    println!(
        "tree: {}; model round times: tree {:.1} ms, flat {:.1} ms, ring {:.1} ms",
        shape.join(", "),
        tree.round_time_s * 1e3,
        flat_model * 1e3,
        ring_model * 1e3
    );
    println!(
        "{:<17} {:>6} {:>7} {:>10} {:>12} {:>12} {:>14}",
        "row", "rounds", "failed", "median ms", "utilisation", "vs tree", "resent/round"
    );
    let mut medians = Vec::new();
    let mut rows: Vec<Value> = Vec::new();
    for (k, name) in ROWS.iter().enumerate() {
        let mut times = Vec::new();
        let mut failed = 0;
        let mut util = Vec::new();
        let mut resent = 0u64;
        for g in (0..per_worker[0].len()).filter(|g| g % ROWS.len() == k) {
            resent += per_worker.iter().map(|v| v[g].resent).sum::<u64>();
            let seen: Vec<Option<f64>> = per_worker.iter().map(|v| v[g].secs).collect();
            if seen.iter().any(Option::is_none) {
                failed += 1;
                continue;
            }
            let t = seen.iter().map(|s| s.unwrap_or(0.0)).fold(0.0, f64::max);
            times.push(t * 1e3);
            let u: f64 = (0..n)
                .map(|w| 2.0 * bytes * 8.0 / t / (f64::from(rate(w)) * 1e6))
                .sum::<f64>()
                / n as f64;
            util.push(u);
        }
        let med = stats::median(&times);
        medians.push(med);
        let ratio = stats::ratio(med, medians[0]);
        let per_round = resent as f64 / args.rounds.max(1) as f64;
        println!(
            "{:<17} {:>6} {:>7} {:>10} {:>11.0}% {:>12} {:>14}",
            name,
            times.len() + failed,
            failed,
            med.map_or("-".into(), |m| format!("{m:.1}")),
            stats::median(&util).unwrap_or(0.0) * 100.0,
            ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            if k < 2 {
                format!("{per_round:.0}")
            } else {
                "-".into()
            },
        );
        rows.push(
            json!({"row": name, "rounds": times.len() + failed, "failed": failed,
                         "median_ms": med, "utilisation": stats::median(&util),
                         "resent_per_round": (k < 2).then_some(per_round)}),
        );
    }
    let best_other = medians[1..]
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    if let Some(t) = medians[0] {
        println!(
            "aleph tree vs the best other row: {:.1}% shorter (median of {} rounds each)",
            (1.0 - t / best_other) * 100.0,
            args.rounds
        );
    }
    if args.json {
        println!("{}", json!({"bench": "agg-tree", "rows": rows}));
    }
}
