//! The Python client (`clients/python/yard_agg`) against this crate, byte for byte: seeded
//! float32 gradients (every magnitude class: zeros, subnormals, values that scale to exact
//! halves, the largest floats, mixed exponents) quantized and framed by `yard_agg.fixed` and
//! `yard_agg.wire` must give exactly the frames [`fixed::quantize`] and [`wire::encode`] give,
//! summed chunks must dequantize to the same float32 bits, and results re-based for another
//! number of workers ([`fixed::rebase`]) must be the same; once with the pure-Python code
//! and once with its torch-vectorised code. A worker of either language can then join the same
//! job: the aggregator sums values, and both send the same values.
//!
//! The pure test needs `python3` on PATH (or `/usr/bin/python3`); the torch test needs real
//! torch at `$YARD_TORCH_PYTHON` or `/usr/bin/python3` (Debian's `python3-torch`, installed by
//! `deploy/install-deps.sh`). Both fail, never skip, without them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use yard_agg::fixed;
use yard_agg::wire::{self, Header, Kind, FLAG_REPLAY, FLAG_RETX};

/// Reads the cases from stdin, answers with the Python client's frames and dequantized bits.
const SCRIPT: &str = r#"
import json, struct, sys
from yard_agg import fixed, wire
use_torch = sys.argv[1] == "torch"
if use_torch:
    import torch
req = json.load(sys.stdin)
out = {"frames": [], "deq": []}
for case in req["cases"]:
    x = list(struct.unpack("<%df" % len(case["bits"]), struct.pack("<%dI" % len(case["bits"]), *case["bits"])))
    g = wire.Geometry(len(x), case["chunk_values"])
    if use_torch:
        exps, q = fixed.quantize_tensor(torch.tensor(x, dtype=torch.float32), case["workers"], g.chunk_values)
        exps, q = exps.tolist(), q.tolist()
    frames = []
    for c in range(g.chunks()):
        s, e = g.chunk_range(c)
        if use_torch:
            exp, vals = exps[c], q[s:e]
        else:
            exp, vals = fixed.quantize(x[s:e], case["workers"])
        h = wire.Header(wire.KIND_DATA, case["flags"], exp, case["job"], case["epoch"],
                        case["round"], c, case["worker"], 0, token=case["token"])
        frames.append(wire.encode(h, vals).hex())
    out["frames"].append(frames)
for d in req["deq"]:
    if use_torch:
        acc = torch.tensor(d["acc"], dtype=torch.int32)
        f = fixed.dequantize_tensor(acc, torch.tensor([d["exp"]], dtype=torch.int32), d["workers"], len(d["acc"])).tolist()
    else:
        f = list(fixed.dequantize(d["acc"], d["exp"], d["workers"]))
    out["deq"].append(list(struct.unpack("<%dI" % len(f), struct.pack("<%df" % len(f), *f))))
out["rebase"] = []
for d in req["rebase"]:
    e, v = fixed.rebase(d["exp"], d["acc"], d["from"], d["to"])
    out["rebase"].append([e, list(v)])
json.dump(out, sys.stdout)
"#;

/// splitmix64: a seeded generator with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One float of a magnitude class chosen by `rng`, around `2^scale`.
fn value(rng: &mut Rng, scale: i32) -> f32 {
    let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
    match rng.below(20) {
        0 => 0.0,
        1 => -0.0,
        2 => f32::from_bits(1 + rng.below(0x7f_ffff) as u32) * sign, // subnormal
        3 => f32::MIN_POSITIVE * sign,
        4 => 2f32.powi(scale) * sign, // a power of two: the exponent rule's edge
        _ => {
            let mantissa = 1.0 + (rng.below(1 << 23) as f32) / (1u32 << 23) as f32;
            let exp = scale - rng.below(30) as i32;
            mantissa * 2f32.powi(exp.clamp(-126, 127)) * sign
        }
    }
}

/// A gradient of `n` values whose chunks land exactly halfway between two fixed-point steps
/// (the one place half-away-from-zero and half-to-even rounding differ).
fn halves(n: usize, workers: u16) -> Vec<f32> {
    let f = fixed::frac_bits(workers);
    (0..n)
        .map(|i| match i % 4 {
            0 => 1.0, // block exponent 1
            k => (i as f32 + 0.5) * 2f32.powi(1 - f) * if k == 2 { -1.0 } else { 1.0 },
        })
        .collect()
}

struct Case {
    workers: u16,
    chunk_values: u16,
    x: Vec<f32>,
    header: Header,
}

fn cases() -> Vec<Case> {
    let mut rng = Rng(0x5EED_0001);
    let mut out = Vec::new();
    let mut job = 1;
    for workers in [1u16, 2, 3, 4, 5, 8, 64] {
        for (n, cv) in [
            (1usize, 360u16),
            (359, 360),
            (360, 360),
            (361, 360),
            (2000, 768),
            (97, 1),
        ] {
            let scale = rng.below(200) as i32 - 100;
            let mut x: Vec<f32> = (0..n).map(|_| value(&mut rng, scale)).collect();
            if n > 5 && rng.below(3) == 0 {
                x[0] = f32::MAX * if rng.below(2) == 0 { 1.0 } else { -1.0 };
            }
            if n > 10 && rng.below(4) == 0 {
                x[..10].fill(0.0); // an all-zero chunk when cv is small
            }
            out.push(case(&mut rng, &mut job, workers, cv, x));
        }
        let h = halves(700, workers);
        out.push(case(&mut rng, &mut job, workers, 360, h));
    }
    out
}

fn case(rng: &mut Rng, job: &mut u32, workers: u16, cv: u16, x: Vec<f32>) -> Case {
    *job += 1;
    let flags = [0, FLAG_RETX, FLAG_REPLAY, FLAG_RETX | FLAG_REPLAY][rng.below(4) as usize];
    Case {
        workers,
        chunk_values: cv,
        x,
        header: Header {
            kind: Kind::Data,
            flags,
            exp: 0,
            job: *job,
            epoch: rng.next() as u32,
            round: rng.next() as u32,
            chunk: 0,
            worker: (rng.below(u64::from(workers))) as u16,
            count: 0,
            contributors: 0,
            token: rng.next() as u32,
        },
    }
}

/// Rust's frames for a case, hex.
fn rust_frames(c: &Case) -> Vec<String> {
    let g = wire::Geometry {
        values: c.x.len() as u32,
        chunk_values: c.chunk_values,
    };
    (0..g.chunks())
        .map(|chunk| {
            let start = g.chunk_start(chunk);
            let (exp, q) = fixed::quantize(&c.x[start..start + g.chunk_len(chunk)], c.workers);
            let h = Header {
                exp,
                chunk,
                ..c.header
            };
            hex(&wire::encode(&h, &q))
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|v| format!("{v:02x}")).collect()
}

/// Summed chunks to dequantize: random accumulators, every exponent class.
fn deq_cases() -> Vec<(Vec<i32>, i8, u16)> {
    let mut rng = Rng(0x5EED_0002);
    let mut out = Vec::new();
    for workers in [1u16, 3, 4, 64] {
        for exp in [-128i8, -127, -100, -1, 0, 1, 30, 100, 127] {
            let acc: Vec<i32> = (0..50)
                .map(|i| match i {
                    0 => i32::MAX,
                    1 => i32::MIN,
                    2 => 0,
                    _ => (rng.next() as i32) >> rng.below(31),
                })
                .collect();
            out.push((acc, exp, workers));
        }
    }
    out
}

/// Results to re-base from one job size to another (an elastic job's replay).
fn rebase_cases() -> Vec<(Vec<i32>, i8, u16, u16)> {
    let mut rng = Rng(0x5EED_0003);
    let mut out = Vec::new();
    for (from, to) in [
        (3u16, 2u16),
        (8, 3),
        (2, 2),
        (64, 1),
        (1, 64),
        (4, 2),
        (2, 4),
        (5, 4),
    ] {
        for exp in [-128i8, -127, -126, -100, 0, 5, 100, 125, 126, 127] {
            let acc: Vec<i32> = (0..20)
                .map(|i| match i {
                    0 => i32::MAX,
                    1 => i32::MIN,
                    2 => 0,
                    3 => -1,
                    _ => (rng.next() as i32) >> rng.below(31),
                })
                .collect();
            out.push((acc, exp, from, to));
        }
    }
    out
}

fn run(python: &Path, mode: &str) -> Value {
    let cases = cases();
    let request = json!({
        "cases": cases.iter().map(|c| json!({
            "workers": c.workers,
            "chunk_values": c.chunk_values,
            "bits": c.x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "flags": c.header.flags,
            "job": c.header.job,
            "epoch": c.header.epoch,
            "round": c.header.round,
            "worker": c.header.worker,
            "token": c.header.token,
        })).collect::<Vec<_>>(),
        "deq": deq_cases().iter().map(|(acc, exp, workers)| json!({
            "acc": acc, "exp": exp, "workers": workers,
        })).collect::<Vec<_>>(),
        "rebase": rebase_cases().iter().map(|(acc, exp, from, to)| json!({
            "acc": acc, "exp": exp, "from": from, "to": to,
        })).collect::<Vec<_>>(),
    });
    let mut child = Command::new(python)
        .args(["-c", SCRIPT, mode])
        .env("PYTHONPATH", python_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())
        .expect("write the cases to python");
    let out = child.wait_with_output().expect("python's output");
    assert!(
        out.status.success(),
        "the Python client ({mode}, {}) failed: {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("python answers JSON");
    let mut frames = 0;
    for (i, c) in cases.iter().enumerate() {
        let want = rust_frames(c);
        let got: Vec<String> = answer["frames"][i]
            .as_array()
            .expect("frames")
            .iter()
            .map(|v| v.as_str().expect("hex").to_owned())
            .collect();
        assert_eq!(got.len(), want.len(), "case {i}: number of chunks");
        for (chunk, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g,
                w,
                "{mode}: case {i} ({} workers, {} values, chunks of {}) chunk {chunk}: the \
                 Python frame differs from the Rust one",
                c.workers,
                c.x.len(),
                c.chunk_values
            );
            frames += 1;
        }
    }
    for (i, (acc, exp, workers)) in deq_cases().iter().enumerate() {
        let want: Vec<u32> = fixed::dequantize(acc, *exp, *workers)
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let got: Vec<u32> = answer["deq"][i]
            .as_array()
            .expect("deq")
            .iter()
            .map(|v| v.as_u64().expect("bits") as u32)
            .collect();
        assert_eq!(
            got, want,
            "{mode}: dequantize of case {i} (exp {exp}, {workers} workers) differs"
        );
    }
    for (i, (acc, exp, from, to)) in rebase_cases().iter().enumerate() {
        let (want_exp, want) = fixed::rebase(*exp, acc, *from, *to);
        let got = &answer["rebase"][i];
        let got_exp = got[0].as_i64().expect("exp");
        let got_values: Vec<i64> = got[1]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_i64().expect("value"))
            .collect();
        assert_eq!(
            (got_exp, got_values),
            (
                i64::from(want_exp),
                want.iter().map(|v| i64::from(*v)).collect::<Vec<_>>()
            ),
            "{mode}: rebase of case {i} (exp {exp}, {from} -> {to} workers) differs"
        );
    }
    println!(
        "{mode}: {} gradients, {frames} frames, {} dequantized chunks and {} re-based results \
         identical to Rust's",
        cases.len(),
        deq_cases().len(),
        rebase_cases().len()
    );
    answer
}

fn python_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../python"))
}

/// `python3` on PATH, else `/usr/bin/python3`; a panic naming both if neither runs.
fn plain_python() -> PathBuf {
    for p in ["python3", "/usr/bin/python3"] {
        if Command::new(p)
            .arg("-c")
            .arg("pass")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return PathBuf::from(p);
        }
    }
    panic!("python3 is needed to test the Python client: neither python3 on PATH nor /usr/bin/python3 runs");
}

/// The interpreter with torch (`$YARD_TORCH_PYTHON`, else `/usr/bin/python3`), or a panic
/// saying how to get it.
fn torch_python() -> PathBuf {
    let p = std::env::var_os("YARD_TORCH_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/usr/bin/python3"), PathBuf::from);
    let ok = Command::new(&p)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "real torch is needed at {} to test yard_agg's vectorised fixed point (apt-get install \
         python3-torch, or deploy/install-deps.sh; another interpreter via YARD_TORCH_PYTHON)",
        p.display()
    );
    p
}

#[test]
fn python_quantizer_and_encoder_are_bit_identical_to_rust() {
    run(&plain_python(), "pure");
}

#[test]
fn torch_quantizer_is_bit_identical_to_rust() {
    run(&torch_python(), "torch");
}
