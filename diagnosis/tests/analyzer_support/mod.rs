//! A small, deterministic job generator for the analyzer tests: a ring all-reduce over one
//! process group of N ranks, M steps, with optional faults, per-host clock skew and jitter.
//!
//! Global time drives the run; each event carries its host's clock (global + skew) and is
//! received by the analyzer 1 ms after it happened. Every live rank heartbeats every 100 ms
//! until the run's end, which is `tail_ns` after the last collective event.

#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use yard_diagnosis::analyzer::{Config, JobAnalyzer};
use yard_diagnosis::event::{Coll, Dir, Dtype, Event, Group, Member, Op, PeerProgress, Phase};
use yard_diagnosis::event::{Rank, Trace};
use yard_diagnosis::verdict::Verdict;

pub const MS: u64 = 1_000_000;
pub const S: u64 = 1_000_000_000;
/// Global start, far from zero so negative skews stay positive.
pub const T0: u64 = 100 * S;
pub const PG: &str = "0";

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Type,
    Dtype,
    Size,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// `rank` never enqueues `seq` (it is stuck in its own code); the others wait.
    Missing { rank: Rank, seq: u64 },
    /// Only `rank` enqueues `seq`; the others issue nothing more.
    Extra { rank: Rank, seq: u64 },
    /// `rank` enqueues `seq` with a different type, dtype or size.
    Mismatch { rank: Rank, seq: u64, kind: Kind },
    /// `rank` dies before `seq`: no event or heartbeat after.
    Dead { rank: Rank, seq: u64 },
    /// Every rank enqueues `seq`; `rank`'s kernel hangs and sends nothing.
    GpuHang { rank: Rank, seq: u64 },
    /// `rank` computes `factor` times longer from `from` on.
    SlowCompute { rank: Rank, factor: f64, from: u64 },
    /// `rank` computes `factor` times longer at exactly `seq`.
    SlowStep { rank: Rank, factor: f64, seq: u64 },
    /// The pair `from -> to` moves data `factor` times slower from seq `at` on.
    SlowLink {
        from: Rank,
        to: Rank,
        factor: f64,
        at: u64,
    },
    /// Every pair touching a host under `switch` is `factor` times slower from `at` on.
    Congestion { switch: usize, factor: f64, at: u64 },
    /// Every rank says goodbye after the last step and goes silent.
    ExitAll,
}

#[derive(Clone, Debug)]
pub struct Sim {
    pub n: u32,
    pub steps: u64,
    pub ranks_per_host: u32,
    pub hosts_per_switch: u32,
    pub compute_ns: u64,
    /// Compute before odd seqs, if different (a forward and a backward pass alternating).
    pub odd_compute_ns: Option<u64>,
    pub transfer_ns: u64,
    pub bytes: u64,
    /// Relative jitter (uniform ±) of compute and transfer times.
    pub jitter: f64,
    pub seed: u64,
    /// Clock offset of each host, ns (missing entries are 0).
    pub skew: Vec<i64>,
    pub peers: bool,
    pub tail_ns: u64,
    pub faults: Vec<Fault>,
}

impl Sim {
    pub fn ring(n: u32, steps: u64) -> Sim {
        Sim {
            n,
            steps,
            ranks_per_host: 1,
            hosts_per_switch: 2,
            compute_ns: 10 * MS,
            odd_compute_ns: None,
            transfer_ns: 5 * MS,
            bytes: 4 << 20,
            jitter: 0.0,
            seed: 1,
            skew: Vec::new(),
            peers: true,
            tail_ns: 10 * S,
            faults: Vec::new(),
        }
    }

    pub fn fault(mut self, f: Fault) -> Sim {
        self.faults.push(f);
        self
    }

    pub fn host(&self, r: Rank) -> usize {
        (r / self.ranks_per_host.max(1)) as usize
    }

    pub fn switch(&self, r: Rank) -> usize {
        self.host(r) / self.hosts_per_switch.max(1) as usize
    }

    fn local(&self, r: Rank, g: u64) -> u64 {
        let skew = self.skew.get(self.host(r)).copied().unwrap_or(0);
        (g as i64 + skew) as u64
    }

    fn compute_factor(&self, r: Rank, s: u64) -> f64 {
        let mut f = 1.0;
        for fault in &self.faults {
            match *fault {
                Fault::SlowCompute { rank, factor, from } if rank == r && s >= from => f *= factor,
                Fault::SlowStep { rank, factor, seq } if rank == r && s == seq => f *= factor,
                _ => {}
            }
        }
        f
    }

    fn pair_factor(&self, from: Rank, to: Rank, s: u64) -> f64 {
        let mut f: f64 = 1.0;
        for fault in &self.faults {
            match *fault {
                Fault::SlowLink {
                    from: a,
                    to: b,
                    factor,
                    at,
                } if a == from && b == to && s >= at => f = f.max(factor),
                Fault::Congestion { switch, factor, at }
                    if s >= at && (self.switch(from) == switch || self.switch(to) == switch) =>
                {
                    f = f.max(factor)
                }
                _ => {}
            }
        }
        f
    }

    /// The events, each with its receive time on the analyzer's clock, in receive order.
    pub fn events(&self) -> Vec<(u64, Event)> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut out: Vec<(u64, Event)> = Vec::new();
        let n = self.n;
        let pg: Arc<str> = Arc::from(PG);
        for r in 0..n {
            let h = self.host(r);
            out.push((
                T0,
                Event::Member(Member {
                    rank: r,
                    world_size: n,
                    host: format!("h{h}"),
                    addr: format!("198.18.0.{}", h + 1),
                    nic: "eth0".into(),
                    switch: format!("tor-{}", self.switch(r)),
                    pid: 1000 + r,
                }),
            ));
        }
        out.push((
            T0,
            Event::Group(Group {
                name: pg.clone(),
                desc: "default_pg".into(),
                ranks: (0..n).collect(),
            }),
        ));
        let mut dead_at: Vec<Option<u64>> = vec![None; n as usize];
        let mut g = T0 + MS;
        let jit = |rng: &mut StdRng| {
            if self.jitter > 0.0 {
                1.0 + rng.gen_range(-self.jitter..self.jitter)
            } else {
                1.0
            }
        };
        let coll = |r: Rank, s: u64, phase: Phase, t: u64, op: Op, dtype: Dtype, bytes: u64| {
            Event::Coll(Coll {
                rank: r,
                pg: pg.clone(),
                seq: s,
                op,
                dtype,
                count: bytes / dtype.size(),
                bytes,
                out_count: 0,
                peer: None,
                phase,
                t_ns: self.local(r, t),
            })
        };
        let peer = |r: Rank, s: u64, other: Rank, dir: Dir, bytes: u64, busy: u64, t: u64| {
            Event::Peer(PeerProgress {
                rank: r,
                pg: pg.clone(),
                seq: s,
                peer: other,
                dir,
                bytes,
                busy_ns: busy,
                t_ns: self.local(r, t),
            })
        };
        let recv = |t: u64| t + MS;
        let mut last = g;
        'steps: for s in 0..self.steps {
            let arrive: Vec<u64> = (0..n)
                .map(|r| {
                    let base = match self.odd_compute_ns {
                        Some(odd) if s % 2 == 1 => odd,
                        _ => self.compute_ns,
                    };
                    let c = base as f64 * self.compute_factor(r, s) * jit(&mut rng);
                    g + c as u64
                })
                .collect();
            // Hang faults at this seq: emit what happens, then stop the collective stream.
            for fault in &self.faults {
                let (op, dtype, bytes) = (Op::AllReduce, Dtype::Float32, self.bytes);
                match *fault {
                    Fault::Missing { rank, seq } if seq == s => {
                        for r in (0..n).filter(|&r| r != rank) {
                            out.push((
                                recv(arrive[r as usize]),
                                coll(r, s, Phase::Enqueue, arrive[r as usize], op, dtype, bytes),
                            ));
                        }
                        last = arrive.iter().copied().max().unwrap_or(g);
                        break 'steps;
                    }
                    Fault::Extra { rank, seq } if seq == s => {
                        let t = arrive[rank as usize];
                        out.push((recv(t), coll(rank, s, Phase::Enqueue, t, op, dtype, bytes)));
                        last = t;
                        break 'steps;
                    }
                    Fault::Mismatch { rank, seq, kind } if seq == s => {
                        for r in 0..n {
                            let (o, d, b) = if r != rank {
                                (op, dtype, bytes)
                            } else {
                                match kind {
                                    Kind::Type => (Op::AllGather, dtype, bytes),
                                    Kind::Dtype => (op, Dtype::BFloat16, bytes),
                                    Kind::Size => (op, dtype, bytes / 2),
                                }
                            };
                            let t = arrive[r as usize];
                            out.push((recv(t), coll(r, s, Phase::Enqueue, t, o, d, b)));
                        }
                        last = arrive.iter().copied().max().unwrap_or(g);
                        break 'steps;
                    }
                    Fault::Dead { rank, seq } if seq == s => {
                        dead_at[rank as usize] = Some(g);
                        for r in (0..n).filter(|&r| r != rank) {
                            let t = arrive[r as usize];
                            out.push((recv(t), coll(r, s, Phase::Enqueue, t, op, dtype, bytes)));
                        }
                        last = arrive.iter().copied().max().unwrap_or(g);
                        break 'steps;
                    }
                    Fault::GpuHang { rank, seq } if seq == s => {
                        let start = arrive.iter().copied().max().unwrap_or(g);
                        for r in 0..n {
                            let t = arrive[r as usize];
                            out.push((recv(t), coll(r, s, Phase::Enqueue, t, op, dtype, bytes)));
                            out.push((
                                recv(start),
                                coll(r, s, Phase::Start, start, op, dtype, bytes),
                            ));
                            // The hung rank sends nothing and waits on its own GPU, not on a
                            // peer; the others wait on their peers.
                            let sent = |r: Rank| if r == rank { 0 } else { bytes / 4 };
                            let busy = if r == rank { 0 } else { MS };
                            let t = start + MS;
                            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                            out.push((recv(t), peer(r, s, next, Dir::Send, sent(r), busy, t)));
                            out.push((recv(t), peer(r, s, prev, Dir::Recv, sent(prev), busy, t)));
                        }
                        last = start + MS;
                        break 'steps;
                    }
                    _ => {}
                }
            }
            let start = arrive.iter().copied().max().unwrap_or(g);
            let j = jit(&mut rng);
            let busy: Vec<u64> = (0..n)
                .map(|r| (self.transfer_ns as f64 * self.pair_factor(r, (r + 1) % n, s) * j) as u64)
                .collect();
            let x = busy.iter().copied().max().unwrap_or(0);
            let end = start + x;
            for r in 0..n {
                let t = arrive[r as usize];
                out.push((
                    recv(t),
                    coll(
                        r,
                        s,
                        Phase::Enqueue,
                        t,
                        Op::AllReduce,
                        Dtype::Float32,
                        self.bytes,
                    ),
                ));
                out.push((
                    recv(start),
                    coll(
                        r,
                        s,
                        Phase::Start,
                        start,
                        Op::AllReduce,
                        Dtype::Float32,
                        self.bytes,
                    ),
                ));
                out.push((
                    recv(end),
                    coll(
                        r,
                        s,
                        Phase::End,
                        end,
                        Op::AllReduce,
                        Dtype::Float32,
                        self.bytes,
                    ),
                ));
                if self.peers && n > 1 {
                    let next = (r + 1) % n;
                    let prev = (r + n - 1) % n;
                    out.push((
                        recv(end),
                        peer(r, s, next, Dir::Send, self.bytes, busy[r as usize], end),
                    ));
                    out.push((
                        recv(end),
                        peer(r, s, prev, Dir::Recv, self.bytes, busy[prev as usize], end),
                    ));
                }
            }
            g = end;
            last = end;
        }
        let end = last + self.tail_ns;
        if self.faults.contains(&Fault::ExitAll) {
            for r in 0..n {
                out.push((
                    recv(last),
                    Event::Exit {
                        rank: r,
                        t_ns: self.local(r, last),
                    },
                ));
            }
        }
        let mut t = T0;
        while t <= end {
            for r in 0..n {
                let alive = dead_at[r as usize].is_none_or(|d| t < d);
                let exited = self.faults.contains(&Fault::ExitAll) && t > last;
                if alive && !exited {
                    out.push((
                        recv(t),
                        Event::Heartbeat {
                            rank: r,
                            t_ns: self.local(r, t),
                        },
                    ));
                }
            }
            t += 100 * MS;
        }
        out.sort_by_key(|e| e.0);
        out
    }

    /// The time the run ends (the analyzer evaluates then).
    pub fn end(&self, events: &[(u64, Event)]) -> u64 {
        events.last().map_or(T0, |e| e.0)
    }

    /// Runs the analyzer over the whole run and evaluates once at its end.
    pub fn verdicts(&self, cfg: &Config) -> Vec<Verdict> {
        let events = self.events();
        analyze(&events, cfg)
    }

    /// The run as an offline record (no heartbeats), taken at its end.
    pub fn trace(&self, stuck: bool) -> Trace {
        let events = self.events();
        Trace {
            job: "sim".into(),
            taken_ns: self.end(&events),
            events: events
                .into_iter()
                .map(|e| e.1)
                .filter(|e| !matches!(e, Event::Heartbeat { .. }))
                .collect(),
            world: (0..self.n).collect(),
            missing: Vec::new(),
            stuck,
            timed: true,
        }
    }
}

/// Ingests events in the given order and evaluates at the latest receive time.
pub fn analyze(events: &[(u64, Event)], cfg: &Config) -> Vec<Verdict> {
    let mut a = JobAnalyzer::new("sim", cfg.clone());
    for (now, ev) in events {
        a.ingest(ev, *now);
    }
    let end = events.iter().map(|e| e.0).max().unwrap_or(0);
    a.evaluate(end).to_vec()
}

/// (class, subtype, culprits) of each verdict, for compact assertions.
pub fn summary(vs: &[Verdict]) -> Vec<(String, String, Vec<Rank>)> {
    vs.iter()
        .map(|v| {
            (
                v.class.to_string(),
                v.subtype.to_string(),
                v.culprits.clone(),
            )
        })
        .collect()
}
