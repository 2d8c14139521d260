//! What reporting one collective event costs, end to end and by part, beside a floor measured
//! in the same run: a bare write of the same bytes to a Unix socket whose reader discards them.
//!
//! - `client_send`: `ProbeClient::coll` (encode + one non-blocking write) as the rank pays it;
//! - `node_ingest`: the node's decode + session + buffer push per event, on a pre-encoded
//!   stream (no syscalls), i.e. the node's CPU per event;
//! - `end_to_end`: events/s from a client through a live probe socket into the node's core;
//! - `floor_write`: one `write(2)` of a COLL-sized frame, nothing else.
//!
//! Prints one JSON object; never fails on a number.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use serde_json::json;
use yard_actors::probe::socket::{self, NodeIdentity, SharedProbe};
use yard_diagnosis::client::{CollCall, ProbeClient};
use yard_diagnosis::event::{Dtype, Op, Phase};
use yard_diagnosis::wire::{Decoder, Hello, Message, Session};

#[derive(Debug, Parser)]
#[command(about = "per-event cost of the probe: client, node, end to end, against a bare write")]
struct Args {
    /// Events per measurement.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Repetitions (interleaved); medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

fn hello() -> Hello {
    Hello {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        pid: std::process::id(),
        job: "bench".into(),
        host: String::new(),
        nic: String::new(),
        switch: String::new(),
        ports: vec![],
    }
}

fn coll(seq: u64) -> Message {
    Message::Coll {
        handle: 0,
        seq,
        op: Op::AllReduce,
        dtype: Dtype::Float32,
        phase: Phase::Enqueue,
        peer: None,
        count: 1 << 20,
        bytes: 4 << 20,
        t_ns: seq,
    }
}

/// ns per event of the node's decode + session + push on an in-memory stream.
fn node_ingest(events: u64) -> f64 {
    let mut stream = Vec::new();
    Message::Hello(hello()).encode(&mut stream);
    for m in yard_diagnosis::wire::group_frames(0, "0", "", &[0]) {
        m.encode(&mut stream);
    }
    let start_of_colls = stream.len();
    for s in 0..events {
        coll(s).encode(&mut stream);
    }
    let shared = SharedProbe::new(usize::MAX / 2);
    let mut decoder = Decoder::new();
    let mut session = Session::new("n1", "198.18.0.1");
    decoder.feed(&stream[..start_of_colls]);
    while let Ok(Some(m)) = decoder.next_message() {
        let _ = session.accept(m);
    }
    let t = Instant::now();
    let mut pushed = 0u64;
    let mut batch = Vec::with_capacity(4096);
    for chunk in stream[start_of_colls..].chunks(64 * 1024) {
        decoder.feed(chunk);
        while let Ok(Some(m)) = decoder.next_message() {
            if let Ok(Some(ev)) = session.accept(m) {
                batch.push(ev);
            }
        }
        let mut s = shared.lock();
        for ev in batch.drain(..) {
            s.core.push("bench", ev);
            pushed += 1;
        }
        if s.core.stats().pending > 100_000 {
            s.core.drain(usize::MAX);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / pushed.max(1) as f64;
    assert_eq!(pushed, events, "every event decoded");
    ns
}

/// ns per `write(2)` of one COLL frame to a reader that discards.
fn floor_write(events: u64) -> anyhow::Result<f64> {
    let (mut a, mut b) = UnixStream::pair().context("cannot make a socket pair")?;
    let mut frame = Vec::new();
    coll(1).encode(&mut frame);
    let total = frame.len() as u64 * events;
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0u64;
        while got < total {
            match b.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
    });
    let t = Instant::now();
    for _ in 0..events {
        a.write_all(&frame)?;
    }
    let ns = t.elapsed().as_nanos() as f64 / events as f64;
    let _ = reader.join();
    Ok(ns)
}

/// (client ns per event, end-to-end events/s, dropped) through a live probe socket.
fn end_to_end(rt: &tokio::runtime::Runtime, events: u64) -> anyhow::Result<(f64, f64, u64)> {
    let dir = tempfile_dir()?;
    let path = dir.join("probe.sock");
    let shared = SharedProbe::new(1 << 22);
    let listener = rt.block_on(async { socket::bind(&path, socket::SocketAccess::default()) })?;
    let node = NodeIdentity {
        name: "n1".into(),
        addr: "198.18.0.1".into(),
    };
    let server = rt.spawn(socket::serve(listener, shared.clone(), node));
    // The node's actor drains the core every report interval; do the same here.
    let drainer_shared = shared.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let drainer = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            drainer_shared.lock().core.drain(usize::MAX);
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let client = ProbeClient::connect(&path, hello());
    let g = client.group("0", "", &[0]);
    let call = CollCall {
        group: g,
        seq: 1,
        op: Op::AllReduce,
        dtype: Dtype::Float32,
        count: 1 << 20,
        bytes: 4 << 20,
        peer: None,
    };
    let t = Instant::now();
    for _ in 0..events {
        client.coll(&call, Phase::Enqueue);
    }
    let client_ns = t.elapsed().as_nanos() as f64 / events as f64;
    let dropped = client.dropped();
    let want = events - dropped;
    let deadline = Instant::now() + Duration::from_secs(60);
    while shared.snapshot().stats.accepted < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let rate = shared.snapshot().stats.accepted as f64 / t.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = drainer.join();
    drop(client);
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
    Ok((client_ns, rate, dropped))
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("yard-probe-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (mut ingest, mut floor, mut client, mut rate, mut dropped) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..args.rounds.max(1) {
        ingest.push(node_ingest(args.events));
        floor.push(floor_write(args.events)?);
        let (c, r, d) = end_to_end(&rt, args.events)?;
        client.push(c);
        rate.push(r);
        dropped += d;
    }
    let (ingest, floor, client, rate) =
        (median(ingest), median(floor), median(client), median(rate));
    let report = json!({
        "events": args.events,
        "rounds": args.rounds,
        "node_ingest_ns_per_event": ingest,
        "client_send_ns_per_event": client,
        "floor_write_ns": floor,
        "client_vs_floor": client / floor,
        "end_to_end_events_per_s": rate,
        "client_dropped": dropped,
        "target_ns_per_event": 1000.0,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
