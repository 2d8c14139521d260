//! The aggregator's state machine in plain Rust, rule for rule the XDP program's
//! (`ebpf/bpf/aggregator.bpf.c`): the same admission checks in the same order, the same slot
//! states, the same counters.
//!
//! Two uses: the reference the XDP program is tested against (the same frames through both must
//! give the same counters and the same replies), and the user-space UDP aggregator the
//! benchmark runs on the same protocol. It works on UDP payloads: the Ethernet/IPv4/UDP checks
//! the program makes before it reads our header are the socket's business here.

use std::collections::BTreeMap;
use std::net::SocketAddrV4;

use crate::fixed::add_into;
use crate::wire::{self, Dtype, Geometry, Header, Kind, WORKERS_MAX};

/// What the aggregator made of a frame (`enum agg_counter_idx`, same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    Added,
    Completed,
    ResultResent,
    Duplicate,
    Stale,
    Ahead,
    Foreign,
    UnknownJob,
    BadHeader,
    PassNotAgg,
    FanoutSent,
    FanoutFailed,
    Forwarded,
    ForwardResent,
    ForwardFailed,
    ParentResult,
}

impl Counter {
    /// Every counter in index order.
    pub const ALL: [Counter; 16] = [
        Counter::Added,
        Counter::Completed,
        Counter::ResultResent,
        Counter::Duplicate,
        Counter::Stale,
        Counter::Ahead,
        Counter::Foreign,
        Counter::UnknownJob,
        Counter::BadHeader,
        Counter::PassNotAgg,
        Counter::FanoutSent,
        Counter::FanoutFailed,
        Counter::Forwarded,
        Counter::ForwardResent,
        Counter::ForwardFailed,
        Counter::ParentResult,
    ];

    /// Stable snake_case name, the metric label: never rename.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Added => "added",
            Counter::Completed => "completed",
            Counter::ResultResent => "result_resent",
            Counter::Duplicate => "duplicate",
            Counter::Stale => "stale",
            Counter::Ahead => "ahead",
            Counter::Foreign => "foreign",
            Counter::UnknownJob => "unknown_job",
            Counter::BadHeader => "bad_header",
            Counter::PassNotAgg => "pass_not_agg",
            Counter::FanoutSent => "fanout_sent",
            Counter::FanoutFailed => "fanout_failed",
            Counter::Forwarded => "forwarded",
            Counter::ForwardResent => "forward_resent",
            Counter::ForwardFailed => "forward_failed",
            Counter::ParentResult => "parent_result",
        }
    }

    /// Index into the program's counter maps.
    pub fn index(self) -> u32 {
        self as u32
    }
}

/// A job as an aggregator serves it: what the daemon writes into `agg_jobs` and `agg_members`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    pub id: u32,
    pub epoch: u32,
    pub geometry: Geometry,
    pub dtype: Dtype,
    /// The members of this epoch by worker index; a chunk completes with one contribution from
    /// each. In a tree, a parent's members include its cluster aggregators (their
    /// [`wire::PORT`]).
    pub members: Vec<SocketAddrV4>,
    /// The token each member's DATA frames must carry, by worker index (one per member): a
    /// frame from a member's address without it is foreign, so a host that forges the address
    /// but cannot read the member's traffic can neither add to a sum, nor replay a result, nor
    /// re-point the member's results.
    pub tokens: Vec<u32>,
    /// The token this aggregator's RESULT frames carry, which its members check.
    pub result_token: u32,
    /// A cluster aggregator's parent: where its partial sums go, whose results it takes.
    pub parent: Option<Parent>,
}

/// A cluster aggregator's parent in a job's tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parent {
    /// The parent aggregator's address ([`wire::PORT`]).
    pub addr: SocketAddrV4,
    /// This aggregator's worker index in the parent's sums.
    pub worker: u16,
    /// This aggregator's token at the parent: what its partial sums carry.
    pub token: u32,
    /// The parent's result token: a RESULT without it is foreign.
    pub result_token: u32,
}

impl JobSpec {
    /// Contributions that complete a chunk.
    pub fn workers(&self) -> u16 {
        u16::try_from(self.members.len()).unwrap_or(u16::MAX)
    }
}

/// What to do with a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Consumed (summed, or refused): nothing is sent.
    Drop,
    /// The chunk was complete already: this result back to the sender only.
    Reply(Vec<u8>),
    /// This frame completed the chunk: this result to every member of the job.
    Fanout(Vec<u8>),
    /// A cluster aggregator's partial sum (a DATA frame) to its parent.
    Up(Vec<u8>),
}

/// The counter a frame counts and what follows from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub counter: Counter,
    pub action: Action,
}

impl Outcome {
    fn drop(counter: Counter) -> Self {
        Outcome {
            counter,
            action: Action::Drop,
        }
    }
}

/// `enum agg_slot_state`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Summing,
    /// `acc` is the chunk's result.
    Done,
    /// A cluster aggregator's partial sum went up with these flags; waiting for the result.
    Forwarded { up_flags: u8 },
}

#[derive(Clone, Debug, Default)]
struct Slot {
    job: u32,
    epoch: u32,
    round: u32,
    seen: u64,
    count: u16,
    exp: i8,
    state: State,
    acc: Vec<i32>,
}

#[derive(Debug)]
struct Served {
    spec: JobSpec,
    /// Two per chunk: round parity.
    slots: Vec<Slot>,
}

/// The reference aggregator.
#[derive(Debug, Default)]
pub struct Aggregator {
    jobs: BTreeMap<u32, Served>,
}

impl Aggregator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `spec` (a new job, or a new epoch of one): the slots of an existing job with the
    /// same geometry are kept, as the program's are, and a new epoch makes them free.
    pub fn set_job(&mut self, spec: JobSpec) {
        let slots_needed = usize::try_from(spec.geometry.chunks()).unwrap_or(0) * 2;
        match self.jobs.get_mut(&spec.id) {
            Some(served) if served.slots.len() == slots_needed => served.spec = spec,
            _ => {
                let slots = vec![Slot::default(); slots_needed];
                self.jobs.insert(spec.id, Served { spec, slots });
            }
        }
    }

    /// Stops serving a job.
    pub fn remove_job(&mut self, id: u32) {
        self.jobs.remove(&id);
    }

    /// The job's members, for a fan-out.
    pub fn members(&self, job: u32) -> &[SocketAddrV4] {
        self.jobs
            .get(&job)
            .map(|s| s.spec.members.as_slice())
            .unwrap_or(&[])
    }

    /// The job's parent, where [`Action::Up`] frames go.
    pub fn parent(&self, job: u32) -> Option<Parent> {
        self.jobs.get(&job).and_then(|s| s.spec.parent)
    }

    /// One frame from `from` (a UDP payload sent to [`wire::PORT`]).
    pub fn receive(&mut self, from: SocketAddrV4, payload: &[u8]) -> Outcome {
        let Ok((h, body)) = Header::parse(payload) else {
            return Outcome::drop(Counter::BadHeader);
        };
        // The program wants the frame to end exactly after the values announced.
        if !matches!(h.kind, Kind::Data | Kind::Result)
            || payload.len() != wire::HEADER_LEN + body.len()
        {
            return Outcome::drop(Counter::BadHeader);
        }
        let Some(served) = self.jobs.get_mut(&h.job) else {
            return Outcome::drop(Counter::UnknownJob);
        };
        let spec = &served.spec;
        let geometry = spec.geometry;
        if h.chunk >= geometry.chunks()
            || usize::from(h.count) != geometry.chunk_len(h.chunk)
            || (spec.dtype == Dtype::I32 && h.exp != 0)
            || usize::from(h.worker) >= WORKERS_MAX
        {
            return Outcome::drop(Counter::BadHeader);
        }
        if h.epoch != spec.epoch {
            return Outcome::drop(Counter::Stale);
        }
        // A result only from this cluster aggregator's parent.
        let from_parent = h.kind == Kind::Result;
        if from_parent && spec.parent.map(|p| (p.addr, p.result_token)) != Some((from, h.token)) {
            return Outcome::drop(Counter::Foreign);
        }
        let w = usize::from(h.worker);
        if !from_parent
            && (spec.members.get(w) != Some(&from) || spec.tokens.get(w) != Some(&h.token))
        {
            return Outcome::drop(Counter::Foreign);
        }
        let result_token = spec.result_token;
        let parent = spec.parent;
        let workers = spec.workers();
        let index = usize::try_from(h.chunk).unwrap_or(usize::MAX) * 2 + (h.round & 1) as usize;
        let Some(slot) = served.slots.get_mut(index) else {
            return Outcome::drop(Counter::BadHeader);
        };
        let values = wire::values(body);
        let bit = 1u64 << h.worker;
        let replay = h.flags & wire::FLAG_REPLAY != 0;

        let mut fresh = slot.job != h.job || slot.epoch != h.epoch;
        if !fresh && h.round != slot.round {
            if (h.round.wrapping_sub(slot.round) as i32) < 0 {
                return Outcome::drop(Counter::Stale);
            }
            // Only a result may be overwritten by round + 2.
            if slot.state != State::Done {
                return Outcome::drop(Counter::Ahead);
            }
            fresh = true;
        }
        if !fresh && slot.state == State::Done {
            if from_parent {
                return Outcome::drop(Counter::Duplicate);
            }
            return Outcome {
                counter: Counter::ResultResent,
                action: Action::Reply(result(&h, slot, result_token)),
            };
        }
        if from_parent {
            // The root's result, whatever this aggregator had summed or sent up of the round.
            *slot = Slot {
                job: h.job,
                epoch: h.epoch,
                round: h.round,
                seen: u64::MAX,
                count: h.contributors,
                exp: h.exp,
                state: State::Done,
                acc: values,
            };
            return Outcome {
                counter: Counter::ParentResult,
                action: Action::Fanout(result(&h, slot, result_token)),
            };
        }
        // A member timed out waiting for a chunk whose partial went up: send it up again. A
        // replayed result still replaces a partial that was summed.
        if let (false, State::Forwarded { up_flags }, Some(p)) = (fresh, slot.state, parent) {
            if !(replay && up_flags & wire::FLAG_REPLAY == 0) {
                return Outcome {
                    counter: Counter::ForwardResent,
                    action: Action::Up(partial(&h, slot, p, up_flags)),
                };
            }
        }
        if fresh || replay {
            // A replayed result is the sum: it counts as every worker's contribution and
            // overrides what was added of the same round.
            *slot = Slot {
                job: h.job,
                epoch: h.epoch,
                round: h.round,
                seen: bit,
                count: if replay { workers } else { 1 },
                exp: h.exp,
                state: State::Summing,
                acc: values,
            };
        } else if slot.seen & bit != 0 {
            return Outcome::drop(Counter::Duplicate);
        } else {
            add_into(&mut slot.acc, &mut slot.exp, &values, h.exp);
            slot.seen |= bit;
            slot.count += 1;
        }
        if slot.count >= workers {
            if let Some(p) = parent {
                // A cluster aggregator: the partial sum goes up, the result comes down.
                let up_flags = if replay { wire::FLAG_REPLAY } else { 0 };
                slot.state = State::Forwarded { up_flags };
                return Outcome {
                    counter: Counter::Forwarded,
                    action: Action::Up(partial(&h, slot, p, up_flags)),
                };
            }
            slot.state = State::Done;
            Outcome {
                counter: Counter::Completed,
                action: Action::Fanout(result(&h, slot, result_token)),
            }
        } else {
            Outcome::drop(Counter::Added)
        }
    }
}

/// The DATA frame carrying a forwarded slot's partial sum to the parent.
fn partial(h: &Header, slot: &Slot, parent: Parent, up_flags: u8) -> Vec<u8> {
    let header = Header {
        kind: Kind::Data,
        flags: up_flags,
        exp: slot.exp,
        worker: parent.worker,
        contributors: 0,
        token: parent.token,
        ..*h
    };
    wire::encode(&header, &slot.acc)
}

/// The result frame for a complete slot, in answer to `h`, carrying this aggregator's result
/// token.
fn result(h: &Header, slot: &Slot, token: u32) -> Vec<u8> {
    let header = Header {
        kind: Kind::Result,
        flags: 0,
        exp: slot.exp,
        worker: 0,
        contributors: slot.count,
        token,
        ..*h
    };
    wire::encode(&header, &slot.acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn addr(i: u8) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, i), 40000 + u16::from(i))
    }

    fn job(workers: u8, values: u32) -> JobSpec {
        JobSpec {
            id: 1,
            epoch: 1,
            geometry: Geometry {
                values,
                chunk_values: 4,
            },
            dtype: Dtype::I32,
            members: (0..workers).map(addr).collect(),
            tokens: (0..workers).map(|w| token(u16::from(w))).collect(),
            result_token: 0x5157_0001,
            parent: None,
        }
    }

    fn token(worker: u16) -> u32 {
        0x7070_0000 | u32::from(worker)
    }

    fn data(worker: u16, round: u32, chunk: u32, values: &[i32]) -> Vec<u8> {
        wire::encode(
            &Header {
                kind: Kind::Data,
                flags: 0,
                exp: 0,
                job: 1,
                epoch: 1,
                round,
                chunk,
                worker,
                count: 0,
                contributors: 0,
                token: token(worker),
            },
            values,
        )
    }

    fn sum_of(action: &Action) -> Vec<i32> {
        let (Action::Reply(b) | Action::Fanout(b)) = action else {
            panic!("no result in {action:?}");
        };
        let (_, body) = Header::parse(b).unwrap();
        wire::values(body)
    }

    #[test]
    fn the_last_contribution_completes_once_and_later_ones_get_the_stored_sum() {
        let mut agg = Aggregator::new();
        agg.set_job(job(3, 6));
        let a = agg.receive(addr(0), &data(0, 0, 0, &[1, 2, 3, 4]));
        assert_eq!(a.counter, Counter::Added);
        let dup = agg.receive(addr(0), &data(0, 0, 0, &[1, 2, 3, 4]));
        assert_eq!(dup.counter, Counter::Duplicate);
        agg.receive(addr(1), &data(1, 0, 0, &[10, 20, 30, 40]));
        let last = agg.receive(addr(2), &data(2, 0, 0, &[i32::MAX, 0, 0, -4]));
        assert_eq!(last.counter, Counter::Completed);
        assert_eq!(
            sum_of(&last.action),
            [i32::MAX.wrapping_add(11), 22, 33, 40]
        );
        let again = agg.receive(addr(1), &data(1, 0, 0, &[10, 20, 30, 40]));
        assert_eq!(again.counter, Counter::ResultResent);
        assert_eq!(sum_of(&again.action), sum_of(&last.action));
    }

    #[test]
    fn rounds_alternate_slots_and_may_not_overrun_an_incomplete_one() {
        let mut agg = Aggregator::new();
        agg.set_job(job(2, 4));
        agg.receive(addr(0), &data(0, 0, 0, &[1; 4]));
        // round 2 is two ahead of an incomplete round 0 in the same slot
        assert_eq!(
            agg.receive(addr(1), &data(1, 2, 0, &[1; 4])).counter,
            Counter::Ahead
        );
        // round 1 uses the other slot
        assert_eq!(
            agg.receive(addr(1), &data(1, 1, 0, &[5; 4])).counter,
            Counter::Added
        );
        assert_eq!(
            agg.receive(addr(1), &data(1, 0, 0, &[1; 4])).counter,
            Counter::Completed
        );
        assert_eq!(
            agg.receive(addr(0), &data(0, 2, 0, &[7; 4])).counter,
            Counter::Added
        );
        assert_eq!(
            agg.receive(addr(1), &data(1, 0, 0, &[1; 4])).counter,
            Counter::Stale
        );
    }

    #[test]
    fn strangers_and_wrong_shapes_are_refused() {
        let mut agg = Aggregator::new();
        agg.set_job(job(2, 6));
        // worker 1's address claiming index 0
        assert_eq!(
            agg.receive(addr(1), &data(0, 0, 0, &[1; 4])).counter,
            Counter::Foreign
        );
        assert_eq!(
            agg.receive(addr(9), &data(1, 0, 0, &[1; 4])).counter,
            Counter::Foreign
        );
        // the last chunk holds 2 values, not 4
        assert_eq!(
            agg.receive(addr(0), &data(0, 0, 1, &[1; 4])).counter,
            Counter::BadHeader
        );
        assert_eq!(
            agg.receive(addr(0), &data(0, 0, 2, &[1; 2])).counter,
            Counter::BadHeader
        );
        let mut other = data(0, 0, 0, &[1; 4]);
        other[8] = 2; // job 2
        assert_eq!(agg.receive(addr(0), &other).counter, Counter::UnknownJob);
        assert_eq!(agg.receive(addr(0), b"hello").counter, Counter::BadHeader);
    }

    /// Issue 25, finding 6: a frame from a member's address without the member's token (what a
    /// host that forges the address sends) is foreign: it adds nothing, and a REPLAY of it does
    /// not become the chunk's result.
    #[test]
    fn a_forged_address_without_the_token_is_foreign() {
        let mut agg = Aggregator::new();
        agg.set_job(job(2, 4));
        let mut forged = data(1, 0, 0, &[9; 4]);
        forged[28..32].copy_from_slice(&(token(1) ^ 1).to_le_bytes());
        assert_eq!(agg.receive(addr(1), &forged).counter, Counter::Foreign);
        forged[6] |= wire::FLAG_REPLAY;
        assert_eq!(agg.receive(addr(1), &forged).counter, Counter::Foreign);
        // the members' own frames complete the chunk with their sum, answered with the token
        assert_eq!(
            agg.receive(addr(0), &data(0, 0, 0, &[1; 4])).counter,
            Counter::Added
        );
        let last = agg.receive(addr(1), &data(1, 0, 0, &[2; 4]));
        assert_eq!(last.counter, Counter::Completed);
        assert_eq!(sum_of(&last.action), [3; 4]);
        let (Action::Fanout(b) | Action::Reply(b)) = &last.action else {
            unreachable!()
        };
        assert_eq!(Header::parse(b).unwrap().0.token, 0x5157_0001);
    }
}
