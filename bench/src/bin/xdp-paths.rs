//! `xdp-paths`: per-packet cost of every path through the XDP gateway program (`yard_gateway`),
//! measured in the kernel with BPF_PROG_TEST_RUN, beside the bounce floor (`yard_bounce`, which
//! only swaps MACs and bounces) measured the same way in the same run: samples interleave
//! floor, path, floor, path, ... and the headline figure is the ratio of the medians. Also the
//! time to program 100k endpoints into `gw_endpoints` and the kernel memory of that map.
//!
//! How each path is measured, because the kernel runs all repeats of one test run on one
//! buffer (the program sees its own output from the second repeat on):
//! - `steady`: paths that leave the frame as it was (passes, drops): `--repeat` runs per sample.
//! - `ttl-loop`: forwarding. The endpoint's host is itself a VIP, so the rewritten frame is
//!   again a tunnel frame to a VIP and takes the same path; the inner TTL (255) drops by one per
//!   run, so each call repeats 250 times and a sample is `--loop-calls` calls. (Every test run
//!   with repeat > 1 swaps the kernel's XDP dispatcher in and out, ~10-20 ms of wall time per
//!   call outside the measured loop, which is what bounds the number of calls.)
//! - `single`: ARP replies turn a request into a reply, which the next run would pass; one run
//!   per call and `--single-calls` calls per sample. A single run's kernel-measured time includes
//!   the kernel's timer read, so its floor is the bounce measured the same way.
//!
//! Every path's counter deltas are checked: the `verified` column is the share of runs that
//! took the intended path (100% unless something is wrong).
//!
//! A benchmark, not a test: prints a table (and with `--json` a JSON object at the end) and never
//! fails on a number; it fails only when it cannot load the programs (needs root).

#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use yard_ebpf::frames::{self, Arp, Inner, VxlanFrame};
use yard_ebpf::{
    ktime_now_ns, Bounce, Counter, EbpfError, Endpoint, Gateway, GatewayConfig, VipMode,
};

#[derive(Debug, Parser)]
#[command(
    name = "xdp-paths",
    about = "per-packet cost of each yard_gateway path against the bounce floor (needs root)"
)]
struct Args {
    /// Interleaved samples per path (each: floor, then path).
    #[arg(long, default_value_t = 5)]
    samples: usize,
    /// Program runs per sample for steady and ttl-loop paths.
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Calls of 250 runs each per sample for the forwarding (ttl-loop) path.
    #[arg(long, default_value_t = 40)]
    loop_calls: u32,
    /// Calls (one run each) per sample for paths that cannot repeat on one buffer.
    #[arg(long, default_value_t = 20_000)]
    single_calls: u32,
    /// Endpoints programmed into gw_endpoints before measuring (and timed).
    #[arg(long, default_value_t = 100_000)]
    endpoints: u32,
    /// Print a JSON object with every figure at the end.
    #[arg(long)]
    json: bool,
}

/// Stop starting new samples after this, to stay well under a minute in total.
const BUDGET: Duration = Duration::from_secs(45);
/// Repeats per call on the TTL-loop path: inner TTL 255 stays > 1 for 254 runs.
const TTL_LOOP: u32 = 250;

const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xff, 0x01];
const SENDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x14];
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const TENANT_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0x01, 0x0a];
const TENANT_SRC_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0x01, 0x14];
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
/// A VIP that is also the host of the loop endpoint (see `ttl-loop`).
const LOOP_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 3);
const NOT_VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const SENDER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 20);
const HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const HOST_UNKNOWN: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 99);
const VNI: u32 = 100;
const TENANT: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 10);
const TENANT_LOOP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 11);
const TENANT_ON_UNKNOWN_HOST: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 30);
const TENANT_UNKNOWN: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 99);
const TENANT_SRC: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 20);
/// A typical small datagram: 64 bytes of inner payload (156-byte frame).
const PAYLOAD: [u8; 64] = [0x5a; 64];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Steady,
    TtlLoop,
    Single,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Steady => "steady",
            Method::TtlLoop => "ttl-loop",
            Method::Single => "single",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Main,
    Fenced,
    Unconfigured,
}

struct PathCase {
    name: &'static str,
    counter: Counter,
    which: Which,
    method: Method,
    frame: Vec<u8>,
}

struct PathResult {
    name: &'static str,
    counter: Counter,
    method: Method,
    repeat: u32,
    calls: u32,
    path_ns: Vec<f64>,
    floor_ns: Vec<f64>,
    verified: Option<f64>,
    error: Option<String>,
}

fn tunnel(vip: Ipv4Addr, dst: Ipv4Addr) -> VxlanFrame {
    VxlanFrame::new(
        SENDER_MAC,
        GW_MAC,
        SENDER,
        vip,
        VNI,
        Inner::udp(TENANT_SRC_MAC, GW_MAC, TENANT_SRC, dst, &PAYLOAD),
    )
}

fn cases() -> Vec<PathCase> {
    let mut fwd = tunnel(LOOP_VIP, TENANT_LOOP);
    if let Inner::Ipv4 { ip, .. } = &mut fwd.inner {
        ip.ttl = 255;
    }
    let inner_arp = VxlanFrame::new(
        SENDER_MAC,
        GW_MAC,
        SENDER,
        VIP,
        VNI,
        Inner::arp_request(TENANT_SRC_MAC, TENANT_SRC, TENANT),
    )
    .build();
    let outer_arp = frames::arp_frame(
        [0xff; 6],
        SENDER_MAC,
        &Arp::request(SENDER_MAC, SENDER, VIP),
    );
    let mut not_vxlan = tunnel(VIP, TENANT);
    not_vxlan.udp_dst = 4790;
    let mut ipv6 = tunnel(VIP, TENANT);
    ipv6.ethertype = frames::ETHERTYPE_IPV6;
    let mut ttl1 = tunnel(VIP, TENANT);
    if let Inner::Ipv4 { ip, .. } = &mut ttl1.inner {
        ip.ttl = 1;
    }
    let full = tunnel(VIP, TENANT).build();
    let truncated = full[..frames::offsets::INNER_L3 + 10].to_vec();
    let case = |name, counter, which, method, frame| PathCase {
        name,
        counter,
        which,
        method,
        frame,
    };
    use Counter as C;
    use Method::*;
    use Which::*;
    vec![
        case("forward", C::Forwarded, Main, TtlLoop, fwd.build()),
        case(
            "inner ARP reply",
            C::ArpRepliedInner,
            Main,
            Single,
            inner_arp,
        ),
        case(
            "outer ARP reply",
            C::ArpRepliedOuter,
            Main,
            Single,
            outer_arp.clone(),
        ),
        case(
            "pass not-VIP",
            C::PassNotVip,
            Main,
            Steady,
            tunnel(NOT_VIP, TENANT).build(),
        ),
        case("pass non-IPv4", C::PassNonIpv4, Main, Steady, ipv6.build()),
        case(
            "pass not-VXLAN",
            C::PassNotVxlan,
            Main,
            Steady,
            not_vxlan.build(),
        ),
        case(
            "drop unknown endpoint",
            C::DropUnknownEndpoint,
            Main,
            Steady,
            tunnel(VIP, TENANT_UNKNOWN).build(),
        ),
        case(
            // Re-addressed to the host: the next run would see a frame for no VIP.
            "pass unresolved host (FIB lookup)",
            C::PassUnresolvedHost,
            Main,
            Single,
            tunnel(VIP, TENANT_ON_UNKNOWN_HOST).build(),
        ),
        case("drop TTL", C::DropTtl, Main, Steady, ttl1.build()),
        case("drop truncated", C::DropTruncated, Main, Steady, truncated),
        case(
            "lease expired, ARP",
            C::DropLeaseExpired,
            Fenced,
            Steady,
            outer_arp,
        ),
        case(
            "pass not configured",
            C::PassNotConfigured,
            Unconfigured,
            Steady,
            full,
        ),
    ]
}

fn configure(gw: &mut Gateway, lease_deadline: u64) -> Result<(), EbpfError> {
    gw.set_config(&GatewayConfig {
        mac: GW_MAC,
        mtu: 1500,
    })?;
    gw.set_lease_deadline(lease_deadline)?;
    gw.put_vip(VIP, VipMode::Owned)?;
    gw.put_vip(LOOP_VIP, VipMode::Owned)?;
    for (ip, host) in [
        (TENANT, HOST),
        (TENANT_LOOP, LOOP_VIP),
        (TENANT_ON_UNKNOWN_HOST, HOST_UNKNOWN),
    ] {
        gw.put_endpoint(&Endpoint {
            vni: VNI,
            ip,
            mac: TENANT_MAC,
            host,
        })?;
    }
    gw.put_host(HOST, HOST_MAC)?;
    gw.put_host(LOOP_VIP, HOST_MAC)?;
    // The sender, and the looping frame's own source after its first rewrite (the VIP).
    gw.put_source(VNI, SENDER)?;
    gw.put_source(VNI, LOOP_VIP)?;
    Ok(())
}

/// 100k distinct (vni, ip) pairs: 65536 addresses per VNI fit in 198.19.0.0/16.
fn bulk_endpoint(i: u32) -> Endpoint {
    let vni = 1000 + i / 50_000;
    let n = i % 50_000;
    Endpoint {
        vni,
        ip: Ipv4Addr::new(198, 19, (n >> 8) as u8, (n & 0xff) as u8),
        mac: [0x02, 0xcc, (i >> 16) as u8, (i >> 8) as u8, i as u8, 0x01],
        host: Ipv4Addr::new(198, 18, (i % 200) as u8, 1 + (i % 250) as u8),
    }
}

struct EndpointFigures {
    count: u32,
    program_ms: f64,
    list_ms: Option<f64>,
    listed: Option<usize>,
    memlock: Option<u64>,
}

fn program_endpoints(gw: &mut Gateway, count: u32) -> Result<EndpointFigures> {
    let start = Instant::now();
    for i in 0..count {
        gw.put_endpoint(&bulk_endpoint(i))
            .with_context(|| format!("endpoint {i}"))?;
    }
    let program_ms = start.elapsed().as_secs_f64() * 1e3;
    let start = Instant::now();
    let listed = gw.endpoints().ok().map(|e| e.len());
    let list_ms = listed.map(|_| start.elapsed().as_secs_f64() * 1e3);
    let memlock = gw
        .map_memory()
        .into_iter()
        .find(|(name, _)| *name == "gw_endpoints")
        .and_then(|(_, m)| m);
    Ok(EndpointFigures {
        count,
        program_ms,
        list_ms,
        listed,
        memlock,
    })
}

/// Mean ns per run over `calls` calls of `repeat` runs each.
fn sample(
    run: impl Fn(&[u8], u32) -> Result<u64, EbpfError>,
    frame: &[u8],
    repeat: u32,
    calls: u32,
) -> Result<f64, EbpfError> {
    let mut total = 0.0;
    for _ in 0..calls {
        total += run(frame, repeat)? as f64;
    }
    Ok(total / f64::from(calls.max(1)))
}

fn counter_totals(gw: &Gateway) -> HashMap<Counter, u64> {
    gw.counters()
        .map(|v| v.into_iter().map(|(c, v)| (c, v.packets)).collect())
        .unwrap_or_default()
}

fn measure(
    args: &Args,
    case: &PathCase,
    gw: &Gateway,
    bounce: &Bounce,
    started: Instant,
) -> PathResult {
    let (repeat, calls) = match case.method {
        Method::Steady => (args.repeat, 1),
        Method::TtlLoop => (TTL_LOOP, args.loop_calls.max(1)),
        Method::Single => (1, args.single_calls.max(1)),
    };
    let mut result = PathResult {
        name: case.name,
        counter: case.counter,
        method: case.method,
        repeat,
        calls,
        path_ns: Vec::new(),
        floor_ns: Vec::new(),
        verified: None,
        error: None,
    };
    let before = counter_totals(gw);
    for _ in 0..args.samples.max(1) {
        if started.elapsed() > BUDGET && !result.path_ns.is_empty() {
            break;
        }
        let floor = sample(|f, r| bounce.bench_run(f, r), &case.frame, repeat, calls);
        let path = sample(|f, r| gw.bench_run(f, r), &case.frame, repeat, calls);
        match (floor, path) {
            (Ok(floor), Ok(path)) => {
                result.floor_ns.push(floor);
                result.path_ns.push(path);
            }
            (Err(e), _) | (_, Err(e)) => {
                result.error = Some(format!("{e}"));
                break;
            }
        }
    }
    let after = counter_totals(gw);
    let delta: HashMap<Counter, u64> = after
        .iter()
        .map(|(c, a)| (*c, a - before.get(c).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect();
    let total: u64 = delta.values().sum();
    if total > 0 {
        let hit = delta.get(&case.counter).copied().unwrap_or(0);
        result.verified = Some(hit as f64 / total as f64);
    }
    result
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map(|v| format!("{v:.prec$}"))
        .unwrap_or_else(|| "-".to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xdp-paths: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let load = "could not load the XDP programs (this benchmark needs root)";
    let bounce = Bounce::load().context(load)?;
    let mut main_gw = Gateway::load().context(load)?;
    let mut fenced = Gateway::load().context(load)?;
    let unconfigured = Gateway::load().context(load)?;
    configure(&mut main_gw, ktime_now_ns() + 3_600_000_000_000)?;
    configure(&mut fenced, 0)?;

    // The paths below then run against a realistically full endpoint table.
    let endpoints = program_endpoints(&mut main_gw, args.endpoints)?;

    let mut results = Vec::new();
    for case in cases() {
        let gw = match case.which {
            Which::Main => &main_gw,
            Which::Fenced => &fenced,
            Which::Unconfigured => &unconfigured,
        };
        results.push(measure(args, &case, gw, &bounce, started));
    }

    println!(
        "xdp-paths: yard_gateway per-packet cost (BPF_PROG_TEST_RUN, kernel-timed), {} interleaved samples, medians",
        args.samples
    );
    println!(
        "{:<22} {:<22} {:<9} {:>11} {:>9} {:>9} {:>6} {:>9}",
        "path", "counter", "method", "runs/sample", "path ns", "floor ns", "ratio", "verified"
    );
    let mut json_paths = Vec::new();
    for r in &results {
        let path = stats::median(&r.path_ns);
        let floor = stats::median(&r.floor_ns);
        let ratio = stats::ratio(path, floor);
        let runs = u64::from(r.repeat) * u64::from(r.calls);
        println!(
            "{:<22} {:<22} {:<9} {:>11} {:>9} {:>9} {:>6} {:>9}{}",
            r.name,
            r.counter.name(),
            r.method.name(),
            runs,
            fmt_opt(path, 1),
            fmt_opt(floor, 1),
            fmt_opt(ratio, 2),
            r.verified
                .map(|v| format!("{:.1}%", v * 100.0))
                .unwrap_or_else(|| "-".into()),
            r.error
                .as_ref()
                .map(|e| format!("  error: {e}"))
                .unwrap_or_default(),
        );
        json_paths.push(json!({
            "path": r.name,
            "counter": r.counter.name(),
            "method": r.method.name(),
            "repeat": r.repeat,
            "calls_per_sample": r.calls,
            "samples": r.path_ns.len(),
            "path_ns": path,
            "floor_ns": floor,
            "ratio": ratio,
            "path_ns_samples": r.path_ns,
            "floor_ns_samples": r.floor_ns,
            "verified_share": r.verified,
            "error": r.error,
        }));
    }
    let per_entry_us = endpoints.program_ms * 1e3 / f64::from(endpoints.count.max(1));
    println!(
        "endpoints: {} programmed into gw_endpoints in {:.0} ms ({:.2} us each, plain per-entry updates); listed {} in {} ms; map memlock {} (preallocated for {} entries)",
        endpoints.count,
        endpoints.program_ms,
        per_entry_us,
        endpoints.listed.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
        fmt_opt(endpoints.list_ms, 0),
        endpoints
            .memlock
            .map(|b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)))
            .unwrap_or_else(|| "-".into()),
        yard_ebpf::layout::ENDPOINTS_MAX,
    );
    println!(
        "methods: steady = one test run of {} repeats per sample; ttl-loop = {} x 250 repeats; single = {} x 1 run (each single run's kernel time includes the kernel's timer read, so its floor is the bounce measured the same way)",
        args.repeat, args.loop_calls, args.single_calls
    );
    let elapsed = started.elapsed().as_secs_f64();
    println!("elapsed: {elapsed:.1} s");
    if args.json {
        let out: Value = json!({
            "bench": "xdp-paths",
            "samples": args.samples,
            "repeat": args.repeat,
            "single_calls": args.single_calls,
            "loop_calls": args.loop_calls,
            "paths": json_paths,
            "endpoints": {
                "count": endpoints.count,
                "program_ms": endpoints.program_ms,
                "per_entry_us": per_entry_us,
                "list_ms": endpoints.list_ms,
                "listed": endpoints.listed,
                "memlock_bytes": endpoints.memlock,
                "capacity": yard_ebpf::layout::ENDPOINTS_MAX,
            },
            "elapsed_s": elapsed,
        });
        println!("{out}");
    }
    Ok(())
}
