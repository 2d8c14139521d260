//! `yard_agg` under BPF_PROG_TEST_RUN, against the reference aggregator (`yard_agg::model`):
//! exact sums at the chunk-size edges and for a 10^6 + 3 value gradient, int32 and float32;
//! duplicates, rounds, epochs, foreign and forged frames; a seeded fuzz run in which every frame
//! must give the model's counter and the model's reply, byte for byte. Needs root.

mod agg_common;
mod common;

use std::net::{Ipv4Addr, SocketAddrV4};

use agg_common::*;
use common::require_root;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yard_agg::model::{Action, Aggregator as Model, JobSpec};
use yard_agg::wire::{self, Dtype, Geometry, Header, Kind};
use yard_ebpf::aggregator::MemberTiming;
use yard_ebpf::frames::HostFrame;
use yard_ebpf::{AggCounter, AggJobEntry, Aggregator, XdpAction};

fn worker_addr(job: u32, w: usize) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(
            198,
            18,
            u8::try_from(job).unwrap(),
            u8::try_from(w + 1).unwrap(),
        ),
        40000 + u16::try_from(w).unwrap(),
    )
}

fn spec(job: u32, workers: usize, values: u32, dtype: Dtype) -> JobSpec {
    JobSpec {
        id: job,
        epoch: 1,
        geometry: Geometry {
            values,
            chunk_values: CHUNK,
        },
        dtype,
        members: (0..workers).map(|w| worker_addr(job, w)).collect(),
        tokens: (0..workers).map(|w| test_token(job, w)).collect(),
        result_token: test_result_token(job, 0),
        parent: None,
    }
}

fn entry(spec: &JobSpec, base: u32) -> AggJobEntry {
    AggJobEntry {
        id: spec.id,
        epoch: spec.epoch,
        base,
        geometry: spec.geometry,
        dtype: spec.dtype,
        members: spec.members.clone(),
        tokens: spec.tokens.clone(),
        result_token: spec.result_token,
        self_ip: AGG,
        parent: None,
    }
}

fn loaded(slots: u32) -> Aggregator {
    require_root();
    Aggregator::load(slots).expect("load the aggregator programs")
}

#[test]
fn int32_sums_are_exact_at_every_size() {
    let mut rng = StdRng::seed_from_u64(1);
    for values in sizes() {
        let n = 3;
        let s = spec(7, n, values, Dtype::I32);
        let agg = {
            let mut a = loaded(s.geometry.chunks() * 2);
            a.set_job(&entry(&s, 0)).unwrap();
            a
        };
        let mut model = Model::new();
        model.set_job(s.clone());
        let grads: Vec<Vec<i32>> = (0..n)
            .map(|_| (0..values).map(|_| rng.gen()).collect())
            .collect();
        let exps = vec![vec![0i8; s.geometry.chunks() as usize]; n];
        let results = run_round(&agg, &mut model, &s, 0, &grads, &exps);
        let flat: Vec<i32> = results.into_iter().flat_map(|(_, v)| v).collect();
        let exact: Vec<i32> = (0..values as usize)
            .map(|i| grads.iter().fold(0i32, |a, g| a.wrapping_add(g[i])))
            .collect();
        assert_eq!(flat, exact, "{values} values");
        let completed = agg
            .counters()
            .unwrap()
            .into_iter()
            .find(|(c, _)| *c == AggCounter::Completed)
            .unwrap()
            .1;
        assert_eq!(completed.packets, u64::from(s.geometry.chunks()));
    }
}

#[test]
fn float32_sums_are_within_the_fixed_point_bound_at_every_size() {
    let mut rng = StdRng::seed_from_u64(2);
    for values in sizes() {
        let n: usize = 4;
        let s = spec(8, n, values, Dtype::F32);
        let mut agg = loaded(s.geometry.chunks() * 2);
        agg.set_job(&entry(&s, 0)).unwrap();
        let mut model = Model::new();
        model.set_job(s.clone());
        let floats = scaled_floats(&mut rng, n, values);
        let (grads, exps) = quantized(&s, &floats);
        let results = run_round(&agg, &mut model, &s, 0, &grads, &exps);
        assert_within_bound(&s, &floats, &results, &format!("{values} values"));
    }
}

fn counter(agg: &Aggregator, job: Option<u32>, c: AggCounter) -> u64 {
    let all = match job {
        Some(j) => agg.job_counters(j).unwrap(),
        None => agg.counters().unwrap(),
    };
    all.into_iter().find(|(k, _)| *k == c).unwrap().1.packets
}

/// Runs `payload` from `from` through both, asserting the same counter moved by one in each
/// and the same reply: returns the program's verdict.
fn both(agg: &Aggregator, model: &mut Model, from: SocketAddrV4, payload: &[u8]) -> XdpAction {
    let before = counts(agg);
    let got = agg.test_run(&frame(from, payload)).unwrap();
    let want = model.receive(from, payload);
    assert_eq!(
        moved(&before, &counts(agg)),
        [want.counter],
        "counters moved"
    );
    match want.action {
        Action::Drop => assert_eq!(got.action, XdpAction::Drop),
        Action::Reply(bytes) => {
            assert_eq!(got.action, XdpAction::Tx);
            assert_eq!(payload_of(&got.frame), bytes.as_slice());
            // turned around: to the sender, from the aggregator
            let f = HostFrame::udp(AGG, wire::PORT, *from.ip(), from.port(), &bytes).build();
            assert_eq!(&got.frame[26..34], &f[26..34], "addresses swapped");
        }
        Action::Fanout(bytes) => {
            assert_eq!(got.action, XdpAction::Pass);
            let expected = as_fanout(&bytes, agg.fanout_tag());
            assert_eq!(payload_of(&got.frame), expected.as_slice());
        }
        Action::Up(bytes) => {
            // trees are agg_tree's: the same bytes up, out of the same interface
            assert_eq!(got.action, XdpAction::Tx);
            assert_eq!(payload_of(&got.frame), bytes.as_slice());
        }
    }
    got.action
}

#[test]
fn duplicates_rounds_epochs_and_strangers_are_counted_and_sums_stay_intact() {
    let a = spec(1, 2, 720, Dtype::I32);
    let mut b = spec(2, 2, 720, Dtype::I32);
    b.members = vec![worker_addr(2, 0), worker_addr(2, 1)];
    let mut agg = loaded(16);
    agg.set_job(&entry(&a, 0)).unwrap();
    agg.set_job(&entry(&b, 4)).unwrap();
    let mut model = Model::new();
    model.set_job(a.clone());
    model.set_job(b.clone());
    let ones = vec![1i32; 360];
    let twos = vec![2i32; 360];

    // a duplicate is never added twice
    assert_eq!(
        both(&agg, &mut model, a.members[0], &data(&a, 0, 0, 0, 0, &ones)),
        XdpAction::Drop
    );
    assert_eq!(
        both(&agg, &mut model, a.members[0], &data(&a, 0, 0, 0, 0, &ones)),
        XdpAction::Drop
    );
    // job b's worker 0 forges job a's id (and a's worker 0 index): foreign, dropped
    let mut forged = data(&a, 0, 0, 0, 0, &vec![1000; 360]);
    assert_eq!(
        both(&agg, &mut model, b.members[0], &forged),
        XdpAction::Drop
    );
    // ... and claiming worker 1's index from worker 0's address
    forged = data(&a, 1, 0, 0, 0, &vec![1000; 360]);
    assert_eq!(
        both(&agg, &mut model, a.members[0], &forged),
        XdpAction::Drop
    );
    assert_eq!(counter(&agg, Some(1), AggCounter::Foreign), 2);
    // round 1 arrives before round 0 is done: its own slot, no interference
    assert_eq!(
        both(&agg, &mut model, a.members[1], &data(&a, 1, 1, 0, 0, &twos)),
        XdpAction::Drop
    );
    // round 0 completes with 1 + 2 = 3 everywhere: the forgeries added nothing
    assert_eq!(
        both(&agg, &mut model, a.members[1], &data(&a, 1, 0, 0, 0, &twos)),
        XdpAction::Pass
    );
    let slot = agg.slot(0).unwrap();
    assert_eq!(slot.done, 1);
    assert!(slot.acc[..360].iter().all(|v| *v == 3));
    // a resend to the complete chunk gets the stored sum back (XDP_TX)
    assert_eq!(
        both(&agg, &mut model, a.members[0], &data(&a, 0, 0, 0, 0, &ones)),
        XdpAction::Tx
    );
    // a stale epoch is dropped
    let mut old = a.clone();
    old.epoch = 0;
    assert_eq!(
        both(
            &agg,
            &mut model,
            a.members[0],
            &data(&old, 0, 0, 1, 0, &ones)
        ),
        XdpAction::Drop
    );
    assert_eq!(counter(&agg, Some(1), AggCounter::Stale), 1);
    // job b is untouched by all of this and completes on its own
    both(&agg, &mut model, b.members[0], &data(&b, 0, 0, 0, 0, &ones));
    both(&agg, &mut model, b.members[1], &data(&b, 1, 0, 0, 0, &ones));
    assert!(agg.slot(4).unwrap().acc[..360].iter().all(|v| *v == 2));
    assert_eq!(counter(&agg, Some(2), AggCounter::Completed), 1);
    assert_eq!(counter(&agg, Some(2), AggCounter::Foreign), 0);
    // a new epoch (a regrouping) frees the slots: round 0 of epoch 2 sums afresh
    let mut next = a.clone();
    next.epoch = 2;
    agg.set_job(&entry(&next, 0)).unwrap();
    model.set_job(next.clone());
    both(
        &agg,
        &mut model,
        next.members[0],
        &data(&next, 0, 0, 0, 0, &twos),
    );
    assert_eq!(
        both(
            &agg,
            &mut model,
            next.members[1],
            &data(&next, 1, 0, 0, 0, &twos)
        ),
        XdpAction::Pass
    );
    assert!(agg.slot(0).unwrap().acc[..360].iter().all(|v| *v == 4));
    // a removed job's frames are an unknown job
    agg.remove_job(2).unwrap();
    model.remove_job(2);
    both(&agg, &mut model, b.members[0], &data(&b, 0, 1, 0, 0, &ones));
    assert_eq!(counter(&agg, None, AggCounter::UnknownJob), 1);
}

#[test]
fn malformed_frames_are_dropped_and_other_traffic_passes() {
    let a = spec(3, 2, 10, Dtype::I32);
    let mut agg = loaded(4);
    agg.set_job(&entry(&a, 0)).unwrap();
    let good = data(&a, 0, 0, 0, 0, &[1; 10]);
    let from = a.members[0];
    let run = |f: Vec<u8>| agg.test_run(&f).unwrap().action;
    // not ours: another port, not UDP, not IPv4
    assert_eq!(
        run(HostFrame::udp(*from.ip(), from.port(), AGG, 9999, &good).build()),
        XdpAction::Pass
    );
    assert_eq!(
        run(HostFrame::tcp(*from.ip(), from.port(), AGG, wire::PORT, &good).build()),
        XdpAction::Pass
    );
    let mut arp = frame(from, &good);
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(run(arp), XdpAction::Pass);
    assert_eq!(counter(&agg, None, AggCounter::PassNotAgg), 3);
    // ours but broken: every checked header field (magic, version, kind) and every truncation
    let mut bad = Vec::new();
    for at in [0usize, 4, 5] {
        let mut p = good.clone();
        p[at] ^= 0x40;
        bad.push(frame(from, &p));
    }
    let mut p = good.clone();
    p[26..28].copy_from_slice(&11u16.to_le_bytes()); // count 11, 10 values present
    bad.push(frame(from, &p));
    let mut p = good.clone();
    p[7] = 3; // an exponent on an int32 job
    bad.push(frame(from, &p));
    let mut p = good.clone();
    p[20..24].copy_from_slice(&1u32.to_le_bytes()); // chunk 1 of a one-chunk gradient
    bad.push(frame(from, &p));
    let mut p = good.clone();
    p[5] = Kind::Fanout as u8; // only the program makes those
    bad.push(frame(from, &p));
    let whole = frame(from, &good);
    for cut in [42usize, 60, 73, whole.len() - 1] {
        bad.push(whole[..cut].to_vec());
    }
    let n = bad.len() as u64;
    for f in bad {
        assert_eq!(run(f), XdpAction::Drop);
    }
    assert_eq!(counter(&agg, None, AggCounter::BadHeader), n);
    assert_eq!(counter(&agg, None, AggCounter::Added), 0);
}

/// Seeded fuzz: random jobs, workers and rounds, with mutated headers, duplicates, strangers
/// and stale epochs; every frame gives the model's counter and reply, byte for byte.
#[test]
fn fuzzed_frames_match_the_reference_model() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let jobs: Vec<JobSpec> = (1..=3u32)
        .map(|j| {
            let mut s = spec(
                j,
                rng.gen_range(1..=4),
                rng.gen_range(1..=1200),
                if j == 2 { Dtype::F32 } else { Dtype::I32 },
            );
            s.geometry.chunk_values = rng.gen_range(1..=400);
            s
        })
        .collect();
    let mut agg = loaded(4096);
    let mut model = Model::new();
    let mut base = 0;
    for s in &jobs {
        agg.set_job(&entry(s, base)).unwrap();
        base += s.geometry.chunks() * 2;
        model.set_job(s.clone());
    }
    let mut rounds = vec![0u32; jobs.len()];
    for _ in 0..6000 {
        let j = rng.gen_range(0..jobs.len());
        let s = &jobs[j];
        let g = s.geometry;
        let w = rng.gen_range(0..s.members.len());
        if rng.gen_bool(0.01) {
            rounds[j] += 1;
        }
        let round = rounds[j].saturating_sub(rng.gen_range(0..2)) + u32::from(rng.gen_bool(0.05));
        let chunk = rng.gen_range(0..g.chunks());
        let len = g.chunk_len(chunk);
        let exp = if s.dtype == Dtype::F32 {
            rng.gen_range(-4..4)
        } else {
            0
        };
        let values: Vec<i32> = (0..len)
            .map(|_| rng.gen_range(-1_000_000..1_000_000))
            .collect();
        let mut payload = data(s, w, round, chunk, exp, &values);
        let mut from = s.members[w];
        match rng.gen_range(0..20) {
            0 => payload[rng.gen_range(0..32)] ^= 1 << rng.gen_range(0..8),
            1 => from = jobs[(j + 1) % jobs.len()].members[0],
            2 => payload[12..16].copy_from_slice(&(s.epoch + 1).to_le_bytes()),
            3 => payload.truncate(rng.gen_range(32..payload.len())),
            4 | 5 => payload[6] |= wire::FLAG_REPLAY,
            _ => {}
        }
        both(&agg, &mut model, from, &payload);
    }
    for (c, v) in agg.counters().unwrap() {
        eprintln!("{:>14}: {}", c.name(), v.packets);
    }
    // every path was taken, many times
    for c in [
        AggCounter::Added,
        AggCounter::Completed,
        AggCounter::ResultResent,
        AggCounter::Duplicate,
        AggCounter::Stale,
        AggCounter::Ahead,
        AggCounter::Foreign,
        AggCounter::UnknownJob,
        AggCounter::BadHeader,
    ] {
        assert!(
            counter(&agg, None, c) >= 40,
            "{} taken too rarely",
            c.name()
        );
    }
}

#[test]
fn the_fan_out_takes_only_fresh_results() {
    let a = spec(4, 2, 10, Dtype::I32);
    let mut agg = loaded(4);
    agg.set_job(&entry(&a, 0)).unwrap();
    // a DATA frame, and a RESULT from elsewhere, are none of its business
    let d = frame(a.members[0], &data(&a, 0, 0, 0, 0, &[1; 10]));
    assert_eq!(
        agg.test_run_fanout(&d).unwrap().0,
        yard_ebpf::TcAction::Unspec
    );
    // a fresh result: a clone to each member whose MAC is known but the last, which gets the
    // original (redirected)
    agg.test_run(&d).unwrap(); // learns worker 0's MAC
    let out = agg
        .test_run(&frame(a.members[1], &data(&a, 1, 0, 0, 0, &[2; 10])))
        .unwrap();
    assert_eq!(out.action, XdpAction::Pass);
    assert_eq!(
        agg.test_run_fanout(&out.frame).unwrap().0,
        yard_ebpf::TcAction::Redirect
    );
    let sent = counter(&agg, Some(4), AggCounter::FanoutSent);
    let failed = counter(&agg, Some(4), AggCounter::FanoutFailed);
    assert_eq!(sent + failed, 2, "one attempt per member");
}

/// Issue 26: the fan-out writes each copy's headers in one store and sends the original to the
/// last worker whose MAC is known. The frame it leaves is that worker's whole RESULT: its MAC,
/// address and port, a valid IPv4 checksum, the result token, the exact sum; a member whose MAC
/// is unknown gets no copy (counted), and with no MAC known the original is dropped.
#[test]
fn the_fan_out_sends_the_original_to_the_last_known_member() {
    let a = spec(5, 3, 10, Dtype::I32);
    let mut agg = loaded(4);
    agg.set_job(&entry(&a, 0)).unwrap();
    let mac = |w: usize| [0x02, 0, 0, 0, 0x55, u8::try_from(w).unwrap()];
    let from = |w: usize, payload: &[u8]| {
        let mut f = HostFrame::udp(
            *a.members[w].ip(),
            a.members[w].port(),
            AGG,
            wire::PORT,
            payload,
        );
        f.eth_src = mac(w);
        f.build()
    };
    let attempts = |agg: &Aggregator| {
        (
            counter(agg, Some(5), AggCounter::FanoutSent),
            counter(agg, Some(5), AggCounter::FanoutFailed),
        )
    };
    // A genuine fresh result of chunk 0 before any member's MAC is known: nobody to send to.
    let result = wire::encode(
        &Header {
            kind: Kind::Fanout,
            flags: 0,
            exp: 0,
            job: 5,
            epoch: 1,
            round: 0,
            chunk: 0,
            worker: 0,
            count: 0,
            contributors: 3,
            token: 0,
        },
        &[7; 10],
    );
    let fanout = HostFrame::udp(
        AGG,
        wire::PORT,
        *a.members[0].ip(),
        40000,
        &as_fanout(&result, agg.fanout_tag()),
    )
    .build();
    let (verdict, _) = agg.test_run_fanout(&fanout).unwrap();
    assert_eq!(verdict, yard_ebpf::TcAction::Shot, "no member to send to");
    assert_eq!(attempts(&agg), (0, 3), "every member counted as failed");

    // Members 0 and 1 contribute (their MACs learned), member 2 not yet: member 1 is the last
    // one known, so it gets the original, member 0 a clone, member 2 nothing.
    for w in [0, 1] {
        let values = [i32::try_from(w).unwrap() + 1; 10];
        let out = agg
            .test_run(&from(w, &data(&a, w, 0, 0, 0, &values)))
            .unwrap();
        assert_eq!(out.action, XdpAction::Drop);
    }
    let (verdict, out) = agg.test_run_fanout(&fanout).unwrap();
    assert_eq!(verdict, yard_ebpf::TcAction::Redirect);
    assert_eq!(
        attempts(&agg),
        (2, 4),
        "two copies sent, member 2 failed again"
    );
    assert_eq!(&out[0..6], &mac(1), "to member 1's MAC");
    assert!(
        yard_ebpf::frames::ipv4_header_valid(&out[14..34]),
        "IPv4 checksum"
    );
    assert_eq!(
        &out[30..34],
        &a.members[1].ip().octets(),
        "to member 1's address"
    );
    assert_eq!(u16::from_be_bytes([out[36], out[37]]), a.members[1].port());
    let (h, body) = Header::parse(payload_of(&out)).expect("a RESULT");
    assert_eq!(
        (h.kind, h.token, h.contributors),
        (Kind::Result, a.result_token, 3)
    );
    assert_eq!(wire::values(body), vec![7; 10], "the values untouched");

    // Member 2 completes chunk 0: its fresh result goes to all three, the original to member 2.
    let done = agg
        .test_run(&from(2, &data(&a, 2, 0, 0, 0, &[3; 10])))
        .unwrap();
    assert_eq!(done.action, XdpAction::Pass);
    let (verdict, out) = agg.test_run_fanout(&done.frame).unwrap();
    assert_eq!(verdict, yard_ebpf::TcAction::Redirect);
    assert_eq!(attempts(&agg), (5, 4), "one copy per member");
    assert_eq!(&out[0..6], &mac(2));
    assert!(
        yard_ebpf::frames::ipv4_header_valid(&out[14..34]),
        "IPv4 checksum"
    );
    let (h, body) = Header::parse(payload_of(&out)).unwrap();
    assert_eq!((h.kind, h.token), (Kind::Result, a.result_token));
    assert_eq!(wire::values(body), vec![6; 10], "the exact sum");
}

/// Issue 26: the multi-buffer build (`yard_agg_frags`, attached where the MTU exceeds one
/// buffer) is the same program: a chunk summed through it gives the same frames, bit for bit,
/// as through `yard_agg`, and a frame longer than its header says is refused alike.
#[test]
fn the_multi_buffer_build_sums_like_the_shipped_one() {
    let a = spec(8, 2, 1000, Dtype::I32);
    let mut single = loaded(a.geometry.chunks() * 2);
    single.set_job(&entry(&a, 0)).unwrap();
    let mut frags = loaded(a.geometry.chunks() * 2);
    frags.set_job(&entry(&a, 0)).unwrap();
    for chunk in 0..a.geometry.chunks() {
        let n = i32::try_from(a.geometry.chunk_len(chunk)).unwrap();
        let mut last = Vec::new();
        for w in 0..2 {
            let scale = i32::try_from(w).unwrap() + 3;
            let values: Vec<i32> = (0..n).map(|i| i * scale - 500).collect();
            let f = frame(a.members[w], &data(&a, w, 0, chunk, 0, &values));
            let mut one = single.test_run(&f).unwrap();
            let mut two = frags.test_run_frags(&f).unwrap();
            assert_eq!(one.action, two.action, "chunk {chunk}, worker {w}");
            // the fan-out tag, drawn at random by each load, aside
            one.frame[HEADERS + 28..HEADERS + 32].fill(0);
            two.frame[HEADERS + 28..HEADERS + 32].fill(0);
            assert_eq!(one.frame, two.frame, "chunk {chunk}, worker {w}");
            last = two.frame;
        }
        let (h, _) = Header::parse(payload_of(&last)).unwrap();
        assert_eq!(h.kind, Kind::Fanout, "chunk {chunk} completed");
    }
    let mut long = frame(a.members[0], &data(&a, 0, 1, 0, 0, &[1; CHUNK as usize]));
    long.extend_from_slice(&[0; 8]);
    assert_eq!(frags.test_run_frags(&long).unwrap().action, XdpAction::Drop);
    // refused before the job is looked up: counted globally
    assert_eq!(counter(&frags, None, AggCounter::BadHeader), 1);
}

/// Issue 25, finding 6: a frame shaped like a fresh result (from the aggregation port, kind
/// FANOUT, a job served here) but addressed to another port passed the XDP program untouched,
/// and the TC fan-out cloned it to every member of the job. The XDP program now drops it, and
/// the fan-out clones nothing that does not carry the load's tag (a frame that reached TC
/// ingress without passing through XDP). A genuine fresh result is still cloned, and its copies
/// leave as a RESULT with the tag cleared.
#[test]
fn a_fanout_frame_to_another_port_is_never_cloned() {
    let a = spec(6, 2, 10, Dtype::I32);
    let mut agg = loaded(4);
    agg.set_job(&entry(&a, 0)).unwrap();
    assert_ne!(agg.fanout_tag(), 0);
    let attempts = |agg: &Aggregator| {
        counter(agg, Some(6), AggCounter::FanoutSent)
            + counter(agg, Some(6), AggCounter::FanoutFailed)
    };
    // Both members' MACs are known, so a clone would go to each.
    agg.test_run(&frame(a.members[0], &data(&a, 0, 0, 0, 0, &[1; 10])))
        .unwrap();
    let genuine = agg
        .test_run(&frame(a.members[1], &data(&a, 1, 0, 0, 0, &[2; 10])))
        .unwrap();
    assert_eq!(genuine.action, XdpAction::Pass);

    // The forgery: a result of job 6 as the program would hand it over, from an outsider's
    // port 7481 to port 9999 (and to the aggregation port's neighbours), with no tag, and
    // with a wrong tag.
    let result = wire::encode(
        &Header {
            kind: Kind::Fanout,
            flags: 0,
            exp: 0,
            job: 6,
            epoch: 1,
            round: 0,
            chunk: 0,
            worker: 0,
            count: 0,
            contributors: 2,
            token: 0,
        },
        &[1000; 10],
    );
    let outsider = Ipv4Addr::new(198, 18, 9, 9);
    let forged: Vec<Vec<u8>> = [9999, 7480, 7482]
        .into_iter()
        .map(|port| HostFrame::udp(outsider, wire::PORT, AGG, port, &result).build())
        .chain([{
            let guessed = as_fanout(&result, agg.fanout_tag() ^ 1);
            HostFrame::udp(outsider, wire::PORT, AGG, 9999, &guessed).build()
        }])
        .collect();
    let before = counter(&agg, None, AggCounter::Foreign);
    let tried = attempts(&agg);
    for f in &forged {
        assert_eq!(agg.test_run(f).unwrap().action, XdpAction::Drop, "XDP");
        // had it reached TC ingress some other way: not cloned
        let (verdict, _) = agg.test_run_fanout(f).unwrap();
        assert_eq!(verdict, yard_ebpf::TcAction::Shot, "TC");
    }
    assert_eq!(attempts(&agg), tried, "no copy of a forged frame");
    assert_eq!(
        counter(&agg, None, AggCounter::Foreign),
        before + 2 * forged.len() as u64,
        "each refusal counted, by XDP and by TC"
    );

    // The genuine result goes to both members (a clone, then the original) as a plain RESULT.
    let (verdict, out) = agg.test_run_fanout(&genuine.frame).unwrap();
    assert_eq!(verdict, yard_ebpf::TcAction::Redirect);
    assert_eq!(attempts(&agg), tried + 2, "one copy per member");
    let (h, body) = Header::parse(payload_of(&out)).expect("a valid RESULT frame");
    assert_eq!((h.kind, h.worker, h.contributors), (Kind::Result, 0, 2));
    assert_eq!(
        h.token, a.result_token,
        "the tag replaced by the result token"
    );
    assert_eq!(wire::values(body), vec![3; 10]);
}

#[test]
fn a_member_left_out_of_a_new_epoch_is_a_stranger_and_a_removed_job_keeps_none() {
    let a = spec(5, 3, 10, Dtype::I32);
    let mut agg = loaded(4);
    agg.set_job(&entry(&a, 0)).unwrap();
    let mut model = Model::new();
    model.set_job(a.clone());
    // an elastic job loses worker 2: epoch 2 with workers 0 and 1
    let mut next = a.clone();
    next.epoch = 2;
    next.members.truncate(2);
    next.tokens.truncate(2);
    agg.set_job(&entry(&next, 0)).unwrap();
    model.set_job(next.clone());
    both(
        &agg,
        &mut model,
        a.members[2],
        &data(&next, 2, 0, 0, 0, &[1; 10]),
    );
    assert_eq!(counter(&agg, Some(5), AggCounter::Foreign), 1);
    // the two left complete the chunk between them
    both(
        &agg,
        &mut model,
        next.members[0],
        &data(&next, 0, 0, 0, 0, &[1; 10]),
    );
    let done = both(
        &agg,
        &mut model,
        next.members[1],
        &data(&next, 1, 0, 0, 0, &[2; 10]),
    );
    assert_eq!(done, XdpAction::Pass);
    // once removed, nothing of the job answers, and its per-job counters are gone from the
    // kernel's table (kept, they would fill it over the jobs a host serves in its life)
    assert!(agg.counted_jobs().unwrap().contains(&5));
    agg.remove_job(5).unwrap();
    model.remove_job(5);
    assert!(
        !agg.counted_jobs().unwrap().contains(&5),
        "the removed job's counters are deleted"
    );
    both(
        &agg,
        &mut model,
        next.members[0],
        &data(&next, 0, 1, 0, 0, &[1; 10]),
    );
    assert_eq!(counter(&agg, None, AggCounter::UnknownJob), 1);
}

/// After a regrouping, a worker that had completed the round sends its stored result of it
/// (REPLAY): that becomes the chunk's result whatever the slow workers added so far, so they get
/// the very bits the fast one has; a replay to a complete chunk is only acknowledged; a replayed
/// round everybody has completes its slot, so the round after next may take it.
#[test]
fn a_replayed_result_becomes_the_chunk_s_result() {
    let a = spec(5, 3, 360, Dtype::F32);
    let mut agg = loaded(8);
    agg.set_job(&entry(&a, 0)).unwrap();
    let mut model = Model::new();
    model.set_job(a.clone());
    let replay = |w: usize, round: u32, exp: i8, values: &[i32]| {
        let mut p = data(&a, w, round, 0, exp, values);
        p[6] |= wire::FLAG_REPLAY;
        p
    };
    // Slow workers 0 and 1 contribute round 4 again; fast worker 2 replays its result.
    let slow = vec![1 << 20; 360];
    for w in 0..2 {
        assert_eq!(
            both(&agg, &mut model, a.members[w], &data(&a, w, 4, 0, 3, &slow)),
            XdpAction::Drop
        );
    }
    let stored: Vec<i32> = (0..360).map(|i| 3 * (1 << 20) + i - 180).collect();
    let got = agg
        .test_run(&frame(a.members[2], &replay(2, 4, 3, &stored)))
        .unwrap();
    assert_eq!(
        got.action,
        XdpAction::Pass,
        "the replay completes the chunk"
    );
    let (h, body) = Header::parse(payload_of(&got.frame)).unwrap();
    assert_eq!((h.exp, h.worker, h.contributors), (3, 0, 3));
    assert_eq!(
        h.token,
        agg.fanout_tag(),
        "handed to the fan-out with the load's tag"
    );
    assert_eq!(
        wire::values(body),
        stored,
        "the fast worker's bits, not a re-sum"
    );
    let want = model.receive(a.members[2], &replay(2, 4, 3, &stored));
    assert!(matches!(want.action, Action::Fanout(_)));
    // A slow worker's resend gets those bits; a second replay is acknowledged the same way.
    for (w, p) in [
        (0, data(&a, 0, 4, 0, 3, &slow)),
        (2, replay(2, 4, 3, &stored)),
    ] {
        let got = agg.test_run(&frame(a.members[w], &p)).unwrap();
        assert_eq!(got.action, XdpAction::Tx);
        assert_eq!(
            wire::values(Header::parse(payload_of(&got.frame)).unwrap().1),
            stored
        );
        model.receive(a.members[w], &p);
    }
    // A behind worker's replay of round 5 (parity 1) completes that slot, which round 7 then
    // takes: nobody waits on a round everybody has.
    assert_eq!(
        both(&agg, &mut model, a.members[0], &replay(0, 5, 3, &stored)),
        XdpAction::Pass
    );
    assert_eq!(
        both(&agg, &mut model, a.members[1], &data(&a, 1, 7, 0, 3, &slow)),
        XdpAction::Drop
    );
    assert_eq!(counter(&agg, Some(5), AggCounter::Ahead), 0);
    assert_eq!(agg.slot(1).unwrap().round, 7);
}

/// The program times each member's frames for the grouping's bandwidth figures: a frame within
/// `AGG_BURST_GAP_NS` (1 ms) of the member's previous one adds the gap and its length, a
/// member's first frame and one after a pause add nothing, another member's frames are its own,
/// and rewriting the job with the member's address unchanged keeps its timing.
#[test]
fn a_member_s_frames_in_a_burst_are_timed_for_its_bandwidth() {
    let s = spec(9, 2, 20 * u32::from(CHUNK), Dtype::I32);
    let mut agg = loaded(s.geometry.chunks() * 2);
    agg.set_job(&entry(&s, 0)).unwrap();
    let frames: Vec<Vec<u8>> = (0..20)
        .map(|c| frame(s.members[0], &data(&s, 0, 0, c, 0, &[1; CHUNK as usize])))
        .collect();
    let len = frames[0].len() as u64;
    let began = std::time::Instant::now();
    for f in &frames {
        agg.test_run(f).unwrap();
    }
    let elapsed = u64::try_from(began.elapsed().as_nanos()).unwrap();
    let timing = agg.member_timing(9, 2).unwrap();
    assert_eq!(timing.len(), 2);
    let t = timing[0].1;
    // Back to back, every gap is well under a millisecond; a loaded machine may stretch one
    // past it, which only leaves that frame out.
    let counted = t.bytes / len;
    assert_eq!(t.bytes % len, 0, "whole frames: {t:?}");
    assert!((10..=19).contains(&counted), "{counted} of 19 gaps counted");
    assert!(
        t.busy_ns > 0 && t.busy_ns < elapsed,
        "{t:?} in {elapsed} ns"
    );
    assert!(
        t.busy_ns < counted * 1_000_000,
        "each gap under 1 ms: {t:?}"
    );
    assert_eq!(
        timing[1].1,
        MemberTiming::default(),
        "worker 1 sent nothing"
    );
    // After a pause, a frame restarts the burst and adds nothing.
    std::thread::sleep(std::time::Duration::from_millis(5));
    let again = frame(s.members[0], &data(&s, 0, 1, 0, 0, &[1; CHUNK as usize]));
    agg.test_run(&again).unwrap();
    assert_eq!(agg.member_timing(9, 2).unwrap()[0].1, t);
    // A rewrite with the same addresses keeps it; a new address starts over.
    agg.set_job(&entry(&s, 0)).unwrap();
    assert_eq!(agg.member_timing(9, 2).unwrap()[0].1, t);
    let mut moved = s.clone();
    moved.epoch = 2;
    moved.members[0] = SocketAddrV4::new(Ipv4Addr::new(198, 18, 9, 99), 40000);
    agg.set_job(&entry(&moved, 0)).unwrap();
    assert_eq!(
        agg.member_timing(9, 2).unwrap()[0].1,
        MemberTiming::default()
    );
}

/// Issue 25, finding 6: a frame from a member's address and port without the member's token
/// (what a host that forges the address but cannot read the member's traffic sends) is foreign:
/// it adds nothing, a REPLAY of it does not become the chunk's result, and it does not re-point
/// the member's results to the forger's MAC. Only the members' own frames complete the chunk,
/// and its result leaves with the job's result token.
#[test]
fn a_member_s_address_without_its_token_sets_nothing() {
    let a = spec(7, 2, 10, Dtype::I32);
    let mut agg = loaded(4);
    agg.set_job(&entry(&a, 0)).unwrap();
    let mac = |last: u8| [0x02, 0, 0, 0, 0x77, last];
    let from = |w: usize, src_mac: [u8; 6], payload: &[u8]| {
        let mut f = HostFrame::udp(
            *a.members[w].ip(),
            a.members[w].port(),
            AGG,
            wire::PORT,
            payload,
        );
        f.eth_src = src_mac;
        f.build()
    };
    // Worker 1 contributes from its own MAC.
    let out = agg
        .test_run(&from(1, mac(1), &data(&a, 1, 0, 0, 0, &[2; 10])))
        .unwrap();
    assert_eq!(out.action, XdpAction::Drop);
    assert_eq!(counter(&agg, Some(7), AggCounter::Added), 1);
    // The forger, from its own MAC with worker 1's and worker 0's addresses: a contribution to
    // another chunk of round 0, a replayed "result" of chunk 0, and the same with a token one
    // bit off.
    let mut wrong = data(&a, 1, 0, 0, 0, &[1000; 10]);
    wrong[28..32].copy_from_slice(&0u32.to_le_bytes());
    let mut replay = data(&a, 0, 0, 0, 0, &[1000; 10]);
    replay[6] |= wire::FLAG_REPLAY;
    replay[28..32].copy_from_slice(&(a.tokens[0] ^ 1).to_le_bytes());
    let mut other_round = data(&a, 1, 1, 0, 0, &[1000; 10]);
    other_round[28..32].copy_from_slice(&a.tokens[0].to_le_bytes()); // worker 0's token as 1
    for (w, p) in [(1, &wrong), (0, &replay), (1, &other_round)] {
        let got = agg.test_run(&from(w, mac(0xee), p)).unwrap();
        assert_eq!(got.action, XdpAction::Drop, "a forged frame as worker {w}");
    }
    assert_eq!(counter(&agg, Some(7), AggCounter::Foreign), 3);
    assert_eq!(
        counter(&agg, Some(7), AggCounter::Added),
        1,
        "nothing added"
    );
    assert_eq!(
        counter(&agg, Some(7), AggCounter::Completed),
        0,
        "no replay taken"
    );
    // Worker 0's own contribution completes the chunk with the members' sum...
    let done = agg
        .test_run(&from(0, mac(0), &data(&a, 0, 0, 0, 0, &[1; 10])))
        .unwrap();
    assert_eq!(done.action, XdpAction::Pass);
    let (h, body) = Header::parse(payload_of(&done.frame)).unwrap();
    assert_eq!(wire::values(body), vec![3; 10]);
    assert_eq!(h.token, agg.fanout_tag());
    // ...and the fan-out's last copy (worker 1's) goes to worker 1's MAC, not the forger's,
    // with the result token.
    let (verdict, last) = agg.test_run_fanout(&done.frame).unwrap();
    assert_eq!(verdict, yard_ebpf::TcAction::Redirect);
    assert_eq!(
        &last[0..6],
        &mac(1),
        "worker 1's results still go to its MAC"
    );
    assert_eq!(
        Header::parse(payload_of(&last)).unwrap().0.token,
        a.result_token
    );
    // A resend is answered with the stored sum and the result token too.
    let again = agg
        .test_run(&from(1, mac(1), &data(&a, 1, 0, 0, 0, &[2; 10])))
        .unwrap();
    assert_eq!(again.action, XdpAction::Tx);
    let (h, _) = Header::parse(payload_of(&again.frame)).unwrap();
    assert_eq!((h.kind, h.token), (Kind::Result, a.result_token));
}
