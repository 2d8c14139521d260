//! The aggregation state the node's aggregation loops (the leader's placement, the bandwidth
//! probes and drift watch) decide on, followed through the change feed. Read once under the
//! state machine's lock when a loop starts (or after a lag or a snapshot), so a tick takes no
//! lock and copies nothing that grows with the cluster: before, the leader's loop copied the
//! whole tables under the lock on every 100 ms tick to find out nothing had changed, and every
//! node's probe loop ran its due-list and drift search under the lock every second.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::TryRecvError;
use yard_raft_store::aggregation::AggTables;
use yard_raft_store::{Change, NodeId, StateMachineData};

/// What the aggregation loops read from the replicated state, followed through the change
/// feed: the aggregation tables as the feed publishes them (shared, never copied), each node's
/// advertised address and host IP, and the hosts the leader committed dead.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub tables: Arc<AggTables>,
    /// Each node's advertised address (`NodeMeta::addr`), where its node endpoint answers.
    pub node_addrs: BTreeMap<NodeId, String>,
    /// Each node's host address, where it has an IPv4 one ([`crate::agg_service::node_ip`]).
    pub node_ips: BTreeMap<NodeId, Ipv4Addr>,
    /// Hosts the leader committed dead (`Command::HostLiveness`): agents, which its probes
    /// do not watch.
    pub hosts_down: BTreeSet<NodeId>,
    /// Hosts drained for maintenance (`Command::DrainNode`): no aggregator seat on them.
    pub drained: BTreeSet<NodeId>,
}

impl Inputs {
    /// The inputs as of `d` (called under the lock: the copies are the aggregation tables
    /// and the node addresses, not the rest of the state).
    pub fn of(d: &StateMachineData) -> Inputs {
        Inputs {
            tables: Arc::new(d.aggregation.clone()),
            node_addrs: d
                .nodes
                .iter()
                .map(|(id, m)| (*id, m.addr.clone()))
                .collect(),
            node_ips: crate::agg_service::node_ips(d),
            hosts_down: d.hosts_down.clone(),
            drained: d.drained.clone(),
        }
    }

    /// Follows one change; `false` when the inputs must be read again (a snapshot replaced
    /// the state).
    pub fn apply(&mut self, change: &Change) -> bool {
        match change {
            Change::Aggregation { tables, .. } => self.tables = Arc::clone(tables),
            Change::Node { id, meta, .. } => {
                match meta {
                    Some(m) => self.node_addrs.insert(*id, m.addr.clone()),
                    None => self.node_addrs.remove(id),
                };
                match meta.as_ref().and_then(crate::agg_service::node_ip) {
                    Some(ip) => self.node_ips.insert(*id, ip),
                    None => self.node_ips.remove(id),
                };
            }
            Change::HostLiveness { id, alive, .. } => {
                if *alive {
                    self.hosts_down.remove(id);
                } else {
                    self.hosts_down.insert(*id);
                }
            }
            Change::Drain { id, drained, .. } => {
                if *drained {
                    self.drained.insert(*id);
                } else {
                    self.drained.remove(id);
                }
            }
            Change::Reset { .. } => return false,
            Change::Kv { .. } | Change::Gateway { .. } => {}
        }
        true
    }
}

/// The inputs and the feed they follow; `None` until the first [`catch_up`] (the leader's loop
/// sets it back to `None` while this node does not lead, so it holds no receiver that fills).
pub type Following = Option<(Inputs, broadcast::Receiver<Change>)>;

/// Brings `following` up to the feed's latest change without blocking: subscribes (through
/// `subscribe`, the one read under the lock) if it was not following, and again after a reset
/// or a lag. `false` if the feed is closed.
pub fn catch_up(
    subscribe: impl Fn() -> (Inputs, broadcast::Receiver<Change>),
    following: &mut Following,
) -> bool {
    loop {
        let Some((inputs, rx)) = following.as_mut() else {
            *following = Some(subscribe());
            return true;
        };
        match rx.try_recv() {
            Ok(change) => {
                if !inputs.apply(&change) {
                    *following = None;
                }
            }
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Lagged(skipped)) => {
                tracing::info!(
                    skipped,
                    "an aggregation loop lagged the change feed; reading the tables again"
                );
                *following = None;
            }
            Err(TryRecvError::Closed) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use yard_raft_store::aggregation::AggCommand;
    use yard_raft_store::Command;
    use yard_raft_store::NodeMeta;

    fn set_node(id: u64, addr: &str) -> Command {
        Command::SetNode(NodeMeta {
            id,
            name: format!("n{id}"),
            addr: addr.into(),
            ..NodeMeta::default()
        })
    }

    fn host(node: u64, slots: u32) -> Command {
        Command::Aggregation(AggCommand::Host {
            node,
            ip: Ipv4Addr::new(198, 18, 0, node as u8),
            slots,
            cpu_millis: 1000,
        })
    }

    /// One write of the kinds that change what the placement reads (node addresses, hosts,
    /// removals) or do not (KV).
    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            (1u64..5, 1u8..9).prop_map(|(id, last)| set_node(id, &format!("198.18.0.{last}:7480"))),
            (1u64..5).prop_map(|id| set_node(id, "localhost:7480")),
            (1u64..5).prop_map(|id| Command::RemoveNode { id }),
            (1u64..5, prop_oneof![Just(0u32), Just(100u32)]).prop_map(|(n, s)| host(n, s)),
            (1u64..5, any::<bool>()).prop_map(|(id, alive)| Command::HostLiveness { id, alive }),
            (1u64..5, any::<bool>()).prop_map(|(id, drained)| Command::DrainNode { id, drained }),
            (0u8..3).prop_map(|k| Command::Put {
                key: format!("k{k}"),
                value: "v".into(),
            }),
        ]
    }

    proptest! {
        /// Following the changes of any sequence of writes gives what reading the tables
        /// afresh gives, and the tables are the feed's own (shared, never copied).
        #[test]
        fn inputs_follow_every_change_as_a_fresh_read_would(
            cmds in proptest::collection::vec(command(), 0..40)
        ) {
            let mut sm = StateMachineData::default();
            let mut inputs = Inputs::of(&sm);
            let mut last_tables = None;
            for cmd in &cmds {
                let (_, changes) = sm.apply_command(cmd);
                for change in &changes {
                    prop_assert!(inputs.apply(change), "{change:?} asked for a resync");
                    if let Change::Aggregation { tables, .. } = change {
                        last_tables = Some(Arc::clone(tables));
                    }
                }
            }
            let fresh = Inputs::of(&sm);
            prop_assert_eq!(&*inputs.tables, &*fresh.tables);
            prop_assert_eq!(&inputs.node_ips, &fresh.node_ips);
            prop_assert_eq!(&inputs.node_addrs, &fresh.node_addrs);
            prop_assert_eq!(&inputs.hosts_down, &fresh.hosts_down);
            prop_assert_eq!(&inputs.drained, &fresh.drained);
            if let Some(t) = last_tables {
                prop_assert!(Arc::ptr_eq(&inputs.tables, &t), "the tables were copied");
            }
        }
    }

    /// A follower that lagged the feed, or saw a snapshot replace the state, reads the tables
    /// again (once each) and carries on from there; a closed feed ends it.
    #[test]
    fn catching_up_reads_again_after_a_lag_or_a_reset_and_only_then() {
        let (tx, _) = broadcast::channel::<Change>(2);
        let state = std::sync::Mutex::new(StateMachineData::default());
        let reads = std::sync::atomic::AtomicUsize::new(0);
        let subscribe = || {
            reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (Inputs::of(&state.lock().unwrap()), tx.subscribe())
        };
        let reads_so_far = || reads.load(std::sync::atomic::Ordering::SeqCst);
        let mut following: Following = None;
        assert!(catch_up(subscribe, &mut following));
        assert_eq!(reads_so_far(), 1);

        // Changes within the feed's capacity are followed, without reading the tables.
        let write = |cmd: &Command| {
            let (_, changes) = state.lock().unwrap().apply_command(cmd);
            for c in changes {
                let _ = tx.send(c);
            }
        };
        write(&set_node(1, "198.18.0.1:7480"));
        write(&host(1, 100));
        assert!(catch_up(subscribe, &mut following));
        assert_eq!(reads_so_far(), 1, "followed, not read again");
        let ips = |f: &Following| f.as_ref().unwrap().0.node_ips.clone();
        let hosts = |f: &Following| {
            f.as_ref()
                .unwrap()
                .0
                .tables
                .hosts
                .keys()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(ips(&following)[&1], Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(hosts(&following), [1]);

        // More than the feed holds: the follower lagged, so it reads the tables again.
        write(&set_node(2, "198.18.0.2:7480"));
        write(&host(2, 100));
        write(&set_node(3, "198.18.0.3:7480"));
        write(&host(1, 0));
        assert!(catch_up(subscribe, &mut following));
        assert_eq!(reads_so_far(), 2, "read again after the lag");
        assert_eq!(ips(&following).len(), 3);
        assert_eq!(hosts(&following), [2]);

        // A snapshot installed: read again.
        let _ = tx.send(Change::Reset { revision: 99 });
        assert!(catch_up(subscribe, &mut following));
        assert_eq!(reads_so_far(), 3, "read again after the reset");

        // The feed closed: the loop ends.
        let mut closed: Following = None;
        let (tx2, _) = broadcast::channel::<Change>(2);
        let rx = tx2.subscribe();
        drop(tx2);
        closed.replace((Inputs::of(&StateMachineData::default()), rx));
        assert!(!catch_up(subscribe, &mut closed));
    }
}
