//! The leader's lease table: the fencing arithmetic behind "at most one node answers for a VIP",
//! free of I/O and clocks (times are milliseconds on a monotonic clock, passed in).
//!
//! # Protocol
//!
//! - Every `renew_ms`, each gateway node reads its own monotonic clock (`t_send`), then sends a
//!   renewal to the leader carrying the revision it has applied.
//! - The leader answers with `granted_ms` ([`LeaseTable::renew`]) and records the lease as ending
//!   at `t_reply + granted_ms`, where `t_reply` is its clock when it answers.
//! - The node's data plane serves its VIPs until [`node_deadline`]`(t_send, granted_ms)`. Since
//!   `t_reply ≥ t_send` in real time, the node's deadline is never later than the leader's
//!   record (up to clock rate drift, which `margin_ms` covers).
//! - The leader grants only while its leadership is quorum-confirmed: it periodically runs a
//!   quorum round (e.g. a heartbeat round) and, when one that started at `confirmed_at`
//!   succeeds, calls [`LeaseTable::confirm_leadership`]. A grant at `now` is
//!   `min(lease_ms, confirmed_at + lease_ms − now)`, refused when that is not positive. So every
//!   deadline this leader hands out ends by `confirmed_at + lease_ms` for a round a quorum acked.
//! - A newly elected leader knows nothing of its predecessor's grants, but they all end before
//!   `elected_at + lease_ms`: the predecessor granted only on rounds a quorum acked, that quorum
//!   intersects the new leader's voters, and a voter acks the old term only before it votes in
//!   the new one. So the new leader treats every node as possibly live until
//!   `became_leader_at + lease_ms + margin_ms` (the *takeover wait*).
//! - A node is *expired* — certain to have fenced itself, so its VIPs may be given away — when
//!   its recorded lease end plus the margin is past and the takeover wait is over. A node that
//!   never renewed to this leader is expired as soon as the takeover wait is over.
//!
//! # Rejoining after a lapse
//!
//! A renewal from an expired node is granted like any other, but by then the leader may have
//! given its VIPs away in a revision the node has not applied, so the node must not re-arm its
//! data plane from its stale table. Two rules close this: a grant carries the revision of the
//! gateway tables the leader had applied, and a node whose deadline had passed takes the grant
//! only once its own tables are at least that new (`super::core`); and the leader grants no
//! lease to an expired node while a placement write is still committing, so that revision
//! includes any reassignment in flight (`node/src/gateway_control.rs`).

use std::collections::{BTreeMap, BTreeSet};

pub use yard_raft_store::NodeId;

/// Lease durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The longest lease a grant gives, and how long after a confirmed quorum round the leader
    /// may still grant.
    pub lease_ms: u64,
    /// Safety margin added before treating a lapsed lease as fenced: clock rate drift and the
    /// time the data plane needs to act on its deadline.
    pub margin_ms: u64,
}

/// The leader-side lease table. Create a fresh one on every election.
#[derive(Debug, Clone)]
pub struct LeaseTable {
    cfg: LeaseConfig,
    became_leader_at: u64,
    /// Start of the latest quorum round that confirmed this leadership.
    confirmed_at: Option<u64>,
    /// Latest recorded lease end per node (`t_reply + granted`): never earlier than any deadline
    /// this leader gave the node.
    ends: BTreeMap<NodeId, u64>,
    /// The applied revision each node last reported.
    applied: BTreeMap<NodeId, u64>,
}

impl LeaseTable {
    pub fn new(cfg: LeaseConfig, became_leader_at_ms: u64) -> Self {
        Self {
            cfg,
            became_leader_at: became_leader_at_ms,
            confirmed_at: None,
            ends: BTreeMap::new(),
            applied: BTreeMap::new(),
        }
    }

    /// A quorum round that began at `round_started_at_ms` succeeded. Rounds may be reported out
    /// of order; the latest start counts.
    pub fn confirm_leadership(&mut self, round_started_at_ms: u64) {
        self.confirmed_at = Some(
            self.confirmed_at
                .map_or(round_started_at_ms, |c| c.max(round_started_at_ms)),
        );
    }

    /// What a renewal answered at `now_ms` may be granted, or `None` when leadership has not been
    /// confirmed recently enough.
    pub fn grantable(&self, now_ms: u64) -> Option<u64> {
        let until = self.confirmed_at?.saturating_add(self.cfg.lease_ms);
        let granted = until.saturating_sub(now_ms).min(self.cfg.lease_ms);
        (granted > 0).then_some(granted)
    }

    /// A renewal from `node` reporting it has applied `applied_revision`, answered at `now_ms`;
    /// returns the granted ms or `None` (leadership not confirmed recently enough: the node must
    /// not extend its lease). The applied revision is recorded either way: it is what placement
    /// uses to confirm a release, and the latest report (not the highest) is kept, so a node that
    /// went back (e.g. restarted from an older snapshot) is not taken for having released.
    pub fn renew(&mut self, node: NodeId, applied_revision: u64, now_ms: u64) -> Option<u64> {
        self.applied.insert(node, applied_revision);
        let granted = self.grantable(now_ms)?;
        let end = now_ms.saturating_add(granted);
        let e = self.ends.entry(node).or_insert(end);
        *e = (*e).max(end);
        Some(granted)
    }

    /// Records that `node` may serve until `until_ms` without renewing: a restart grace that was
    /// committed through Raft before it was granted (so every later leader knows of it and
    /// holds the node the same way, from its own election on).
    pub fn hold(&mut self, node: NodeId, until_ms: u64) {
        let e = self.ends.entry(node).or_insert(until_ms);
        *e = (*e).max(until_ms);
    }

    /// Whether `node` is certain to have fenced itself at `now_ms` (see [`expired`](Self::expired)).
    pub fn is_expired(&self, node: NodeId, now_ms: u64) -> bool {
        self.expired(&BTreeSet::from([node]), now_ms)
            .contains(&node)
    }

    /// Nodes whose recorded lease end is after `now_ms`.
    pub fn live(&self, now_ms: u64) -> BTreeSet<NodeId> {
        self.ends
            .iter()
            .filter(|(_, end)| **end > now_ms)
            .map(|(n, _)| *n)
            .collect()
    }

    /// The end of the takeover wait: until then a predecessor's grant may still run.
    fn takeover_until(&self) -> u64 {
        self.became_leader_at
            .saturating_add(self.cfg.lease_ms)
            .saturating_add(self.cfg.margin_ms)
    }

    /// Nodes certain to have fenced themselves at `now_ms`: recorded end + margin < now, and the
    /// takeover wait (`became_leader_at + lease_ms + margin_ms < now`) is over. Classifies every
    /// node in `known` (e.g. every owner in the VIP table: a node that never renewed to this
    /// leader is expired once the takeover wait is over) and every node that ever renewed.
    pub fn expired(&self, known: &BTreeSet<NodeId>, now_ms: u64) -> BTreeSet<NodeId> {
        if self.takeover_until() >= now_ms {
            return BTreeSet::new();
        }
        known
            .iter()
            .chain(self.ends.keys())
            .filter(|n| {
                self.ends
                    .get(n)
                    .is_none_or(|end| end.saturating_add(self.cfg.margin_ms) < now_ms)
            })
            .copied()
            .collect()
    }

    /// The applied revision each node last reported.
    pub fn applied(&self) -> &BTreeMap<NodeId, u64> {
        &self.applied
    }

    /// The earliest instant after `now_ms` at which [`live`](Self::live) or
    /// [`expired`](Self::expired) may answer differently — a lease lapsing, a lapsed lease
    /// becoming certainly fenced, or the takeover wait ending — for the shell's timer; `None` if
    /// nothing is pending.
    pub fn next_expiry(&self, now_ms: u64) -> Option<u64> {
        let takeover = self.takeover_until().saturating_add(1);
        self.ends
            .values()
            .flat_map(|end| {
                [
                    *end,
                    end.saturating_add(self.cfg.margin_ms).saturating_add(1),
                ]
            })
            .chain(std::iter::once(takeover))
            .filter(|t| *t > now_ms)
            .min()
    }
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

    const CFG: LeaseConfig = LeaseConfig {
        lease_ms: 1000,
        margin_ms: 100,
    };

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn no_grant_before_leadership_is_confirmed() {
        let mut t = LeaseTable::new(CFG, 0);
        assert_eq!(t.renew(1, 3, 10), None);
        assert_eq!(t.applied()[&1], 3, "the report is kept even when refused");
        assert!(t.live(10).is_empty());
    }

    #[test]
    fn grant_is_capped_by_the_confirmation() {
        let mut t = LeaseTable::new(CFG, 0);
        t.confirm_leadership(100);
        assert_eq!(t.renew(1, 0, 100), Some(1000));
        assert_eq!(t.renew(1, 0, 400), Some(700));
        assert_eq!(t.renew(1, 0, 1099), Some(1));
        // Stale confirmation: refused.
        assert_eq!(t.renew(1, 0, 1100), None);
        assert_eq!(t.renew(1, 0, 5000), None);
        t.confirm_leadership(5000);
        assert_eq!(t.renew(1, 0, 5010), Some(990));
    }

    #[test]
    fn confirmations_out_of_order_keep_the_latest() {
        let mut t = LeaseTable::new(CFG, 0);
        t.confirm_leadership(500);
        t.confirm_leadership(200);
        assert_eq!(t.grantable(600), Some(900));
    }

    #[test]
    fn live_until_the_recorded_end() {
        let mut t = LeaseTable::new(CFG, 0);
        t.confirm_leadership(200);
        t.renew(1, 0, 200);
        assert_eq!(t.live(1199), set(&[1]));
        assert!(t.live(1200).is_empty());
    }

    #[test]
    fn takeover_wait_of_a_new_leader() {
        let mut t = LeaseTable::new(CFG, 5000);
        t.confirm_leadership(5000);
        let known = set(&[1, 2]);
        // Node 1 renews once, early; node 2 never does.
        t.renew(1, 0, 5000);
        for now in [5000, 6000, 6100] {
            assert!(t.expired(&known, now).is_empty(), "at {now}");
        }
        // 5000 + 1000 + 100 < 6101: the predecessor's grants are over; 1's own lease ended at
        // 6000, + margin = 6100 < 6101.
        assert_eq!(t.expired(&known, 6101), set(&[1, 2]));
    }

    #[test]
    fn a_node_that_stops_renewing_expires_exactly_after_end_plus_margin() {
        let mut t = LeaseTable::new(CFG, 0);
        t.confirm_leadership(2000);
        t.renew(1, 0, 2000); // ends at 3000
        t.renew(2, 0, 2500); // ends at 3000 too: capped by the confirmation
        t.confirm_leadership(2900);
        t.renew(2, 0, 2950); // ends at 3900
        let known = set(&[1, 2]);
        assert!(t.expired(&known, 3100).is_empty());
        assert_eq!(t.expired(&known, 3101), set(&[1]));
        assert_eq!(t.expired(&known, 4000), set(&[1]));
        assert_eq!(t.expired(&known, 4001), set(&[1, 2]));
        assert!(t.live(3000).contains(&2) && !t.live(3000).contains(&1));
    }

    #[test]
    fn a_node_never_seen_is_expired_only_after_the_takeover_wait() {
        let t = LeaseTable::new(CFG, 300);
        let known = set(&[7]);
        assert!(t.expired(&known, 1400).is_empty());
        assert_eq!(t.expired(&known, 1401), set(&[7]));
        assert!(t.live(1401).is_empty());
    }

    #[test]
    fn renewed_nodes_are_classified_even_if_not_known() {
        let mut t = LeaseTable::new(CFG, 0);
        t.confirm_leadership(0);
        t.renew(4, 0, 0);
        assert_eq!(t.expired(&BTreeSet::new(), 1101), set(&[4]));
    }

    #[test]
    fn next_expiry_is_the_next_change() {
        let mut t = LeaseTable::new(CFG, 0);
        assert_eq!(t.next_expiry(0), Some(1101), "the takeover wait");
        t.confirm_leadership(500);
        t.renew(1, 0, 600); // ends 1500, fenced from 1601
        assert_eq!(t.next_expiry(600), Some(1101));
        assert_eq!(t.next_expiry(1101), Some(1500));
        assert_eq!(t.next_expiry(1500), Some(1601));
        assert_eq!(t.next_expiry(1601), None);
        // Each answer is a real change point.
        assert!(t.live(1499).contains(&1) && t.live(1500).is_empty());
        assert!(t.expired(&set(&[1]), 1600).is_empty());
        assert_eq!(t.expired(&set(&[1]), 1601), set(&[1]));
    }

    #[test]
    fn a_held_node_stays_live_through_its_grace_and_expires_after_it() {
        let mut t = LeaseTable::new(CFG, 0);
        t.confirm_leadership(0);
        t.hold(7, 5_000);
        assert!(t.live(4_999).contains(&7));
        assert!(!t.is_expired(7, 5_000 + 100));
        assert!(t.is_expired(7, 5_000 + 101));
        // A renewal never shortens a hold.
        t.renew(7, 0, 1_000);
        assert!(t.live(4_999).contains(&7));
    }

    #[test]
    fn node_side_helpers() {
        assert_eq!(node_deadline(100, 900), 1000);
    }

    // ----- safety across a change of leader -----

    #[derive(Debug, Clone)]
    enum Op {
        /// Leader `leader` learns that a round started at `started` succeeded (at `at`).
        Confirm { leader: u8, started: u64, at: u64 },
        /// `node` sends a renewal to `leader` at `t_send`; the leader answers at `t_reply`.
        Renew {
            leader: u8,
            node: NodeId,
            t_send: u64,
            t_reply: u64,
            applied: u64,
        },
        /// The new leader classifies every node at `at`.
        Check { at: u64 },
    }

    impl Op {
        fn at(&self) -> u64 {
            match self {
                Op::Confirm { at, .. } | Op::Check { at } => *at,
                Op::Renew { t_reply, .. } => *t_reply,
            }
        }
    }

    #[derive(Debug, Clone)]
    struct Scenario {
        cfg: LeaseConfig,
        t_e: u64,
        ops: Vec<Op>,
    }

    /// Old leader elected at 0, confirmed by rounds started up to `t_q`; new leader elected at
    /// `t_e > t_q`, confirmed by rounds started from `t_e` on. Both grant to renewals with random
    /// delays at any time (the old one does not know it was deposed). One clock for everyone.
    fn scenario() -> impl Strategy<Value = Scenario> {
        (10..500u64, 0..50u64, 0..1000u64)
            .prop_flat_map(|(lease, margin, t_q)| {
                // Mostly a quick election, so the old leader's grants overlap the new term.
                let gap = prop_oneof![3 => 1..lease, 1 => 1..4 * lease];
                (Just((lease, margin, t_q)), gap)
            })
            .prop_flat_map(|((lease, margin, t_q), gap)| {
                let t_e = t_q + gap;
                let from = t_q.saturating_sub(lease);
                let horizon = t_e + 3 * lease + margin;
                let confirm = prop_oneof![
                    (from..=t_q, 0..100u64).prop_map(move |(s, d)| Op::Confirm {
                        leader: 1,
                        started: s,
                        at: s + d
                    }),
                    (t_e..horizon, 0..100u64).prop_map(move |(s, d)| Op::Confirm {
                        leader: 2,
                        started: s,
                        at: s + d
                    }),
                ];
                let delay = prop_oneof![3 => 0..lease / 4 + 1, 1 => 0..2 * lease];
                let renew = (1..=2u8, 1..5u64, from..horizon, delay, 0..100u64).prop_map(
                    |(leader, node, t_send, delay, applied)| Op::Renew {
                        leader,
                        node,
                        t_send,
                        t_reply: t_send + delay,
                        applied,
                    },
                );
                let check = (t_e..horizon + lease).prop_map(|at| Op::Check { at });
                prop::collection::vec(prop_oneof![2 => confirm, 6 => renew, 3 => check], 0..120)
                    .prop_map(move |mut ops| {
                        // The old leader's last successful round started at t_q.
                        ops.push(Op::Confirm {
                            leader: 1,
                            started: t_q,
                            at: t_q,
                        });
                        Scenario {
                            cfg: LeaseConfig {
                                lease_ms: lease,
                                margin_ms: margin,
                            },
                            t_e,
                            ops,
                        }
                    })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn expired_nodes_hold_no_running_lease(mut s in scenario()) {
            // Events at the same instant: confirmations and grants happen before a check.
            s.ops.sort_by_key(|op| (op.at(), matches!(op, Op::Check { .. })));
            let mut old = LeaseTable::new(s.cfg, 0);
            let mut new = LeaseTable::new(s.cfg, s.t_e);
            let known: BTreeSet<NodeId> = (1..5).collect();
            // Every deadline each node has been handed, by either leader.
            let mut deadlines: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
            for op in &s.ops {
                match *op {
                    Op::Confirm { leader, started, .. } => {
                        if leader == 1 { old.confirm_leadership(started) } else { new.confirm_leadership(started) }
                    }
                    Op::Renew { leader, node, t_send, t_reply, applied } => {
                        let table = if leader == 1 { &mut old } else { &mut new };
                        if let Some(g) = table.renew(node, applied, t_reply) {
                            prop_assert!(g <= s.cfg.lease_ms);
                            deadlines.entry(node).or_default().push(node_deadline(t_send, g));
                        }
                    }
                    Op::Check { at } => {
                        for n in new.expired(&known, at) {
                            for d in deadlines.get(&n).into_iter().flatten() {
                                prop_assert!(*d < at, "node {} expired at {} holds a lease until {}", n, at, d);
                            }
                        }
                        // Live and expired never overlap.
                        prop_assert!(new.live(at).is_disjoint(&new.expired(&known, at)));
                    }
                }
            }
        }
    }
}
