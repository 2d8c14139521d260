//! Role assignment and the membership autopilot.
//!
//! A Switchyard cluster keeps a small Raft voter set. Every other host is a
//! **replica** (a non-voting openraft learner that receives the log and serves
//! watch streams) or an **agent** (outside Raft membership; it follows the
//! state through a watch from a replica). The Raft leader runs this module to
//! decide which role a joining host gets ([`role_for_join`]) and which single
//! membership change the autopilot makes next ([`decide`]).
//!
//! The module is a pure function of its inputs: no I/O, no clock and no
//! randomness. Time arrives as [`ClusterView::now_ms`], so every rule can be
//! tested by building a view by hand, and two leaders shown the same view make
//! the same choice. The shell runs at most one change at a time
//! (`change_membership`, `add_learner`) and calls [`decide`] again after each
//! change commits, so each decision only has to be safe on its own.
//!
//! # Definitions used throughout
//!
//! * A host is **down** when `alive` is false; it has been down for
//!   `now_ms - since_ms`.
//! * A host is **gone** when it has been down for at least `voter_grace_ms`.
//!   Only gone hosts are replaced or dropped, so a host that restarts inside
//!   the grace keeps its place.
//! * A host is **stable** when it is alive and has been alive for at least
//!   `stable_ms`; only stable hosts are promoted or added, so a host that has
//!   just come back is not trusted with a vote.
//! * A host is **caught up** when its `lag` is known and at most `max_lag`.
//!   A voter that must first replay a long log would slow every commit.
//! * A host is **eligible** when it is stable and caught up.
//! * The **healthy** voters (and replicas) are those that are not gone.
//!
//! # Zones
//!
//! `zone: None` counts as *no zone*: it carries no placement information, so
//! it never makes a zone look crowded, never counts as filling an empty zone,
//! and never starts a rebalance. When ranking candidates, an unknown zone sits
//! between a known zone holding no voter (certainly adds spread) and a known
//! zone already holding one (certainly adds none), because it may be either.
//! Counting each `None` as its own zone instead would let a cluster with no
//! zone labels look perfectly spread and hide crowding that is really there.
//!
//! # Small clusters
//!
//! With fewer hosts than `voters`, every host that can be a voter is one: two
//! hosts with a target of three are both voters, as the cluster has always
//! run. Two voters tolerate no failure, but a single voter tolerates none
//! either, and keeping both means the second host holds a full copy of the
//! log. This is the one place where an even voter count lasts; otherwise even
//! counts exist only between a `Promote` and the `Demote` that follows it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The part a host plays in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A member of the Raft voter set; counts towards quorum.
    Voter,
    /// A non-voting openraft learner that receives the log and serves watches.
    Replica,
    /// Outside Raft membership; follows the state through a replica's watch.
    Agent,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Voter => "voter",
            Role::Replica => "replica",
            Role::Agent => "agent",
        })
    }
}

/// The autopilot's targets and timings, read from the `raft.*` config keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RolesConfig {
    /// Target voter count; odd so that no vote can split evenly.
    pub voters: usize,
    /// Target replica count; replicas are the pool voters are replaced from.
    pub replicas: usize,
    /// How long a voter (or replica) must be down before it is replaced
    /// (or dropped), so that a restart does not churn membership.
    pub voter_grace_ms: u64,
    /// How long a host must have been alive before it is promoted or added,
    /// so that a host that flaps is not handed a vote.
    pub stable_ms: u64,
    /// How many entries a host may trail the leader's commit and still be
    /// promoted, so that a new voter does not stall commits while catching up.
    pub max_lag: u64,
}

impl Default for RolesConfig {
    fn default() -> Self {
        RolesConfig {
            voters: 3,
            replicas: 2,
            voter_grace_ms: 5000,
            stable_ms: 2000,
            max_lag: 64,
        }
    }
}

/// Why a [`RolesConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolesError {
    /// The voter target is even, zero or above seven.
    #[error("raft.voters must be an odd number from 1 to 7, not {0}")]
    Voters(usize),
    /// The grace is zero, which would replace a voter on every restart.
    #[error(
        "raft.voter_grace_ms must be at least 1, so a restarting voter is not replaced at once"
    )]
    VoterGrace,
}

impl RolesConfig {
    /// Checks the targets.
    ///
    /// Voters must be odd because an even set tolerates no more failures than
    /// the odd set one smaller, while needing one more vote per commit; more
    /// than seven voters makes every commit wait on more round trips for no
    /// useful gain in tolerance. A zero grace would turn every restart of a
    /// voter into a promote/demote pair.
    pub fn validate(&self) -> Result<(), RolesError> {
        if self.voters == 0 || self.voters > 7 || self.voters.is_multiple_of(2) {
            return Err(RolesError::Voters(self.voters));
        }
        if self.voter_grace_ms == 0 {
            return Err(RolesError::VoterGrace);
        }
        Ok(())
    }
}

/// What the leader knows about one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostView {
    /// The host's Raft node id.
    pub id: u64,
    /// The failure zone the host reports, if any.
    pub zone: Option<String>,
    /// The host's current role as the leader last committed it.
    pub role: Role,
    /// Whether the host currently answers.
    pub alive: bool,
    /// When `alive` last changed, in the same clock as `now_ms`.
    pub since_ms: u64,
    /// Entries the host trails the leader's commit; `None` when unknown.
    pub lag: Option<u64>,
    /// Drained for maintenance (`yard node drain`): it is given no vote or replica seat, and
    /// the ones it holds go to other hosts as if it were gone, without the grace. The leader
    /// itself keeps its vote while it leads (demoting it would force an election): it hands
    /// its leadership over first ([`hands_over`]), and the next leader then demotes it.
    pub drained: bool,
}

/// The leader's view of the whole cluster at one instant.
///
/// The leader must appear in `hosts` as an alive voter; if it does not, the
/// view is inconsistent and [`decide`] makes no change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The current time, in milliseconds on the leader's clock.
    pub now_ms: u64,
    /// The id of the leader running the autopilot.
    pub leader: u64,
    /// Every known host, each id once.
    pub hosts: Vec<HostView>,
    /// Whether a membership change has been proposed and not yet committed.
    pub change_in_flight: bool,
}

/// One membership change for the shell to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Replica to voter.
    Promote { id: u64 },
    /// Voter to replica, whether the voter is alive or down.
    Demote { id: u64 },
    /// Replica to agent; the host leaves Raft membership entirely.
    Drop { id: u64 },
    /// Agent to replica.
    AddReplica { id: u64 },
}

impl Action {
    /// The host the action changes.
    pub fn id(&self) -> u64 {
        match *self {
            Action::Promote { id }
            | Action::Demote { id }
            | Action::Drop { id }
            | Action::AddReplica { id } => id,
        }
    }

    /// The role the action takes its host from.
    pub fn from_role(&self) -> Role {
        match self {
            Action::Promote { .. } | Action::Drop { .. } => Role::Replica,
            Action::Demote { .. } => Role::Voter,
            Action::AddReplica { .. } => Role::Agent,
        }
    }

    /// The role the action gives its host.
    pub fn to_role(&self) -> Role {
        match self {
            Action::Promote { .. } => Role::Voter,
            Action::Demote { .. } | Action::AddReplica { .. } => Role::Replica,
            Action::Drop { .. } => Role::Agent,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host {} from {} to {}",
            self.id(),
            self.from_role(),
            self.to_role()
        )
    }
}

/// The autopilot's next step and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The change to make, or `None` to make none now.
    pub action: Option<Action>,
    /// One lowercase sentence a `yard members` user can read.
    pub reason: String,
}

impl Decision {
    fn act(action: Action, reason: String) -> Self {
        Decision {
            action: Some(action),
            reason,
        }
    }

    fn wait(reason: String) -> Self {
        Decision {
            action: None,
            reason,
        }
    }
}

/// The role a host that asks to join gets.
///
/// * A host already in the view keeps its role: a rejoin after a restart must
///   not reshuffle membership; the autopilot moves hosts when needed.
/// * With quorum lost (or an invalid config) the host becomes an agent, which
///   needs no membership change, because no change could commit anyway.
/// * While the voter set is below target the host becomes a voter, even while
///   another change is in flight: a cluster whose first hosts start together
///   should not wait `stable_ms` per host to gain fault tolerance, and the
///   shell queues the change behind the one in flight. If the in-flight change
///   was itself a voter join, the set may overshoot; the autopilot's shrink
///   rule demotes the extra voter, so the overshoot is harmless.
/// * Otherwise, while a change is in flight the host becomes an agent: a
///   second queued change would be decided on a stale view, and the autopilot
///   adds the host as a replica once it is stable if one is needed.
/// * Otherwise the host becomes a replica while healthy replicas are below
///   target, else an agent.
///
/// The zone does not affect the role: a host that has just joined is not yet
/// stable, so zone placement is left to the autopilot, which sees the host
/// again once it has been alive for `stable_ms`.
pub fn role_for_join(cfg: &RolesConfig, view: &ClusterView, id: u64, _zone: Option<&str>) -> Role {
    if let Some(host) = view.hosts.iter().find(|h| h.id == id) {
        return host.role;
    }
    let c = Cluster::new(cfg, view);
    if cfg.validate().is_err() || !c.has_quorum() {
        return Role::Agent;
    }
    if c.count(Role::Voter) < cfg.voters {
        return Role::Voter;
    }
    if view.change_in_flight {
        return Role::Agent;
    }
    if c.healthy_count(Role::Replica) < cfg.replicas {
        Role::Replica
    } else {
        Role::Agent
    }
}

/// Whether the leader should hand its leadership to another voter before anything else: it is
/// drained and another voter that is alive and not drained can take over
/// (`yard_control::leader_transfer` picks which).
pub fn hands_over(view: &ClusterView) -> bool {
    let leader_drained = view.hosts.iter().any(|h| h.id == view.leader && h.drained);
    leader_drained
        && view
            .hosts
            .iter()
            .any(|h| h.id != view.leader && h.role == Role::Voter && h.alive && !h.drained)
}

/// The autopilot's next membership change.
///
/// The rules are tried in order and the first that applies wins; each returns
/// at most one action, and every action keeps a majority of the new voter set
/// alive (see `Cluster::keeps_quorum`).
///
/// 1. `blocked`: no change while the config is invalid, a change is in
///    flight, the view is inconsistent, or quorum is lost.
/// 2. `shrink`: with more voters than the target, demote one.
/// 3. `fill`: with fewer healthy voters than the target, promote a replica
///    (or add an agent as a replica to promote next).
/// 4. `drop_gone_replica`: drop a replica that has been down past the grace.
/// 5. `drop_surplus_replica`: with more healthy replicas than the target,
///    drop one.
/// 6. `add_replica`: with fewer healthy replicas than the target, add one.
/// 7. `rebalance`: promote a replica into a zone with no voter while another
///    zone holds two or more.
/// 8. `idle`: otherwise explain why nothing is done.
pub fn decide(cfg: &RolesConfig, view: &ClusterView) -> Decision {
    let c = Cluster::new(cfg, view);
    blocked(&c)
        .or_else(|| shrink(&c))
        .or_else(|| fill(&c))
        .or_else(|| drop_gone_replica(&c))
        .or_else(|| drop_surplus_replica(&c))
        .or_else(|| add_replica(&c))
        .or_else(|| rebalance(&c))
        .unwrap_or_else(|| idle(&c))
}

/// Refuses any change while one could be wrong or could not commit.
///
/// An in-flight change means the view is about to change; deciding on it
/// could stack two changes, which openraft forbids and which could break
/// quorum between them. Without a majority of voters alive nothing commits,
/// so proposing a change would only hang the shell.
fn blocked(c: &Cluster) -> Option<Decision> {
    if let Err(e) = c.cfg.validate() {
        return Some(Decision::wait(format!(
            "no membership change while the config is invalid: {e}"
        )));
    }
    if c.view.change_in_flight {
        return Some(Decision::wait(
            "a membership change is in flight; the next one waits until it commits".into(),
        ));
    }
    if !c.leader_is_alive_voter() {
        return Some(Decision::wait(format!(
            "leader {} is not an alive voter in this view; no membership change until the view is consistent",
            c.view.leader
        )));
    }
    if !c.has_quorum() {
        return Some(Decision::wait(format!(
            "quorum lost: {} of {} voters alive; no membership change can commit",
            c.alive_voters(),
            c.count(Role::Voter)
        )));
    }
    None
}

/// Demotes one voter while the voter set is above target.
///
/// This finishes a replacement (after a `Promote` the set is one over, and
/// the gone voter is the one to leave) and shrinks an old all-voter cluster
/// one step at a time. Down voters go first because they contribute nothing
/// to quorum; then voters from the most crowded zone, so the survivors spread
/// over zones; then the most lagging, then the highest id, so the choice is
/// deterministic. The leader is never demoted: the leader removing itself
/// forces an election and a pause in commits.
fn shrink(c: &Cluster) -> Option<Decision> {
    let n = c.count(Role::Voter);
    if n <= c.cfg.voters {
        return None;
    }
    let victim = c
        .hosts(Role::Voter)
        .filter(|v| v.id != c.view.leader)
        .filter(|v| c.keeps_quorum(Action::Demote { id: v.id }))
        .max_by_key(|v| c.demote_key(v))?;
    let why = match c.down_for(victim) {
        _ if c.is_drained(victim) => format!("demoting voter {}, drained,", victim.id),
        Some(ms) => format!("demoting voter {}, down for {ms} ms,", victim.id),
        None => match victim.zone.as_deref() {
            Some(z) => format!(
                "demoting voter {} (zone {z} holds {} voters)",
                victim.id,
                c.zone_voters(z)
            ),
            None => format!("demoting voter {}", victim.id),
        },
    };
    Some(Decision::act(
        Action::Demote { id: victim.id },
        format!(
            "{why} to bring the voter set from {n} back to {}",
            c.cfg.voters
        ),
    ))
}

/// Restores the voter count when healthy voters are below target.
///
/// Add before remove: the replacement is promoted while the gone voter still
/// holds its seat, so the set never shrinks below the target in between, and
/// [`shrink`] then demotes the gone voter. Only eligible replicas are
/// promoted. If none exists, an eligible agent is added as a replica so the
/// next decision can promote it; otherwise the autopilot waits (see [`idle`]).
fn fill(c: &Cluster) -> Option<Decision> {
    let healthy = c.healthy_count(Role::Voter);
    if healthy >= c.cfg.voters {
        return None;
    }
    let purpose = match c.longest_gone(Role::Voter) {
        Some(g) => format!("to replace voter {}, {}", g.id, c.gone_note(g)),
        None => format!(
            "because the voter set has {healthy} of {} voters",
            c.cfg.voters
        ),
    };
    if let Some(r) = c.best_candidate(Role::Replica, true) {
        return Some(Decision::act(
            Action::Promote { id: r.id },
            format!("promoting replica {}{} {purpose}", r.id, zone_note(r)),
        ));
    }
    let a = c.best_candidate(Role::Agent, true)?;
    Some(Decision::act(
        Action::AddReplica { id: a.id },
        format!(
            "adding agent {}{} as a replica so it can be promoted {purpose}",
            a.id,
            zone_note(a)
        ),
    ))
}

/// Drops a replica that has been down past the grace.
///
/// A gone learner still costs the leader replication work and hides the fact
/// that the replica pool is short; dropping it lets [`add_replica`] refill the
/// pool. The longest-down replica goes first. If the host returns it is an
/// agent and can be added again.
fn drop_gone_replica(c: &Cluster) -> Option<Decision> {
    let r = c.longest_gone(Role::Replica)?;
    Some(Decision::act(
        Action::Drop { id: r.id },
        format!(
            "dropping replica {}, {}, from raft membership",
            r.id,
            c.gone_note(r)
        ),
    ))
}

/// Drops one replica while healthy replicas are above target.
///
/// Every learner costs the leader a replication stream. Down replicas go
/// first, then those least useful as a future voter: not eligible, in a
/// crowded zone, most lagging, highest id.
fn drop_surplus_replica(c: &Cluster) -> Option<Decision> {
    let n = c.healthy_count(Role::Replica);
    if n <= c.cfg.replicas {
        return None;
    }
    let r = c
        .hosts(Role::Replica)
        .filter(|r| !c.is_gone(r) && r.id != c.view.leader)
        .max_by_key(|r| c.drop_key(r))?;
    Some(Decision::act(
        Action::Drop { id: r.id },
        format!(
            "dropping replica {} to an agent because there are {n} replicas and the target is {}",
            r.id, c.cfg.replicas
        ),
    ))
}

/// Adds a stable agent as a replica while healthy replicas are below target.
///
/// Lag is not required here: a learner catches up from the log once added,
/// and it is only promoted once it has. Candidates are ranked like promotion
/// candidates so the pool favours zones without a voter.
fn add_replica(c: &Cluster) -> Option<Decision> {
    let n = c.healthy_count(Role::Replica);
    if n >= c.cfg.replicas {
        return None;
    }
    let a = c.best_candidate(Role::Agent, false)?;
    Some(Decision::act(
        Action::AddReplica { id: a.id },
        format!(
            "adding agent {}{} as a replica because there are {n} of {} replicas",
            a.id,
            zone_note(a),
            c.cfg.replicas
        ),
    ))
}

/// Promotes a replica into an empty zone while another zone holds two voters.
///
/// Losing a zone that holds two of three voters loses quorum, so spreading is
/// worth one promote/demote pair. It runs only in a settled voter set (at
/// target, all alive), and [`shrink`] then demotes from the most crowded
/// zone, never from the zone just filled (it holds one voter, the crowded
/// zone at least two). Each pair lowers the number of surplus voters sharing
/// a zone by one and nothing raises it again while liveness holds, so the
/// rebalance cannot oscillate. Hosts without a zone never trigger it.
fn rebalance(c: &Cluster) -> Option<Decision> {
    if c.count(Role::Voter) != c.cfg.voters || c.alive_voters() != c.cfg.voters {
        return None;
    }
    let (crowded, k) = c.most_crowded_zone()?;
    if k < 2 {
        return None;
    }
    let r = c
        .hosts(Role::Replica)
        .filter(|r| c.is_eligible(r))
        .filter(|r| r.zone.as_deref().is_some_and(|z| c.zone_voters(z) == 0))
        .min_by_key(|r| c.candidate_key(r))?;
    Some(Decision::act(
        Action::Promote { id: r.id },
        format!(
            "promoting replica {}{}, a zone with no voter, because zone {crowded} holds {k} voters",
            r.id,
            zone_note(r)
        ),
    ))
}

/// Explains why no change is made, most pressing first.
fn idle(c: &Cluster) -> Decision {
    let cfg = c.cfg;
    let healthy = c.healthy_count(Role::Voter);
    if healthy < cfg.voters {
        let what = match c.longest_gone(Role::Voter) {
            Some(g) if c.is_drained(g) => format!("voter {} is drained", g.id),
            Some(g) => format!(
                "voter {} has been down for {} ms",
                g.id,
                c.down_for(g).unwrap_or(0)
            ),
            None => format!("the voter set has {healthy} of {} voters", cfg.voters),
        };
        return Decision::wait(format!(
            "{what} but no replica or agent is alive for {} ms and within {} entries of the commit, so no voter can be added yet",
            cfg.stable_ms, cfg.max_lag
        ));
    }
    if let Some(d) = c.hosts(Role::Voter).find(|v| !v.alive) {
        return Decision::wait(format!(
            "voter {} has been down for {} ms, inside the {} ms grace, so it is not replaced yet",
            d.id,
            c.down_for(d).unwrap_or(0),
            cfg.voter_grace_ms
        ));
    }
    let replicas = c.healthy_count(Role::Replica);
    if replicas < cfg.replicas {
        return Decision::wait(format!(
            "there are {replicas} of {} replicas and no agent has been alive for {} ms to add",
            cfg.replicas, cfg.stable_ms
        ));
    }
    Decision::wait(format!(
        "membership is settled with {} voters, {replicas} replicas and {} agents",
        c.count(Role::Voter),
        c.count(Role::Agent)
    ))
}

/// " (zone x)" for a host with a zone, or nothing.
fn zone_note(h: &HostView) -> String {
    h.zone
        .as_deref()
        .map(|z| format!(" (zone {z})"))
        .unwrap_or_default()
}

/// The smallest number of votes that is a majority of `n` voters.
fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// Read-only helpers over one config and view.
struct Cluster<'a> {
    cfg: &'a RolesConfig,
    view: &'a ClusterView,
}

impl<'a> Cluster<'a> {
    fn new(cfg: &'a RolesConfig, view: &'a ClusterView) -> Self {
        Cluster { cfg, view }
    }

    fn hosts(&self, role: Role) -> impl Iterator<Item = &'a HostView> + 'a {
        self.view.hosts.iter().filter(move |h| h.role == role)
    }

    fn count(&self, role: Role) -> usize {
        self.hosts(role).count()
    }

    fn alive_voters(&self) -> usize {
        self.hosts(Role::Voter).filter(|h| h.alive).count()
    }

    /// Hosts of `role` that are not gone.
    fn healthy_count(&self, role: Role) -> usize {
        self.hosts(role).filter(|h| !self.is_gone(h)).count()
    }

    fn has_quorum(&self) -> bool {
        self.alive_voters() >= majority(self.count(Role::Voter))
    }

    fn leader_is_alive_voter(&self) -> bool {
        self.view
            .hosts
            .iter()
            .any(|h| h.id == self.view.leader && h.role == Role::Voter && h.alive)
    }

    /// How long `h` has been down, or `None` if it is alive.
    fn down_for(&self, h: &HostView) -> Option<u64> {
        (!h.alive).then(|| self.view.now_ms.saturating_sub(h.since_ms))
    }

    fn is_gone(&self, h: &HostView) -> bool {
        self.is_drained(h)
            || self
                .down_for(h)
                .is_some_and(|ms| ms >= self.cfg.voter_grace_ms)
    }

    /// Drained, and not the leader (which keeps its vote while it leads).
    fn is_drained(&self, h: &HostView) -> bool {
        h.drained && h.id != self.view.leader
    }

    fn is_stable(&self, h: &HostView) -> bool {
        !h.drained && h.alive && self.view.now_ms.saturating_sub(h.since_ms) >= self.cfg.stable_ms
    }

    /// Why `h` is gone, for a decision's reason: drained, or down for how long.
    fn gone_note(&self, h: &HostView) -> String {
        if self.is_drained(h) {
            "drained".into()
        } else {
            format!("down for {} ms", self.down_for(h).unwrap_or(0))
        }
    }

    fn is_eligible(&self, h: &HostView) -> bool {
        self.is_stable(h) && h.lag.is_some_and(|l| l <= self.cfg.max_lag)
    }

    /// The host of `role` that has been gone longest (lowest id on ties).
    fn longest_gone(&self, role: Role) -> Option<&'a HostView> {
        self.hosts(role)
            .filter(|h| self.is_gone(h))
            .max_by_key(|h| (self.down_for(h), std::cmp::Reverse(h.id)))
    }

    /// Healthy voters in the known zone `zone`.
    fn zone_voters(&self, zone: &str) -> usize {
        self.hosts(Role::Voter)
            .filter(|v| !self.is_gone(v) && v.zone.as_deref() == Some(zone))
            .count()
    }

    /// The known zone with the most healthy voters (lowest name on ties).
    fn most_crowded_zone(&self) -> Option<(&'a str, usize)> {
        self.hosts(Role::Voter)
            .filter_map(|v| v.zone.as_deref())
            .map(|z| (z, self.zone_voters(z)))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
    }

    /// How crowded `h`'s zone would be with `h` as a voter, doubled so that
    /// an unknown zone (3) ranks between a known empty zone (2) and a known
    /// zone already holding one voter (4). For a voter the count includes
    /// itself, so the same scale ranks demotion victims.
    fn zone_score(&self, h: &HostView) -> usize {
        match h.zone.as_deref() {
            None => 3,
            Some(z) => {
                let others =
                    self.zone_voters(z) - usize::from(h.role == Role::Voter && !self.is_gone(h));
                2 * (others + 1)
            }
        }
    }

    /// Promotion ranking, smallest first: emptiest zone, lowest lag (unknown
    /// last), lowest id.
    fn candidate_key(&self, h: &HostView) -> (usize, u64, u64) {
        (self.zone_score(h), h.lag.unwrap_or(u64::MAX), h.id)
    }

    /// The best host of `role` to promote or add: stable, and eligible when
    /// `need_caught_up`.
    fn best_candidate(&self, role: Role, need_caught_up: bool) -> Option<&'a HostView> {
        self.hosts(role)
            .filter(|h| self.is_stable(h))
            .filter(|h| !need_caught_up || self.is_eligible(h))
            .filter(|h| self.keeps_quorum(promotion(role, h.id)))
            .min_by_key(|h| self.candidate_key(h))
    }

    /// Demotion ranking, largest first: gone, then down longest, then most
    /// crowded zone, then most lagging, then highest id.
    fn demote_key(&self, v: &HostView) -> (bool, u64, usize, u64, u64) {
        (
            self.is_gone(v),
            self.down_for(v).unwrap_or(0),
            self.zone_score(v),
            v.lag.unwrap_or(u64::MAX),
            v.id,
        )
    }

    /// Surplus-drop ranking, largest first: down longest, then not eligible,
    /// then the worst promotion candidate.
    fn drop_key(&self, r: &HostView) -> (u64, bool, bool, (usize, u64, u64)) {
        (
            self.down_for(r).unwrap_or(0),
            !r.alive,
            !self.is_eligible(r),
            self.candidate_key(r),
        )
    }

    /// Whether, after `action`, the alive voters are still a majority of the
    /// new voter set: the one invariant no decision may break, because a
    /// change that leaves a minority alive can never commit the next one.
    fn keeps_quorum(&self, action: Action) -> bool {
        let Some(h) = self.view.hosts.iter().find(|h| h.id == action.id()) else {
            return false;
        };
        let (mut n, mut alive) = (self.count(Role::Voter), self.alive_voters());
        match action {
            Action::Promote { .. } => {
                n += 1;
                alive += usize::from(h.alive);
            }
            Action::Demote { .. } => {
                n -= 1;
                alive -= usize::from(h.alive);
            }
            Action::Drop { .. } | Action::AddReplica { .. } => {}
        }
        n > 0 && alive >= majority(n)
    }
}

/// The action that moves a host of `role` one step towards voter.
fn promotion(role: Role, id: u64) -> Action {
    match role {
        Role::Agent => Action::AddReplica { id },
        _ => Action::Promote { id },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: u64 = 100_000;

    fn host(id: u64, zone: Option<&str>, role: Role, lag: Option<u64>) -> HostView {
        HostView {
            id,
            zone: zone.map(str::to_owned),
            role,
            alive: true,
            since_ms: 0,
            lag,
            drained: false,
        }
    }

    fn voter(id: u64, zone: &str) -> HostView {
        host(id, Some(zone), Role::Voter, Some(0))
    }

    fn replica(id: u64, zone: &str, lag: u64) -> HostView {
        host(id, Some(zone), Role::Replica, Some(lag))
    }

    fn agent(id: u64, zone: &str) -> HostView {
        host(id, Some(zone), Role::Agent, Some(0))
    }

    /// Marks `h` down for `ms` milliseconds.
    fn down(mut h: HostView, ms: u64) -> HostView {
        h.alive = false;
        h.since_ms = NOW - ms;
        h
    }

    fn view(leader: u64, hosts: Vec<HostView>) -> ClusterView {
        ClusterView {
            now_ms: NOW,
            leader,
            hosts,
            change_in_flight: false,
        }
    }

    /// Applies `action` as the shell would once it commits.
    fn apply(view: &mut ClusterView, action: Action) {
        let h = view
            .hosts
            .iter_mut()
            .find(|h| h.id == action.id())
            .expect("action names a known host");
        assert_eq!(h.role, action.from_role(), "{action} from wrong role");
        h.role = action.to_role();
    }

    /// Decides and applies once, returning the action taken.
    fn step(cfg: &RolesConfig, view: &mut ClusterView) -> Option<Action> {
        let d = decide(cfg, view);
        if let Some(a) = d.action {
            apply(view, a);
        }
        d.action
    }

    /// Runs the autopilot until it stops, returning every action.
    fn run(cfg: &RolesConfig, view: &mut ClusterView) -> Vec<Action> {
        let mut actions = Vec::new();
        while let Some(a) = step(cfg, view) {
            actions.push(a);
            assert!(actions.len() < 200, "no fixed point: {actions:?}");
        }
        actions
    }

    fn ids(view: &ClusterView, role: Role) -> Vec<u64> {
        view.hosts
            .iter()
            .filter(|h| h.role == role)
            .map(|h| h.id)
            .collect()
    }

    #[test]
    fn config_defaults_validate() {
        assert_eq!(RolesConfig::default().validate(), Ok(()));
    }

    #[test]
    fn config_rejects_bad_voters_and_grace() {
        for voters in [0, 2, 4, 8, 9] {
            let cfg = RolesConfig {
                voters,
                ..RolesConfig::default()
            };
            assert_eq!(cfg.validate(), Err(RolesError::Voters(voters)));
        }
        let four = RolesConfig {
            voters: 4,
            ..RolesConfig::default()
        };
        assert_eq!(
            four.validate().unwrap_err().to_string(),
            "raft.voters must be an odd number from 1 to 7, not 4"
        );
        let no_grace = RolesConfig {
            voter_grace_ms: 0,
            ..RolesConfig::default()
        };
        assert_eq!(no_grace.validate(), Err(RolesError::VoterGrace));
    }

    #[test]
    fn invalid_config_makes_no_change() {
        let cfg = RolesConfig {
            voters: 4,
            ..RolesConfig::default()
        };
        let v = view(1, vec![voter(1, "a"), replica(2, "b", 0)]);
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None);
        assert!(d.reason.contains("raft.voters"), "{}", d.reason);
    }

    #[test]
    fn role_displays_lowercase() {
        assert_eq!(Role::Voter.to_string(), "voter");
        assert_eq!(Role::Replica.to_string(), "replica");
        assert_eq!(Role::Agent.to_string(), "agent");
        assert_eq!(
            Action::Drop { id: 4 }.to_string(),
            "host 4 from replica to agent"
        );
    }

    #[test]
    fn voter_lost_promotes_then_demotes() {
        let cfg = RolesConfig::default();
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "b"),
                down(voter(3, "c"), 6000),
                replica(4, "c", 3),
                replica(5, "a", 0),
                agent(6, "b"),
            ],
        );
        let d = decide(&cfg, &v);
        assert_eq!(d.action, Some(Action::Promote { id: 4 }));
        assert_eq!(
            d.reason,
            "promoting replica 4 (zone c) to replace voter 3, down for 6000 ms"
        );
        apply(&mut v, d.action.unwrap());
        let d = decide(&cfg, &v);
        assert_eq!(d.action, Some(Action::Demote { id: 3 }));
        assert_eq!(
            d.reason,
            "demoting voter 3, down for 6000 ms, to bring the voter set from 4 back to 3"
        );
        apply(&mut v, d.action.unwrap());
        assert_eq!(step(&cfg, &mut v), Some(Action::Drop { id: 3 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::AddReplica { id: 6 }));
        assert_eq!(step(&cfg, &mut v), None);
        assert_eq!(ids(&v, Role::Voter), vec![1, 2, 4]);
    }

    /// `yard node drain` of a voter: replaced at once (no grace), add before remove, then
    /// dropped to an agent; the drained host is never chosen back.
    #[test]
    fn a_drained_leader_hands_over_when_another_voter_can_lead() {
        let mut v = ClusterView {
            now_ms: 100_000,
            leader: 1,
            hosts: vec![voter(1, "a"), voter(2, "b"), voter(3, "c")],
            change_in_flight: false,
        };
        assert!(!hands_over(&v));
        v.hosts[0].drained = true;
        assert!(hands_over(&v));
        v.hosts[1].drained = true;
        v.hosts[2].alive = false;
        assert!(!hands_over(&v), "no voter can take over");
    }

    #[test]
    fn a_drained_voter_is_replaced_demoted_and_dropped_without_the_grace() {
        let cfg = RolesConfig::default();
        let mut drained = voter(3, "c");
        drained.drained = true;
        let mut drained_agent = agent(7, "c");
        drained_agent.drained = true;
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "b"),
                drained,
                replica(4, "c", 0),
                replica(5, "d", 0),
                drained_agent,
            ],
        );
        let d = decide(&cfg, &v);
        assert_eq!(d.action, Some(Action::Promote { id: 4 }), "{}", d.reason);
        assert!(
            d.reason.contains("to replace voter 3, drained"),
            "{}",
            d.reason
        );
        apply(&mut v, Action::Promote { id: 4 });
        let d = decide(&cfg, &v);
        assert_eq!(d.action, Some(Action::Demote { id: 3 }), "{}", d.reason);
        assert!(
            d.reason.starts_with("demoting voter 3, drained,"),
            "{}",
            d.reason
        );
        apply(&mut v, Action::Demote { id: 3 });
        let d = decide(&cfg, &v);
        assert_eq!(d.action, Some(Action::Drop { id: 3 }), "{}", d.reason);
        apply(&mut v, Action::Drop { id: 3 });
        // The replica pool is one short and only the drained agent could fill it: nothing.
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None, "{}", d.reason);
        let voters: Vec<u64> = v
            .hosts
            .iter()
            .filter(|h| h.role == Role::Voter)
            .map(|h| h.id)
            .collect();
        assert_eq!(voters, [1, 2, 4]);
    }

    /// A drained leader keeps its vote while it leads: demoting it would force an election,
    /// and replacing it first would leave the surplus on a healthy voter.
    #[test]
    fn a_drained_leader_keeps_its_vote_while_it_leads() {
        let cfg = RolesConfig::default();
        let mut leader = voter(1, "a");
        leader.drained = true;
        let v = view(
            1,
            vec![
                leader,
                voter(2, "b"),
                voter(3, "c"),
                replica(4, "d", 0),
                replica(5, "e", 0),
            ],
        );
        assert_eq!(decide(&cfg, &v).action, None);
    }

    #[test]
    fn voter_lost_without_caught_up_replica_waits() {
        let cfg = RolesConfig::default();
        let mut fresh = replica(5, "c", 0);
        fresh.since_ms = NOW - 500;
        let v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "b"),
                down(voter(3, "c"), 6000),
                replica(4, "c", 500),
                fresh,
            ],
        );
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None);
        assert_eq!(
            d.reason,
            "voter 3 has been down for 6000 ms but no replica or agent is alive for 2000 ms \
             and within 64 entries of the commit, so no voter can be added yet"
        );
    }

    #[test]
    fn voter_lost_with_only_agents_adds_a_candidate_first() {
        let cfg = RolesConfig {
            replicas: 0,
            ..RolesConfig::default()
        };
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "b"),
                down(voter(3, "c"), 6000),
                agent(4, "c"),
            ],
        );
        assert_eq!(step(&cfg, &mut v), Some(Action::AddReplica { id: 4 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Promote { id: 4 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Demote { id: 3 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Drop { id: 3 }));
        assert_eq!(step(&cfg, &mut v), None);
    }

    #[test]
    fn voter_flapping_inside_grace_is_kept() {
        let cfg = RolesConfig::default();
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "b"),
                down(voter(3, "c"), 4999),
                replica(4, "c", 0),
                replica(5, "a", 0),
            ],
        );
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None);
        assert_eq!(
            d.reason,
            "voter 3 has been down for 4999 ms, inside the 5000 ms grace, so it is not replaced yet"
        );
        // It comes back: alive again, not yet stable, still a voter.
        v.hosts[2].alive = true;
        v.hosts[2].since_ms = NOW - 10;
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None);
        assert!(
            d.reason.starts_with("membership is settled"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn whole_zone_lost() {
        let cfg = RolesConfig::default();
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "b"),
                down(voter(3, "c"), 9000),
                replica(4, "a", 0),
                replica(5, "d", 10),
                down(replica(6, "c", 0), 9000),
                agent(7, "b"),
                down(agent(8, "c"), 9000),
            ],
        );
        // Zone d holds no voter, so replica 5 wins despite its lag.
        assert_eq!(step(&cfg, &mut v), Some(Action::Promote { id: 5 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Demote { id: 3 }));
        // Replicas 3 and 6 have both been down 9000 ms; the lower id goes first.
        assert_eq!(step(&cfg, &mut v), Some(Action::Drop { id: 3 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Drop { id: 6 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::AddReplica { id: 7 }));
        assert_eq!(step(&cfg, &mut v), None);
        assert_eq!(ids(&v, Role::Voter), vec![1, 2, 5]);
        assert_eq!(ids(&v, Role::Replica), vec![4, 7]);
    }

    #[test]
    fn two_of_three_voters_lost_is_quorum_lost() {
        let cfg = RolesConfig::default();
        let v = view(
            1,
            vec![
                voter(1, "a"),
                down(voter(2, "b"), 9000),
                down(voter(3, "c"), 9000),
                replica(4, "b", 0),
                replica(5, "c", 0),
            ],
        );
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None);
        assert_eq!(
            d.reason,
            "quorum lost: 1 of 3 voters alive; no membership change can commit"
        );
    }

    #[test]
    fn two_of_five_voters_lost_is_replaced_one_at_a_time() {
        let cfg = RolesConfig {
            voters: 5,
            ..RolesConfig::default()
        };
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "b"),
                voter(3, "c"),
                down(voter(4, "d"), 8000),
                down(voter(5, "e"), 7000),
                replica(6, "d", 0),
                replica(7, "e", 0),
            ],
        );
        assert_eq!(step(&cfg, &mut v), Some(Action::Promote { id: 6 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Demote { id: 4 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Promote { id: 7 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Demote { id: 5 }));
        assert_eq!(ids(&v, Role::Voter), vec![1, 2, 3, 6, 7]);
    }

    #[test]
    fn host_joining_mid_change() {
        let cfg = RolesConfig::default();
        let mut v = view(1, vec![voter(1, "a"), voter(2, "b"), voter(3, "c")]);
        v.change_in_flight = true;
        assert_eq!(role_for_join(&cfg, &v, 9, Some("d")), Role::Agent);
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None);
        assert_eq!(
            d.reason,
            "a membership change is in flight; the next one waits until it commits"
        );
        // Below the voter target a joining host is a voter even mid-change.
        v.hosts.pop();
        assert_eq!(role_for_join(&cfg, &v, 9, Some("d")), Role::Voter);
    }

    #[test]
    fn host_joining_without_change_in_flight() {
        let cfg = RolesConfig::default();
        let mut v = view(1, vec![voter(1, "a"), voter(2, "b"), voter(3, "c")]);
        assert_eq!(role_for_join(&cfg, &v, 4, None), Role::Replica);
        v.hosts.push(replica(4, "a", 0));
        v.hosts.push(replica(5, "b", 0));
        assert_eq!(role_for_join(&cfg, &v, 6, None), Role::Agent);
        // A rejoining member keeps its role.
        assert_eq!(role_for_join(&cfg, &v, 4, Some("a")), Role::Replica);
        // With quorum lost a joining host needs no membership change.
        v.hosts[1] = down(voter(2, "b"), 10);
        v.hosts[2] = down(voter(3, "c"), 10);
        v.hosts.truncate(3);
        assert_eq!(role_for_join(&cfg, &v, 6, None), Role::Agent);
    }

    #[test]
    fn two_hosts_with_target_three_are_both_voters() {
        let cfg = RolesConfig::default();
        let mut v = view(1, vec![voter(1, "a")]);
        assert_eq!(role_for_join(&cfg, &v, 2, Some("b")), Role::Voter);
        v.hosts.push(voter(2, "b"));
        let d = decide(&cfg, &v);
        assert_eq!(d.action, None);
        assert_eq!(
            d.reason,
            "the voter set has 2 of 3 voters but no replica or agent is alive for 2000 ms \
             and within 64 entries of the commit, so no voter can be added yet"
        );
        // A lone leader promotes a stable replica rather than stay alone.
        let mut v = view(1, vec![voter(1, "a"), replica(2, "b", 0)]);
        assert_eq!(step(&cfg, &mut v), Some(Action::Promote { id: 2 }));
        assert_eq!(step(&cfg, &mut v), None);
    }

    #[test]
    fn leader_is_never_demoted() {
        let cfg = RolesConfig {
            voters: 1,
            replicas: 0,
            ..RolesConfig::default()
        };
        // The leader is the highest id in the most crowded zone, and lags.
        let mut leader = voter(9, "a");
        leader.lag = Some(1000);
        let mut hosts: Vec<HostView> = (1..9)
            .map(|id| voter(id, ["a", "b"][id as usize % 2]))
            .collect();
        hosts.push(leader);
        let mut v = view(9, hosts);
        let actions = run(&cfg, &mut v);
        assert!(actions.iter().all(|a| a.id() != 9), "{actions:?}");
        assert_eq!(ids(&v, Role::Voter), vec![9]);
        assert_eq!(ids(&v, Role::Replica), Vec::<u64>::new());
    }

    #[test]
    fn nine_voter_upgrade_converges() {
        let cfg = RolesConfig::default();
        let zones = ["a", "b", "c"];
        let hosts = (1..=9)
            .map(|id| voter(id, zones[(id as usize - 1) % 3]))
            .collect();
        let mut v = view(1, hosts);
        let actions = run(&cfg, &mut v);
        let demotes = actions
            .iter()
            .take_while(|a| matches!(a, Action::Demote { .. }));
        assert_eq!(demotes.count(), 6, "{actions:?}");
        assert!(actions[6..]
            .iter()
            .all(|a| matches!(a, Action::Drop { .. })));
        assert_eq!(actions.len(), 10);
        assert_eq!(ids(&v, Role::Voter), vec![1, 2, 3]);
        assert_eq!(ids(&v, Role::Replica), vec![4, 5]);
        assert_eq!(ids(&v, Role::Agent), vec![6, 7, 8, 9]);
        assert!(decide(&cfg, &v).reason.starts_with("membership is settled"));
    }

    #[test]
    fn nine_voter_upgrade_demotes_dead_voters_first() {
        let cfg = RolesConfig::default();
        let mut hosts: Vec<HostView> = (1..=9).map(|id| voter(id, "a")).collect();
        hosts[3] = down(voter(4, "a"), 100);
        hosts[6] = down(voter(7, "a"), 100_000);
        let mut v = view(1, hosts);
        assert_eq!(step(&cfg, &mut v), Some(Action::Demote { id: 7 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Demote { id: 4 }));
        assert_eq!(step(&cfg, &mut v), Some(Action::Demote { id: 9 }));
    }

    #[test]
    fn zone_rebalance_does_not_oscillate() {
        let cfg = RolesConfig::default();
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "a"),
                voter(3, "b"),
                replica(4, "c", 5),
                replica(5, "a", 0),
            ],
        );
        let d = decide(&cfg, &v);
        assert_eq!(d.action, Some(Action::Promote { id: 4 }));
        assert_eq!(
            d.reason,
            "promoting replica 4 (zone c), a zone with no voter, because zone a holds 2 voters"
        );
        apply(&mut v, d.action.unwrap());
        let d = decide(&cfg, &v);
        assert_eq!(d.action, Some(Action::Demote { id: 2 }));
        assert_eq!(
            d.reason,
            "demoting voter 2 (zone a holds 2 voters) to bring the voter set from 4 back to 3"
        );
        apply(&mut v, d.action.unwrap());
        for _ in 0..10 {
            assert_eq!(step(&cfg, &mut v), None);
        }
        assert_eq!(ids(&v, Role::Voter), vec![1, 3, 4]);
    }

    #[test]
    fn hosts_without_zone_never_trigger_rebalance() {
        let cfg = RolesConfig::default();
        let mut v = view(
            1,
            vec![
                voter(1, "a"),
                voter(2, "a"),
                voter(3, "a"),
                host(4, None, Role::Replica, Some(0)),
                host(5, None, Role::Replica, Some(0)),
            ],
        );
        assert_eq!(step(&cfg, &mut v), None);
    }

    // ----- properties -----

    fn arb_config() -> impl Strategy<Value = RolesConfig> {
        (
            prop::sample::select(vec![1usize, 3, 5, 7]),
            0usize..5,
            1u64..8000,
            0u64..5000,
            0u64..100,
        )
            .prop_map(|(voters, replicas, voter_grace_ms, stable_ms, max_lag)| {
                RolesConfig {
                    voters,
                    replicas,
                    voter_grace_ms,
                    stable_ms,
                    max_lag,
                }
            })
    }

    const PROP_NOW: u64 = 20_000;

    type ArbHost = (Role, Option<u8>, bool, u64, Option<u64>, bool);

    fn arb_host() -> impl Strategy<Value = ArbHost> {
        (
            prop::sample::select(vec![Role::Voter, Role::Replica, Role::Agent]),
            prop::option::of(0u8..4),
            prop::bool::weighted(0.8),
            0..=PROP_NOW,
            prop::option::weighted(0.8, 0u64..150),
            prop::bool::weighted(0.1),
        )
    }

    fn arb_view() -> impl Strategy<Value = ClusterView> {
        (1usize..40)
            .prop_flat_map(|n| (prop::collection::vec(arb_host(), n), 0..n, any::<bool>()))
            .prop_map(|(parts, leader, in_flight)| {
                let mut hosts: Vec<HostView> = parts
                    .into_iter()
                    .enumerate()
                    .map(
                        |(i, (role, zone, alive, since_ms, lag, drained))| HostView {
                            id: i as u64 + 1,
                            zone: zone.map(|z| format!("z{z}")),
                            role,
                            alive,
                            since_ms,
                            lag,
                            drained,
                        },
                    )
                    .collect();
                hosts[leader].role = Role::Voter;
                hosts[leader].alive = true;
                ClusterView {
                    now_ms: PROP_NOW,
                    leader: leader as u64 + 1,
                    hosts,
                    change_in_flight: in_flight,
                }
            })
    }

    /// Alive voters are a majority of the voter set.
    fn quorum_held(v: &ClusterView) -> bool {
        let n = v.hosts.iter().filter(|h| h.role == Role::Voter).count();
        let alive = v
            .hosts
            .iter()
            .filter(|h| h.role == Role::Voter && h.alive)
            .count();
        alive >= majority(n)
    }

    /// Checks one decided action: right role, leader untouched, quorum kept.
    fn check_action(v: &ClusterView, a: Action) -> Result<(), TestCaseError> {
        let h = v.hosts.iter().find(|h| h.id == a.id());
        prop_assert!(h.is_some_and(|h| h.role == a.from_role()), "{a} on {h:?}");
        prop_assert!(a.id() != v.leader, "{a} touches the leader");
        let mut after = v.clone();
        apply(&mut after, a);
        prop_assert!(quorum_held(&after), "{a} breaks quorum");
        Ok(())
    }

    /// There are enough hosts to fill the voter set: healthy voters plus
    /// eligible non-voters reach the target. Implies the weaker reading
    /// "enough alive, stable, caught-up hosts".
    fn enough(cfg: &RolesConfig, v: &ClusterView) -> bool {
        let c = Cluster::new(cfg, v);
        let healthy = c.healthy_count(Role::Voter);
        let eligible = v
            .hosts
            .iter()
            .filter(|h| h.role != Role::Voter && c.is_eligible(h))
            .count();
        healthy + eligible >= cfg.voters
    }

    /// Runs to a fixed point within `hosts * 4` steps, checking each action.
    fn converge(cfg: &RolesConfig, v: &mut ClusterView) -> Result<(), TestCaseError> {
        let limit = v.hosts.len() * 4;
        for _ in 0..=limit {
            match decide(cfg, v).action {
                None => return Ok(()),
                Some(a) => {
                    check_action(v, a)?;
                    apply(v, a);
                }
            }
        }
        Err(TestCaseError::fail(format!(
            "no fixed point within {limit} steps"
        )))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn decided_actions_keep_quorum_and_leader(cfg in arb_config(), v in arb_view()) {
            if let Some(a) = decide(&cfg, &v).action {
                prop_assert!(!v.change_in_flight);
                check_action(&v, a)?;
            }
        }

        #[test]
        fn join_never_breaks_quorum(cfg in arb_config(), v in arb_view()) {
            let id = v.hosts.len() as u64 + 1;
            let role = role_for_join(&cfg, &v, id, None);
            let mut after = v.clone();
            after.hosts.push(HostView { id, zone: None, role, alive: true, since_ms: PROP_NOW, lag: None, drained: false });
            prop_assert!(!quorum_held(&v) || quorum_held(&after));
        }

        #[test]
        fn autopilot_converges(cfg in arb_config(), mut v in arb_view()) {
            v.change_in_flight = false;
            let held = quorum_held(&v);
            converge(&cfg, &mut v)?;
            let c = Cluster::new(&cfg, &v);
            if held && enough(&cfg, &v) {
                prop_assert_eq!(c.count(Role::Voter), cfg.voters);
                prop_assert!(v.hosts.iter().all(|h| h.role != Role::Voter || !c.is_gone(h)));
            }
            // Once every down host is past its grace and every alive host is
            // stable, the voter set is exactly the target and all alive.
            v.now_ms += cfg.voter_grace_ms + cfg.stable_ms;
            converge(&cfg, &mut v)?;
            if held && enough(&cfg, &v) {
                let voters: Vec<_> = v.hosts.iter().filter(|h| h.role == Role::Voter).collect();
                prop_assert_eq!(voters.len(), cfg.voters);
                prop_assert!(voters.iter().all(|h| h.alive));
            }
        }
    }
}
