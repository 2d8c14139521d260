//! Release levels and the cluster level that gates new formats, as etcd's cluster version does.
//!
//! Every encoding that crosses nodes or outlives a process is positional (bincode), so a node
//! of an earlier release cannot decode a command variant, a table field or a wire message that
//! was added after it. A rolling upgrade therefore runs two releases side by side, and nothing
//! the earlier one cannot read may be written until every host runs the new one.
//!
//! - Each release has a [`LEVEL`], raised whenever a release adds a command or a table field
//!   that an earlier one cannot decode. Releases before levels existed are level 0.
//! - The cluster's level lives in the replicated tables (`StateMachineData::cluster_level`,
//!   set by `Command::SetClusterLevel`), so every node reads the same one at the same index.
//!   It only ever rises.
//! - The leader raises it ([`next_level`]) once every host of the tables (voters, replicas and
//!   agents that are not known dead) has answered with its release level: the lowest of them.
//! - A command is proposed only when the cluster's level reaches the command's
//!   ([`command_level`], [`gate`]); otherwise it is refused with one sentence.
//! - Tables written at a level above this release's are refused with a sentence naming both
//!   (`earlier_tables`), so a node downgraded after the level rose stops with a reason instead
//!   of a decoding error.

use std::collections::BTreeMap;

use crate::{Command, NodeId};

/// This release's level: the highest cluster level whose formats it reads and writes.
///
/// Level 1 adds the cluster level itself (`Command::SetClusterLevel` and the tables' field)
/// and host drains (`Command::DrainNode`, the tables' `drained`).
pub const LEVEL: u32 = 1;

/// The lowest cluster level at which `cmd` may be proposed: the level of the release that
/// added it (or changed its encoding). A batch or a session-tagged write needs its parts'.
pub fn command_level(cmd: &Command) -> u32 {
    match cmd {
        Command::SetClusterLevel { .. } | Command::DrainNode { .. } => 1,
        Command::Batch(cmds) => cmds.iter().map(command_level).max().unwrap_or(0),
        Command::Once { cmd, .. } => command_level(cmd),
        _ => 0,
    }
}

/// Why `cmd` cannot be proposed in a cluster at `cluster_level`, if it cannot.
pub fn gate(cmd: &Command, cluster_level: u32) -> Result<(), String> {
    let needs = command_level(cmd);
    if needs <= cluster_level {
        return Ok(());
    }
    Err(format!(
        "this write needs cluster level {needs} and the cluster is at level {cluster_level}: some host still runs an earlier release; finish the upgrade of every host first"
    ))
}

/// What the leader does about the cluster level after asking every host for its release
/// level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raise {
    /// The cluster is at this release's level: nothing to ask any more.
    Done,
    /// Propose `Command::SetClusterLevel` with this level.
    To(u32),
    /// Stay: these hosts answered a lower level than this release's, or did not answer
    /// (`None`).
    Hold(Vec<(NodeId, Option<u32>)>),
}

/// Decides the cluster level from each host's answer (`None`: it did not answer). The level
/// rises to the lowest answer, capped at this release's; a host that did not answer holds it
/// where it is, because it may run any release. It never falls.
pub fn next_level(current: u32, answers: &BTreeMap<NodeId, Option<u32>>) -> Raise {
    if current >= LEVEL {
        return Raise::Done;
    }
    let behind: Vec<(NodeId, Option<u32>)> = answers
        .iter()
        .filter(|(_, level)| level.is_none_or(|l| l < LEVEL))
        .map(|(id, level)| (*id, *level))
        .collect();
    if behind.iter().any(|(_, level)| level.is_none()) {
        return Raise::Hold(behind);
    }
    let lowest = answers.values().flatten().copied().min().unwrap_or(LEVEL);
    let target = lowest.min(LEVEL);
    if target > current {
        Raise::To(target)
    } else {
        Raise::Hold(behind)
    }
}

/// Whether a host whose release level is `release` (None: it did not answer) may join a
/// cluster at `cluster_level`: it must read every command the tables may hold. A host of an
/// earlier release would fail on the first table or entry of a later level it is sent.
pub fn admits_host(cluster_level: u32, host: NodeId, release: Option<u32>) -> Result<(), String> {
    match release {
        Some(r) if r >= cluster_level => Ok(()),
        Some(r) => Err(format!(
            "node {host} runs a release of level {r} and the cluster is at level {cluster_level}; start it with a release of level {cluster_level} or later"
        )),
        None => Err(format!(
            "cannot ask node {host} which release it runs, and the cluster is at level {cluster_level}; it joins once it answers"
        )),
    }
}

/// The sentence for tables (a snapshot, a watch snapshot) written at `level`, above this
/// release's.
pub fn too_new(level: u32) -> String {
    format!(
        "these tables were written by a cluster at level {level} and this yard release is level {LEVEL}; run a release of level {level} or later"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_joins_only_with_a_release_of_the_cluster_level_or_later() {
        assert_eq!(admits_host(0, 7, Some(0)), Ok(()));
        assert_eq!(admits_host(1, 7, Some(2)), Ok(()));
        let old = admits_host(1, 7, Some(0)).unwrap_err();
        assert!(old.contains("node 7 runs a release of level 0") && old.contains("level 1"));
        assert!(admits_host(1, 7, None).is_err());
    }
    use proptest::prelude::*;

    fn answers(pairs: &[(NodeId, Option<u32>)]) -> BTreeMap<NodeId, Option<u32>> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn the_level_rises_only_when_every_host_answered_this_release() {
        assert_eq!(
            next_level(0, &answers(&[(1, Some(1)), (2, Some(1)), (9, Some(1))])),
            Raise::To(1)
        );
        // One host on the release before levels: hold, and say which.
        assert_eq!(
            next_level(0, &answers(&[(1, Some(1)), (2, Some(0)), (9, Some(1))])),
            Raise::Hold(vec![(2, Some(0))])
        );
        // One agent that did not answer may run anything.
        assert_eq!(
            next_level(0, &answers(&[(1, Some(1)), (9, None)])),
            Raise::Hold(vec![(9, None)])
        );
        assert_eq!(next_level(1, &answers(&[(2, Some(0))])), Raise::Done);
    }

    #[test]
    fn a_host_of_a_later_release_counts_as_this_one() {
        assert_eq!(
            next_level(0, &answers(&[(1, Some(1)), (2, Some(LEVEL + 3))])),
            Raise::To(LEVEL)
        );
    }

    #[test]
    fn commands_added_at_a_level_are_refused_below_it() {
        let set = Command::SetClusterLevel { level: 1 };
        assert_eq!(command_level(&set), 1);
        let put = Command::Put {
            key: "k".into(),
            value: "v".into(),
        };
        assert!(gate(&put, 0).is_ok());
        let why = gate(&Command::Batch(vec![put.clone(), set.clone()]), 0).unwrap_err();
        assert!(
            why.contains("needs cluster level 1 and the cluster is at level 0"),
            "{why}"
        );
        let once = Command::Once {
            tag: crate::SessionTag {
                client: 1,
                seq: 1,
                first_unacked: 1,
            },
            now_unix_ms: 0,
            cmd: Box::new(set.clone()),
        };
        assert!(gate(&once, 0).is_err());
        assert!(gate(&once, 1).is_ok());
    }

    proptest! {
        /// Whatever the hosts answer, the level never falls, never passes this release's, and
        /// never passes a host's answer.
        #[test]
        fn the_level_never_falls_or_passes_a_host(
            current in 0u32..=LEVEL,
            levels in proptest::collection::btree_map(1u64..50, proptest::option::of(0u32..4), 0..12),
        ) {
            match next_level(current, &levels) {
                Raise::Done => prop_assert!(current >= LEVEL),
                Raise::To(l) => {
                    prop_assert!(l > current && l <= LEVEL);
                    for level in levels.values() {
                        prop_assert!(level.is_some_and(|v| v >= l));
                    }
                }
                Raise::Hold(behind) => {
                    prop_assert!(!behind.is_empty());
                }
            }
        }
    }
}
