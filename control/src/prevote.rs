//! Pre-vote in front of Raft elections (Raft dissertation §9.6), as a pure decision: whether
//! this node would grant another's pre-vote ([`grant`]) and when its own elections are enabled
//! ([`Gate`]). The node's shell (`node/src/prevote/`) reads openraft's state into a
//! [`LocalView`], asks the voters and turns [`Effect`]s into openraft's `elect` setting; the
//! reasons for the design are in its module doc.

use std::collections::BTreeSet;

/// A host's id, as Raft numbers it.
type NodeId = u64;

/// What this node knows of its own Raft state, for a pre-vote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalView {
    /// This node leads.
    pub leader: bool,
    /// How long ago this node last heard from a leader it follows (`None`: it follows none,
    /// e.g. it is a candidate or voted for one).
    pub heard_ms_ago: Option<u64>,
    /// The current voters.
    pub voters: BTreeSet<NodeId>,
}

/// Timings, all from the Raft section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreVoteConfig {
    /// A leader heard within this long keeps its followers from voting for anyone else:
    /// openraft's leader lease (the longest election timeout), which its real vote honours
    /// too. The dissertation's shortest election timeout (2.5 heartbeats here) let a
    /// follower whose heartbeats ran late on a loaded machine grant the lossy node's pre-vote.
    /// A follower of a dead leader still opens elections before openraft's timer runs out
    /// (lease + an election timeout).
    pub quiet_ms: u64,
    /// How long elections stay enabled after a granted round: long enough for openraft's own
    /// timer (leader lease + an election timeout after the last message) and a retry or two
    /// after a split vote.
    pub window_ms: u64,
    /// How often a round is started while no answer made a majority: one heartbeat.
    pub round_ms: u64,
}

/// Whether this node would vote for another now: not while it leads, nor while it hears from
/// the leader it follows.
pub fn grant(cfg: &PreVoteConfig, view: &LocalView) -> bool {
    !view.leader && view.heard_ms_ago.is_none_or(|ms| ms >= cfg.quiet_ms)
}

/// Silence is believed only for time this node was watching. After a stall of the whole
/// process or machine (a paused VM, an overloaded host: every task frozen together), each
/// node's last message from the leader looks old at once, and the first pre-vote asked after
/// it would be granted before the leader's next heartbeat could arrive: an election for
/// nothing (seen once in the in-memory suite on a loaded machine). So a gap between the gate's
/// ticks longer than half the quiet time restarts the watch, and silence counts from there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Watch {
    last_tick: Option<u64>,
    since: u64,
}

impl Watch {
    /// The gate ticked at `now_ms`.
    pub fn tick(&mut self, now_ms: u64, cfg: &PreVoteConfig) {
        if self
            .last_tick
            .is_none_or(|t| now_ms.saturating_sub(t) > cfg.quiet_ms / 2)
        {
            self.since = now_ms;
        }
        self.last_tick = Some(now_ms);
    }

    /// How long ago the leader was last heard, as far as this node watched.
    pub fn heard(&self, heard_ms_ago: Option<u64>, now_ms: u64) -> Option<u64> {
        heard_ms_ago.map(|ms| ms.min(now_ms.saturating_sub(self.since)))
    }
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Enable or disable openraft's election timer.
    Elect(bool),
    /// Stand for election now (after a short random stagger the shell adds, so that two
    /// nodes that won their pre-votes together rarely split the vote): a won pre-vote round
    /// has shown a majority would vote, which is what an election timeout waits to find out.
    /// Waiting for openraft's own timer after the pre-vote cost 50-80 ms more per failover
    /// than etcd, whose pre-vote is followed by its vote at once.
    Campaign,
    /// Ask these voters for their pre-vote in round `round`; feed answers to [`Gate::answer`].
    Ask { round: u64, to: Vec<NodeId> },
}

#[derive(Debug, Clone)]
struct Round {
    id: u64,
    started_ms: u64,
    voters: BTreeSet<NodeId>,
    granted: BTreeSet<NodeId>,
}

impl Round {
    fn won(&self) -> bool {
        self.granted.intersection(&self.voters).count() * 2 > self.voters.len()
    }
}

/// One node's election gate.
#[derive(Debug, Clone)]
pub struct Gate {
    cfg: PreVoteConfig,
    me: NodeId,
    /// Elections are enabled until then (ms), after a granted round.
    allowed_until: u64,
    round: Option<Round>,
    rounds: u64,
    /// The last setting given to openraft (`None`: none yet).
    elect: Option<bool>,
}

impl Gate {
    pub fn new(cfg: PreVoteConfig, me: NodeId) -> Self {
        Self {
            cfg,
            me,
            allowed_until: 0,
            round: None,
            rounds: 0,
            elect: None,
        }
    }

    /// Whether elections are enabled as of the last effect.
    pub fn electing(&self) -> bool {
        self.elect == Some(true)
    }

    fn set(&mut self, on: bool, out: &mut Vec<Effect>) {
        if self.elect != Some(on) {
            self.elect = Some(on);
            out.push(Effect::Elect(on));
        }
    }

    /// Re-evaluates at `now_ms` with this node's state.
    pub fn tick(&mut self, now_ms: u64, view: &LocalView) -> Vec<Effect> {
        let mut out = Vec::new();
        if view.leader || !view.voters.contains(&self.me) {
            // A leader does not elect; a learner cannot. Decided again once that changes.
            self.round = None;
            self.allowed_until = 0;
            self.set(false, &mut out);
            return out;
        }
        if view.heard_ms_ago.is_some_and(|ms| ms < self.cfg.quiet_ms) {
            self.round = None;
            self.allowed_until = 0;
            self.set(false, &mut out);
            return out;
        }
        if now_ms < self.allowed_until {
            self.set(true, &mut out);
            return out;
        }
        let due = self
            .round
            .as_ref()
            .is_none_or(|r| now_ms >= r.started_ms.saturating_add(self.cfg.round_ms));
        if due {
            self.rounds += 1;
            let round = Round {
                id: self.rounds,
                started_ms: now_ms,
                voters: view.voters.clone(),
                granted: BTreeSet::from([self.me]),
            };
            if round.won() {
                self.round = None;
                self.allowed_until = now_ms.saturating_add(self.cfg.window_ms);
                self.set(true, &mut out);
                out.push(Effect::Campaign);
                return out;
            }
            let to = round
                .voters
                .iter()
                .filter(|v| **v != self.me)
                .copied()
                .collect();
            out.push(Effect::Ask {
                round: round.id,
                to,
            });
            self.round = Some(round);
        }
        self.set(false, &mut out);
        out
    }

    /// `from`'s answer in round `round`.
    pub fn answer(&mut self, round: u64, from: NodeId, granted: bool, now_ms: u64) -> Vec<Effect> {
        let mut out = Vec::new();
        let Some(r) = self.round.as_mut().filter(|r| r.id == round) else {
            return out;
        };
        if granted {
            r.granted.insert(from);
        }
        if r.won() {
            self.round = None;
            self.allowed_until = now_ms.saturating_add(self.cfg.window_ms);
            self.set(true, &mut out);
            out.push(Effect::Campaign);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: PreVoteConfig = PreVoteConfig {
        quiet_ms: 50,
        window_ms: 320,
        round_ms: 20,
    };

    fn view(heard: Option<u64>, voters: &[NodeId]) -> LocalView {
        LocalView {
            leader: false,
            heard_ms_ago: heard,
            voters: voters.iter().copied().collect(),
        }
    }

    fn asked(effects: &[Effect]) -> Option<(u64, Vec<NodeId>)> {
        effects.iter().find_map(|e| match e {
            Effect::Ask { round, to } => Some((*round, to.clone())),
            _ => None,
        })
    }

    #[test]
    fn a_voter_refuses_while_it_leads_or_hears_its_leader() {
        assert!(!grant(
            &CFG,
            &LocalView {
                leader: true,
                ..view(None, &[1, 2, 3])
            }
        ));
        assert!(!grant(&CFG, &view(Some(49), &[1, 2, 3])));
        assert!(grant(&CFG, &view(Some(50), &[1, 2, 3])));
        assert!(grant(&CFG, &view(None, &[1, 2, 3])));
    }

    #[test]
    fn a_follower_hearing_its_leader_never_stands() {
        let mut g = Gate::new(CFG, 2);
        for t in 0..100 {
            let fx = g.tick(t * 20, &view(Some(10), &[1, 2, 3]));
            assert!(asked(&fx).is_none());
            assert!(!g.electing());
        }
    }

    /// The lossy follower: it hears nothing, but the others do and refuse; it never stands.
    #[test]
    fn a_follower_the_others_refuse_never_stands() {
        let mut g = Gate::new(CFG, 2);
        let mut rounds = 0;
        for t in 0..200 {
            let now = t * 10;
            let fx = g.tick(now, &view(Some(now + 60), &[1, 2, 3]));
            if let Some((round, to)) = asked(&fx) {
                rounds += 1;
                assert_eq!(to, vec![1, 3]);
                for v in to {
                    assert!(g.answer(round, v, false, now + 1).is_empty());
                }
            }
            assert!(!g.electing(), "elections enabled at {now} ms");
        }
        // One round per heartbeat, not one per tick.
        assert!((90..=110).contains(&rounds), "{rounds} rounds");
    }

    #[test]
    fn one_grant_of_three_voters_opens_elections_for_a_window() {
        let mut g = Gate::new(CFG, 2);
        let fx = g.tick(1_000, &view(Some(60), &[1, 2, 3]));
        let (round, _) = asked(&fx).unwrap();
        assert!(!g.electing());
        // Won: elections open and this node stands at once, not after openraft's timeout.
        assert_eq!(
            g.answer(round, 3, true, 1_005),
            vec![Effect::Elect(true), Effect::Campaign]
        );
        // A stale round's answer changes nothing.
        assert!(g.answer(round, 1, true, 1_006).is_empty());
        assert!(g.tick(1_300, &view(Some(360), &[1, 2, 3])).is_empty());
        assert!(g.electing());
        // Past the window, a new round is needed; until it wins, no elections.
        let fx = g.tick(1_400, &view(Some(460), &[1, 2, 3]));
        assert!(asked(&fx).is_some());
        assert!(fx.contains(&Effect::Elect(false)));
    }

    #[test]
    fn hearing_a_leader_again_closes_elections_at_once() {
        let mut g = Gate::new(CFG, 1);
        let (round, _) = asked(&g.tick(0, &view(None, &[1, 2, 3]))).unwrap();
        g.answer(round, 2, true, 1);
        assert!(g.electing());
        assert_eq!(
            g.tick(20, &view(Some(0), &[1, 2, 3])),
            vec![Effect::Elect(false)]
        );
        // A late answer of the abandoned round opens nothing.
        assert!(g.answer(round, 3, true, 21).is_empty());
        assert!(!g.electing());
    }

    #[test]
    fn silence_counts_only_while_watching() {
        let mut w = Watch::default();
        for t in (0..=200).step_by(20) {
            w.tick(t, &CFG);
        }
        // Ticking steadily: the leader's silence is believed as it is.
        assert_eq!(w.heard(Some(120), 200), Some(120));
        assert_eq!(w.heard(None, 200), None);
        // A stall: no tick for 400 ms. The silence before the stall is not believed; it is
        // believed again once it was watched for the quiet time.
        w.tick(600, &CFG);
        assert_eq!(w.heard(Some(420), 600), Some(0));
        assert!(!grant(&CFG, &view(w.heard(Some(420), 600), &[1, 2, 3])));
        for t in (620..=660).step_by(20) {
            w.tick(t, &CFG);
        }
        assert_eq!(w.heard(Some(480), 660), Some(60));
        assert!(grant(&CFG, &view(w.heard(Some(480), 660), &[1, 2, 3])));
        // A gap up to half the quiet time is ordinary lateness.
        w.tick(685, &CFG);
        assert_eq!(w.heard(Some(505), 685), Some(85));
    }

    #[test]
    fn a_sole_voter_elects_without_asking() {
        let mut g = Gate::new(CFG, 1);
        assert_eq!(
            g.tick(0, &view(None, &[1])),
            vec![Effect::Elect(true), Effect::Campaign]
        );
    }

    #[test]
    fn leaders_and_learners_do_not_elect() {
        let mut g = Gate::new(CFG, 4);
        assert_eq!(
            g.tick(0, &view(None, &[1, 2, 3])),
            vec![Effect::Elect(false)]
        );
        let mut g = Gate::new(CFG, 1);
        let leading = LocalView {
            leader: true,
            ..view(None, &[1, 2, 3])
        };
        assert_eq!(g.tick(0, &leading), vec![Effect::Elect(false)]);
    }

    /// Two followers of a dead leader: each refuses the other until both have been silent
    /// for `quiet_ms`; then the first round either starts wins, within two rounds of that.
    #[test]
    fn followers_of_a_dead_leader_open_elections_within_two_rounds_of_the_quiet_time() {
        let cfg = CFG;
        let (mut a, mut b) = (Gate::new(cfg, 1), Gate::new(cfg, 2));
        let voters = [1, 2, 3];
        // A heard the leader last at 0, B at 15 (a heartbeat later); the leader died then.
        let (last_a, last_b) = (0u64, 15u64);
        let mut opened = None;
        for now in (0..400).step_by(5) {
            let va = view(Some(now - last_a), &voters);
            let vb = view(Some(now.saturating_sub(last_b)), &voters);
            if let Some((round, _)) = asked(&a.tick(now, &va)) {
                let g = grant(&cfg, &vb);
                a.answer(round, 2, g, now);
            }
            if let Some((round, _)) = asked(&b.tick(now, &vb)) {
                let g = grant(&cfg, &va);
                b.answer(round, 1, g, now);
            }
            if (a.electing() || b.electing()) && opened.is_none() {
                opened = Some(now);
            }
        }
        let opened = opened.expect("no follower may elect");
        assert!(
            opened <= last_b + cfg.quiet_ms + 2 * cfg.round_ms,
            "elections opened at {opened} ms"
        );
    }
}
