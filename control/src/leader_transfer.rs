//! Moving leadership to another voter (`yard leader transfer`, a drained leader), decided as
//! pure functions the leader's procedure follows.
//!
//! openraft 0.9 has no leadership transfer, and its followers refuse every vote while their
//! leader's lease lasts (`election_timeout_max` since its last append). So the leader stops
//! replicating to every voter but the target ([`pick`]) and proposes nothing new (writes wait
//! for the handover, then go to the new leader): the target receives every entry, and the
//! others' leases run out. Then ([`step`]) the target stands for election: its log is at least
//! as long as any other voter's, so they grant it their votes, and the old leader steps down on
//! the higher term. Writes pause for about one lease (`election_timeout_max`, 80 ms by
//! default) plus the election. etcd's `move-leader` does the same in spirit with raft's
//! TimeoutNow message.

use std::collections::{BTreeMap, BTreeSet};

/// Which voter takes over: `asked` if the operator named one, else the most caught-up voter
/// other than `me` that is not drained (ties: the lowest id). `matched`: the last log index
/// each voter is known to hold.
pub fn pick(
    me: u64,
    voters: &BTreeSet<u64>,
    drained: &BTreeSet<u64>,
    matched: &BTreeMap<u64, u64>,
    asked: Option<u64>,
) -> Result<u64, String> {
    if let Some(id) = asked {
        return if id == me {
            Err(format!("node {id} already leads"))
        } else if !voters.contains(&id) {
            Err(format!("node {id} is not a voter; only a voter can lead"))
        } else if drained.contains(&id) {
            Err(format!("node {id} is drained; undrain it before it leads"))
        } else {
            Ok(id)
        };
    }
    voters
        .iter()
        .filter(|id| **id != me && !drained.contains(id))
        .max_by_key(|id| {
            (
                matched.get(id).copied().unwrap_or(0),
                std::cmp::Reverse(**id),
            )
        })
        .copied()
        .ok_or_else(|| "no other voter can lead: add or undrain one first".to_string())
}

/// What the leader does next while it holds replication back for the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Keep holding: the others' leases or the target's log are not there yet.
    Wait,
    /// Ask the target to stand for election now.
    Elect,
    /// Stop holding and refuse the transfer, for this reason.
    GiveUp(String),
}

/// The step after holding for `held_ms`: the target may stand once every other voter's lease
/// (`lease_ms` since the last append it got, at most the hold's start) ran out and it holds
/// the leader's whole log (`target_matched` ≥ `last_log`). A target that does not catch up
/// within `limit_ms` is given up, so a slow target never stalls the cluster's replication for
/// longer than that.
pub fn step(
    target: u64,
    held_ms: u64,
    lease_ms: u64,
    target_matched: Option<u64>,
    last_log: u64,
    limit_ms: u64,
) -> Step {
    let caught_up = target_matched.is_some_and(|m| m >= last_log);
    if held_ms > lease_ms && caught_up {
        Step::Elect
    } else if held_ms >= limit_ms {
        Step::GiveUp(format!(
            "node {target} did not catch up with the leader's log within {limit_ms} ms; leadership stays"
        ))
    } else {
        Step::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn the_named_voter_or_the_most_caught_up_one_takes_over() {
        let voters = set(&[1, 2, 3]);
        let matched: BTreeMap<u64, u64> = [(1, 10), (2, 8), (3, 9)].into();
        assert_eq!(pick(1, &voters, &set(&[]), &matched, None), Ok(3));
        assert_eq!(pick(1, &voters, &set(&[3]), &matched, None), Ok(2));
        assert_eq!(pick(1, &voters, &set(&[]), &matched, Some(2)), Ok(2));
        let tied: BTreeMap<u64, u64> = [(1, 10), (2, 9), (3, 9)].into();
        assert_eq!(pick(1, &voters, &set(&[]), &tied, None), Ok(2));
        for (asked, says) in [(1, "already leads"), (4, "not a voter"), (3, "drained")] {
            let e = pick(1, &voters, &set(&[3]), &matched, Some(asked)).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        assert!(pick(1, &set(&[1]), &set(&[]), &matched, None).is_err());
        assert!(pick(1, &voters, &set(&[2, 3]), &matched, None).is_err());
    }

    #[test]
    fn the_target_stands_once_the_leases_ran_out_and_it_has_the_whole_log() {
        assert_eq!(step(2, 50, 80, Some(10), 10, 2000), Step::Wait);
        assert_eq!(step(2, 90, 80, Some(9), 10, 2000), Step::Wait);
        assert_eq!(step(2, 90, 80, None, 10, 2000), Step::Wait);
        assert_eq!(step(2, 90, 80, Some(10), 10, 2000), Step::Elect);
        assert!(matches!(
            step(2, 2000, 80, Some(9), 10, 2000),
            Step::GiveUp(_)
        ));
    }

    proptest! {
        /// Whatever the cluster, the pick is another voter that is not drained, and a named
        /// voter that qualifies is the one picked.
        #[test]
        fn a_pick_is_another_undrained_voter(
            me in 1u64..6,
            voters in proptest::collection::btree_set(1u64..6, 1..6),
            drained in proptest::collection::btree_set(1u64..6, 0..3),
            matched in proptest::collection::btree_map(1u64..6, 0u64..20, 0..6),
            asked in proptest::option::of(1u64..7),
        ) {
            if let Ok(id) = pick(me, &voters, &drained, &matched, asked) {
                prop_assert!(id != me && voters.contains(&id) && !drained.contains(&id));
                if let Some(a) = asked {
                    prop_assert_eq!(id, a);
                }
            } else if asked.is_none() {
                prop_assert!(voters.iter().all(|v| *v == me || drained.contains(v)));
            }
        }
    }
}
