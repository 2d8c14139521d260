//! The autopilot's loop: on the leader, every `TICK`, it builds the roles core's view of the
//! hosts and executes the one membership change `yard_control::roles::decide` returns, waiting
//! for it to commit before the next decision (one change at a time). Everything it decides is
//! in the core; this file only gathers the view and runs openraft's membership calls.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use openraft::{ChangeMembers, ServerState};
use yard_control::roles::{Action, ClusterView, HostView, Role};
use yard_raft_store::{Command, NodeId, NodeInfo};

use crate::roles::{host_meta, zone_of};
use crate::service::Node;

/// How often the leader reconsiders the roles.
const TICK: Duration = Duration::from_millis(500);
/// The longest one membership change may take before the loop gives up on it and decides again.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// When each host was last seen to change between alive and not, on the leader's clock: the
/// core's `since_ms`. A host first seen is taken to have changed just now, which is the
/// cautious reading for both rules that use it (a voter is replaced only after its grace, a
/// host promoted only after it was stable).
#[derive(Debug, Default)]
pub struct HostClock {
    seen: BTreeMap<NodeId, (bool, u64)>,
}

impl HostClock {
    fn since(&mut self, id: NodeId, alive: bool, now_ms: u64) -> u64 {
        let e = self.seen.entry(id).or_insert((alive, now_ms));
        if e.0 != alive {
            *e = (alive, now_ms);
        }
        e.1
    }
}

/// The hosts as the roles core sees them: Raft members with their roles, the leader's
/// reachability and replication lag; agents from the hosts table with the liveness their
/// replicas report.
pub fn view(
    node: &Node,
    clock: &mut HostClock,
    now_ms: u64,
    agent_lag: &BTreeMap<NodeId, u64>,
) -> ClusterView {
    view_of(node, clock, now_ms, agent_lag, true)
}

/// The members alone, which is all a joining host's role depends on
/// (`yard_control::roles::role_for_join`): a join costs the leader the same at 5,000 hosts as
/// at 5, where the whole view made N joins cost O(N²).
pub fn members_view(node: &Node) -> ClusterView {
    view_of(node, &mut HostClock::default(), 0, &BTreeMap::new(), false)
}

fn view_of(
    node: &Node,
    clock: &mut HostClock,
    now_ms: u64,
    agent_lag: &BTreeMap<NodeId, u64>,
    with_agents: bool,
) -> ClusterView {
    let (voters, members) = (node.voter_ids(), node.member_ids());
    let reach = node.reachability();
    let me = node.id();
    let metrics = node.raft().metrics().borrow().clone();
    let last = metrics.last_log_index.unwrap_or(0);
    let lag_of = |id: NodeId| -> Option<u64> {
        if id == me {
            return Some(0);
        }
        let matched = metrics
            .replication
            .as_ref()?
            .get(&id)?
            .map_or(0, |l| l.index);
        Some(last.saturating_sub(matched))
    };
    // One read of the tables for every host, agents and their liveness included.
    let (zones, agents, drained) = node.feed().read(|d| {
        let zones: BTreeMap<NodeId, Option<String>> = members
            .iter()
            .filter_map(|id| d.nodes.get(id).map(|n| (*id, zone_of(n))))
            .collect();
        let agents: Vec<(NodeId, Option<String>, bool)> = if with_agents {
            d.nodes
                .iter()
                .filter(|(id, _)| !members.contains(id))
                .map(|(id, n)| (*id, zone_of(n), !d.hosts_down.contains(id)))
                .collect()
        } else {
            Vec::new()
        };
        (zones, agents, d.drained.clone())
    });
    let mut hosts: Vec<HostView> = Vec::with_capacity(members.len() + agents.len());
    for id in &members {
        let alive = *id == me || reach.get(id).copied().unwrap_or(true);
        hosts.push(HostView {
            id: *id,
            zone: zones.get(id).cloned().flatten(),
            role: if voters.contains(id) {
                Role::Voter
            } else {
                Role::Replica
            },
            alive,
            since_ms: clock.since(*id, alive, now_ms),
            lag: lag_of(*id),
            drained: drained.contains(id),
        });
    }
    for (id, zone, alive) in agents {
        hosts.push(HostView {
            id,
            zone,
            role: Role::Agent,
            alive,
            since_ms: clock.since(id, alive, now_ms),
            lag: agent_lag.get(&id).copied(),
            drained: drained.contains(&id),
        });
    }
    ClusterView {
        now_ms,
        leader: me,
        hosts,
        change_in_flight: false,
    }
}

/// How often the autopilot asks the members where their agents' watches stand, while it may
/// need a candidate.
const LAG_EVERY: Duration = Duration::from_secs(2);

/// Whether the roles core may look for an agent to add: a voter or replica is down, or the
/// replicas are fewer than wanted.
fn wants_candidates(cfg: &yard_control::roles::RolesConfig, view: &ClusterView) -> bool {
    let count = |r: Role| view.hosts.iter().filter(|h| h.role == r).count();
    view.hosts.iter().any(|h| h.role != Role::Agent && !h.alive)
        || count(Role::Voter) < cfg.voters
        || count(Role::Replica) < cfg.replicas
}

/// Runs for the life of the node; acts only while it leads.
pub async fn run(node: Node) {
    let started = Instant::now();
    let mut clock = HostClock::default();
    let mut last_reason = String::new();
    let mut agent_lag: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut lag_asked: Option<Instant> = None;
    loop {
        tokio::time::sleep(TICK).await;
        if node.raft().metrics().borrow().state != ServerState::Leader {
            clock = HostClock::default();
            crate::raft_wait::wait_leading(node.raft(), crate::raft_wait::IDLE_RECHECK).await;
            continue;
        }
        let now_ms = started.elapsed().as_millis() as u64;
        let mut view = view(&node, &mut clock, now_ms, &agent_lag);
        if wants_candidates(node.roles(), &view)
            && lag_asked.is_none_or(|at| at.elapsed() >= LAG_EVERY)
        {
            // Agents' lag is known only to the members serving them: asked only while a
            // voter or replica is missing, when the core may need an agent to promote.
            lag_asked = Some(Instant::now());
            let commit = node.feed().applied_index();
            let members = node.member_ids();
            agent_lag = crate::roles::members::agent_positions(&node, &members, TICK)
                .await
                .into_iter()
                .map(|(id, p)| (id, p.lag(commit)))
                .collect();
            view = self::view(&node, &mut clock, now_ms, &agent_lag);
        }
        if yard_control::roles::hands_over(&view) {
            // A drained leader gives its leadership away first; the next leader demotes it.
            if let Err(why) = crate::roles::leader_transfer::transfer(&node, None).await {
                tracing::warn!(%why, "the drained leader could not hand over; retrying");
            }
            continue;
        }
        let decision = yard_control::roles::decide(node.roles(), &view);
        if decision.reason != last_reason {
            tracing::info!(reason = %decision.reason, action = ?decision.action, "autopilot");
            last_reason = decision.reason.clone();
        }
        node.set_autopilot_reason(decision.reason.clone());
        let Some(action) = decision.action else {
            continue;
        };
        match tokio::time::timeout(CHANGE_TIMEOUT, execute(&node, action)).await {
            Ok(Ok(())) => tracing::info!(%action, "autopilot change committed"),
            Ok(Err(e)) => tracing::warn!(%action, error = %e, "autopilot change failed"),
            Err(_) => tracing::warn!(%action, "autopilot change did not commit in time"),
        }
    }
}

/// Runs one action with openraft and records the host's new role in the hosts table.
async fn execute(node: &Node, action: Action) -> Result<(), String> {
    let raft = node.raft();
    let id = action.id();
    let ids = BTreeSet::from([id]);
    let err = |e: &dyn std::fmt::Display| e.to_string();
    match action {
        Action::Promote { .. } => raft
            .change_membership(ChangeMembers::AddVoterIds(ids), false)
            .await
            .map(drop)
            .map_err(|e| err(&e))?,
        // Kept as a learner: a demoted voter stays a caught-up replica.
        Action::Demote { .. } => raft
            .change_membership(ChangeMembers::RemoveVoters(ids), true)
            .await
            .map(drop)
            .map_err(|e| err(&e))?,
        Action::Drop { .. } => raft
            .change_membership(ChangeMembers::RemoveNodes(ids), false)
            .await
            .map(drop)
            .map_err(|e| err(&e))?,
        Action::AddReplica { .. } => {
            let meta = node
                .feed()
                .read(|d| d.nodes.get(&id).cloned())
                .ok_or_else(|| format!("host {id} is not in the hosts table"))?;
            let info = NodeInfo {
                addr: meta.addr.clone(),
                name: meta.name.clone(),
            };
            raft.add_learner(id, info, true)
                .await
                .map(drop)
                .map_err(|e| err(&e))?
        }
    }
    let meta = node.feed().read(|d| d.nodes.get(&id).cloned());
    if let Some(meta) = meta {
        let zone = zone_of(&meta).unwrap_or_default();
        let record = host_meta(id, &meta.name, &meta.addr, &zone, action.to_role());
        raft.client_write(Command::SetNode(record))
            .await
            .map_err(|e| err(&e))?;
    }
    Ok(())
}
