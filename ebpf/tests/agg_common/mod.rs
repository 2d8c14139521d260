//! What the aggregator's BPF_PROG_TEST_RUN tests share (`agg_prog`, `agg_variants`): frames
//! from a worker, one round through the program and the reference model, the gradient sizes at
//! the chunk edges, and float32 inputs checked against the fixed-point bound.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4};

use rand::Rng;
use yard_agg::fixed;
use yard_agg::model::{Action, Aggregator as Model, JobSpec};
use yard_agg::wire::{self, Header, Kind};
use yard_ebpf::frames::HostFrame;
use yard_ebpf::{AggCounter, Aggregator, XdpAction};

pub const AGG: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
pub const CHUNK: u16 = 360;
pub const HEADERS: usize = 14 + 20 + 8;

pub fn frame(from: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    HostFrame::udp(*from.ip(), from.port(), AGG, wire::PORT, payload).build()
}

/// Every global counter's packets, in [`AggCounter::ALL`] order.
pub fn counts(agg: &Aggregator) -> Vec<u64> {
    agg.counters()
        .unwrap()
        .into_iter()
        .map(|(_, v)| v.packets)
        .collect()
}

/// The counters that moved between two [`counts`].
pub fn moved(before: &[u64], after: &[u64]) -> Vec<AggCounter> {
    AggCounter::ALL
        .iter()
        .zip(before.iter().zip(after))
        .filter(|(_, (b, a))| a != b)
        .map(|(c, _)| *c)
        .collect()
}

/// The aggregation payload of an output frame.
pub fn payload_of(frame: &[u8]) -> &[u8] {
    &frame[HEADERS..]
}

/// A result's payload as `yard_agg` hands it to the TC fan-out: kind FANOUT, and the load's
/// fan-out tag as its token, which the fan-out replaces with the result token.
pub fn as_fanout(result: &[u8], tag: u32) -> Vec<u8> {
    let mut out = result.to_vec();
    out[5] = Kind::Fanout as u8;
    out[28..32].copy_from_slice(&tag.to_le_bytes());
    out
}

/// Member `w`'s token in the tests' jobs: distinct per job and worker, never 0.
pub fn test_token(job: u32, w: usize) -> u32 {
    0x7000_0000 | job << 8 | u32::try_from(w).unwrap()
}

/// The tests' result token of job `job` at an aggregator (its index in a tree, 0 if flat).
pub fn test_result_token(job: u32, aggregator: usize) -> u32 {
    0x5200_0000 | job << 8 | u32::try_from(aggregator).unwrap()
}

pub fn data(spec: &JobSpec, w: usize, round: u32, chunk: u32, exp: i8, values: &[i32]) -> Vec<u8> {
    wire::encode(
        &Header {
            kind: Kind::Data,
            flags: 0,
            exp,
            job: spec.id,
            epoch: spec.epoch,
            round,
            chunk,
            worker: u16::try_from(w).unwrap(),
            count: 0,
            contributors: 0,
            token: spec.tokens.get(w).copied().unwrap_or(0), // a stranger has none
        },
        values,
    )
}

/// Sums one round of `grads` (one per worker) through the program and the model, chunk by
/// chunk, workers in a rotating order; returns the program's results (values and exponent per
/// chunk), asserting each equals the model's byte for byte.
pub fn run_round(
    agg: &Aggregator,
    model: &mut Model,
    spec: &JobSpec,
    round: u32,
    grads: &[Vec<i32>],
    exps: &[Vec<i8>],
) -> Vec<(i8, Vec<i32>)> {
    let g = spec.geometry;
    let n = grads.len();
    let mut out = Vec::new();
    for c in 0..g.chunks() {
        let range = g.chunk_start(c)..g.chunk_start(c) + g.chunk_len(c);
        let mut result = None;
        for k in 0..n {
            let w = (k + c as usize) % n;
            let payload = data(
                spec,
                w,
                round,
                c,
                exps[w][c as usize],
                &grads[w][range.clone()],
            );
            let got = agg.test_run(&frame(spec.members[w], &payload)).unwrap();
            let want = model.receive(spec.members[w], &payload);
            if k + 1 < n {
                assert_eq!(got.action, XdpAction::Drop, "chunk {c} worker {w}");
                assert_eq!(want.action, Action::Drop);
            } else {
                assert_eq!(
                    got.action,
                    XdpAction::Pass,
                    "the last contribution fans out"
                );
                let Action::Fanout(bytes) = want.action else {
                    panic!("the model did not complete chunk {c}");
                };
                let expected = as_fanout(&bytes, agg.fanout_tag()); // XDP hands it to TC
                assert_eq!(payload_of(&got.frame), expected.as_slice(), "chunk {c}");
                let (h, body) = Header::parse(&bytes).unwrap();
                assert_eq!(
                    (h.worker, usize::from(h.contributors)),
                    (0, n),
                    "contributors"
                );
                result = Some((h.exp, wire::values(body)));
            }
        }
        out.push(result.expect("a result"));
    }
    out
}

/// Gradient sizes at the chunk's edges, and a large one.
pub fn sizes() -> [u32; 5] {
    let c = u32::from(CHUNK);
    [1, c - 1, c, c + 1, 1_000_003]
}

/// `n` workers' float32 gradients of `values`, worker `w` at scale 4^w, so that exponents
/// differ and the aggregator's re-scaling is exercised.
pub fn scaled_floats(rng: &mut impl Rng, n: usize, values: u32) -> Vec<Vec<f32>> {
    (0..n)
        .map(|w| {
            (0..values)
                .map(|_| rng.gen_range(-1.0f32..1.0) * 4f32.powi(i32::try_from(w).unwrap()))
                .collect()
        })
        .collect()
}

/// Each worker's chunks quantised for `spec`: (values, exponent per chunk) per worker.
pub fn quantized(spec: &JobSpec, floats: &[Vec<f32>]) -> (Vec<Vec<i32>>, Vec<Vec<i8>>) {
    let g = spec.geometry;
    let n = floats.len();
    let mut grads = vec![Vec::new(); n];
    let mut exps = vec![Vec::new(); n];
    for w in 0..n {
        for c in 0..g.chunks() {
            let range = g.chunk_start(c)..g.chunk_start(c) + g.chunk_len(c);
            let (e, q) = fixed::quantize(&floats[w][range], n as u16);
            grads[w].extend(q);
            exps[w].push(e);
        }
    }
    (grads, exps)
}

/// Asserts every summed element of `results` is within the fixed-point bound of the exact sum
/// of `floats`.
pub fn assert_within_bound(
    spec: &JobSpec,
    floats: &[Vec<f32>],
    results: &[(i8, Vec<i32>)],
    what: &str,
) {
    let n = floats.len() as u16;
    for (c, (exp, acc)) in results.iter().enumerate() {
        let start = spec.geometry.chunk_start(c as u32);
        let got = fixed::dequantize(acc, *exp, n);
        let bound = fixed::error_bound(n, *exp);
        for (j, v) in got.iter().enumerate() {
            let exact: f64 = floats.iter().map(|f| f64::from(f[start + j])).sum();
            let slack = bound + f64::from(v.abs()) * f64::from(f32::EPSILON);
            assert!(
                (f64::from(*v) - exact).abs() <= slack,
                "{what}, element {}: {v} vs {exact} (bound {slack})",
                start + j
            );
        }
    }
}
