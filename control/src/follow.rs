//! Which Raft member an agent follows. Agents spread over the members by rendezvous hashing
//! (highest random weight): each agent ranks the members by a hash of the pair, so the agents
//! divide evenly, a member's loss moves only its own agents (to their second choice), and no
//! coordination is needed. The leader is taken last: it already carries every write's
//! replication, and the watch fan-out is what replicas are for.

use std::collections::BTreeSet;

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
    use proptest::prelude::*;

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
