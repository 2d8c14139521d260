//! `agg-sum-variants`: per-packet cost of the aggregator's sum strategies (`SumVariant`: the
//! shipped spin lock (BPF ISA v3), the same source built for the default ISA v1, atomic adds, per-CPU partial sums
//! merged at completion), measured in the kernel with BPF_PROG_TEST_RUN beside the bounce floor
//! (`yard_bounce`), all in one run, samples interleaved (floor, lock, lock-v1, atomic, per-cpu,
//! floor, ...). Headline figures are medians over samples and their ratio to the shipped lock.
//!
//! - `single`: one thread, one run per call (the floor measured the same way, so both include
//!   the kernel's timer read), each call a new (chunk, worker) of a 32-worker int32 job: `add`
//!   (31 contributions that do not complete the chunk), `complete` (the 32nd, which writes the
//!   sum into the frame; for per-cpu it also merges the CPUs' partials), `resend` (a
//!   contribution to a complete chunk, answered with the stored sum). Counters are checked
//!   afterwards (`verified`: the share of calls that took the intended path).
//! - `2cpu`: two threads pinned to CPUs 0 and 1, 16 workers each, contributing to the same
//!   chunk at the same time (a barrier per chunk): the mean kernel ns per contribution over a
//!   chunk's 32 (31 adds and one completion, whichever thread it falls to), against the same
//!   mean from one thread (`1cpu`) in the same sample. `verified`: chunks completed / chunks.
//!
//! A benchmark, not a test: prints a table (`--json`: one JSON object) and never fails on a
//! number; it needs root and, for `2cpu`, two CPUs.

#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::sync::Barrier;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_agg::wire::{self, Dtype, Geometry, Header, Kind};
use yard_ebpf::frames::HostFrame;
use yard_ebpf::{AggCounter, AggJobEntry, Aggregator, Bounce, SumVariant};

#[derive(Debug, Parser)]
#[command(
    name = "agg-sum-variants",
    about = "per-packet cost of the aggregator's sum strategies against the shipped spin lock (needs root)"
)]
struct Args {
    /// Interleaved samples per variant and path.
    #[arg(long, default_value_t = 7)]
    samples: usize,
    /// Chunks per sample (each: 31 adds, 1 completion, 1 resend).
    #[arg(long, default_value_t = 100)]
    chunks: u32,
    /// Chunks per sample of the two-CPU runs.
    #[arg(long, default_value_t = 100)]
    concurrent_chunks: u32,
    #[arg(long)]
    json: bool,
}

const AGG: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// The lock-free strategies hold at most 32 workers per job.
const WORKERS: usize = 32;

fn worker(w: usize) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(198, 18, 1, u8::try_from(w + 1).unwrap_or(0)),
        40000,
    )
}

/// A member's frame token in this bench's jobs (`agg_hdr.token`; the daemon draws real ones
/// from the job's secret, `yard_actors::aggregator::auth`): what the program compares per frame.
fn bench_token(job: u32, worker: usize) -> u32 {
    0x6265_0000 ^ job << 24 ^ worker as u32
}

fn frame(job: u32, w: usize, chunk: u32, values: &[i32]) -> Vec<u8> {
    let payload = wire::encode(
        &Header {
            kind: Kind::Data,
            flags: 0,
            exp: 0,
            job,
            epoch: 1,
            round: 0,
            chunk,
            worker: u16::try_from(w).unwrap_or(0),
            count: 0,
            contributors: 0,
            token: bench_token(job, w),
        },
        values,
    );
    let from = worker(w);
    HostFrame::udp(*from.ip(), from.port(), AGG, wire::PORT, &payload).build()
}

/// A job `id` of `chunks` chunks of `cv` values at slot `base`, 32 workers.
fn job(id: u32, base: u32, chunks: u32, cv: u16) -> AggJobEntry {
    AggJobEntry {
        id,
        epoch: 1,
        base,
        geometry: Geometry {
            values: chunks * u32::from(cv),
            chunk_values: cv,
        },
        dtype: Dtype::I32,
        members: (0..WORKERS).map(worker).collect(),
        tokens: (0..WORKERS).map(|w| bench_token(id, w)).collect(),
        result_token: bench_token(id, 0xfff),
        self_ip: AGG,
        parent: None,
    }
}

struct Row {
    variant: SumVariant,
    path: &'static str,
    values: usize,
    ns: Vec<f64>,
    floor: Vec<f64>,
    verified: f64,
}

fn counter(agg: &Aggregator, c: AggCounter) -> Result<u64> {
    Ok(agg
        .counters()?
        .into_iter()
        .find(|(k, _)| *k == c)
        .map_or(0, |(_, v)| v.packets))
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .with_context(|| format!("could not pin a thread to CPU {cpu}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agg-sum-variants: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One variant loaded for a chunk size: job 1 for the single-thread paths, job 2 for the 1cpu
/// runs and job 3 for the 2cpu runs, each with chunks for every sample.
struct Loaded {
    agg: Aggregator,
    single_chunk: u32,
    one_cpu_chunk: u32,
    two_cpu_chunk: u32,
}

fn run(args: &Args) -> Result<()> {
    let load = "could not load the XDP programs (this benchmark needs root)";
    let bounce = Bounce::load().context(load)?;
    let two_cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if !two_cpus {
        eprintln!("agg-sum-variants: one CPU only: the 2cpu rows are left out");
    }
    let samples = u32::try_from(args.samples)?;
    let mut rows = Vec::new();
    for values in [360usize, 768] {
        let cv = u16::try_from(values)?;
        let data: Vec<i32> = (0..values).map(|i| i32::try_from(i).unwrap_or(0)).collect();
        let floor_frame = frame(1, 0, 0, &data);
        let single_chunks = args.chunks * samples;
        let conc_chunks = args.concurrent_chunks * samples;
        let mut loaded = Vec::new();
        for variant in SumVariant::ALL {
            let jobs = [
                job(1, 0, single_chunks, cv),
                job(2, single_chunks * 2, conc_chunks, cv),
                job(3, (single_chunks + conc_chunks) * 2, conc_chunks, cv),
            ];
            let slots = (single_chunks + 2 * conc_chunks) * 2;
            let mut agg = Aggregator::load_variant(slots, variant).context(load)?;
            for j in &jobs {
                agg.set_job(j)?;
                agg.prepare_round(j, 0)?;
            }
            loaded.push(Loaded {
                agg,
                single_chunk: 0,
                one_cpu_chunk: 0,
                two_cpu_chunk: 0,
            });
        }
        // per variant: add, complete, resend, 1cpu, 2cpu sample vectors; floors likewise
        let mut ns = vec![[(); 5].map(|_| Vec::new()); loaded.len()];
        let mut floors = vec![[(); 5].map(|_| Vec::new()); loaded.len()];
        let before: Vec<[u64; 3]> = loaded
            .iter()
            .map(|l| {
                [
                    AggCounter::Added,
                    AggCounter::Completed,
                    AggCounter::ResultResent,
                ]
                .map(|c| counter(&l.agg, c).unwrap_or(0))
            })
            .collect();
        for _ in 0..args.samples {
            for (k, l) in loaded.iter_mut().enumerate() {
                // single: floor, then each path, per call
                let (mut add, mut complete, mut resend, mut floor) = (0u64, 0u64, 0u64, 0u64);
                for _ in 0..args.chunks {
                    let c = l.single_chunk;
                    for w in 0..WORKERS - 1 {
                        floor += bounce.bench_run(&floor_frame, 1)?;
                        add += l.agg.bench_run(&frame(1, w, c, &data), 1)?;
                    }
                    floor += bounce.bench_run(&floor_frame, 1)?;
                    complete += l.agg.bench_run(&frame(1, WORKERS - 1, c, &data), 1)?;
                    resend += l.agg.bench_run(&frame(1, 0, c, &data), 1)?;
                    l.single_chunk += 1;
                }
                let calls = f64::from(args.chunks);
                let floor_ns = floor as f64 / (calls * WORKERS as f64);
                ns[k][0].push(add as f64 / (calls * (WORKERS - 1) as f64));
                ns[k][1].push(complete as f64 / calls);
                ns[k][2].push(resend as f64 / calls);
                for f in floors[k].iter_mut().take(3) {
                    f.push(floor_ns);
                }
                // 1cpu: a chunk's 32 contributions from one thread
                let mut one = 0u64;
                let mut floor1 = 0u64;
                for _ in 0..args.concurrent_chunks {
                    for w in 0..WORKERS {
                        floor1 += bounce.bench_run(&floor_frame, 1)?;
                        one += l.agg.bench_run(&frame(2, w, l.one_cpu_chunk, &data), 1)?;
                    }
                    l.one_cpu_chunk += 1;
                }
                let per = f64::from(args.concurrent_chunks) * WORKERS as f64;
                ns[k][3].push(one as f64 / per);
                floors[k][3].push(floor1 as f64 / per);
                if !two_cpus {
                    continue;
                }
                // 2cpu: the same, two threads on two CPUs, the same chunk at once
                let first = l.two_cpu_chunk;
                let chunks = args.concurrent_chunks;
                let barrier = Barrier::new(2);
                let agg = &l.agg;
                let (bounce_ref, data_ref, floor_ref) = (&bounce, &data, &floor_frame);
                let results: Vec<Result<(u64, u64, u64)>> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..2usize)
                        .map(|t| {
                            let barrier = &barrier;
                            scope.spawn(move || -> Result<(u64, u64, u64)> {
                                pin(t)?;
                                let frames: Vec<Vec<Vec<u8>>> = (0..chunks)
                                    .map(|c| {
                                        (t..WORKERS)
                                            .step_by(2)
                                            .map(|w| frame(3, w, first + c, data_ref))
                                            .collect()
                                    })
                                    .collect();
                                let (mut sum, mut floor, mut calls) = (0u64, 0u64, 0u64);
                                for chunk_frames in &frames {
                                    barrier.wait();
                                    for f in chunk_frames {
                                        sum += agg.bench_run(f, 1)?;
                                        calls += 1;
                                    }
                                    // the floor after the chunk, so it does not spread the race
                                    for _ in 0..chunk_frames.len() {
                                        floor += bounce_ref.bench_run(floor_ref, 1)?;
                                    }
                                }
                                Ok((sum, floor, calls))
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join()
                                .unwrap_or_else(|_| Err(anyhow!("a thread panicked")))
                        })
                        .collect()
                });
                let (mut sum, mut floor, mut calls) = (0u64, 0u64, 0u64);
                for r in results {
                    let (s, f, c) = r?;
                    sum += s;
                    floor += f;
                    calls += c;
                }
                l.two_cpu_chunk += chunks;
                ns[k][4].push(sum as f64 / calls as f64);
                floors[k][4].push(floor as f64 / calls as f64);
            }
        }
        for (k, l) in loaded.iter().enumerate() {
            let after = [
                AggCounter::Added,
                AggCounter::Completed,
                AggCounter::ResultResent,
            ]
            .map(|c| counter(&l.agg, c).unwrap_or(0));
            let single = f64::from(l.single_chunk);
            let conc = f64::from(l.one_cpu_chunk + l.two_cpu_chunk);
            // completions: single chunks + 1cpu chunks + 2cpu chunks
            let completed = (after[1] - before[k][1]) as f64;
            let added = (after[0] - before[k][0]) as f64;
            let add_expected = (single + conc) * (WORKERS - 1) as f64;
            let verified = [
                added / add_expected,
                completed / (single + conc),
                (after[2] - before[k][2]) as f64 / single,
                completed / (single + conc),
                completed / (single + conc),
            ];
            let paths = ["add", "complete", "resend", "1cpu", "2cpu"];
            for (p, path) in paths.iter().enumerate() {
                if ns[k][p].is_empty() {
                    continue;
                }
                rows.push(Row {
                    variant: l.agg.variant(),
                    path,
                    values,
                    ns: std::mem::take(&mut ns[k][p]),
                    floor: std::mem::take(&mut floors[k][p]),
                    verified: verified[p],
                });
            }
        }
    }
    report(args, &rows);
    Ok(())
}

fn report(args: &Args, rows: &[Row]) {
    println!(
        "{:<13} {:<9} {:>6} {:>10} {:>10} {:>12} {:>10} {:>9}",
        "variant", "path", "values", "median ns", "floor ns", "over floor", "vs lock", "verified"
    );
    let mut out = Vec::new();
    for r in rows {
        let (m, f) = (stats::median(&r.ns), stats::median(&r.floor));
        let lock = rows
            .iter()
            .find(|o| o.variant == SumVariant::SpinLock && o.path == r.path && o.values == r.values)
            .and_then(|o| stats::median(&o.ns));
        let vs_lock = stats::ratio(m, lock);
        let over = m.zip(f).map(|(m, f)| m - f);
        println!(
            "{:<13} {:<9} {:>6} {:>10.1} {:>10.1} {:>12.1} {:>9.2}x {:>8.0}%",
            r.variant.name(),
            r.path,
            r.values,
            m.unwrap_or(f64::NAN),
            f.unwrap_or(f64::NAN),
            over.unwrap_or(f64::NAN),
            vs_lock.unwrap_or(f64::NAN),
            r.verified * 100.0
        );
        out.push(
            json!({"variant": r.variant.name(), "path": r.path, "values": r.values,
            "median_ns": m, "floor_median_ns": f, "over_floor_ns": over, "vs_spin_lock": vs_lock,
            "samples": r.ns, "floor_samples": r.floor, "verified": r.verified}),
        );
    }
    println!(
        "statistic: median of {} interleaved samples (single: {} chunks of 32 contributions each; 1cpu/2cpu: {} chunks each), kernel ns per call from BPF_PROG_TEST_RUN; vs lock = median / the shipped spin lock's median",
        args.samples, args.chunks, args.concurrent_chunks
    );
    if args.json {
        println!("{}", Value::Array(out));
    }
}
