//! Which Raft member an agent follows. Agents spread over the members by rendezvous hashing
//! (highest random weight): each agent ranks the members by a hash of the pair, so the agents
//! divide evenly, a member's loss moves only its own agents (to their second choice), and no
//! coordination is needed. The leader is taken last: it already carries every write's
//! replication, and the watch fan-out is what replicas are for.
//!
//! [`Follower`] keeps an agent on the member that last answered (sticky: a member that comes
//! back does not pull its agents back and forth), names a backup for a poll that goes
//! unanswered, and keeps a member that failed out of reach for a time that doubles with each
//! consecutive failure: a dead member still in the membership (until the autopilot removes
//! it) must not take an agent's polls again every few seconds, each one lost to a timeout
//! while the agent's member judges it silent.

use std::collections::{BTreeMap, BTreeSet};

/// The first pause after a member failed a poll.
pub const AVOID_MIN_MS: u64 = 1_000;
/// The longest pause.
pub const AVOID_MAX_MS: u64 = 30_000;

/// How often a member that may have been removed while it was away asks another member.
pub const MEMBER_CHECK_MS: u64 = 2_000;

/// Whether a host that Raft says is a member should ask another member now whether it still is
/// one. Raft's leader stops replicating to a host once its removal commits, so a host that was
/// down, paused or cut off at that moment restarts or resumes believing it is still a member:
/// a replica waits forever, a voter stands for election in a membership that no longer exists
/// (the Raft dissertation's disruptive removed server). A replica asks every
/// [`MEMBER_CHECK_MS`]; a voter only after hearing no leader for that long (a voter that hears
/// one is a member), and again every [`MEMBER_CHECK_MS`] while it hears none.
pub fn member_check_due(
    voter: bool,
    leaderless_ms: Option<u64>,
    since_last_check_ms: Option<u64>,
) -> bool {
    let quiet = since_last_check_ms.is_none_or(|ms| ms >= MEMBER_CHECK_MS);
    if voter {
        quiet && leaderless_ms.is_some_and(|ms| ms >= MEMBER_CHECK_MS)
    } else {
        quiet
    }
}

/// How long a voter has been without a leader it can count on, for [`member_check_due`]:
/// a follower's time since it last heard its leader (`heard_ms_ago`), a leader's time since a
/// quorum last acknowledged it (`quorum_ack_ms_ago`, never when `None`). A leader is not
/// leaderless by being one: a voter cut off while the others replaced it goes on believing it
/// leads its old term (openraft 0.9 has no check-quorum), and only a quorum's silence shows it.
pub fn leaderless_ms(
    leader: bool,
    heard_ms_ago: Option<u64>,
    quorum_ack_ms_ago: Option<u64>,
) -> Option<u64> {
    let ms = if leader {
        quorum_ack_ms_ago
    } else {
        heard_ms_ago
    };
    if leader && ms.is_some_and(|ms| ms < MEMBER_CHECK_MS) {
        return None;
    }
    Some(ms.unwrap_or(u64::MAX))
}

/// The addresses an agent keeps for its next start: the members it follows now (in id order),
/// then the seeds it was started with that are not among them. An agent's tables live in
/// memory only, so after a restart these are all it knows of its cluster; the host it joined
/// through may since have become an agent itself (the autopilot replaced it) or left, and an
/// agent remembering only that host would never find the cluster again.
pub fn seeds_to_remember(members: &BTreeMap<u64, String>, started_with: &[String]) -> Vec<String> {
    let mut seeds: Vec<String> = members.values().cloned().collect();
    for s in started_with {
        if !seeds.contains(s) {
            seeds.push(s.clone());
        }
    }
    seeds
}

/// Whether a member's answer shows that this host (`me`) was removed while it was away: the
/// member's membership is newer than the one this host last knew (`mine_at`, the log index of
/// its configuration) and does not hold this host. Then the host follows as an agent; otherwise
/// it leaves the answer alone and catches up through Raft.
pub fn removed_while_away(me: u64, mine_at: u64, theirs_at: u64, theirs: &BTreeSet<u64>) -> bool {
    theirs_at > mine_at && !theirs.contains(&me)
}

/// One agent's choice of member.
#[derive(Debug, Clone, Default)]
pub struct Follower {
    following: Option<u64>,
    /// Member -> (avoided until, consecutive failures).
    avoid: BTreeMap<u64, (u64, u32)>,
}

/// Where the next poll goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Targets {
    /// The member to poll.
    pub primary: u64,
    /// Where a second poll goes if the first is not answered in time (the primary itself
    /// when there is no other member).
    pub backup: u64,
}

impl Follower {
    /// The member this agent follows now, if one answered last.
    pub fn following(&self) -> Option<u64> {
        self.following
    }

    /// The next poll's targets among `members` (none: no member known yet).
    pub fn targets(
        &self,
        agent: u64,
        members: &BTreeSet<u64>,
        leader: Option<u64>,
        now_ms: u64,
    ) -> Option<Targets> {
        let avoided: BTreeSet<u64> = self
            .avoid
            .iter()
            .filter(|(_, (until, _))| *until > now_ms)
            .map(|(m, _)| *m)
            .collect();
        let order = ranked(agent, members, leader, &avoided);
        let primary = self
            .following
            .filter(|f| members.contains(f) && !avoided.contains(f))
            .or_else(|| order.first().copied())?;
        let backup = order
            .iter()
            .copied()
            .find(|m| *m != primary)
            .unwrap_or(primary);
        Some(Targets { primary, backup })
    }

    /// `member` answered a poll: follow it, and forget its failures.
    pub fn answered(&mut self, member: u64) {
        self.following = Some(member);
        self.avoid.remove(&member);
    }

    /// `member` failed a poll (an error, a timeout, or slower than the backup).
    pub fn failed(&mut self, member: u64, now_ms: u64) {
        if self.following == Some(member) {
            self.following = None;
        }
        let strikes = self.avoid.get(&member).map_or(0, |(_, s)| *s) + 1;
        let pause = AVOID_MIN_MS
            .saturating_mul(1 << (strikes - 1).min(16))
            .min(AVOID_MAX_MS);
        self.avoid.insert(member, (now_ms + pause, strikes));
    }
}

/// The members an agent may follow, best first: non-leaders by their hash with `agent`, then
/// the leader; members in `avoid` (recently failed) go after all others, in the same order.
pub fn ranked(
    agent: u64,
    members: &BTreeSet<u64>,
    leader: Option<u64>,
    avoid: &BTreeSet<u64>,
) -> Vec<u64> {
    let mut order: Vec<u64> = members.iter().copied().filter(|m| *m != agent).collect();
    order.sort_by_key(|m| {
        (
            avoid.contains(m),
            Some(*m) == leader,
            std::cmp::Reverse(weight(agent, *m)),
            *m,
        )
    });
    order
}

/// A well-mixed 64-bit hash of the pair (splitmix64's finaliser over both ids): stable across
/// versions and platforms, which a std `Hasher` does not promise.
fn weight(agent: u64, member: u64) -> u64 {
    let mut z = agent
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(member.rotate_left(32))
        .wrapping_add(0x6A09_E667_F3BC_C909);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_remembers_its_members_before_the_host_it_joined_through() {
        let members: BTreeMap<u64, String> = [(3, "198.18.0.3:7480"), (2, "198.18.0.2:7480")]
            .into_iter()
            .map(|(id, a)| (id, a.to_owned()))
            .collect();
        let joined = vec!["198.18.0.1:7480".to_owned(), "198.18.0.2:7480".to_owned()];
        assert_eq!(
            seeds_to_remember(&members, &joined),
            ["198.18.0.2:7480", "198.18.0.3:7480", "198.18.0.1:7480"]
        );
        assert_eq!(seeds_to_remember(&BTreeMap::new(), &joined), joined);
    }

    #[test]
    fn a_leader_is_leaderless_only_once_a_quorum_stops_acknowledging_it() {
        assert_eq!(leaderless_ms(true, None, Some(30)), None, "acked just now");
        assert_eq!(
            leaderless_ms(true, None, Some(MEMBER_CHECK_MS)),
            Some(MEMBER_CHECK_MS)
        );
        assert_eq!(
            leaderless_ms(true, None, None),
            Some(u64::MAX),
            "never acked"
        );
        let stale = leaderless_ms(true, None, Some(9_000));
        assert!(member_check_due(true, stale, None), "a cut-off leader asks");
    }

    #[test]
    fn a_follower_is_leaderless_for_as_long_as_it_heard_none() {
        assert_eq!(leaderless_ms(false, Some(40), Some(9_000)), Some(40));
        assert_eq!(leaderless_ms(false, None, None), Some(u64::MAX));
    }

    #[test]
    fn a_voter_checks_its_membership_only_after_hearing_no_leader_for_a_while() {
        assert!(!member_check_due(true, None, None), "it hears a leader");
        assert!(!member_check_due(true, Some(MEMBER_CHECK_MS - 1), None));
        assert!(member_check_due(true, Some(MEMBER_CHECK_MS), None));
        assert!(!member_check_due(
            true,
            Some(10 * MEMBER_CHECK_MS),
            Some(10)
        ));
        assert!(member_check_due(
            true,
            Some(10 * MEMBER_CHECK_MS),
            Some(MEMBER_CHECK_MS)
        ));
    }

    #[test]
    fn a_replica_checks_every_period_leader_or_not() {
        assert!(member_check_due(false, None, None));
        assert!(!member_check_due(false, None, Some(MEMBER_CHECK_MS - 1)));
        assert!(member_check_due(false, Some(0), Some(MEMBER_CHECK_MS)));
    }

    #[test]
    fn only_a_newer_membership_without_this_host_removes_it() {
        let without_me = BTreeSet::from([2, 3, 4]);
        let with_me = BTreeSet::from([1, 2, 3]);
        assert!(removed_while_away(1, 10, 20, &without_me));
        assert!(!removed_while_away(1, 10, 20, &with_me), "still a member");
        assert!(
            !removed_while_away(1, 20, 20, &without_me),
            "not newer than its own"
        );
        assert!(
            !removed_while_away(1, 30, 20, &without_me),
            "an older, stale answer"
        );
    }
    use proptest::prelude::*;

    #[test]
    fn an_agent_stays_with_the_member_that_answered() {
        let members = set(&[1, 2, 3]);
        let mut f = Follower::default();
        let first = f.targets(9, &members, Some(1), 0).unwrap();
        assert_ne!(first.primary, 1, "the leader is taken last");
        assert_ne!(first.primary, first.backup);
        // It answered through the backup (the ranked first was slow): stay there.
        f.failed(first.primary, 0);
        f.answered(first.backup);
        let next = f.targets(9, &members, Some(1), 10_000_000).unwrap();
        assert_eq!(next.primary, first.backup);
    }

    #[test]
    fn a_failing_member_is_avoided_for_longer_each_time() {
        let members = set(&[1, 2]);
        let mut f = Follower::default();
        let dead = f.targets(5, &members, None, 0).unwrap().primary;
        let alive = if dead == 1 { 2 } else { 1 };
        let mut now = 0;
        for strike in 0..6u32 {
            f.failed(dead, now);
            let pause = (AVOID_MIN_MS << strike).min(AVOID_MAX_MS);
            assert_eq!(
                f.targets(5, &members, None, now + pause - 1)
                    .unwrap()
                    .primary,
                alive
            );
            now += pause;
            // Not followed any more: once the pause ends the ranked first is tried again.
            assert_eq!(f.targets(5, &members, None, now).unwrap().primary, dead);
        }
        f.answered(dead);
        f.failed(dead, now);
        f.answered(dead);
        assert_eq!(f.targets(5, &members, None, now).unwrap().primary, dead);
    }

    #[test]
    fn one_member_is_its_own_backup_and_none_gives_no_target() {
        let f = Follower::default();
        assert_eq!(
            f.targets(5, &set(&[3]), Some(3), 0),
            Some(Targets {
                primary: 3,
                backup: 3
            })
        );
        assert_eq!(f.targets(5, &BTreeSet::new(), None, 0), None);
    }

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn the_leader_comes_last_and_failed_members_after_it() {
        let members = set(&[1, 2, 3, 4, 5]);
        let order = ranked(100, &members, Some(2), &set(&[4]));
        assert_eq!(order.len(), 5);
        assert_eq!(order[3], 2);
        assert_eq!(order[4], 4);
    }

    #[test]
    fn agents_spread_evenly_over_the_replicas() {
        let members = set(&[1, 2, 3, 4, 5]);
        let mut load = std::collections::BTreeMap::new();
        for agent in 1000..6000 {
            *load
                .entry(ranked(agent, &members, Some(1), &BTreeSet::new())[0])
                .or_insert(0) += 1;
        }
        // Four non-leaders share 5,000 agents: each within 10% of 1,250.
        assert_eq!(load.len(), 4, "{load:?}");
        assert!(load.values().all(|n| (1125..=1375).contains(n)), "{load:?}");
    }

    proptest! {
        /// Losing a member moves only the agents that followed it.
        #[test]
        fn a_lost_member_moves_only_its_own_agents(agent in 0u64..1_000_000, lost in 1u64..8) {
            let members: BTreeSet<u64> = (1..8).collect();
            let before = ranked(agent, &members, None, &BTreeSet::new())[0];
            let mut fewer = members.clone();
            fewer.remove(&lost);
            let after = ranked(agent, &fewer, None, &BTreeSet::new())[0];
            if before != lost {
                prop_assert_eq!(before, after);
            }
        }
    }
}
