//! `agg-paths`: per-packet cost of each path through the aggregator's XDP program (`yard_agg`),
//! measured in the kernel with BPF_PROG_TEST_RUN beside the bounce floor (`yard_bounce`)
//! measured the same way in the same run, samples interleaved (floor, path, floor, path, ...);
//! the headline figures are medians and their ratio to the floor's median.
//!
//! Two ways of measuring, because map writes persist between runs:
//! - `steady` (`--repeat` runs of one frame per sample): paths that leave the frame and the
//!   slot as they were: a duplicate contribution, traffic that is not ours.
//! - `single` (one run per call, `--calls` calls per sample, floor measured the same way, so
//!   both include the kernel's timer read): a new contribution that is summed (`add`), the
//!   last one that completes a chunk and writes the sum into the frame (`complete`), and a
//!   resend to a complete chunk answered with the stored sum (`resend`). Each call uses a new
//!   (chunk, worker) of a 64-worker job so the path is the intended one; the counters are
//!   checked afterwards (`verified`).
//!
//! For chunks of 360 values (1500-byte MTU) and 768 (jumbo). A benchmark, not a test: prints a
//! table (`--json`: one JSON object) and never fails on a number; it needs root.

#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_agg::wire::{self, Dtype, Geometry, Header, Kind};
use yard_ebpf::frames::HostFrame;
use yard_ebpf::{AggCounter, AggJobEntry, Aggregator, Bounce};

#[derive(Debug, Parser)]
#[command(
    name = "agg-paths",
    about = "per-packet cost of each yard_agg path against the bounce floor (needs root)"
)]
struct Args {
    /// Interleaved samples per path.
    #[arg(long, default_value_t = 5)]
    samples: usize,
    /// Runs per sample of the steady paths.
    #[arg(long, default_value_t = 200_000)]
    repeat: u32,
    /// Calls per sample of the single-run paths (a multiple of 63 is used).
    #[arg(long, default_value_t = 6_300)]
    calls: u32,
    #[arg(long)]
    json: bool,
}

const AGG: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const WORKERS: usize = 64;

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

fn frame(job: u32, w: usize, round: u32, chunk: u32, values: &[i32]) -> Vec<u8> {
    let payload = wire::encode(
        &Header {
            kind: Kind::Data,
            flags: 0,
            exp: 0,
            job,
            epoch: 1,
            round,
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

struct Row {
    path: &'static str,
    values: usize,
    mode: &'static str,
    ns: Vec<f64>,
    floor: Vec<f64>,
    verified: Option<f64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agg-paths: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn counter(agg: &Aggregator, c: AggCounter) -> Result<u64> {
    Ok(agg
        .counters()?
        .into_iter()
        .find(|(k, _)| *k == c)
        .map_or(0, |(_, v)| v.packets))
}

fn run(args: &Args) -> Result<()> {
    let load = "could not load the XDP programs (this benchmark needs root)";
    let bounce = Bounce::load().context(load)?;
    let per_sample = (args.calls / 63).max(1);
    let mut rows = Vec::new();
    for values in [360usize, 768] {
        let cv = u16::try_from(values)?;
        let chunks = per_sample * u32::try_from(args.samples)? + 1;
        let geometry = Geometry {
            values: chunks * u32::from(cv),
            chunk_values: cv,
        };
        let mut agg = Aggregator::load(chunks * 2 + 4).context(load)?;
        agg.set_job(&AggJobEntry {
            id: 1,
            epoch: 1,
            base: 0,
            geometry,
            dtype: Dtype::I32,
            members: (0..WORKERS).map(worker).collect(),
            tokens: (0..WORKERS).map(|w| bench_token(1, w)).collect(),
            result_token: bench_token(1, 0xfff),
            self_ip: AGG,
            parent: None,
        })?;
        // A two-worker job for the duplicate path: worker 0's contribution is in, so its
        // repeats are duplicates and leave frame and slot as they are.
        agg.set_job(&AggJobEntry {
            id: 2,
            epoch: 1,
            base: chunks * 2,
            geometry: Geometry {
                values: u32::from(cv),
                chunk_values: cv,
            },
            dtype: Dtype::I32,
            members: vec![worker(0), worker(1)],
            tokens: vec![bench_token(2, 0), bench_token(2, 1)],
            result_token: bench_token(2, 0xfff),
            self_ip: AGG,
            parent: None,
        })?;
        let data: Vec<i32> = (0..values).map(|i| i32::try_from(i).unwrap_or(0)).collect();
        let dup = frame(2, 0, 0, 0, &data);
        agg.test_run(&dup)?;
        let other = HostFrame::udp(
            *worker(0).ip(),
            40000,
            AGG,
            9999,
            &wire::encode(
                &Header {
                    kind: Kind::Data,
                    flags: 0,
                    exp: 0,
                    job: 1,
                    epoch: 1,
                    round: 0,
                    chunk: 0,
                    worker: 0,
                    count: 0,
                    contributors: 0,
                    token: bench_token(1, 0),
                },
                &data,
            ),
        )
        .build();
        let floor_frame = dup.clone();

        let mut steady = [
            ("duplicate", dup.clone(), Vec::new(), Vec::new()),
            ("pass_not_agg", other, Vec::new(), Vec::new()),
        ];
        let mut single = [
            ("add", Vec::new(), Vec::new()),
            ("complete", Vec::new(), Vec::new()),
            ("resend", Vec::new(), Vec::new()),
        ];
        let before = [
            AggCounter::Added,
            AggCounter::Completed,
            AggCounter::ResultResent,
        ]
        .map(|c| counter(&agg, c).unwrap_or(0));
        let mut chunk = 0u32;
        for _ in 0..args.samples {
            for (_, f, ns, floor) in steady.iter_mut() {
                floor.push(bounce.bench_run(&floor_frame, args.repeat)? as f64);
                ns.push(agg.bench_run(f, args.repeat)? as f64);
            }
            // Single runs: floor, then each path, per call.
            let (mut add, mut complete, mut resend, mut floor) = (0u64, 0u64, 0u64, 0u64);
            for _ in 0..per_sample {
                for w in 0..WORKERS - 1 {
                    floor += bounce.bench_run(&floor_frame, 1)?;
                    add += agg.bench_run(&frame(1, w, 0, chunk, &data), 1)?;
                }
                floor += bounce.bench_run(&floor_frame, 1)?;
                complete += agg.bench_run(&frame(1, WORKERS - 1, 0, chunk, &data), 1)?;
                resend += agg.bench_run(&frame(1, 0, 0, chunk, &data), 1)?;
                chunk += 1;
            }
            let calls = f64::from(per_sample);
            let floor_ns = floor as f64 / (calls * WORKERS as f64);
            single[0]
                .1
                .push(add as f64 / (calls * (WORKERS - 1) as f64));
            single[1].1.push(complete as f64 / calls);
            single[2].1.push(resend as f64 / calls);
            for s in single.iter_mut() {
                s.2.push(floor_ns);
            }
        }
        let after = [
            AggCounter::Added,
            AggCounter::Completed,
            AggCounter::ResultResent,
        ]
        .map(|c| counter(&agg, c).unwrap_or(0));
        let expected = [
            u64::from(chunk) * (WORKERS as u64 - 1),
            u64::from(chunk),
            u64::from(chunk),
        ];
        for (path, ns, floor) in single {
            let k = match path {
                "add" => 0,
                "complete" => 1,
                _ => 2,
            };
            let verified = (after[k] - before[k]) as f64 / expected[k] as f64;
            rows.push(Row {
                path,
                values,
                mode: "single",
                ns,
                floor,
                verified: Some(verified),
            });
        }
        for (path, _, ns, floor) in steady {
            // bench_run gives the kernel's mean per run already
            rows.push(Row {
                path,
                values,
                mode: "steady",
                ns,
                floor,
                verified: None,
            });
        }
    }
    let mut out = Vec::new();
    println!(
        "{:<14} {:>6} {:<7} {:>10} {:>10} {:>8} {:>12} {:>9}",
        "path", "values", "mode", "median ns", "floor ns", "ratio", "ns/value", "verified"
    );
    for r in &rows {
        let (m, f) = (stats::median(&r.ns), stats::median(&r.floor));
        let ratio = stats::ratio(m, f);
        let per_value = m.map(|m| (m - f.unwrap_or(0.0)).max(0.0) / r.values as f64);
        println!(
            "{:<14} {:>6} {:<7} {:>10.1} {:>10.1} {:>8.2} {:>12.3} {:>9}",
            r.path,
            r.values,
            r.mode,
            m.unwrap_or(f64::NAN),
            f.unwrap_or(f64::NAN),
            ratio.unwrap_or(f64::NAN),
            per_value.unwrap_or(f64::NAN),
            r.verified
                .map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
        );
        out.push(
            json!({"path": r.path, "values": r.values, "mode": r.mode, "median_ns": m,
                        "floor_median_ns": f, "ratio": ratio, "ns_per_value_over_floor": per_value,
                        "samples": r.ns, "floor_samples": r.floor, "verified": r.verified}),
        );
    }
    println!(
        "statistic: median of {} interleaved samples; floor: yard_bounce measured the same way",
        args.samples
    );
    if args.json {
        println!("{}", Value::Array(out));
    }
    Ok(())
}
