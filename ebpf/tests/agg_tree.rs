//! `yard_agg` as a tree of aggregators (ALEPH) under BPF_PROG_TEST_RUN: three loaded programs
//! (a root and two cluster aggregators, each with its own maps, as on three hosts), frames
//! carried between them by the test, every frame also run through the reference model of its
//! host (same counter, same bytes). Exact sums through the two levels, int32 and float32, and a
//! seeded lossy network (drops, duplicates, reordering, resends on timeout) in which every
//! worker must end each round with the same bits and each chunk completes once at the root.
//! Needs root.

mod agg_common;
mod common;

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};

use agg_common::*;
use common::require_root;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yard_agg::model::{Action, Aggregator as Model, JobSpec, Parent};
use yard_agg::wire::{self, Dtype, Geometry, Header, Kind};
use yard_ebpf::frames::{ipv4_header_valid, HostFrame};
use yard_ebpf::{AggCounter, AggJobEntry, AggParent, Aggregator, XdpAction};

const JOB: u32 = 11;

/// A chunk's result as a worker holds it: exponent and values.
type Chunk = (i8, Vec<i32>);
const PARENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];

/// Where a frame is going in the test's network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum To {
    Host(usize),
    Worker(usize),
}

/// One aggregator host: its program, its model and what it serves.
struct Host {
    ip: Ipv4Addr,
    bpf: Aggregator,
    model: Model,
    spec: JobSpec,
}

impl Host {
    fn addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ip, wire::PORT)
    }
}

/// A two-level tree: host 0 the root, hosts 1.. cluster aggregators; `direct` workers on the
/// root, `clusters[k]` workers on host k + 1. Worker ids are global, ranks in order.
struct Tree {
    hosts: Vec<Host>,
    /// Per worker: its host and its index there.
    placed: Vec<(usize, u16)>,
    workers: usize,
}

fn worker_addr(w: usize) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(198, 18, 1, u8::try_from(w + 1).unwrap()),
        41000 + u16::try_from(w).unwrap(),
    )
}

/// Member `i`'s token at host `h` of the tree.
fn host_token(h: usize, i: usize) -> u32 {
    test_token(100 + u32::try_from(h).unwrap(), i)
}

/// The loader's view of a cluster aggregator's parent, with the next hop's MAC.
fn agg_parent(p: &Parent, mac: [u8; 6]) -> AggParent {
    AggParent {
        addr: p.addr,
        worker: p.worker,
        mac,
        token: p.token,
        result_token: p.result_token,
    }
}

fn host_addr(h: usize) -> SocketAddrV4 {
    SocketAddrV4::new(host_ip(h), wire::PORT)
}

fn host_ip(h: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, 100 + u8::try_from(h).unwrap())
}

impl Tree {
    fn new(direct: usize, clusters: &[usize], values: u32, dtype: Dtype) -> Tree {
        require_root();
        let geometry = Geometry {
            values,
            chunk_values: CHUNK,
        };
        let mut placed = Vec::new();
        let mut w = 0;
        let mut members: Vec<Vec<SocketAddrV4>> = vec![Vec::new(); clusters.len() + 1];
        for (h, n) in std::iter::once(direct)
            .chain(clusters.iter().copied())
            .enumerate()
        {
            for _ in 0..n {
                placed.push((h, u16::try_from(members[h].len()).unwrap()));
                members[h].push(worker_addr(w));
                w += 1;
            }
        }
        // The root's members: its own workers, then the cluster aggregators.
        for k in 0..clusters.len() {
            members[0].push(SocketAddrV4::new(host_ip(k + 1), wire::PORT));
        }
        let root_members = members[0].len();
        let hosts = members
            .into_iter()
            .enumerate()
            .map(|(h, members)| {
                let parent = (h > 0).then(|| {
                    let worker = root_members - clusters.len() + h - 1;
                    Parent {
                        addr: SocketAddrV4::new(host_ip(0), wire::PORT),
                        worker: u16::try_from(worker).unwrap(),
                        token: host_token(0, worker),
                        result_token: test_result_token(JOB, 0),
                    }
                });
                let tokens = (0..members.len()).map(|i| host_token(h, i)).collect();
                let spec = JobSpec {
                    id: JOB,
                    epoch: 1,
                    geometry,
                    dtype,
                    members,
                    tokens,
                    result_token: test_result_token(JOB, h),
                    parent,
                };
                let mut bpf = Aggregator::load(geometry.chunks() * 2).expect("load");
                bpf.set_job(&AggJobEntry {
                    id: JOB,
                    epoch: 1,
                    base: 0,
                    geometry,
                    dtype,
                    members: spec.members.clone(),
                    tokens: spec.tokens.clone(),
                    result_token: spec.result_token,
                    self_ip: host_ip(h),
                    parent: parent.map(|p| agg_parent(&p, PARENT_MAC)),
                })
                .unwrap();
                let mut model = Model::new();
                model.set_job(spec.clone());
                Host {
                    ip: host_ip(h),
                    bpf,
                    model,
                    spec,
                }
            })
            .collect();
        Tree {
            hosts,
            placed,
            workers: w,
        }
    }

    /// Runs `payload` from `from` into host `h`'s program and model: asserts they agree (one
    /// counter each, the same bytes out) and returns where the program's output goes.
    fn deliver(&mut self, h: usize, from: SocketAddrV4, payload: &[u8]) -> Vec<(To, Vec<u8>)> {
        let host = &mut self.hosts[h];
        let frame = HostFrame::udp(*from.ip(), from.port(), host.ip, wire::PORT, payload).build();
        let before = counts(&host.bpf);
        let got = host.bpf.test_run(&frame).unwrap();
        let want = host.model.receive(from, payload);
        assert_eq!(
            moved(&before, &counts(&host.bpf)),
            [want.counter],
            "host {h}: counters moved"
        );
        let out = payload_of(&got.frame).to_vec();
        match want.action {
            Action::Drop => {
                assert_eq!(got.action, XdpAction::Drop, "host {h}");
                Vec::new()
            }
            Action::Reply(bytes) => {
                assert_eq!(got.action, XdpAction::Tx, "host {h}");
                assert_eq!(out, bytes, "host {h}: reply");
                vec![(self.route(from), bytes)]
            }
            Action::Up(bytes) => {
                assert_eq!(got.action, XdpAction::Tx, "host {h}: up");
                assert_eq!(out, bytes, "host {h}: partial sum");
                let f = &got.frame;
                assert_eq!(&f[0..6], &PARENT_MAC, "to the parent's MAC");
                assert!(ipv4_header_valid(&f[14..34]), "a valid IPv4 header");
                assert_eq!(&f[26..30], &host_ip(h).octets(), "from this host");
                assert_eq!(&f[30..34], &host_ip(0).octets(), "to the root");
                assert_eq!(&f[34..38], &[0x1d, 0x39, 0x1d, 0x39], "port 7481 to 7481");
                vec![(To::Host(0), bytes)]
            }
            Action::Fanout(bytes) => {
                assert_eq!(got.action, XdpAction::Pass, "host {h}: fan-out");
                let expected = as_fanout(&bytes, host.bpf.fanout_tag());
                assert_eq!(out, expected, "host {h}: fan-out");
                // What yard_agg_fanout sends: a copy to every member.
                let members = self.hosts[h].spec.members.clone();
                members
                    .iter()
                    .map(|m| (self.route(*m), bytes.clone()))
                    .collect()
            }
        }
    }

    /// The worker or host behind an address.
    fn route(&self, a: SocketAddrV4) -> To {
        if let Some(h) = self.hosts.iter().position(|h| h.addr() == a) {
            return To::Host(h);
        }
        To::Worker((0..self.workers).find(|w| worker_addr(*w) == a).unwrap())
    }

    /// Worker `w`'s contribution to `chunk` of `round`.
    fn contribution(
        &self,
        w: usize,
        round: u32,
        chunk: u32,
        exp: i8,
        v: &[i32],
        flags: u8,
    ) -> Vec<u8> {
        let (h, index) = self.placed[w];
        let spec = &self.hosts[h].spec;
        wire::encode(
            &Header {
                kind: Kind::Data,
                flags,
                exp,
                job: JOB,
                epoch: spec.epoch,
                round,
                chunk,
                worker: index,
                count: 0,
                contributors: 0,
                token: spec.tokens[usize::from(index)],
            },
            v,
        )
    }

    /// A regrouping onto the same tree: every host serves epoch `epoch` from now on.
    fn set_epoch(&mut self, epoch: u32) {
        for (h, host) in self.hosts.iter_mut().enumerate() {
            host.spec.epoch = epoch;
            host.model.set_job(host.spec.clone());
            host.bpf
                .set_job(&AggJobEntry {
                    id: JOB,
                    epoch,
                    base: 0,
                    geometry: host.spec.geometry,
                    dtype: host.spec.dtype,
                    members: host.spec.members.clone(),
                    tokens: host.spec.tokens.clone(),
                    result_token: host.spec.result_token,
                    self_ip: host_ip(h),
                    parent: host.spec.parent.map(|p| agg_parent(&p, PARENT_MAC)),
                })
                .unwrap();
        }
    }

    /// Delivers `frames` (sender, destination, payload) and everything they cause, in order,
    /// with no loss; returns what each worker received (chunk 0 results, in arrival order).
    fn settle(&mut self, frames: Vec<(SocketAddrV4, To, Vec<u8>)>) -> Vec<Vec<Vec<i32>>> {
        let mut got = vec![Vec::new(); self.workers];
        let mut flight: VecDeque<(SocketAddrV4, To, Vec<u8>)> = frames.into();
        while let Some((from, to, bytes)) = flight.pop_front() {
            match to {
                To::Host(h) => {
                    let me = self.hosts[h].addr();
                    for (next, out) in self.deliver(h, from, &bytes) {
                        flight.push_back((me, next, out));
                    }
                }
                To::Worker(w) => {
                    let (_, body) = Header::parse(&bytes).unwrap();
                    got[w].push(wire::values(body));
                }
            }
        }
        got
    }

    fn count(&self, h: usize, c: AggCounter) -> u64 {
        let all = self.hosts[h].bpf.counters().unwrap();
        all.into_iter().find(|(k, _)| *k == c).unwrap().1.packets
    }
}

/// The network's faults.
#[derive(Clone, Copy)]
struct Faults {
    drop: f64,
    dup: f64,
    /// Deliver a random frame in flight rather than the oldest.
    reorder: bool,
}

const CLEAN: Faults = Faults {
    drop: 0.0,
    dup: 0.0,
    reorder: false,
};

/// One round of every worker's gradient through the tree over a network with `faults`: each
/// worker sends every chunk, then, whenever nothing is in flight, resends (RETX) the chunks it
/// has no result for, as its timeout would. Returns each worker's results per chunk.
fn round(
    t: &mut Tree,
    rng: &mut StdRng,
    faults: Faults,
    round: u32,
    grads: &[Vec<i32>],
    exps: &[Vec<i8>],
) -> Vec<Vec<Option<Chunk>>> {
    let g = t.hosts[0].spec.geometry;
    let chunks = g.chunks() as usize;
    let mut results: Vec<Vec<Option<Chunk>>> = vec![vec![None; chunks]; t.workers];
    let mut flight: VecDeque<(SocketAddrV4, To, Vec<u8>)> = VecDeque::new();
    let send = |flight: &mut VecDeque<(SocketAddrV4, To, Vec<u8>)>,
                rng: &mut StdRng,
                from: SocketAddrV4,
                to: To,
                bytes: Vec<u8>| {
        if rng.gen_bool(faults.drop) {
            return;
        }
        if rng.gen_bool(faults.dup) {
            flight.push_back((from, to, bytes.clone()));
        }
        flight.push_back((from, to, bytes));
    };
    let mut resends = 0;
    for pass in 0.. {
        let mut missing = false;
        for w in 0..t.workers {
            for c in 0..chunks {
                if results[w][c].is_some() {
                    continue;
                }
                missing = true;
                let range =
                    g.chunk_start(c as u32)..g.chunk_start(c as u32) + g.chunk_len(c as u32);
                let flags = if pass == 0 { 0 } else { wire::FLAG_RETX };
                let bytes = t.contribution(w, round, c as u32, exps[w][c], &grads[w][range], flags);
                let to = To::Host(t.placed[w].0);
                send(&mut flight, rng, worker_addr(w), to, bytes);
            }
        }
        if !missing {
            break;
        }
        if pass > 0 {
            resends += 1;
            assert!(resends < 200, "round {round} never completed");
        }
        while !flight.is_empty() {
            let k = if faults.reorder {
                rng.gen_range(0..flight.len())
            } else {
                0
            };
            let (from, to, bytes) = flight.remove(k).unwrap();
            match to {
                To::Host(h) => {
                    for (next, out) in t.deliver(h, from, &bytes) {
                        let from = t.hosts[h].addr();
                        send(&mut flight, rng, from, next, out);
                    }
                }
                To::Worker(w) => {
                    let (h, body) = Header::parse(&bytes).unwrap();
                    assert_eq!(h.kind, Kind::Result);
                    if h.round != round {
                        continue;
                    }
                    let got = (h.exp, wire::values(body));
                    let slot = &mut results[w][h.chunk as usize];
                    if let Some(had) = slot {
                        assert_eq!(
                            *had, got,
                            "worker {w} chunk {}: a second, different result",
                            h.chunk
                        );
                    }
                    *slot = Some(got);
                }
            }
        }
    }
    results
}

fn int_grads(rng: &mut StdRng, n: usize, values: u32) -> Vec<Vec<i32>> {
    (0..n)
        .map(|_| (0..values).map(|_| rng.gen()).collect())
        .collect()
}

fn exact_i32(grads: &[Vec<i32>]) -> Vec<i32> {
    (0..grads[0].len())
        .map(|i| grads.iter().fold(0i32, |a, g| a.wrapping_add(g[i])))
        .collect()
}

fn flat(results: &[Option<Chunk>]) -> Vec<i32> {
    results
        .iter()
        .flat_map(|r| r.clone().expect("a result").1)
        .collect()
}

#[test]
fn int32_sums_through_two_levels_are_exact_and_each_chunk_completes_once() {
    let mut rng = StdRng::seed_from_u64(13);
    for values in sizes() {
        let mut t = Tree::new(1, &[3, 2], values, Dtype::I32);
        let chunks = u64::from(t.hosts[0].spec.geometry.chunks());
        for r in 0..3 {
            let grads = int_grads(&mut rng, t.workers, values);
            let exps = vec![vec![0i8; chunks as usize]; t.workers];
            let results = round(&mut t, &mut rng, CLEAN, r, &grads, &exps);
            let exact = exact_i32(&grads);
            for (w, res) in results.iter().enumerate() {
                assert_eq!(flat(res), exact, "{values} values, round {r}, worker {w}");
            }
        }
        assert_eq!(
            t.count(0, AggCounter::Completed),
            3 * chunks,
            "root completions"
        );
        for h in 1..3 {
            assert_eq!(
                t.count(h, AggCounter::Forwarded),
                3 * chunks,
                "host {h} forwards"
            );
            assert_eq!(
                t.count(h, AggCounter::ParentResult),
                3 * chunks,
                "host {h} results"
            );
            assert_eq!(
                t.count(h, AggCounter::Completed),
                0,
                "a cluster completes nothing"
            );
        }
    }
}

#[test]
fn float32_sums_through_two_levels_are_within_the_bound_and_bit_identical() {
    let mut rng = StdRng::seed_from_u64(14);
    for values in sizes() {
        let mut t = Tree::new(2, &[2, 3], values, Dtype::F32);
        let spec = JobSpec {
            members: (0..t.workers).map(worker_addr).collect(),
            ..t.hosts[0].spec.clone()
        };
        let floats = scaled_floats(&mut rng, t.workers, values);
        // Every worker scales for the job's N, whichever aggregator it sends to.
        let (grads, exps) = quantized(&spec, &floats);
        let results = round(&mut t, &mut rng, CLEAN, 0, &grads, &exps);
        let first: Vec<Chunk> = results[0].iter().map(|r| r.clone().unwrap()).collect();
        for (w, res) in results.iter().enumerate() {
            let mine: Vec<Chunk> = res.iter().map(|r| r.clone().unwrap()).collect();
            assert_eq!(mine, first, "worker {w}'s bits");
        }
        assert_within_bound(&spec, &floats, &first, &format!("{values} values"));
    }
}

#[test]
fn a_lossy_reordering_duplicating_network_still_gives_every_worker_the_exact_sum_once() {
    let faults = Faults {
        drop: 0.15,
        dup: 0.1,
        reorder: true,
    };
    for seed in 0..6 {
        let mut rng = StdRng::seed_from_u64(100 + seed);
        let values = 4 * u32::from(CHUNK) + 7;
        let mut t = Tree::new(2, &[3, 1], values, Dtype::I32);
        let chunks = u64::from(t.hosts[0].spec.geometry.chunks());
        let mut per_round: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
        for r in 0..4 {
            let grads = int_grads(&mut rng, t.workers, values);
            let exps = vec![vec![0i8; chunks as usize]; t.workers];
            let results = round(&mut t, &mut rng, faults, r, &grads, &exps);
            let exact = exact_i32(&grads);
            for (w, res) in results.iter().enumerate() {
                assert_eq!(flat(res), exact, "seed {seed} round {r} worker {w}");
            }
            per_round.insert(r, exact);
        }
        // Completion exactly once per chunk and round, at the root and in each cluster.
        assert_eq!(t.count(0, AggCounter::Completed), 4 * chunks, "seed {seed}");
        for h in 1..3 {
            assert_eq!(
                t.count(h, AggCounter::Forwarded),
                4 * chunks,
                "seed {seed} host {h}"
            );
        }
        let resent: u64 = (1..3).map(|h| t.count(h, AggCounter::ForwardResent)).sum();
        assert!(
            resent > 0,
            "seed {seed}: losses were repaired by sending partials again"
        );
    }
}

#[test]
fn a_partial_sum_waits_for_the_parents_mac_and_goes_up_on_the_next_resend() {
    let mut t = Tree::new(0, &[2], u32::from(CHUNK), Dtype::I32);
    let g = t.hosts[1].spec.geometry;
    let mut entry = AggJobEntry {
        id: JOB,
        epoch: 1,
        base: 0,
        geometry: g,
        dtype: Dtype::I32,
        members: t.hosts[1].spec.members.clone(),
        tokens: t.hosts[1].spec.tokens.clone(),
        result_token: t.hosts[1].spec.result_token,
        self_ip: host_ip(1),
        parent: Some(agg_parent(&t.hosts[1].spec.parent.unwrap(), [0; 6])),
    };
    t.hosts[1].bpf.set_job(&entry).unwrap();
    let v = vec![5i32; usize::from(CHUNK)];
    let a = t.contribution(0, 0, 0, 0, &v, 0);
    let b = t.contribution(1, 0, 0, 0, &v, 0);
    let run = |t: &Tree, w: usize, p: &[u8]| {
        let f = HostFrame::udp(
            *worker_addr(w).ip(),
            worker_addr(w).port(),
            host_ip(1),
            wire::PORT,
            p,
        )
        .build();
        t.hosts[1].bpf.test_run(&f).unwrap()
    };
    assert_eq!(run(&t, 0, &a).action, XdpAction::Drop);
    assert_eq!(
        run(&t, 1, &b).action,
        XdpAction::Drop,
        "no MAC: nothing can go up"
    );
    assert_eq!(t.count(1, AggCounter::ForwardFailed), 1);
    entry.parent.as_mut().unwrap().mac = PARENT_MAC;
    t.hosts[1].bpf.set_job(&entry).unwrap();
    let out = run(&t, 1, &b);
    assert_eq!(out.action, XdpAction::Tx, "the resend sends the partial up");
    let (h, body) = Header::parse(payload_of(&out.frame)).unwrap();
    assert_eq!((h.kind, h.worker), (Kind::Data, 0));
    assert_eq!(wire::values(body), vec![10; usize::from(CHUNK)]);
    assert_eq!(t.count(1, AggCounter::ForwardResent), 1);
}

#[test]
fn results_only_from_the_parent_and_data_only_from_members() {
    let mut t = Tree::new(1, &[2], u32::from(CHUNK), Dtype::I32);
    let v = vec![1i32; usize::from(CHUNK)];
    // A RESULT from a worker to a cluster aggregator, and to the root: foreign.
    let mut forged = t.contribution(1, 0, 0, 0, &v, 0);
    forged[5] = Kind::Result as u8;
    assert!(t.deliver(1, worker_addr(1), &forged).is_empty());
    assert_eq!(t.count(1, AggCounter::Foreign), 1);
    assert!(t.deliver(0, worker_addr(1), &forged).is_empty());
    assert_eq!(t.count(0, AggCounter::Foreign), 1, "the root has no parent");
    // A cluster aggregator's partial from a host that is not in the root's members.
    let stranger = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 199), wire::PORT);
    let up = t.contribution(1, 0, 0, 0, &v, 0);
    let mut claims_child = up.clone();
    claims_child[24..26].copy_from_slice(&1u16.to_le_bytes());
    assert!(t.deliver(0, stranger, &claims_child).is_empty());
    assert_eq!(t.count(0, AggCounter::Foreign), 2);
    // A RESULT from the root's address and port without the root's result token (a host that
    // forges the root's address): foreign at the cluster aggregator, which sets nothing.
    let mut spoofed = t.contribution(1, 0, 0, 0, &[1000; CHUNK as usize], 0);
    spoofed[5] = Kind::Result as u8;
    spoofed[28..32].copy_from_slice(&(test_result_token(JOB, 0) ^ 1).to_le_bytes());
    assert!(t.deliver(1, host_addr(0), &spoofed).is_empty());
    assert_eq!(t.count(1, AggCounter::Foreign), 2);
    assert_eq!(t.count(1, AggCounter::ParentResult), 0);
    // A partial from the cluster aggregator's address and its index at the root (1), with the
    // root's worker 0's token instead of its own: foreign.
    let mut wrong = t.contribution(0, 0, 0, 0, &v, 0);
    assert_eq!(wrong[28..32], host_token(0, 0).to_le_bytes());
    wrong[24] = 1;
    assert!(t.deliver(0, host_addr(1), &wrong).is_empty());
    assert_eq!(t.count(0, AggCounter::Foreign), 3);
    assert_eq!(t.count(0, AggCounter::Added), 0);
}

/// After a regrouping, a worker that had round 1's result replays it (REPLAY) while the others
/// sum round 1 again: wherever the replaying worker sits (at the root, or in a cluster whose
/// aggregator sends the replay up flagged as such), every worker ends with the replayed bits,
/// not a re-sum. The replayed values are deliberately not the sum, so a re-sum would show.
#[test]
fn a_replayed_result_reaches_every_worker_through_the_tree_after_a_regrouping() {
    let c = usize::from(CHUNK);
    let stored: Vec<i32> = (0..c as i32).map(|i| i * 7 - 3).collect();
    // (root's own workers, clusters): the replaying worker 0 at the root, then in a cluster.
    for (direct, clusters) in [(1usize, vec![2usize]), (0, vec![1, 2])] {
        let mut t = Tree::new(direct, &clusters, u32::from(CHUNK), Dtype::I32);
        t.set_epoch(2);
        let mine = vec![1i32; c];
        let placed = t.placed.clone();
        let at = |w: usize| To::Host(placed[w].0);
        let replay = t.contribution(0, 1, 0, 0, &stored, wire::FLAG_REPLAY);
        // Worker 1 sums round 1 again first, then worker 0's replay arrives.
        let frames = vec![
            (worker_addr(1), at(1), t.contribution(1, 1, 0, 0, &mine, 0)),
            (worker_addr(0), at(0), replay),
        ];
        let got = t.settle(frames);
        // Worker 2 sums round 1 again last: its aggregator answers with the stored result.
        let late = t.settle(vec![(
            worker_addr(2),
            at(2),
            t.contribution(2, 1, 0, 0, &mine, 0),
        )]);
        for w in 0..3 {
            let first = got[w].first().or(late[w].first()).unwrap_or_else(|| {
                panic!("layout {direct}/{clusters:?}: worker {w} got no result")
            });
            assert_eq!(
                *first, stored,
                "layout {direct}/{clusters:?}: worker {w}'s bits"
            );
        }
        assert_eq!(
            t.count(0, AggCounter::Completed),
            1,
            "the root completed round 1 once"
        );
    }
}

/// A root that sums 64 members (63 of its own workers and one cluster aggregator, the most its
/// bitmap holds): its RESULT frames say 64 contributions. Version 1 of the header carried that
/// count in `worker`, which the cluster aggregator checks as an index (< 64) before it looks at
/// where the frame came from, so it dropped every result as a bad header and the cluster's
/// workers never completed a round. The count now has a field of its own.
#[test]
fn a_root_of_64_members_completes_rounds_through_its_cluster() {
    let mut rng = StdRng::seed_from_u64(64);
    let values = 2 * u32::from(CHUNK) + 1;
    let mut t = Tree::new(63, &[2], values, Dtype::I32);
    assert_eq!(
        t.hosts[0].spec.members.len(),
        wire::WORKERS_MAX,
        "the root's members"
    );
    let chunks = u64::from(t.hosts[0].spec.geometry.chunks());
    for r in 0..2 {
        let grads = int_grads(&mut rng, t.workers, values);
        let exps = vec![vec![0i8; chunks as usize]; t.workers];
        let results = round(&mut t, &mut rng, CLEAN, r, &grads, &exps);
        let exact = exact_i32(&grads);
        for (w, res) in results.iter().enumerate() {
            assert_eq!(flat(res), exact, "round {r}, worker {w}");
        }
    }
    assert_eq!(
        t.count(0, AggCounter::Completed),
        2 * chunks,
        "root completions"
    );
    assert_eq!(
        t.count(1, AggCounter::ParentResult),
        2 * chunks,
        "results taken"
    );
    assert_eq!(t.count(1, AggCounter::BadHeader), 0, "no result dropped");
    // What the cluster's workers got says 64 contributions, and no worker index.
    let v = vec![1i32; usize::from(CHUNK)];
    let late = t.contribution(63, 0, 0, 0, &v, wire::FLAG_RETX);
    let out = t.deliver(1, worker_addr(63), &late);
    let (h, _) = Header::parse(&out[0].1).unwrap();
    assert_eq!((h.kind, h.worker, h.contributors), (Kind::Result, 0, 64));
}
