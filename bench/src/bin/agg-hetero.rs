//! `agg-hetero`: communication time per round when one worker's link is 4x slower (issue 12's
//! heterogeneity benchmark): the whole-gradient cache the XDP aggregator has (`yard_agg` in
//! XDP on namespace host 1) against the same program and client limited to a SwitchML-style
//! slot pool (`Tuning::slot_pool`: chunk k + P is sent only once chunk k's result is in, as
//! reusing P slots forces), side by side in one run.
//!
//! Hosts 2..=N+1 run one worker each (`yard_agg::worker`). Every worker's link is limited with
//! TBF in both directions (its own eth0 egress, and its bridge port's egress toward it) to
//! `--fast-mbit`, and the last worker's to a quarter of that. Rounds alternate between the rows
//! (cache, pool, cache, pool, ...), all workers starting each round together; a round's
//! communication time is the slowest worker's all-reduce time (when every worker has the whole
//! sum), and each row's figure is the median over its rounds. Every result is checked bit-exact
//! against the int32 sum. Failed rounds are counted in the table, not hidden.
//!
//! A benchmark, not a test: it prints figures and fails only if it cannot set up (needs root).

#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::net::{SocketAddrV4, UdpSocket};
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
use yard_ebpf::{AggJobEntry, Aggregator, XdpMode};

#[derive(Debug, Parser)]
#[command(
    name = "agg-hetero",
    about = "whole-gradient cache against a SwitchML-size slot pool, one link 4x slower (needs root)"
)]
struct Args {
    /// Workers (at least 4).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Values (int32) of each worker's gradient.
    #[arg(long, default_value_t = 1 << 18)]
    values: u32,
    /// Rounds per row.
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// TBF rate of the fast links, both directions; the slow link gets a quarter.
    #[arg(long, default_value_t = 200)]
    fast_mbit: u32,
    /// Client windows of the whole-gradient cache rows: 64 is the client's default; a window
    /// of at least the gradient's chunks lets a fast worker send all of it at once.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 4096])]
    cache_windows: Vec<usize>,
    /// Slot pools of the pool rows (window = pool). SwitchML keeps 256 packets in flight per
    /// worker (its configs/general.cfg), 64 per worker thread.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 256])]
    pools: Vec<usize>,
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

/// One row of the table: a name and the client tuning it runs with.
#[derive(Clone)]
struct Mode {
    name: String,
    tuning: Tuning,
}

/// What one worker saw of one round.
#[derive(Clone, Debug)]
struct Seen {
    secs: f64,
    /// Until every chunk had been sent once.
    sent_secs: f64,
    resent: u64,
    error: Option<String>,
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
            eprintln!("agg-hetero: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let n = args.workers;
    if n < 4 {
        return Err(anyhow!("--workers must be at least 4, not {n}"));
    }
    let xdp_mode = match args.xdp_mode.as_str() {
        "native" => XdpMode::Native,
        "generic" => XdpMode::Generic,
        other => return Err(anyhow!("--xdp-mode is native or generic, not {other}")),
    };
    let mut modes: Vec<Mode> = args
        .cache_windows
        .iter()
        .map(|&w| Mode {
            name: format!("cache w={w}"),
            tuning: Tuning {
                window: w.max(1),
                ..Tuning::default()
            },
        })
        .collect();
    modes.extend(args.pools.iter().map(|&p| Mode {
        name: format!("pool P={p}"),
        tuning: Tuning {
            window: p.max(1),
            slot_pool: Some(p.max(1)),
            ..Tuning::default()
        },
    }));
    if modes.is_empty() {
        return Err(anyhow!("no rows: give --cache-windows or --pools"));
    }
    let slow_mbit = (args.fast_mbit / 4).max(1);
    let topo =
        Arc::new(Topology::new(n + 1).context("cannot make the namespace hosts (needs root)")?);
    for w in 0..n {
        let host = w + 2;
        let rate = if w == n - 1 {
            slow_mbit
        } else {
            args.fast_mbit
        };
        topo.rate_limit(host, rate)?;
        topo.rate_limit_toward(host, rate)?;
    }
    let agg_addr = SocketAddrV4::new(topo.addr(1), PORT);
    let members: Vec<SocketAddrV4> = (0..n)
        .map(|w| SocketAddrV4::new(topo.addr(w + 2), 40000))
        .collect();
    let geometry = Geometry {
        values: args.values,
        chunk_values: CHUNK,
    };
    // Round g (0-based over the whole run) is row g % modes, repetition g / modes.
    let total = modes.len() * args.rounds;
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
    let ready = Arc::new(Barrier::new(2));
    let (stop2, ready2, members2) = (stop.clone(), ready.clone(), members.clone());
    let agg = topo.thread_in_host(1, move || -> Result<()> {
        let mut a = Aggregator::load(geometry.chunks() * 2)?;
        a.attach("eth0", xdp_mode)?;
        a.set_job(&AggJobEntry {
            id: 1,
            epoch: 1,
            base: 0,
            geometry,
            dtype: Dtype::I32,
            tokens: (0..members2.len()).map(|w| bench_token(1, 0, w)).collect(),
            members: members2,
            result_token: bench_result_token(1, 0),
            self_ip: *agg_addr.ip(),
            parent: None,
        })?;
        ready2.wait();
        while !stop2.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    })?;
    ready.wait();

    let start = Arc::new(Barrier::new(n));
    let mut threads = Vec::new();
    for (w, &addr) in members.iter().enumerate() {
        let (start, exact, modes) = (start.clone(), exact.clone(), modes.clone());
        let values = args.values;
        threads.push(topo.thread_in_host(w + 2, move || -> Result<Vec<Seen>> {
            let sock = UdpSocket::bind(addr)?;
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
            let mut seen = Vec::with_capacity(total);
            for g in 0..total {
                let mode = &modes[g % modes.len()];
                let mut worker = Worker::new(sock.try_clone()?, m, mode.tuning);
                let round = u32::try_from(g)?;
                worker.set_round(round);
                let mut grad = gradient(w, round, values);
                start.wait();
                let t0 = Instant::now();
                let result = worker.all_reduce_i32(&mut grad);
                let secs = t0.elapsed().as_secs_f64();
                seen.push(match result {
                    Ok(stats) if grad == exact[g] => Seen {
                        secs,
                        sent_secs: stats.all_sent_after.as_secs_f64(),
                        resent: stats.resent,
                        error: None,
                    },
                    Ok(stats) => Seen {
                        secs,
                        sent_secs: stats.all_sent_after.as_secs_f64(),
                        resent: stats.resent,
                        error: Some("not the exact sum".into()),
                    },
                    Err(e) => Seen {
                        secs,
                        sent_secs: f64::NAN,
                        resent: 0,
                        error: Some(e.to_string()),
                    },
                });
            }
            Ok(seen)
        })?);
    }
    let mut per_worker = Vec::new();
    for t in threads {
        per_worker.push(t.join().map_err(|_| anyhow!("a worker panicked"))??);
    }
    stop.store(true, Ordering::Relaxed);
    agg.join()
        .map_err(|_| anyhow!("the aggregator panicked"))??;
    report(args, &modes, &per_worker, slow_mbit);
    Ok(())
}

fn report(args: &Args, modes: &[Mode], per_worker: &[Vec<Seen>], slow_mbit: u32) {
    let n = per_worker.len();
    let bytes = f64::from(args.values) * 4.0;
    println!(
        "{} workers, {} int32 values ({:.2} MiB) each, chunks of {CHUNK}; links (TBF, both directions): {} x {} Mbit/s, 1 x {} Mbit/s",
        n,
        args.values,
        bytes / 1048576.0,
        n - 1,
        args.fast_mbit,
        slow_mbit
    );
    println!(
        "{:<13} {:>6} {:>7} {:>9} {:>9} {:>9} {:>13} {:>8} {:>9} {:>10}",
        "row",
        "rounds",
        "failed",
        "comm ms",
        "fast ms",
        "slow ms",
        "fast sent ms",
        "resends",
        "vs first",
        "less time"
    );
    let mut rows = Vec::new();
    for (k, mode) in modes.iter().enumerate() {
        let (mut comm, mut fast, mut slow, mut sent) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut resent = 0u64;
        let mut failed = Vec::new();
        let rounds: Vec<usize> = (0..per_worker[0].len())
            .filter(|g| g % modes.len() == k)
            .collect();
        for &g in &rounds {
            let seen: Vec<&Seen> = per_worker.iter().map(|v| &v[g]).collect();
            if let Some(e) = seen.iter().find_map(|s| s.error.clone()) {
                failed.push(format!("round {g}: {e}"));
                continue;
            }
            comm.push(seen.iter().map(|s| s.secs).fold(0.0, f64::max) * 1e3);
            fast.push(seen[..n - 1].iter().map(|s| s.secs).sum::<f64>() / (n - 1) as f64 * 1e3);
            slow.push(seen[n - 1].secs * 1e3);
            sent.push(
                seen[..n - 1].iter().map(|s| s.sent_secs).sum::<f64>() / (n - 1) as f64 * 1e3,
            );
            resent += seen.iter().map(|s| s.resent).sum::<u64>();
        }
        rows.push((
            mode.name.clone(),
            rounds.len(),
            failed,
            comm,
            fast,
            slow,
            sent,
            resent,
        ));
    }
    let cache = stats::median(&rows[0].3);
    let mut out = Vec::new();
    for (name, rounds, failed, comm, fast, slow, sent, resent) in &rows {
        let m = stats::median(comm);
        let vs = stats::ratio(m, cache);
        // how much less time the cache takes than this row: 1 - cache / row
        let less = stats::ratio(cache, m).map(|r| 1.0 - r);
        println!(
            "{:<13} {:>6} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>13.1} {:>8} {:>8.2}x {:>9.0}%",
            name,
            rounds,
            failed.len(),
            m.unwrap_or(f64::NAN),
            stats::median(fast).unwrap_or(f64::NAN),
            stats::median(slow).unwrap_or(f64::NAN),
            stats::median(sent).unwrap_or(f64::NAN),
            resent,
            vs.unwrap_or(f64::NAN),
            less.unwrap_or(f64::NAN) * 100.0
        );
        for f in failed {
            println!("    failed: {f}");
        }
        out.push(
            json!({"row": name, "rounds": rounds, "failed": failed, "comm_ms_median": m,
            "fast_ms_median": stats::median(fast), "slow_ms_median": stats::median(slow),
            "fast_sent_ms_median": stats::median(sent),
            "resends": resent, "vs_first_row": vs, "first_row_less_time": less,
            "comm_ms": comm}),
        );
    }
    println!(
        "statistic: median over each row's rounds, rows interleaved round by round; comm = the slowest worker's all-reduce time in a round (every worker has the sum), fast = the fast workers' mean, slow = the slow worker's; fast sent = the fast workers' mean time until each of their chunks had gone once; vs first = row / first row (the client's default: whole-gradient cache, window 64); less time = 1 - first row / row; every completed round bit-exact"
    );
    if args.json {
        println!("{}", Value::Array(out));
    }
}
