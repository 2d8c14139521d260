//! Client sessions: what makes a retried write apply exactly once (Raft dissertation §6.3).
//!
//! Every write a client sends carries its session id (a random 64-bit client id), a sequence
//! number, and the lowest sequence number it still waits on (`first_unacked`). The state machine
//! keeps, per client, the reply of every write at or above `first_unacked`: a write that arrives
//! again (a follower retrying it on a new leader, or the client on another endpoint after a lost
//! reply) gets its first reply back and changes nothing. Replies below `first_unacked` are the
//! client's own acknowledgement that it has them, so they are dropped.
//!
//! The table is bounded and expired deterministically: time is a *replicated clock*, the largest
//! wall-clock stamp proposers put into the commands (never a local clock), sessions idle for
//! [`SESSION_TTL_MS`] of it are dropped, and beyond [`MAX_SESSIONS`] the least recently active
//! is. A write of a session the table no longer knows is refused when the client says it had
//! earlier replies (`first_unacked > 1`): whether that write already applied cannot be told any
//! more, so the client must treat its outcome as unknown and open a new session.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command::Response;

/// How long (replicated clock) a client's session outlives its last write.
pub const SESSION_TTL_MS: u64 = 10 * 60 * 1000;
/// Most sessions kept; beyond this the least recently active one is dropped.
pub const MAX_SESSIONS: usize = 16_384;
/// Most unacknowledged replies kept per session (a client with more writes in flight than this
/// loses exactly-once for the oldest ones, which it has certainly given up on).
pub const MAX_REPLIES_PER_SESSION: usize = 4_096;
/// How often (replicated clock) idle sessions are swept.
const SWEEP_EVERY_MS: u64 = 1_000;

/// Who sent a write, and which of its writes it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionTag {
    /// The client's random id.
    pub client: u64,
    /// This write's number in the client's sequence (from 1).
    pub seq: u64,
    /// The lowest sequence number whose reply the client has not yet received.
    pub first_unacked: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Session {
    /// Replies of the writes the client may still ask about, by sequence number.
    replies: BTreeMap<u64, Response>,
    /// Writes below this were acknowledged (or dropped): a retry of one is refused.
    floor: u64,
    /// Replicated clock at the session's last write.
    last_active_ms: u64,
}

/// What the table says about a write before it is applied.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Apply it, then [`Sessions::record`] the reply.
    Apply,
    /// Already applied: answer with the first reply, change nothing.
    Duplicate(Response),
    /// The outcome cannot be known (the session expired, or the client acknowledged it already).
    Refused(String),
}

/// The replicated session table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sessions {
    /// The replicated clock: the largest proposer stamp applied so far.
    clock_ms: u64,
    next_sweep_ms: u64,
    sessions: BTreeMap<u64, Session>,
    /// Writes answered from the table instead of applied again (kept for metrics and tests).
    duplicates: u64,
}

impl Sessions {
    /// Advances the replicated clock to `stamp_ms` (never back) and drops idle sessions.
    pub fn tick(&mut self, stamp_ms: u64) {
        self.clock_ms = self.clock_ms.max(stamp_ms);
        if self.clock_ms < self.next_sweep_ms {
            return;
        }
        self.next_sweep_ms = self.clock_ms + SWEEP_EVERY_MS;
        let horizon = self.clock_ms.saturating_sub(SESSION_TTL_MS);
        self.sessions.retain(|_, s| s.last_active_ms >= horizon);
    }

    /// Decides what to do with a tagged write.
    pub fn admit(&mut self, tag: &SessionTag) -> Admission {
        let Some(s) = self.sessions.get_mut(&tag.client) else {
            if tag.first_unacked > 1 {
                return Admission::Refused(format!(
                    "client session {:016x} expired, so whether write {} already applied is unknown",
                    tag.client, tag.seq
                ));
            }
            return Admission::Apply;
        };
        s.last_active_ms = self.clock_ms;
        if let Some(r) = s.replies.get(&tag.seq) {
            self.duplicates += 1;
            return Admission::Duplicate(r.clone());
        }
        if tag.seq < s.floor {
            return Admission::Refused(format!(
                "write {} of client session {:016x} was already acknowledged",
                tag.seq, tag.client
            ));
        }
        Admission::Apply
    }

    /// Records the reply of a write that was applied.
    pub fn record(&mut self, tag: &SessionTag, reply: &Response) {
        if !self.sessions.contains_key(&tag.client) && self.sessions.len() >= MAX_SESSIONS {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(id, s)| (s.last_active_ms, **id))
                .map(|(id, _)| *id);
            if let Some(id) = oldest {
                self.sessions.remove(&id);
            }
        }
        let clock = self.clock_ms;
        let s = self.sessions.entry(tag.client).or_default();
        s.last_active_ms = clock;
        // The client has every reply below `first_unacked`: forget them.
        if tag.first_unacked > s.floor {
            s.floor = tag.first_unacked;
            s.replies = s.replies.split_off(&tag.first_unacked);
        }
        s.replies.insert(tag.seq, reply.clone());
        while s.replies.len() > MAX_REPLIES_PER_SESSION {
            if let Some((seq, _)) = s.replies.pop_first() {
                s.floor = s.floor.max(seq + 1);
            }
        }
    }

    /// Sessions kept.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Writes answered from the table since the cluster began.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// The replicated clock.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(client: u64, seq: u64, first_unacked: u64) -> SessionTag {
        SessionTag {
            client,
            seq,
            first_unacked,
        }
    }

    #[test]
    fn a_repeated_write_gets_its_first_reply() {
        let mut s = Sessions::default();
        s.tick(1_000);
        let t = tag(7, 1, 1);
        assert_eq!(s.admit(&t), Admission::Apply);
        s.record(&t, &Response::Written { revision: 3 });
        assert_eq!(
            s.admit(&t),
            Admission::Duplicate(Response::Written { revision: 3 })
        );
        assert_eq!(s.duplicates(), 1);
    }

    #[test]
    fn acknowledged_replies_are_forgotten_and_their_retries_refused() {
        let mut s = Sessions::default();
        for seq in 1..=3 {
            let t = tag(1, seq, 1);
            assert_eq!(s.admit(&t), Admission::Apply);
            s.record(&t, &Response::Written { revision: seq });
        }
        // The client got replies 1 and 2.
        let t = tag(1, 4, 3);
        assert_eq!(s.admit(&t), Admission::Apply);
        s.record(&t, &Response::Written { revision: 4 });
        assert!(matches!(s.admit(&tag(1, 1, 3)), Admission::Refused(_)));
        assert_eq!(
            s.admit(&tag(1, 3, 3)),
            Admission::Duplicate(Response::Written { revision: 3 })
        );
    }

    #[test]
    fn idle_sessions_expire_by_the_replicated_clock_and_their_old_writes_are_refused() {
        let mut s = Sessions::default();
        s.tick(10);
        let t = tag(5, 1, 1);
        s.record(&t, &Response::Written { revision: 1 });
        s.tick(10 + SESSION_TTL_MS - 1);
        assert_eq!(s.len(), 1);
        s.tick(10 + SESSION_TTL_MS + SWEEP_EVERY_MS + 1);
        assert!(s.is_empty());
        // A retry of the expired session's write cannot be told apart from a new one...
        assert!(matches!(s.admit(&tag(5, 2, 2)), Admission::Refused(_)));
        // ...but a brand-new session's first write is applied.
        assert_eq!(s.admit(&tag(6, 1, 1)), Admission::Apply);
    }

    #[test]
    fn the_clock_never_goes_back() {
        let mut s = Sessions::default();
        s.tick(5_000);
        s.tick(1_000);
        assert_eq!(s.clock_ms(), 5_000);
    }

    #[test]
    fn the_table_is_bounded_by_dropping_the_least_recently_active() {
        let mut s = Sessions::default();
        for c in 0..MAX_SESSIONS as u64 {
            s.tick(c);
            s.record(&tag(c, 1, 1), &Response::None);
        }
        s.tick(MAX_SESSIONS as u64);
        s.record(&tag(u64::MAX, 1, 1), &Response::None);
        assert_eq!(s.len(), MAX_SESSIONS);
        assert_eq!(
            s.admit(&tag(0, 1, 1)),
            Admission::Apply,
            "client 0 was dropped"
        );
        assert!(matches!(s.admit(&tag(1, 1, 1)), Admission::Duplicate(_)));
    }

    #[test]
    fn replies_per_session_are_bounded() {
        let mut s = Sessions::default();
        let n = MAX_REPLIES_PER_SESSION as u64 + 10;
        for seq in 1..=n {
            s.record(&tag(9, seq, 1), &Response::None);
        }
        assert!(matches!(s.admit(&tag(9, 1, 1)), Admission::Refused(_)));
        assert!(matches!(s.admit(&tag(9, n, 1)), Admission::Duplicate(_)));
    }
}
