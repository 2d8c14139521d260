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
use crate::wire::{self, Dtype, Geometry, Header, Kind, FLAG_RETX};

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
}

/// The client's timing and window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Chunks awaiting their result at once.
    pub window: usize,
    /// First resend timeout of a chunk.
    pub timeout: Duration,
    /// The timeout doubles on each resend of a chunk, up to this.
    pub max_timeout: Duration,
    /// A round that receives no new result for this long fails.
    pub give_up: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            window: 256,
            timeout: Duration::from_millis(20),
            max_timeout: Duration::from_millis(500),
            give_up: Duration::from_secs(10),
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
    /// Results for chunks already received, or for another job, epoch or round.
    pub ignored: u64,
}

/// One worker of one job.
#[derive(Debug)]
pub struct Worker {
    socket: UdpSocket,
    membership: Membership,
    tuning: Tuning,
    round: u32,
    buf: Vec<u8>,
}

#[derive(Clone, Copy)]
struct Pending {
    sent_at: Instant,
    timeout: Duration,
    done: bool,
    in_flight: bool,
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
        }
    }

    /// The round the next call sums.
    pub fn round(&self) -> u32 {
        self.round
    }

    /// Starts counting rounds at `round` (a worker that joins a running job).
    pub fn set_round(&mut self, round: u32) {
        self.round = round;
    }

    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Sums `grad` (int32) with every worker's, in place.
    pub fn all_reduce_i32(&mut self, grad: &mut [i32]) -> Result<RoundStats, AggError> {
        self.check(grad.len(), Dtype::I32)?;
        let input = grad.to_vec();
        self.round_trip(
            |_, range| (0, input[range].to_vec()),
            |range, _exp, values| grad[range].copy_from_slice(values),
        )
    }

    /// Sums `grad` (float32) with every worker's, in place, within [`fixed::error_bound`].
    pub fn all_reduce_f32(&mut self, grad: &mut [f32]) -> Result<RoundStats, AggError> {
        self.check(grad.len(), Dtype::F32)?;
        fixed::check_finite(grad)?;
        let workers = self.membership.workers;
        let input = grad.to_vec();
        self.round_trip(
            |_, range| fixed::quantize(&input[range], workers),
            |range, exp, values| {
                grad[range].copy_from_slice(&fixed::dequantize(values, exp, workers))
            },
        )
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

    /// One round: `encode(chunk, range)` gives a chunk's exponent and values, `store(range,
    /// exp, sum)` takes its result.
    fn round_trip(
        &mut self,
        mut encode: impl FnMut(u32, std::ops::Range<usize>) -> (i8, Vec<i32>),
        mut store: impl FnMut(std::ops::Range<usize>, i8, &[i32]),
    ) -> Result<RoundStats, AggError> {
        let m = self.membership;
        let g = m.geometry;
        let chunks = g.chunks();
        let range = |c: u32| g.chunk_start(c)..g.chunk_start(c) + g.chunk_len(c);
        let frames: Vec<Vec<u8>> = (0..chunks)
            .map(|c| {
                let (exp, values) = encode(c, range(c));
                wire::encode(
                    &Header {
                        kind: Kind::Data,
                        flags: 0,
                        exp,
                        job: m.job,
                        epoch: m.epoch,
                        round: self.round,
                        chunk: c,
                        worker: m.worker,
                        count: 0,
                    },
                    &values,
                )
            })
            .collect();
        let now = Instant::now();
        let mut pending = vec![
            Pending {
                sent_at: now,
                timeout: self.tuning.timeout,
                done: false,
                in_flight: false,
            };
            frames.len()
        ];
        let mut stats = RoundStats::default();
        let mut next = 0usize;
        let mut in_flight = 0usize;
        let mut left = frames.len();
        let mut last_progress = Instant::now();
        while left > 0 {
            // Fill the window.
            while in_flight < self.tuning.window && next < frames.len() {
                self.socket.send_to(&frames[next], m.aggregator)?;
                pending[next].sent_at = Instant::now();
                pending[next].in_flight = true;
                stats.sent += 1;
                in_flight += 1;
                next += 1;
            }
            // Resend what timed out; the earliest deadline bounds the wait.
            let now = Instant::now();
            let mut wait = self.tuning.max_timeout;
            for (c, p) in pending.iter_mut().enumerate() {
                if !p.in_flight {
                    continue;
                }
                let due = p.sent_at + p.timeout;
                if due <= now {
                    self.socket
                        .send_to(&frames_retx(&frames[c]), m.aggregator)?;
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
            self.socket
                .set_read_timeout(Some(wait.max(Duration::from_micros(100))))?;
            let (n, _from) = match self.socket.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            let Ok((h, body)) = Header::parse(&self.buf[..n]) else {
                stats.ignored += 1;
                continue;
            };
            let c = h.chunk as usize;
            if h.kind != Kind::Result
                || h.job != m.job
                || h.epoch != m.epoch
                || h.round != self.round
                || c >= pending.len()
                || pending[c].done
                || usize::from(h.count) != g.chunk_len(h.chunk)
            {
                stats.ignored += 1;
                continue;
            }
            store(range(h.chunk), h.exp, &wire::values(body));
            pending[c].done = true;
            if pending[c].in_flight {
                pending[c].in_flight = false;
                in_flight -= 1;
            }
            stats.results += 1;
            left -= 1;
            last_progress = Instant::now();
        }
        self.round = self.round.wrapping_add(1);
        Ok(stats)
    }
}

/// The same frame marked as a resend.
fn frames_retx(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[6] |= FLAG_RETX;
    f
}
