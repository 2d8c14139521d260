//! The leader's aggregation loop: on every tick while this node leads, the placement core
//! (`yard_actors::aggregator::placement`) decides on the replicated tables, the leader's
//! reachability view (and how long each node has been unreachable, `Sustained`) and the hosts
//! it committed dead (agents, which its probes do not watch), and its commands are proposed.
//! Each command is guarded by its job's epoch, so a decision overtaken by another write is
//! skipped at apply time; the loop itself decides nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use yard_actors::aggregator::placement::{decide, ClusterView, Sustained};
use yard_raft_store::Command;

use crate::agg_feed::{catch_up, Following, Inputs};
use crate::service::Node;

/// Runs until the process ends.
pub async fn run(node: Node, every: Duration, worker_gone: Duration) {
    let mut tick = tokio::time::interval(every);
    let began = tokio::time::Instant::now();
    let gone_ms = u64::try_from(worker_gone.as_millis()).unwrap_or(u64::MAX);
    let mut sustained = Sustained::new(gone_ms);
    // The last inputs that decided nothing: the same tables revision and view decide the same
    // again (the core is pure), so the grouping's search is not rerun on every tick.
    let mut settled: Option<(u64, ClusterView)> = None;
    let mut following: Following = None;
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if node.raft().metrics().borrow().state != ServerState::Leader {
            // A new term starts the stretches over: only this leader's own probes count.
            sustained = Sustained::new(gone_ms);
            settled = None;
            following = None;
            crate::raft_wait::wait_leading(node.raft(), crate::raft_wait::IDLE_RECHECK).await;
            continue;
        }
        let unreachable: BTreeSet<u64> = node
            .reachability()
            .into_iter()
            .filter(|(_, ok)| !ok)
            .map(|(id, _)| id)
            .collect();
        if !catch_up(|| node.feed().subscribe_with(Inputs::of), &mut following) {
            return;
        }
        let Some((inputs, _)) = following.as_ref() else {
            continue;
        };
        let tables = Arc::clone(&inputs.tables);
        let now_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut view = sustained.view(
            now_ms,
            &unreachable,
            &inputs.hosts_down,
            inputs.node_ips.clone(),
        );
        view.drained = inputs.drained.clone();
        let key = (tables.revision, view.clone());
        if settled.as_ref() == Some(&key) {
            continue;
        }
        // The grouping's search can take a while on a large job: on a blocking thread, on
        // the shared tables, so the runtime's other tasks (Raft, QUIC) are not held up by it.
        let decided = tokio::task::spawn_blocking({
            let view = view.clone();
            move || decide(&tables, &view)
        })
        .await;
        let decision = match decided {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "the aggregation decision failed; deciding again next tick");
                continue;
            }
        };
        if decision.commands.is_empty() {
            settled = Some(key);
        }
        for cmd in decision.commands {
            tracing::info!(command = ?cmd, "aggregation decision");
            if let Err(e) = node.raft().client_write(Command::Aggregation(cmd)).await {
                tracing::warn!(error = %e, "aggregation decision not committed; deciding again next tick");
                break;
            }
        }
    }
}

/// Runs on a node whose aggregator is disabled, until the process ends: whenever the replicated
/// tables list this node as an aggregating host (it was enabled before a restart, or its
/// registration was still being retried), it asks for the host to be deregistered
/// (`AggCommand::Host` with no slots), so the leader stops placing jobs on a program that no
/// longer runs and moves those it had there. Driven by the change feed, so an idle node sends
/// nothing.
pub async fn deregister_while_disabled(node: Node) {
    use tokio::sync::broadcast::error::RecvError;
    use yard_raft_store::Change;

    let me = node.id();
    let (data, mut rx) = node.feed().subscribe();
    let mut listed = data.aggregation.hosts.get(&me).map(|h| h.ip);
    loop {
        if let Some(ip) = listed {
            let req = crate::rpc::AdminRequest::Agg(crate::rpc::AggRequest::Host {
                node: me,
                ip,
                slots: 0,
                cpu_millis: 0,
            });
            match node.serve_admin(req).await {
                crate::rpc::Reply::Admin(_) => {
                    tracing::info!(node = me, %ip, "aggregator disabled: deregistered this host");
                }
                other => {
                    tracing::debug!(reply = ?other, "deregistration not committed yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    listed = node
                        .feed()
                        .read(|d| d.aggregation.hosts.get(&me).map(|h| h.ip));
                    continue;
                }
            }
        }
        listed = match rx.recv().await {
            Ok(Change::Aggregation { tables, .. }) => tables.hosts.get(&me).map(|h| h.ip),
            Ok(Change::Reset { .. }) | Err(RecvError::Lagged(_)) => {
                let (data, fresh) = node.feed().subscribe();
                rx = fresh;
                data.aggregation.hosts.get(&me).map(|h| h.ip)
            }
            Ok(_) => None,
            Err(RecvError::Closed) => return,
        };
    }
}
