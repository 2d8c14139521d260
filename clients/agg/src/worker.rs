//! A worker's side of one job: each call sums one round of the gradient with every other
//! worker's, through the job's aggregator.
//!
//! Sending is windowed (at most `window` chunks awaiting their result), a chunk whose result
//! has not come back within the timeout is sent again (marked as a resend, the timeout doubled
//! up to a cap), and results are written into the caller's buffer as they arrive, in any order.
//! The aggregator answers a resend to a finished chunk with the stored sum, so a lost result
//! costs one timeout, never the round. A round that makes no progress for `give_up` fails with
//! an error naming the job and the aggregator.

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use crate::fixed::{self, FixedError};
use crate::wire::{self, Dtype, Geometry, Header, Kind, FLAG_REPLAY, FLAG_RETX};

/// Where and as whom a worker aggregates: the job's current membership, as the cluster's job
/// table gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Membership {
    pub job: u32,
    pub epoch: u32,
    /// This worker's index in the job.
    pub worker: u16,
    /// Workers of this epoch.
    pub workers: u16,
    pub aggregator: SocketAddrV4,
    pub geometry: Geometry,
    pub dtype: Dtype,
    /// What this worker's DATA frames carry in `token`: its proof, to the aggregator, that a
    /// frame from its address is its own (drawn per job, epoch, aggregator and worker).
    pub token: u32,
    /// What the aggregator's RESULT frames carry in `token`: a result without it is ignored.
    pub result_token: u32,
}

/// The client's timing and window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Chunks awaiting their result at once. Their results can arrive in one burst, which must
    /// fit the socket's receive buffer (Linux's default, 208 KiB, holds about 90 frames of a
    /// 1500-byte MTU as the kernel accounts them): 256 lost most of each burst in the
    /// agg-throughput benchmark and ran 10 times slower than 64.
    pub window: usize,
    /// First resend timeout of a chunk.
    pub timeout: Duration,
    /// The timeout doubles on each resend of a chunk, up to this.
    pub max_timeout: Duration,
    /// A round that receives no new result for this long fails.
    pub give_up: Duration,
    /// `Some(p)`: send as if the aggregator had a SwitchML-style pool of `p` slots, reused
    /// chunk after chunk, instead of the whole gradient cached: chunks `0..p` go at once and
    /// chunk `k + p` goes when chunk `k`'s result comes in (in such a pool it reuses chunk `k`'s
    /// slot), so at most `p` chunks are in flight and `window` only bounds the first burst.
    /// The agg-hetero benchmark compares the two; `None`, the default, is the whole-gradient
    /// cache the aggregator has.
    pub slot_pool: Option<usize>,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            window: 64,
            timeout: Duration::from_millis(20),
            max_timeout: Duration::from_millis(500),
            give_up: Duration::from_secs(10),
            slot_pool: None,
        }
    }
}

/// Why a round failed.
#[derive(Debug, thiserror::Error)]
pub enum AggError {
    #[error("the gradient has {got} values but job {job} sums {want}")]
    Size { job: u32, got: usize, want: u32 },
    #[error("job {job} sums {want} values, not {got}")]
    Dtype { job: u32, want: Dtype, got: Dtype },
    #[error(transparent)]
    NotFinite(#[from] FixedError),
    #[error("job {job}: no result from aggregator {aggregator} for {waited:?} (round {round}, {missing} chunks missing); the job may be gone or its aggregator down")]
    Timeout {
        job: u32,
        aggregator: SocketAddrV4,
        round: u32,
        missing: usize,
        waited: Duration,
    },
    #[error("aggregation socket error")]
    Io(#[from] io::Error),
}

/// Per-round statistics, for the caller's metrics and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundStats {
    pub sent: u64,
    pub resent: u64,
    pub results: u64,
    /// Results for chunks already received, or for another job, epoch or round, and frames
    /// that are not results at all ([`RoundStats::foreign`] ones included).
    pub ignored: u64,
    /// Frames from anyone but the job's aggregator (its address and port), or without its
    /// result token: ignored whatever they carry, so a host that is not the aggregator cannot
    /// give this worker a result.
    pub foreign: u64,
    /// Results for a chunk already received in this round and epoch that differ from the first
    /// one: the chunk was completed twice with different sums, which must never happen (the
    /// chaos schedule checks it stays 0).
    pub conflicting: u64,
    /// From the round's start until every chunk of it had been sent once: when this worker's
    /// upload was done and only results were awaited (the agg-hetero benchmark's figure of how
    /// far a fast worker gets ahead of a slow one).
    pub all_sent_after: Duration,
}

/// One worker of one job.
#[derive(Debug)]
pub struct Worker {
    socket: UdpSocket,
    membership: Membership,
    tuning: Tuning,
    round: u32,
    buf: Vec<u8>,
    /// The last completed round's results, kept for a regrouping (see
    /// [`Worker::set_membership`]).
    last: Option<LastRound>,
    /// Whether the next round also sends the last one's results again (the epoch changed).
    replay: bool,
}

/// A completed round's results as they arrived: each chunk's exponent and sum, in units of the
/// job's fixed point for `workers`.
#[derive(Debug, Clone)]
struct LastRound {
    workers: u16,
    chunks: Vec<(i8, Vec<i32>)>,
}

/// A round's input as the caller gave it.
#[derive(Debug, Clone)]
enum Input {
    I32(Vec<i32>),
    F32(Vec<f32>),
}

impl Input {
    /// Chunk `c` as it travels for a job of `workers`: exponent and values.
    fn chunk(&self, range: std::ops::Range<usize>, workers: u16) -> (i8, Vec<i32>) {
        match self {
            Input::I32(v) => (0, v[range].to_vec()),
            Input::F32(v) => fixed::quantize(&v[range], workers),
        }
    }
}

#[derive(Clone, Copy)]
struct Pending {
    sent_at: Instant,
    timeout: Duration,
    done: bool,
    in_flight: bool,
    /// A digest of the result taken (exponent and sum), to tell a repeat from a conflict.
    digest: u64,
}

impl Worker {
    /// A worker sending from `socket` (bound to the address the job registered for it).
    pub fn new(socket: UdpSocket, membership: Membership, tuning: Tuning) -> Self {
        Worker {
            socket,
            membership,
            tuning,
            round: 0,
            buf: vec![0u8; 65536],
            last: None,
            replay: false,
        }
    }

    /// The round the next call sums.
    pub fn round(&self) -> u32 {
        self.round
    }

    /// Starts counting rounds at `round` (a worker that joins a running job).
    pub fn set_round(&mut self, round: u32) {
        self.round = round;
        self.last = None;
    }

    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Takes a new membership (a regrouping: the aggregator moved, or a worker left an elastic
    /// job). The round that failed under the old one is summed again, whole, under the new
    /// epoch by the next call: results of the old epoch are never mixed with the new one's.
    ///
    /// Workers can be one round apart when the epoch changes (a fast one had every result of
    /// round r before the old aggregator died, a slow one had not), so the next call also sends
    /// this worker's stored *results* of its last completed round, flagged REPLAY: the new
    /// aggregator takes each as that chunk's result, so the slow workers get the very bits the
    /// fast ones already have (a re-sum of float32 could differ in the last bits, because the
    /// aggregator's re-scaling depends on arrival order), and the fast ones take the echo only
    /// as an acknowledgement. A result is re-based onto the new epoch's fixed point if the
    /// number of workers changed ([`fixed::rebase`]).
    pub fn set_membership(&mut self, membership: Membership) {
        if membership.epoch != self.membership.epoch {
            self.replay = self.last.is_some();
        }
        self.membership = membership;
    }

    /// Sums `grad` (int32) with every worker's, in place.
    pub fn all_reduce_i32(&mut self, grad: &mut [i32]) -> Result<RoundStats, AggError> {
        self.check(grad.len(), Dtype::I32)?;
        let input = Input::I32(grad.to_vec());
        self.round_trip(&input, |range, _exp, values| {
            grad[range].copy_from_slice(values)
        })
        .map(|(stats, last)| self.finish(last, stats))
    }

    /// Sums `grad` (float32) with every worker's, in place, within [`fixed::error_bound`].
    pub fn all_reduce_f32(&mut self, grad: &mut [f32]) -> Result<RoundStats, AggError> {
        self.check(grad.len(), Dtype::F32)?;
        fixed::check_finite(grad)?;
        let workers = self.membership.workers;
        let input = Input::F32(grad.to_vec());
        self.round_trip(&input, |range, exp, values| {
            grad[range].copy_from_slice(&fixed::dequantize(values, exp, workers))
        })
        .map(|(stats, last)| self.finish(last, stats))
    }

    fn finish(&mut self, last: LastRound, stats: RoundStats) -> RoundStats {
        self.last = Some(last);
        self.replay = false;
        self.round = self.round.wrapping_add(1);
        stats
    }

    fn check(&self, len: usize, dtype: Dtype) -> Result<(), AggError> {
        let m = &self.membership;
        if len != m.geometry.values as usize {
            return Err(AggError::Size {
                job: m.job,
                got: len,
                want: m.geometry.values,
            });
        }
        if dtype != m.dtype {
            return Err(AggError::Dtype {
                job: m.job,
                want: m.dtype,
                got: dtype,
            });
        }
        Ok(())
    }

    /// One round: every chunk of `input` sent, resent until its result came, and `store(range,
    /// exp, sum)` given each result; returns the results as they came, for a replay. After a
    /// regrouping the last round's results go too, and their echoes only acknowledge them.
    fn round_trip(
        &mut self,
        input: &Input,
        mut store: impl FnMut(std::ops::Range<usize>, i8, &[i32]),
    ) -> Result<(RoundStats, LastRound), AggError> {
        let m = self.membership;
        let g = m.geometry;
        let chunks = g.chunks();
        let range = |c: u32| g.chunk_start(c)..g.chunk_start(c) + g.chunk_len(c);
        let frame = |round: u32, c: u32, (exp, values): (i8, Vec<i32>), flags: u8| {
            wire::encode(
                &Header {
                    kind: Kind::Data,
                    flags,
                    exp,
                    job: m.job,
                    epoch: m.epoch,
                    round,
                    chunk: c,
                    worker: m.worker,
                    count: 0,
                    contributors: 0,
                    token: m.token,
                },
                &values,
            )
        };
        let previous = self.round.wrapping_sub(1);
        let replayed = match (&self.last, self.replay) {
            (Some(last), true) => Some(last),
            _ => None,
        };
        // Frame i < chunks is this round's chunk i; i >= chunks the last round's result of chunk
        // i - chunks, replayed: sent at once, outside the window, and resent until acknowledged
        // or until this round is complete, but never waited for. A worker that was itself behind
        // replays a round everybody has; it completes a slot nobody waits on.
        let mut frames: Vec<Vec<u8>> = (0..chunks)
            .map(|c| frame(self.round, c, input.chunk(range(c), m.workers), 0))
            .collect();
        if let Some(last) = replayed {
            frames.extend(last.chunks.iter().enumerate().map(|(c, (exp, values))| {
                let rebased = match m.dtype {
                    Dtype::I32 => (*exp, values.clone()),
                    Dtype::F32 => fixed::rebase(*exp, values, last.workers, m.workers),
                };
                frame(previous, c as u32, rebased, FLAG_REPLAY)
            }));
        }
        let mut results: Vec<(i8, Vec<i32>)> = vec![(0, Vec::new()); chunks as usize];
        let now = Instant::now();
        let started = now;
        let mut pending = vec![
            Pending {
                sent_at: now,
                timeout: self.tuning.timeout,
                done: false,
                in_flight: false,
                digest: 0,
            };
            frames.len()
        ];
        let mut stats = RoundStats::default();
        // Indices in flight, so that the resend scan after each result costs the window, not
        // the gradient (a full scan made a round quadratic in its chunks).
        let mut flying: Vec<usize> = Vec::with_capacity(self.tuning.window);
        for i in chunks as usize..frames.len() {
            self.socket.send_to(&frames[i], m.aggregator)?;
            pending[i].in_flight = true;
            flying.push(i);
            stats.sent += 1;
        }
        // The socket's read timeout as last set, in whole milliseconds: set again only when it
        // changes.
        let mut read_timeout_ms = 0u128;
        let mut next = 0usize;
        let mut first_sent = 0usize;
        let mut in_flight = 0usize;
        let mut left = chunks as usize;
        let mut last_progress = Instant::now();
        while left > 0 {
            // Fill the window.
            // With a slot pool only the first `p` chunks go from here; each later one goes
            // when its slot is free (below, as a result comes in).
            while in_flight < self.tuning.window
                && next < chunks as usize
                && self.tuning.slot_pool.is_none_or(|p| next < p.max(1))
            {
                let i = next;
                self.socket.send_to(&frames[i], m.aggregator)?;
                pending[i].sent_at = Instant::now();
                pending[i].in_flight = true;
                flying.push(i);
                stats.sent += 1;
                in_flight += 1;
                next += 1;
                first_sent += 1;
                if first_sent == chunks as usize {
                    stats.all_sent_after = started.elapsed();
                }
            }
            // Resend what timed out; the earliest deadline bounds the wait.
            let now = Instant::now();
            let mut wait = self.tuning.max_timeout;
            for &i in &flying {
                let p = &mut pending[i];
                let due = p.sent_at + p.timeout;
                if due <= now {
                    self.socket
                        .send_to(&frames_retx(&frames[i]), m.aggregator)?;
                    stats.resent += 1;
                    p.sent_at = now;
                    p.timeout = (p.timeout * 2).min(self.tuning.max_timeout);
                    wait = wait.min(p.timeout);
                } else {
                    wait = wait.min(due - now);
                }
            }
            if last_progress.elapsed() > self.tuning.give_up {
                return Err(AggError::Timeout {
                    job: m.job,
                    aggregator: m.aggregator,
                    round: self.round,
                    missing: left,
                    waited: last_progress.elapsed(),
                });
            }
            let wait_ms = wait.as_millis().max(1);
            if wait_ms != read_timeout_ms {
                self.socket
                    .set_read_timeout(Some(Duration::from_millis(wait_ms as u64)))?;
                read_timeout_ms = wait_ms;
            }
            let (n, from) = match self.socket.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            // Results come from the aggregator's address and port only (the XDP program
            // answers from the address the worker sent to, and its fan-out keeps it), with its
            // result token.
            if from != std::net::SocketAddr::V4(m.aggregator) {
                stats.ignored += 1;
                stats.foreign += 1;
                continue;
            }
            let Ok((h, body)) = Header::parse(&self.buf[..n]) else {
                stats.ignored += 1;
                continue;
            };
            if h.token != m.result_token {
                stats.ignored += 1;
                stats.foreign += 1;
                continue;
            }
            let i = match h.round {
                r if r == self.round => h.chunk as usize,
                r if replayed.is_some() && r == previous => chunks as usize + h.chunk as usize,
                _ => usize::MAX,
            };
            if h.kind != Kind::Result
                || h.job != m.job
                || h.epoch != m.epoch
                || i >= pending.len()
                || usize::from(h.count) != g.chunk_len(h.chunk)
            {
                stats.ignored += 1;
                continue;
            }
            let digest = result_digest(h.exp, body);
            if pending[i].done {
                stats.ignored += 1;
                if pending[i].digest != digest {
                    stats.conflicting += 1;
                }
                continue;
            }
            let was_in_flight = std::mem::replace(&mut pending[i].in_flight, false);
            if was_in_flight {
                if let Some(k) = flying.iter().position(|x| *x == i) {
                    flying.swap_remove(k);
                }
            }
            pending[i].done = true;
            pending[i].digest = digest;
            if i >= chunks as usize {
                continue; // a replay's acknowledgement
            }
            let values = wire::values(body);
            store(range(h.chunk), h.exp, &values);
            results[h.chunk as usize] = (h.exp, values);
            if was_in_flight {
                in_flight -= 1;
            }
            // A pool's slot is free once its chunk is summed: the chunk `p` further reuses it.
            if let Some(p) = self.tuning.slot_pool {
                let j = i + p.max(1);
                if j < chunks as usize && !pending[j].in_flight && !pending[j].done {
                    self.socket.send_to(&frames[j], m.aggregator)?;
                    pending[j].sent_at = Instant::now();
                    pending[j].in_flight = true;
                    flying.push(j);
                    stats.sent += 1;
                    in_flight += 1;
                    next = next.max(j + 1);
                    first_sent += 1;
                    if first_sent == chunks as usize {
                        stats.all_sent_after = started.elapsed();
                    }
                }
            }
            stats.results += 1;
            left -= 1;
            last_progress = Instant::now();
        }
        let last = LastRound {
            workers: m.workers,
            chunks: results,
        };
        Ok((stats, last))
    }
}

/// FNV-1a over a result's exponent and values: equal results, equal digests.
fn result_digest(exp: i8, body: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::iter::once(exp as u8).chain(body.iter().copied()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The same frame marked as a resend.
fn frames_retx(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[6] |= FLAG_RETX;
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::net::Ipv4Addr;

    /// A one-worker job of 20 chunks against a fake aggregator on loopback that answers every
    /// chunk at once except chunk 0, which it answers only on its third resend. Returns the
    /// chunks the fake had received when it answered chunk 0, and the round's result.
    fn hold_chunk_zero(tuning: Tuning) -> (BTreeSet<u32>, Vec<i32>) {
        let agg = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let std::net::SocketAddr::V4(agg_addr) = agg.local_addr().unwrap() else {
            unreachable!("bound to an IPv4 address")
        };
        let geometry = Geometry {
            values: 20 * 8,
            chunk_values: 8,
        };
        let m = Membership {
            job: 1,
            epoch: 1,
            worker: 0,
            workers: 1,
            aggregator: agg_addr,
            geometry,
            dtype: Dtype::I32,
            token: 7,
            result_token: 8,
        };
        let fake = std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            let mut at_answer = None;
            let mut resends_of_zero = 0;
            let mut answered = BTreeSet::new();
            let mut buf = [0u8; 2048];
            agg.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            while answered.len() < 20 {
                let (n, from) = agg.recv_from(&mut buf).expect("the worker keeps sending");
                let (h, body) = Header::parse(&buf[..n]).unwrap();
                seen.insert(h.chunk);
                if h.chunk == 0 && resends_of_zero < 3 {
                    if h.flags & FLAG_RETX != 0 {
                        resends_of_zero += 1;
                    }
                    if resends_of_zero < 3 {
                        continue;
                    }
                    at_answer = Some(seen.clone());
                }
                assert_eq!(h.token, 7, "the worker's token");
                let reply = Header {
                    kind: Kind::Result,
                    worker: 0,
                    contributors: 2,
                    token: 8,
                    ..h
                };
                agg.send_to(&wire::encode(&reply, &wire::values(body)), from)
                    .unwrap();
                answered.insert(h.chunk);
            }
            at_answer.expect("chunk 0 was answered")
        });
        let mut w = Worker::new(sock, m, tuning);
        let mut grad: Vec<i32> = (0..160).collect();
        w.all_reduce_i32(&mut grad).unwrap();
        (fake.join().unwrap(), grad)
    }

    /// Issue 25, finding 6: a result from anyone but the job's aggregator, or without its result
    /// token, is ignored, even one that names the job, epoch, round and chunk and arrives before
    /// the aggregator's.
    #[test]
    fn a_forged_result_from_another_address_is_ignored() {
        let agg = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let forger = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let std::net::SocketAddr::V4(agg_addr) = agg.local_addr().unwrap() else {
            unreachable!("bound to an IPv4 address")
        };
        let m = Membership {
            job: 4,
            epoch: 2,
            worker: 0,
            workers: 1,
            aggregator: agg_addr,
            geometry: Geometry {
                values: 8,
                chunk_values: 4,
            },
            dtype: Dtype::I32,
            token: 0x1111_2222,
            result_token: 0x3333_4444,
        };
        let fake = std::thread::spawn(move || {
            let mut answered = BTreeSet::new();
            let mut buf = [0u8; 2048];
            agg.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            while answered.len() < 2 {
                let (n, from) = agg.recv_from(&mut buf).expect("the worker keeps sending");
                let (h, body) = Header::parse(&buf[..n]).unwrap();
                let reply = Header {
                    kind: Kind::Result,
                    worker: 0,
                    contributors: 1,
                    token: 0x3333_4444,
                    ..h
                };
                if answered.insert(h.chunk) {
                    // The same result with another sum, first: from another port of the same
                    // host with the right token, and from the aggregator's own address (as a
                    // host that forges it would) with a wrong one.
                    let forged = wire::encode(&reply, &[666; 4]);
                    forger.send_to(&forged, from).unwrap();
                    let guessed = Header {
                        token: 0x3333_4445,
                        ..reply
                    };
                    agg.send_to(&wire::encode(&guessed, &[667; 4]), from)
                        .unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                }
                agg.send_to(&wire::encode(&reply, &wire::values(body)), from)
                    .unwrap();
            }
        });
        let mut w = Worker::new(sock, m, Tuning::default());
        let mut grad: Vec<i32> = (1..=8).collect();
        let stats = w.all_reduce_i32(&mut grad).unwrap();
        fake.join().unwrap();
        assert_eq!(
            grad,
            (1..=8).collect::<Vec<i32>>(),
            "the aggregator's sums only"
        );
        assert_eq!(stats.foreign, 4, "each forged result counted");
        assert_eq!(stats.conflicting, 0);
    }

    #[test]
    fn a_slot_pool_holds_back_chunk_k_plus_p_until_chunk_k_is_summed() {
        let (seen, grad) = hold_chunk_zero(Tuning {
            slot_pool: Some(4),
            ..Tuning::default()
        });
        // 4, 8, 12 and 16 reuse chunk 0's slot in turn: none could go before its result.
        let all: BTreeSet<u32> = (0..20).collect();
        let blocked: BTreeSet<u32> = [4, 8, 12, 16].into();
        assert_eq!(seen, &all - &blocked);
        assert_eq!(grad, (0..160).collect::<Vec<i32>>());
    }

    #[test]
    fn the_whole_gradient_cache_sends_past_a_chunk_whose_result_is_late() {
        let (seen, grad) = hold_chunk_zero(Tuning::default());
        assert_eq!(seen, (0..20).collect());
        assert_eq!(grad, (0..160).collect::<Vec<i32>>());
    }
}
