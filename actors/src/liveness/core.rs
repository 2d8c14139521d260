//! The liveness decision, free of I/O and clocks.

use std::collections::{BTreeMap, BTreeSet};

/// What happens to the liveness core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A probe interval elapsed. `leader` says whether this node leads; `members` is the current
    /// membership without this node.
    Tick {
        leader: bool,
        members: BTreeSet<u64>,
    },
    /// A probe sent in round `round` to `id` came back (`ok`) or failed.
    ProbeResult { id: u64, round: u64, ok: bool },
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Probe these members, tagging the results with `round`.
    Probe { round: u64, ids: Vec<u64> },
    /// Publish this reachability view (only emitted when it changes).
    Publish(BTreeMap<u64, bool>),
}

#[derive(Debug, Clone)]
pub struct LivenessCore {
    misses_allowed: u32,
    round: u64,
    /// Consecutive failed probes per member.
    misses: BTreeMap<u64, u32>,
    /// Round of the last probe answered per member; a result older than it is ignored.
    last_answer: BTreeMap<u64, u64>,
    published: BTreeMap<u64, bool>,
    leader: bool,
}

impl LivenessCore {
    pub fn new(misses_allowed: u32) -> Self {
        Self {
            misses_allowed: misses_allowed.max(1),
            round: 0,
            misses: BTreeMap::new(),
            last_answer: BTreeMap::new(),
            published: BTreeMap::new(),
            leader: false,
        }
    }

    fn view(&self) -> BTreeMap<u64, bool> {
        if !self.leader {
            return BTreeMap::new();
        }
        self.misses
            .iter()
            .map(|(id, m)| (*id, *m < self.misses_allowed))
            .collect()
    }

    fn publish_if_changed(&mut self, effects: &mut Vec<Effect>) {
        let view = self.view();
        if view != self.published {
            self.published = view.clone();
            effects.push(Effect::Publish(view));
        }
    }

    pub fn handle(&mut self, event: Event) -> Vec<Effect> {
        let mut effects = Vec::new();
        match event {
            Event::Tick { leader, members } => {
                if leader && !self.leader {
                    // A new leader starts from "unknown = not yet missed": members are given the
                    // full miss budget before being declared unreachable.
                    self.misses.clear();
                    self.last_answer.clear();
                }
                self.leader = leader;
                self.misses.retain(|id, _| members.contains(id));
                self.last_answer.retain(|id, _| members.contains(id));
                for id in &members {
                    self.misses.entry(*id).or_insert(0);
                }
                if leader && !members.is_empty() {
                    self.round += 1;
                    // Every outstanding probe of the previous round that has not answered by now
                    // counts as a miss.
                    for (id, m) in self.misses.iter_mut() {
                        let answered = self.last_answer.get(id).copied().unwrap_or(0);
                        if self.round > 1 && answered + 1 < self.round {
                            *m = m.saturating_add(1);
                        }
                    }
                    effects.push(Effect::Probe {
                        round: self.round,
                        ids: members.iter().copied().collect(),
                    });
                }
            }
            Event::ProbeResult { id, round, ok } => {
                if !self.misses.contains_key(&id) {
                    return effects;
                }
                if ok {
                    let last = self.last_answer.entry(id).or_insert(0);
                    if round > *last {
                        *last = round;
                        self.misses.insert(id, 0);
                    }
                }
            }
        }
        self.publish_if_changed(&mut effects);
        effects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(core: &mut LivenessCore, leader: bool, members: &[u64]) -> Vec<Effect> {
        core.handle(Event::Tick {
            leader,
            members: members.iter().copied().collect(),
        })
    }

    fn published(effects: &[Effect]) -> Option<BTreeMap<u64, bool>> {
        effects.iter().find_map(|e| match e {
            Effect::Publish(v) => Some(v.clone()),
            _ => None,
        })
    }

    #[test]
    fn member_becomes_unreachable_after_misses_and_recovers_on_answer() {
        let mut core = LivenessCore::new(3);
        let fx = tick(&mut core, true, &[2, 3]);
        assert_eq!(published(&fx), Some(BTreeMap::from([(2, true), (3, true)])));
        core.handle(Event::ProbeResult {
            id: 2,
            round: 1,
            ok: true,
        });
        core.handle(Event::ProbeResult {
            id: 3,
            round: 1,
            ok: true,
        });
        let mut last = None;
        for round in 2..=5 {
            core.handle(Event::ProbeResult {
                id: 2,
                round,
                ok: true,
            });
            if let Some(v) = published(&tick(&mut core, true, &[2, 3])) {
                last = Some(v);
            }
        }
        assert_eq!(last, Some(BTreeMap::from([(2, true), (3, false)])));
        let fx = core.handle(Event::ProbeResult {
            id: 3,
            round: 6,
            ok: true,
        });
        assert_eq!(published(&fx), Some(BTreeMap::from([(2, true), (3, true)])));
    }

    #[test]
    fn followers_publish_nothing_and_probe_nobody() {
        let mut core = LivenessCore::new(2);
        let fx = tick(&mut core, false, &[2, 3]);
        assert!(fx.is_empty());
    }

    #[test]
    fn removed_members_leave_the_view() {
        let mut core = LivenessCore::new(2);
        tick(&mut core, true, &[2, 3]);
        let fx = tick(&mut core, true, &[2]);
        assert_eq!(published(&fx), Some(BTreeMap::from([(2, true)])));
    }

    #[test]
    fn stale_results_do_not_revive() {
        let mut core = LivenessCore::new(1);
        tick(&mut core, true, &[2]);
        core.handle(Event::ProbeResult {
            id: 2,
            round: 1,
            ok: true,
        });
        tick(&mut core, true, &[2]);
        let fx = tick(&mut core, true, &[2]);
        assert_eq!(published(&fx), Some(BTreeMap::from([(2, false)])));
        // a late answer to round 1 is older than what we already know
        let fx = core.handle(Event::ProbeResult {
            id: 2,
            round: 1,
            ok: true,
        });
        assert!(published(&fx).is_none());
    }
}
