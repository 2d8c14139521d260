//! The aggregator's sum strategies (`SumVariant`: the shipped spin lock, atomic adds, per-CPU
//! partial sums) under BPF_PROG_TEST_RUN: each must give the reference aggregator's result
//! (`yard_agg::model`) byte for byte from one CPU, at the chunk-size edges and for a 10^6 + 3
//! value gradient, int32 and (where the strategy sums it) float32; keep duplicates out, answer
//! resends from the stored sum and recycle slots across rounds; and, from two threads pinned to
//! two CPUs contributing to the same chunks at once, complete every chunk exactly once with the
//! exact int32 sum (float32 within the fixed-point bound). Needs root and two CPUs.

mod agg_common;
mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Barrier;

use agg_common::*;
use common::require_root;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yard_agg::fixed;
use yard_agg::model::{Aggregator as Model, JobSpec};
use yard_agg::wire::{self, Dtype, Geometry};
use yard_ebpf::{AggCounter, AggJobEntry, Aggregator, SumVariant, XdpAction};

fn worker_addr(w: usize) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(198, 18, 1, u8::try_from(w + 1).unwrap()),
        40000 + u16::try_from(w).unwrap(),
    )
}

fn spec(workers: usize, values: u32, dtype: Dtype) -> JobSpec {
    JobSpec {
        id: 7,
        epoch: 1,
        geometry: Geometry {
            values,
            chunk_values: CHUNK,
        },
        dtype,
        members: (0..workers).map(worker_addr).collect(),
        tokens: (0..workers).map(|w| test_token(7, w)).collect(),
        result_token: test_result_token(7, 0),
        parent: None,
    }
}

fn entry(spec: &JobSpec) -> AggJobEntry {
    AggJobEntry {
        id: spec.id,
        epoch: spec.epoch,
        base: 0,
        geometry: spec.geometry,
        dtype: spec.dtype,
        members: spec.members.clone(),
        tokens: spec.tokens.clone(),
        result_token: spec.result_token,
        self_ip: AGG,
        parent: None,
    }
}

/// `variant` loaded with room for `spec`, serving it, prepared for round 0.
fn loaded(variant: SumVariant, spec: &JobSpec) -> Aggregator {
    require_root();
    let mut agg = Aggregator::load_variant(spec.geometry.chunks() * 2, variant)
        .unwrap_or_else(|e| panic!("load the {} aggregator: {e}", variant.name()));
    agg.set_job(&entry(spec)).unwrap();
    agg.prepare_round(&entry(spec), 0).unwrap();
    agg
}

fn counter(agg: &Aggregator, c: AggCounter) -> u64 {
    agg.counters()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == c)
        .unwrap()
        .1
        .packets
}

#[test]
fn every_variant_sums_int32_exactly_at_every_size_over_rounds() {
    let mut rng = StdRng::seed_from_u64(11);
    for variant in SumVariant::ALL {
        for values in sizes() {
            let n = 3;
            let s = spec(n, values, Dtype::I32);
            let agg = loaded(variant, &s);
            let mut model = Model::new();
            model.set_job(s.clone());
            let exps = vec![vec![0i8; s.geometry.chunks() as usize]; n];
            // Three rounds: round 2 reuses round 0's slots (recycled by round 1's completions).
            let rounds = if values > 10_000 { 3 } else { 4 };
            for round in 0..rounds {
                let grads: Vec<Vec<i32>> = (0..n)
                    .map(|_| (0..values).map(|_| rng.gen()).collect())
                    .collect();
                let flat: Vec<i32> = run_round(&agg, &mut model, &s, round, &grads, &exps)
                    .into_iter()
                    .flat_map(|(_, v)| v)
                    .collect();
                let exact: Vec<i32> = (0..values as usize)
                    .map(|i| grads.iter().fold(0i32, |a, g| a.wrapping_add(g[i])))
                    .collect();
                assert_eq!(
                    flat,
                    exact,
                    "{} {values} values round {round}",
                    variant.name()
                );
            }
            assert_eq!(
                counter(&agg, AggCounter::Completed),
                u64::from(s.geometry.chunks() * rounds),
                "{}: every chunk completed once per round",
                variant.name()
            );
        }
    }
}

#[test]
fn float32_variants_are_within_the_fixed_point_bound_and_atomic_refuses_float() {
    let mut rng = StdRng::seed_from_u64(12);
    for variant in SumVariant::ALL {
        if !variant.sums(Dtype::F32) {
            require_root();
            let s = spec(4, 720, Dtype::F32);
            let mut agg = Aggregator::load_variant(4, variant).unwrap();
            let err = agg.set_job(&entry(&s)).unwrap_err().to_string();
            assert_eq!(err, "the atomic sum strategy sums int32 jobs only");
            continue;
        }
        for values in sizes() {
            let n: usize = 4;
            let s = spec(n, values, Dtype::F32);
            let agg = loaded(variant, &s);
            let mut model = Model::new();
            model.set_job(s.clone());
            let floats = scaled_floats(&mut rng, n, values);
            let (grads, exps) = quantized(&s, &floats);
            // From one CPU a variant's result is the model's, byte for byte (run_round checks).
            let results = run_round(&agg, &mut model, &s, 0, &grads, &exps);
            assert_within_bound(&s, &floats, &results, variant.name());
        }
    }
}

#[test]
fn lock_free_variants_keep_out_duplicates_answer_resends_and_refuse_stale_and_ahead_rounds() {
    for variant in [SumVariant::Atomic, SumVariant::PerCpu] {
        let s = spec(2, 720, Dtype::I32);
        let agg = loaded(variant, &s);
        let run = |w: usize, round: u32, chunk: u32, v: i32| {
            agg.test_run(&frame(
                s.members[w],
                &data(&s, w, round, chunk, 0, &[v; 360]),
            ))
            .unwrap()
        };
        let name = variant.name();
        assert_eq!(run(0, 0, 0, 1).action, XdpAction::Drop);
        assert_eq!(run(0, 0, 0, 1).action, XdpAction::Drop, "{name}: duplicate");
        assert_eq!(counter(&agg, AggCounter::Duplicate), 1, "{name}");
        // round 2 while round 0 is incomplete breaks the protocol: dropped, nothing added
        assert_eq!(run(1, 2, 0, 50).action, XdpAction::Drop);
        assert_eq!(counter(&agg, AggCounter::Ahead), 1, "{name}");
        let done = run(1, 0, 0, 2);
        assert_eq!(done.action, XdpAction::Pass, "{name}: completes");
        let sum = wire::values(&done.frame[HEADERS + wire::HEADER_LEN..]);
        assert!(
            sum.iter().all(|v| *v == 3),
            "{name}: 1 + 2, duplicate not added"
        );
        // a resend to the complete chunk: the stored sum, to the sender
        let again = run(0, 0, 0, 1);
        assert_eq!(again.action, XdpAction::Tx, "{name}: resend answered");
        assert_eq!(
            wire::values(&again.frame[HEADERS + wire::HEADER_LEN..]),
            sum
        );
        // round 1 (recycled by round 0's completion), then round 2 takes round 0's slot
        assert_eq!(run(0, 1, 0, 5).action, XdpAction::Drop);
        assert_eq!(run(1, 1, 0, 6).action, XdpAction::Pass);
        assert_eq!(run(0, 2, 0, 7).action, XdpAction::Drop);
        let r2 = run(1, 2, 0, 8);
        assert_eq!(
            r2.action,
            XdpAction::Pass,
            "{name}: round 2 in round 0's slot"
        );
        assert!(wire::values(&r2.frame[HEADERS + wire::HEADER_LEN..])
            .iter()
            .all(|v| *v == 15));
        // a replayed result (a regrouping's) is not taken as the sum: the variants do not regroup
        let mut replay = data(&s, 0, 3, 0, 0, &[9; 360]);
        replay[6] |= wire::FLAG_REPLAY;
        let stale_before = counter(&agg, AggCounter::Stale);
        let out = agg.test_run(&frame(s.members[0], &replay)).unwrap();
        assert_eq!(out.action, XdpAction::Drop, "{name}: replay");
        assert_eq!(counter(&agg, AggCounter::Stale), stale_before + 1, "{name}");
        // a late round-0 frame now meets a slot of round 2: stale, not answered
        let stale_before = counter(&agg, AggCounter::Stale);
        assert_eq!(run(0, 0, 0, 1).action, XdpAction::Drop, "{name}");
        assert_eq!(counter(&agg, AggCounter::Stale), stale_before + 1, "{name}");
        // a job whose slots were not prepared sums nothing: stale
        let other = JobSpec {
            epoch: 2,
            ..s.clone()
        };
        let mut fresh = Aggregator::load_variant(4, variant).unwrap();
        fresh.set_job(&entry(&other)).unwrap();
        let out = fresh
            .test_run(&frame(
                other.members[0],
                &data(&other, 0, 0, 0, 0, &[1; 360]),
            ))
            .unwrap();
        assert_eq!(out.action, XdpAction::Drop);
        assert_eq!(counter(&fresh, AggCounter::Stale), 1, "{name}: unprepared");
        // more than 32 workers do not fit the lock-free bitmap
        let big = spec(33, 360, Dtype::I32);
        let err = fresh.set_job(&entry(&big)).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("the {name} sum strategy holds at most 32 workers per job")
        );
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .unwrap_or_else(|e| panic!("pin a thread to CPU {cpu}: {e}"));
}

fn cpu_now() -> usize {
    rustix::thread::sched_getcpu()
}

/// Two threads on CPUs 0 and 1, half the workers each, contributing to the same chunk at the
/// same time (a barrier per chunk): every chunk completes exactly once, with the exact sum.
#[test]
fn two_cpus_contributing_to_the_same_chunks_complete_each_once_with_the_exact_sum() {
    require_root();
    assert!(
        std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2,
        "this test runs two threads on two CPUs and needs at least two"
    );
    let workers = 32;
    let chunks = 600u32;
    for variant in SumVariant::ALL {
        for dtype in [Dtype::I32, Dtype::F32] {
            if !variant.sums(dtype) {
                continue;
            }
            let s = spec(workers, chunks * u32::from(CHUNK), dtype);
            let agg = loaded(variant, &s);
            let mut rng = StdRng::seed_from_u64(13);
            let floats: Vec<Vec<f32>> = (0..workers)
                .map(|w| {
                    (0..s.geometry.values)
                        .map(|_| rng.gen_range(-1.0f32..1.0) * 2f32.powi((w % 5) as i32))
                        .collect()
                })
                .collect();
            let ints: Vec<Vec<i32>> = (0..workers)
                .map(|_| (0..s.geometry.values).map(|_| rng.gen()).collect())
                .collect();
            // frames[c][w]
            let frames: Vec<Vec<Vec<u8>>> = (0..chunks)
                .map(|c| {
                    (0..workers)
                        .map(|w| {
                            let r = s.geometry.chunk_start(c)
                                ..s.geometry.chunk_start(c) + s.geometry.chunk_len(c);
                            let (e, q) = match dtype {
                                Dtype::I32 => (0, ints[w][r].to_vec()),
                                Dtype::F32 => fixed::quantize(&floats[w][r], workers as u16),
                            };
                            frame(s.members[w], &data(&s, w, 0, c, e, &q))
                        })
                        .collect()
                })
                .collect();
            let barrier = Barrier::new(2);
            let passes: Vec<u64> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..2)
                    .map(|t| {
                        let (agg, frames, barrier) = (&agg, &frames, &barrier);
                        scope.spawn(move || {
                            pin(t);
                            assert_eq!(cpu_now(), t);
                            let mut passes = 0u64;
                            for chunk in frames {
                                barrier.wait();
                                for f in chunk.iter().skip(t).step_by(2) {
                                    let out = agg.test_run(f).unwrap();
                                    if out.action == XdpAction::Pass {
                                        passes += 1;
                                    }
                                }
                            }
                            passes
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let name = format!("{} {dtype:?}", variant.name());
            assert_eq!(
                passes.iter().sum::<u64>(),
                u64::from(chunks),
                "{name}: one completion per chunk"
            );
            assert_eq!(
                counter(&agg, AggCounter::Completed),
                u64::from(chunks),
                "{name}"
            );
            assert_eq!(
                counter(&agg, AggCounter::Added),
                u64::from(chunks) * (workers as u64 - 1),
                "{name}"
            );
            for c in 0..chunks {
                let slot = agg.slot(c * 2).unwrap();
                assert_eq!(slot.done, 1, "{name} chunk {c}");
                assert_eq!(usize::from(slot.count), workers, "{name} chunk {c}");
                let start = s.geometry.chunk_start(c);
                let len = s.geometry.chunk_len(c);
                match dtype {
                    Dtype::I32 => {
                        let exact: Vec<i32> = (start..start + len)
                            .map(|i| ints.iter().fold(0i32, |a, g| a.wrapping_add(g[i])))
                            .collect();
                        assert_eq!(&slot.acc[..len], exact.as_slice(), "{name} chunk {c}");
                    }
                    Dtype::F32 => {
                        let got = fixed::dequantize(&slot.acc[..len], slot.exp, workers as u16);
                        let bound = fixed::error_bound(workers as u16, slot.exp);
                        for (j, v) in got.iter().enumerate() {
                            let exact: f64 = floats.iter().map(|f| f64::from(f[start + j])).sum();
                            let slack = bound + f64::from(v.abs()) * f64::from(f32::EPSILON);
                            assert!(
                                (f64::from(*v) - exact).abs() <= slack,
                                "{name} chunk {c} element {j}: {v} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }
}
