//! Gateway leases held by a quorum of voters, with durable revocation: the fencing arithmetic
//! behind "at most one node answers for a VIP", free of I/O and clocks (times are milliseconds
//! on a monotonic clock, passed in).
//!
//! # Why a quorum lease
//!
//! A lease granted by the Raft leader alone dies with the leader: until a new leader is elected
//! and confirmed nobody grants, and an election under CPU contention takes longer than the
//! 90 ms lease, so every gateway node fenced itself although the dead leader owned no VIP. Here
//! every voter grants, so a lease outlives the loss of any minority of voters, the leader
//! included, for as long as the election takes.
//!
//! # Protocol
//!
//! - **Renewal.** Every `renew_ms`, each gateway node reads its own clock (`t_send`) and sends a
//!   renewal to every voter (as it sees the membership), in parallel.
//! - **Grant.** A voter ([`VoterLeases::grant`]) grants `lease_ms` unless it holds a revocation
//!   for the node, records `promised[node] = max(promised[node], now + lease_ms)` on its own
//!   clock (`now` ≥ `t_send` in real time), and replies with its applied gateway revision.
//! - **Node deadline.** When a majority of the voters granted in one round, the node's data plane
//!   serves until [`node_deadline`]`(t_send, min granted)` ([`quorum_grant`]); otherwise the
//!   round extends nothing. After a lapse the node re-arms only once its tables are at least as
//!   new as the highest revision among the granters (`super::core`).
//! - **Revocation.** Before giving a node's VIPs away, the leader revokes it: it sends
//!   `Revoke(node, stamp)` to every voter. A voter ([`VoterLeases::revoke`]) records the
//!   revocation *durably* (a restarted voter must still refuse), refuses the node from then on,
//!   and answers with how long its promise still runs: `max(promised[node], started_at +
//!   lease_ms) − now` (a voter that restarted less than a lease ago may have granted just before
//!   it died and no longer knows it), and how long ago it applied the revocation (`held`: the
//!   durable write). The leader turns each answer received at its time `r` into the bound
//!   `(r − held) + remaining` (the voter applied it at or before `r − held`) and, once a
//!   majority answered, holds the node as certainly fenced from [`fenced_at`]: the largest bound
//!   plus `margin_ms` (clock-rate drift and the data plane's reaction time).
//! - **Un-revocation.** A revoked node gets a lease again only when the leader sends
//!   `Unrevoke(node, stamp)` to every voter, which it does once the node reports an applied
//!   revision at least the leader's and no placement write is in flight.
//! - **Stamps.** Revocations and un-revocations carry a [`Stamp`] `(term, seq)`; a voter applies
//!   one only if its stamp is newer than the last it applied for that node (also durable), so a
//!   late or reordered message, or one from a deposed leader, changes nothing. A revocation
//!   answer counts only when the voter applied (or already held) exactly that revocation.
//!
//! # Safety argument
//!
//! Claim: once a majority `M` of the voters answered a revocation, no deadline the node ever
//! computes lies after [`fenced_at`] − `margin_ms`.
//!
//! - A node deadline `d = t_send + min g` stems from a round that a majority `G` granted. `G` and
//!   `M` intersect in some voter `v`.
//! - `v` granted the round before it applied the revocation: after applying it, `v` refuses the
//!   node until a newer un-revocation, which this leader sends only after it stopped relying on
//!   the fence (and which a deposed leader's stale stamps cannot undo). A restart does not
//!   change that: the revocation and its stamp are on disk before the answer is sent.
//! - So when `v` answered, its promise covered that grant: `promised ≥ t_grant + g ≥ t_send + g
//!   ≥ d`, unless `v` restarted in between, in which case the grant happened before the restart
//!   and `started_at + lease_ms ≥ t_grant + g ≥ d` (grants are at most `lease_ms`). `v` reported
//!   at least `d − now_v`, and the leader's bound `r + remaining ≥ now_v + remaining ≥ d` in real
//!   time.
//! - Rounds sent after the revocation reached a majority cannot collect a majority of grants at
//!   all: every majority contains a revoked voter.
//!
//! Restart graces are not voter grants: a grace is committed through Raft before it is granted
//! (by the leader alone), so every later leader knows it, and no leader revokes a graced node
//! before the grace ends (`super::leader`).
//!
//! Limitation: the node counts its majority against the voter set it sees, the leader against
//! its own; both come from the replicated membership, and a membership change that lands during
//! one node's lapse could make the two majorities disjoint. Membership changes are operator
//! actions; drain gateway nodes first.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
pub use yard_raft_store::NodeId;

/// Lease durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The lease each voter grants per renewal: how long a node serves after a renewal round
    /// it sent, and so the floor of failover time.
    pub lease_ms: u64,
    /// Safety margin added before treating a revoked lease as fenced: clock rate drift and the
    /// time the data plane needs to act on its deadline.
    pub margin_ms: u64,
}

/// Orders revocations and un-revocations of one node: the issuing leader's term, then a
/// counter of that leader.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Stamp {
    pub term: u64,
    pub seq: u64,
}

/// The durable part of a voter's lease state: per node, the newest stamp applied and whether
/// the node is revoked. A voter writes it to disk before answering a revocation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocations {
    pub nodes: BTreeMap<NodeId, (Stamp, bool)>,
}

impl Revocations {
    pub fn is_revoked(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(|(_, r)| *r)
    }
}

/// What a voter answers to a revocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevokeOutcome {
    /// The node is revoked at this stamp (now or already); its promise runs `remaining_ms` more.
    /// `changed`: the durable state changed and must be written before answering.
    Revoked { remaining_ms: u64, changed: bool },
    /// A newer stamp was already applied for the node: this revocation is void.
    Superseded,
}

/// One voter's lease state (every voter keeps one, leader or not).
#[derive(Debug, Clone)]
pub struct VoterLeases {
    lease_ms: u64,
    /// When this voter (process) started: it may have promised up to a lease before.
    started_at: u64,
    /// Latest promise per node, on this voter's clock.
    promised: BTreeMap<NodeId, u64>,
    durable: Revocations,
}

impl VoterLeases {
    /// A voter started at `started_at_ms` with the revocations it had stored.
    pub fn new(lease_ms: u64, started_at_ms: u64, durable: Revocations) -> Self {
        Self {
            lease_ms,
            started_at: started_at_ms,
            promised: BTreeMap::new(),
            durable,
        }
    }

    /// A renewal from `node` at `now_ms`: the granted ms, or `None` when the node is revoked.
    pub fn grant(&mut self, node: NodeId, now_ms: u64) -> Option<u64> {
        if self.durable.is_revoked(node) {
            return None;
        }
        let end = now_ms.saturating_add(self.lease_ms);
        let p = self.promised.entry(node).or_insert(end);
        *p = (*p).max(end);
        Some(self.lease_ms)
    }

    /// Until when this voter may have promised `node` a lease (its clock), including grants
    /// made before a restart it no longer remembers.
    pub fn promised(&self, node: NodeId) -> u64 {
        let before_start = self.started_at.saturating_add(self.lease_ms);
        self.promised
            .get(&node)
            .map_or(before_start, |p| (*p).max(before_start))
    }

    /// Revokes `node` at `stamp` (see the module doc).
    pub fn revoke(&mut self, node: NodeId, stamp: Stamp, now_ms: u64) -> RevokeOutcome {
        let remaining_ms = self.promised(node).saturating_sub(now_ms);
        match self.durable.nodes.get(&node) {
            Some((s, _)) if *s > stamp => RevokeOutcome::Superseded,
            Some((s, true)) if *s == stamp => RevokeOutcome::Revoked {
                remaining_ms,
                changed: false,
            },
            Some((s, false)) if *s == stamp => RevokeOutcome::Superseded,
            _ => {
                self.durable.nodes.insert(node, (stamp, true));
                RevokeOutcome::Revoked {
                    remaining_ms,
                    changed: true,
                }
            }
        }
    }

    /// Lifts the revocation of `node` if `stamp` is newer than the last one applied. Returns
    /// whether a revocation was lifted: only then must the state be written before answering.
    /// (The newer stamp of a node that was not revoked need not survive a restart: forgetting
    /// it can only let a stale revocation through, and revoking is always safe.)
    pub fn unrevoke(&mut self, node: NodeId, stamp: Stamp) -> bool {
        match self.durable.nodes.get(&node) {
            Some((s, _)) if *s >= stamp => false,
            prior => {
                let lifted = prior.is_some_and(|(_, revoked)| *revoked);
                self.durable.nodes.insert(node, (stamp, false));
                lifted
            }
        }
    }

    pub fn is_revoked(&self, node: NodeId) -> bool {
        self.durable.is_revoked(node)
    }

    /// What must be on disk.
    pub fn durable(&self) -> &Revocations {
        &self.durable
    }
}

/// A node's renewal round: given the number of voters it sees and the grants it received (each
/// `(granted_ms, voter's revision)`), the round's grant `(min granted, max revision)` when a
/// majority granted, else `None`. The node's deadline is then
/// [`node_deadline`]`(t_send, granted)`.
pub fn quorum_grant(voters: usize, grants: &[(u64, u64)]) -> Option<(u64, u64)> {
    if voters == 0 || grants.len() < majority(voters) {
        return None;
    }
    let granted = grants.iter().map(|g| g.0).min()?;
    let revision = grants.iter().map(|g| g.1).max()?;
    Some((granted, revision))
}

/// The smallest majority of `voters`.
pub fn majority(voters: usize) -> usize {
    voters / 2 + 1
}

/// The leader's bound from one revocation answer: the voter's promise ran `remaining_ms` more
/// when it applied the revocation, at or before `received_at_ms` (leader clock; the shell passes
/// the receipt time less the time the voter held the answer back).
pub fn answer_bound(received_at_ms: u64, remaining_ms: u64) -> u64 {
    received_at_ms.saturating_add(remaining_ms)
}

/// When a node revoked at a majority is certainly fenced: the largest answer bound plus the
/// margin (`None` without answers).
pub fn fenced_at(bounds: impl IntoIterator<Item = u64>, margin_ms: u64) -> Option<u64> {
    bounds
        .into_iter()
        .max()
        .map(|b| b.saturating_add(margin_ms))
}

/// The node's own view: its lease deadline after a grant received for a renewal sent at
/// `t_send_ms` (its own clock, read before sending). Its data plane serves its VIPs while its
/// clock is before this.
pub fn node_deadline(t_send_ms: u64, granted_ms: u64) -> u64 {
    t_send_ms.saturating_add(granted_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S1: Stamp = Stamp { term: 1, seq: 1 };
    const S2: Stamp = Stamp { term: 1, seq: 2 };

    #[test]
    fn a_voter_grants_until_revoked_and_reports_its_promise() {
        let mut v = VoterLeases::new(90, 0, Revocations::default());
        assert_eq!(v.grant(7, 1000), Some(90));
        assert_eq!(v.grant(7, 1030), Some(90));
        assert_eq!(v.promised(7), 1120);
        assert_eq!(
            v.revoke(7, S1, 1050),
            RevokeOutcome::Revoked {
                remaining_ms: 70,
                changed: true
            }
        );
        assert_eq!(v.grant(7, 1060), None, "refused once revoked");
        assert_eq!(v.promised(7), 1120, "a refusal promises nothing");
        // The same revocation again: same answer, nothing to write.
        assert_eq!(
            v.revoke(7, S1, 1100),
            RevokeOutcome::Revoked {
                remaining_ms: 20,
                changed: false
            }
        );
        assert!(v.unrevoke(7, S2));
        assert_eq!(v.grant(7, 1200), Some(90));
    }

    #[test]
    fn a_restarted_voter_refuses_and_reports_its_start_plus_a_lease() {
        let mut v = VoterLeases::new(90, 0, Revocations::default());
        v.grant(7, 1000);
        v.revoke(7, S1, 1010);
        // Restart at 1050 with what was on disk: still refusing.
        let mut v = VoterLeases::new(90, 1050, v.durable().clone());
        assert_eq!(v.grant(7, 1060), None);
        // A node it never saw since the restart: it may have granted just before dying.
        assert_eq!(
            v.revoke(8, S1, 1100),
            RevokeOutcome::Revoked {
                remaining_ms: 40,
                changed: true
            }
        );
        assert_eq!(
            v.revoke(9, S1, 2000),
            RevokeOutcome::Revoked {
                remaining_ms: 0,
                changed: true
            }
        );
    }

    #[test]
    fn only_lifting_a_revocation_needs_a_write() {
        let mut v = VoterLeases::new(90, 0, Revocations::default());
        assert!(!v.unrevoke(7, S1), "nothing was revoked");
        assert_eq!(v.revoke(7, S1, 0), RevokeOutcome::Superseded);
        v.revoke(7, S2, 0);
        assert!(v.unrevoke(7, Stamp { term: 1, seq: 3 }));
        assert!(
            !v.unrevoke(7, Stamp { term: 1, seq: 4 }),
            "a repair of a live node"
        );
    }

    #[test]
    fn stale_stamps_change_nothing() {
        let mut v = VoterLeases::new(90, 0, Revocations::default());
        assert!(!v.unrevoke(7, S2));
        // A revocation older than the un-revocation (reordered, or a deposed leader's): void.
        assert_eq!(v.revoke(7, S1, 10), RevokeOutcome::Superseded);
        assert!(!v.is_revoked(7));
        // A revocation answered with the same stamp as an un-revocation is void too.
        assert_eq!(v.revoke(7, S2, 10), RevokeOutcome::Superseded);
        let s3 = Stamp { term: 2, seq: 0 };
        assert!(matches!(v.revoke(7, s3, 10), RevokeOutcome::Revoked { .. }));
        assert!(
            !v.unrevoke(7, S2),
            "an older un-revocation does not lift it"
        );
        assert!(v.is_revoked(7));
    }

    #[test]
    fn a_round_needs_a_majority_and_takes_the_shortest_grant() {
        assert_eq!(quorum_grant(3, &[(90, 5)]), None);
        assert_eq!(quorum_grant(3, &[(90, 5), (80, 7)]), Some((80, 7)));
        assert_eq!(quorum_grant(5, &[(90, 5), (80, 7)]), None);
        assert_eq!(quorum_grant(1, &[(90, 5)]), Some((90, 5)));
        assert_eq!(quorum_grant(0, &[]), None);
        assert_eq!(quorum_grant(4, &[(90, 1), (90, 1)]), None);
        assert_eq!(majority(4), 3);
    }

    #[test]
    fn the_fence_is_the_latest_bound_plus_the_margin() {
        assert_eq!(answer_bound(1000, 60), 1060);
        assert_eq!(fenced_at([1060, 1090, 1010], 10), Some(1100));
        assert_eq!(fenced_at([], 10), None);
        assert_eq!(node_deadline(100, 900), 1000);
    }

    // ----- safety: no node deadline outlives a completed revocation -----

    #[derive(Debug, Clone)]
    struct Scenario {
        voters: usize,
        lease: u64,
        margin: u64,
        /// Renewal rounds: send time and, per voter, the delay until it handles the renewal
        /// (`None`: lost).
        rounds: Vec<(u64, Vec<Option<u64>>)>,
        /// The revocation: send time and, per voter, (delay to the voter, delay back), `None`
        /// when lost.
        revoke_at: u64,
        revoke: Vec<Option<(u64, u64)>>,
        /// Voter restarts: (voter, time).
        restarts: Vec<(usize, u64)>,
    }

    fn scenario() -> impl Strategy<Value = Scenario> {
        (
            prop_oneof![Just(3usize), Just(5usize)],
            10..200u64,
            0..20u64,
        )
            .prop_flat_map(|(voters, lease, margin)| {
                let delay = prop::option::weighted(0.85, 0..2 * lease);
                let round = (0..2000u64, prop::collection::vec(delay, voters));
                let answer = prop::option::weighted(0.8, (0..2 * lease, 0..2 * lease));
                (
                    prop::collection::vec(round, 0..40),
                    0..2000u64,
                    prop::collection::vec(answer, voters),
                    prop::collection::vec((0..voters, 0..2500u64), 0..3),
                )
                    .prop_map(move |(rounds, revoke_at, revoke, restarts)| {
                        Scenario {
                            voters,
                            lease,
                            margin,
                            rounds,
                            revoke_at,
                            revoke,
                            restarts,
                        }
                    })
            })
    }

    #[derive(Debug, Clone, Copy)]
    enum Ev {
        Grant { round: usize, voter: usize },
        Revoke { voter: usize },
        Restart { voter: usize },
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn no_deadline_outlives_a_completed_revocation(s in scenario()) {
            // Every voter event in time order (ties: as generated), one clock for everyone.
            let mut events: Vec<(u64, Ev)> = Vec::new();
            for (round, (t_send, delays)) in s.rounds.iter().enumerate() {
                for (voter, d) in delays.iter().enumerate() {
                    if let Some(d) = d {
                        events.push((t_send + d, Ev::Grant { round, voter }));
                    }
                }
            }
            for (voter, a) in s.revoke.iter().enumerate() {
                if let Some((to, _)) = a {
                    events.push((s.revoke_at + to, Ev::Revoke { voter }));
                }
            }
            for (voter, at) in &s.restarts {
                events.push((*at, Ev::Restart { voter: *voter }));
            }
            events.sort_by_key(|e| e.0);
            let mut voters: Vec<VoterLeases> = (0..s.voters)
                .map(|_| VoterLeases::new(s.lease, 0, Revocations::default()))
                .collect();
            let mut grants: Vec<Vec<(u64, u64)>> = vec![Vec::new(); s.rounds.len()];
            // The leader's answers: (received at, remaining).
            let mut answers: Vec<(u64, u64)> = Vec::new();
            for (at, ev) in events {
                match ev {
                    Ev::Grant { round, voter } => {
                        if let Some(g) = voters[voter].grant(7, at) {
                            grants[round].push((g, 0));
                        }
                    }
                    Ev::Revoke { voter } => {
                        if let RevokeOutcome::Revoked { remaining_ms, .. } =
                            voters[voter].revoke(7, S1, at)
                        {
                            let back = s.revoke[voter].unwrap().1;
                            answers.push((at + back, remaining_ms));
                        }
                    }
                    Ev::Restart { voter } => {
                        let durable = voters[voter].durable().clone();
                        voters[voter] = VoterLeases::new(s.lease, at, durable);
                    }
                }
            }
            // The leader holds the node fenced once a majority answered, from the answers it
            // had then (the first `majority` to arrive).
            answers.sort_by_key(|a| a.0);
            if answers.len() < majority(s.voters) {
                return Ok(());
            }
            let counted = &answers[..majority(s.voters)];
            let fence = fenced_at(counted.iter().map(|(r, rem)| answer_bound(*r, *rem)), s.margin)
                .unwrap();
            for (round, (t_send, _)) in s.rounds.iter().enumerate() {
                if let Some((g, _)) = quorum_grant(s.voters, &grants[round]) {
                    let d = node_deadline(*t_send, g);
                    prop_assert!(
                        d + s.margin <= fence,
                        "round {} sent at {} holds until {}, fenced from {}", round, t_send, d, fence
                    );
                }
            }
        }
    }
}
