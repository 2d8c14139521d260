//! Rust and Python workers in one job: one `yard_agg::worker::Worker` and two Python
//! `yard_agg.Worker`s (`python3`, pure standard library) sum float32 gradients round after
//! round through the reference aggregator (`yard_agg::model`, the XDP program's rules) on
//! loopback. Every worker must get the same bits each round, within the fixed-point bound of
//! the exact sum: the two clients are interchangeable in a job.
//!
//! Needs `python3` on PATH (or `/usr/bin/python3`): fails, never skips, without it.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use yard_agg::fixed;
use yard_agg::model::{Action, Aggregator, JobSpec};
use yard_agg::wire::{Dtype, Geometry};
use yard_agg::worker::{Membership, Tuning, Worker};

const VALUES: u32 = 1000; // 3 chunks of 360, the last short
const CHUNK: u16 = 360;
const ROUNDS: usize = 4;
const PYTHON_WORKERS: usize = 2;
/// The reference aggregator's result token in this test; worker `w`'s token is [`token`].
const RESULT_TOKEN: u32 = 0x5245_5355;

fn token(w: usize) -> u32 {
    0x544f_4b00 + u32::try_from(w).unwrap()
}

/// A Python worker: prints its bound port, reads the membership and its gradients, prints
/// each round's result as float32 bits.
const SCRIPT: &str = r#"
import json, socket, struct, sys
import yard_agg
from yard_agg.session import Membership
from yard_agg.wire import Geometry
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
req = json.loads(sys.stdin.readline())
m = req["membership"]
w = yard_agg.Worker(s, Membership(m["job"], m["epoch"], m["worker"], m["workers"],
                                  ("127.0.0.1", m["port"]), Geometry(m["values"], m["chunk_values"]),
                                  "f32", m["token"], m["result_token"]))
out = []
for bits in req["grads"]:
    x = struct.unpack("<%df" % len(bits), struct.pack("<%dI" % len(bits), *bits))
    r = w.all_reduce_f32(x)
    out.append(list(struct.unpack("<%dI" % len(r), r.tobytes())))
print(json.dumps(out), flush=True)
"#;

fn gradient(worker: usize, round: usize) -> Vec<f32> {
    (0..VALUES as usize)
        .map(|i| {
            let t = (i * 7 + worker * 131 + round * 17) as f32;
            (t * 0.37).sin() * 10f32.powi((i % 9) as i32 - 4)
        })
        .collect()
}

fn python() -> PathBuf {
    for p in ["python3", "/usr/bin/python3"] {
        if Command::new(p)
            .args(["-c", "pass"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return PathBuf::from(p);
        }
    }
    panic!("python3 is needed to test the Python client with the Rust one: neither python3 on PATH nor /usr/bin/python3 runs");
}

#[test]
fn rust_and_python_workers_get_the_same_bits_from_one_job() {
    let python = python();
    let agg_sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let agg_addr = match agg_sock.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let rust_sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let rust_addr = match rust_sock.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let workers = 1 + PYTHON_WORKERS;

    let mut children = Vec::new();
    let mut members = vec![rust_addr];
    for _ in 0..PYTHON_WORKERS {
        let mut child = Command::new(&python)
            .args(["-c", SCRIPT])
            .env(
                "PYTHONPATH",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../python"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("a python worker did not print its port: {line:?}"));
        members.push(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        children.push((child, out));
    }

    // The reference aggregator: the XDP program's rules, its fan-out done by the thread.
    let geometry = Geometry {
        values: VALUES,
        chunk_values: CHUNK,
    };
    let mut model = Aggregator::new();
    model.set_job(JobSpec {
        id: 5,
        epoch: 1,
        geometry,
        dtype: Dtype::F32,
        tokens: (0..members.len()).map(token).collect(),
        members: members.clone(),
        result_token: RESULT_TOKEN,
        parent: None,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    agg_sock
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let aggregator = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while !stop2.load(Ordering::Relaxed) {
            let Ok((n, std::net::SocketAddr::V4(from))) = agg_sock.recv_from(&mut buf) else {
                continue;
            };
            match model.receive(from, &buf[..n]).action {
                Action::Drop => {}
                Action::Reply(frame) => {
                    let _ = agg_sock.send_to(&frame, from);
                }
                Action::Fanout(frame) => {
                    for m in model.members(5).to_vec() {
                        let _ = agg_sock.send_to(&frame, m);
                    }
                }
                Action::Up(frame) => {
                    if let Some(p) = model.parent(5) {
                        let _ = agg_sock.send_to(&frame, p.addr);
                    }
                }
            }
        }
    });

    for (i, (child, _)) in children.iter_mut().enumerate() {
        let grads: Vec<Vec<u32>> = (0..ROUNDS)
            .map(|r| gradient(1 + i, r).iter().map(|v| v.to_bits()).collect())
            .collect();
        let req = json!({
            "membership": {"job": 5, "epoch": 1, "worker": 1 + i, "workers": workers,
                           "port": agg_addr.port(), "values": VALUES, "chunk_values": CHUNK,
                           "token": token(1 + i), "result_token": RESULT_TOKEN},
            "grads": grads,
        });
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{req}").unwrap();
    }
    let mut w = Worker::new(
        rust_sock,
        Membership {
            job: 5,
            epoch: 1,
            worker: 0,
            workers: workers as u16,
            aggregator: agg_addr,
            geometry,
            dtype: Dtype::F32,
            token: token(0),
            result_token: RESULT_TOKEN,
        },
        Tuning::default(),
    );
    let mut rust_results = Vec::new();
    for r in 0..ROUNDS {
        let mut g = gradient(0, r);
        w.all_reduce_f32(&mut g).expect("the Rust worker's round");
        rust_results.push(g);
    }
    let mut python_results = Vec::new();
    for (mut child, mut out) in children {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let status = child.wait().unwrap();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut err).unwrap();
        }
        assert!(status.success(), "a python worker failed: {err}");
        let v: Value = serde_json::from_str(line.trim()).expect("python results");
        python_results.push(v);
    }
    stop.store(true, Ordering::Relaxed);
    aggregator.join().unwrap();

    for (r, got) in rust_results.iter().enumerate() {
        let bits: Vec<u64> = got.iter().map(|v| u64::from(v.to_bits())).collect();
        for (p, py) in python_results.iter().enumerate() {
            let py_bits: Vec<u64> = py[r]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap())
                .collect();
            assert!(
                py_bits == bits,
                "round {r}: python worker {} got other bits than the Rust worker",
                p + 1
            );
        }
        // And the sum is right: within the bound of the largest exponent a chunk can have.
        for (j, v) in got.iter().enumerate() {
            let exact: f64 = (0..workers).map(|k| f64::from(gradient(k, r)[j])).sum();
            let c = j / usize::from(CHUNK);
            let chunk_max = (0..workers)
                .flat_map(|k| {
                    let g = gradient(k, r);
                    let s = c * usize::from(CHUNK);
                    let e = (s + usize::from(CHUNK)).min(VALUES as usize);
                    g[s..e].to_vec()
                })
                .fold(0f32, |m, x| m.max(x.abs()));
            let bound = fixed::error_bound(workers as u16, fixed::block_exp(&[chunk_max]))
                + f64::from(v.abs()) * f64::from(f32::EPSILON);
            assert!(
                (f64::from(*v) - exact).abs() <= bound,
                "round {r} element {j}: {v} vs exact {exact}"
            );
        }
    }
    println!(
        "{ROUNDS} rounds of {VALUES} float32 values: 1 Rust and {PYTHON_WORKERS} Python workers got identical bits"
    );
}
