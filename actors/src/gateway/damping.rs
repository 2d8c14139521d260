//! Ownership damping on the leader, free of I/O and clocks: a gateway node whose lease lapsed
//! gets VIPs back only after a hold-down of sustained healthy renewals, and the hold-down grows
//! when it keeps lapsing (route-flap damping as BGP does it).
//!
//! Without it, a node whose control traffic is lossy but whose data plane is fine lapses, has
//! its VIPs moved away, renews again, gets them back by rebalancing and lapses again: measured,
//! one VIP changed owner 47 times in 20 s. Every move costs the traffic a gratuitous-ARP
//! round, so the VIPs should rather stay where they went.
//!
//! # Model
//!
//! - Each lapse adds a penalty of 1 to the node's figure of merit; the penalty decays
//!   exponentially with `half_life_ms` (`p(t) = p₀ · 2^(−Δt / half_life)`) while the node is
//!   healthy past its hold-down, so a node that stays healthy is forgiven (time spent lapsed or
//!   held down earns nothing: otherwise a node lapsing right after each hold-down would see
//!   its hold-down converge instead of grow).
//! - The penalty just after a lapse sets the hold-down: `holddown_ms · 2^(p − 1)`, capped at
//!   `max_holddown_ms`. The first lapse (or one long after the last) waits the base; each lapse
//!   that follows soon after quadruples it. In BGP terms the node is *suppressed* while the
//!   penalty is above the level the hold-down timer stands for, and *reused* when it ends.
//! - The hold-down runs from the moment the node is healthy again ([`Damping::restored`]) and a
//!   lapse inside it starts over (with the larger penalty), so only *sustained* health counts.
//! - Damping delays only a node's return. It never delays a failover: the VIPs of a lapsed node
//!   go to the eligible nodes at once; the leader only leaves held nodes out of the nodes that
//!   may *receive* VIPs (unless no other node could take them: an unanswered VIP is worse than a
//!   flapping owner).

use std::collections::{BTreeMap, BTreeSet};

pub use yard_raft_store::NodeId;

/// Damping settings (`[gateway]` holddown keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DampingConfig {
    /// Hold-down after a first lapse.
    pub holddown_ms: u64,
    /// The longest hold-down.
    pub max_holddown_ms: u64,
    /// Half-life of the lapse penalty.
    pub half_life_ms: u64,
}

impl Default for DampingConfig {
    fn default() -> Self {
        // A node whose control traffic is lossy lapses every few seconds (measured: 40% loss
        // on its control port, a lapse every few seconds): a first hold-down of that order keeps
        // it from getting VIPs back between most lapses, and the next one is four times longer.
        Self {
            holddown_ms: 3_000,
            max_holddown_ms: 60_000,
            half_life_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Track {
    /// Penalty as of `at`; it decays only after `at` (the end of the hold-down: time spent
    /// lapsed or held down earns no forgiveness).
    penalty: f64,
    at: u64,
    /// The hold-down set by the latest lapse.
    holddown_ms: u64,
    /// Healthy again since (after the latest lapse); `None` while lapsed.
    healthy_since: Option<u64>,
}

/// Per-node damping state.
#[derive(Debug, Clone, Default)]
pub struct Damping {
    cfg: DampingConfig,
    nodes: BTreeMap<NodeId, Track>,
}

impl Damping {
    pub fn new(cfg: DampingConfig) -> Self {
        Self {
            cfg,
            nodes: BTreeMap::new(),
        }
    }

    fn decayed(&self, t: &Track, now_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(t.at) as f64;
        let h = self.cfg.half_life_ms.max(1) as f64;
        t.penalty * (-dt / h).exp2()
    }

    /// `node`'s lease lapsed at `now_ms`; returns the hold-down it will serve once healthy.
    pub fn lapse(&mut self, node: NodeId, now_ms: u64) -> u64 {
        let prior = self.nodes.get(&node);
        let penalty = prior.map_or(0.0, |t| self.decayed(t, now_ms)) + 1.0;
        // Quadrupled per recent lapse: a lossy owner that got its VIPs back once does not get
        // them back again within the same fault (doubling still let it return a third time).
        let factor = 4f64.powf(penalty - 1.0);
        let holddown = ((self.cfg.holddown_ms as f64) * factor)
            .min(self.cfg.max_holddown_ms as f64)
            .max(self.cfg.holddown_ms.min(self.cfg.max_holddown_ms) as f64)
            as u64;
        self.nodes.insert(
            node,
            Track {
                penalty,
                at: u64::MAX,
                holddown_ms: holddown,
                healthy_since: None,
            },
        );
        holddown
    }

    /// `node` holds a lease again from `now_ms`: its hold-down starts.
    pub fn restored(&mut self, node: NodeId, now_ms: u64) {
        if let Some(t) = self.nodes.get_mut(&node) {
            if t.healthy_since.is_none() {
                t.healthy_since = Some(now_ms);
                t.at = now_ms.saturating_add(t.holddown_ms);
            }
        }
    }

    /// Until when `node` may not receive VIPs: `None` if it may (never lapsed, or its hold-down
    /// is over); `Some(u64::MAX)` while it is still lapsed.
    pub fn held_until(&self, node: NodeId, now_ms: u64) -> Option<u64> {
        let t = self.nodes.get(&node)?;
        let until = match t.healthy_since {
            None => u64::MAX,
            Some(since) => since.saturating_add(t.holddown_ms),
        };
        (until > now_ms).then_some(until)
    }

    /// Whether `node` is inside its hold-down at `now_ms`.
    pub fn is_held(&self, node: NodeId, now_ms: u64) -> bool {
        self.held_until(node, now_ms).is_some()
    }

    /// The nodes of `among` inside their hold-down.
    pub fn held(&self, among: &BTreeSet<NodeId>, now_ms: u64) -> BTreeSet<NodeId> {
        among
            .iter()
            .filter(|n| self.is_held(**n, now_ms))
            .copied()
            .collect()
    }

    /// The hold-down the latest lapse of `node` set.
    pub fn holddown_ms(&self, node: NodeId) -> Option<u64> {
        self.nodes.get(&node).map(|t| t.holddown_ms)
    }

    /// `node`'s penalty at `now_ms`.
    pub fn penalty(&self, node: NodeId, now_ms: u64) -> f64 {
        self.nodes
            .get(&node)
            .map_or(0.0, |t| self.decayed(t, now_ms))
    }

    /// The next end of a hold-down after `now_ms` (for the leader's timer).
    pub fn next_change(&self, now_ms: u64) -> Option<u64> {
        self.nodes
            .keys()
            .filter_map(|n| self.held_until(*n, now_ms))
            .filter(|t| *t != u64::MAX)
            .min()
    }

    /// Forgets nodes whose penalty has decayed to nothing and that are not held (bounded state).
    pub fn prune(&mut self, now_ms: u64) {
        let keep: BTreeSet<NodeId> = self
            .nodes
            .iter()
            .filter(|(n, t)| self.is_held(**n, now_ms) || self.decayed(t, now_ms) > 0.01)
            .map(|(n, _)| *n)
            .collect();
        self.nodes.retain(|n, _| keep.contains(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CFG: DampingConfig = DampingConfig {
        holddown_ms: 1_000,
        max_holddown_ms: 60_000,
        half_life_ms: 30_000,
    };

    #[test]
    fn a_node_never_lapsed_is_not_held() {
        let d = Damping::new(CFG);
        assert!(!d.is_held(1, 0));
        assert_eq!(d.next_change(0), None);
    }

    #[test]
    fn a_first_lapse_waits_the_base_from_the_return() {
        let mut d = Damping::new(CFG);
        assert_eq!(d.lapse(1, 10_000), 1_000);
        assert_eq!(d.held_until(1, 10_500), Some(u64::MAX), "held while lapsed");
        d.restored(1, 12_000);
        assert!(d.is_held(1, 12_999));
        assert!(!d.is_held(1, 13_000));
        assert_eq!(d.next_change(12_000), Some(13_000));
    }

    #[test]
    fn lapses_in_a_row_wait_longer_each_time_up_to_the_cap() {
        let mut d = Damping::new(CFG);
        let mut now = 0;
        let mut last = 0;
        for k in 0..12 {
            let h = d.lapse(1, now);
            assert!(
                h > last || h == CFG.max_holddown_ms,
                "lapse {k}: {h} after {last}"
            );
            assert!(h <= CFG.max_holddown_ms);
            last = h;
            // Back 100 ms later, lapses again right after its hold-down.
            d.restored(1, now + 100);
            now += 100 + h;
        }
        assert_eq!(last, CFG.max_holddown_ms);
    }

    #[test]
    fn a_healthy_node_is_forgiven() {
        let mut d = Damping::new(CFG);
        for t in [0, 300, 600, 900] {
            d.lapse(1, t);
            d.restored(1, t + 100);
        }
        let p = d.penalty(1, 1_000);
        assert!((p - 4.0).abs() < 1e-9, "{p}");
        // Back at 1000 with the longest hold-down (1 s x 4^3, capped at 60 s): no forgiveness
        // before 61000, half the penalty one half-life after, nothing to speak of ten later.
        assert_eq!(d.holddown_ms(1), Some(60_000));
        assert!((d.penalty(1, 61_000) - p).abs() < 1e-9);
        assert!((d.penalty(1, 91_000) - p / 2.0).abs() < 1e-9);
        assert!(d.penalty(1, 361_000) < 0.01);
        // A lapse after a long healthy spell waits the base again.
        assert_eq!(d.lapse(1, 600_000), 1_000);
        d.restored(1, 600_000);
        d.prune(700_000);
        assert!(d.nodes.contains_key(&1), "penalty not yet gone");
        d.prune(10_000_000);
        assert!(d.nodes.is_empty());
    }

    proptest! {
        /// A node that lapses every `period` ms is never out of its hold-down while it flaps:
        /// after its first lapse, every instant is inside a hold-down or a lapse.
        #[test]
        fn a_flapping_node_gets_nothing_back_while_it_flaps(
            period in 200..1_500u64,
            down in 10..150u64,
            flaps in 3..50usize,
        ) {
            let mut d = Damping::new(CFG);
            let mut held_from_second = true;
            for k in 0..flaps as u64 {
                let t = k * period;
                // Check every 10 ms of the healthy stretch before this lapse.
                if k >= 2 {
                    let mut s = (k - 1) * period + down;
                    while s < t {
                        held_from_second &= d.is_held(1, s);
                        s += 10;
                    }
                }
                d.lapse(1, t);
                d.restored(1, t + down);
            }
            // From the second lapse on, the hold-down (almost 2 s) outlasts a period under 1.5 s.
            prop_assert!(held_from_second);
        }

        #[test]
        fn holddowns_stay_within_base_and_cap(times in prop::collection::vec(0..1_000_000u64, 1..40)) {
            let mut times = times;
            times.sort();
            let mut d = Damping::new(CFG);
            for t in times {
                let h = d.lapse(3, t);
                prop_assert!((CFG.holddown_ms..=CFG.max_holddown_ms).contains(&h));
                d.restored(3, t);
            }
        }
    }
}
