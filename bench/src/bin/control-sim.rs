//! `control-sim`: the control plane at 100 to 5,000 hosts in one process, to show that the
//! leader's work per write does not grow with the hosts, how long a write takes to reach every
//! agent, and how fast a dead agent is known to the leader while one agent's link is lossy.
//!
//! What runs for real: five whole `yard::service::Node`s (three voters, two replicas: the roles
//! core's defaults) with real openraft, sled-backed logs, the real state machine, write batcher,
//! pre-vote gate, autopilot and host liveness loops (`roles::liveness::report` / `judge`, hence
//! the real `WatcherCore` and `HostLivenessCore`), all over `MemNetwork`, where every request
//! and reply goes through the real frame codec. Each member runs on a tokio runtime of its own
//! (one worker, the daemon's default), and a member's side of every request it receives runs
//! on that runtime, so each member's CPU can be read from its threads.
//!
//! The agents are light: one task each instead of a whole `Node`, sharing one runtime. Each
//! joins with the real `Request::Join` (the roles core makes it an agent), then follows the
//! tables as `roles::agent::follow` does: the member from the real `follow::Follower`, the real
//! `Request::Watch` long-poll with its second poll after two holds, and the real
//! `StateMachineStore::apply_watched` / `install_watched` into a state machine of its own. What
//! the light agent leaves out: forwarding writes, actors, metrics, and a Raft instance and
//! sled log of its own (its state machine shares one temporary sled database with the others;
//! an agent never builds a Raft snapshot, the only thing that store writes to sled). The
//! members' own liveness probing is not run (every member stays up here).
//!
//! Loss: one agent's link delays each message (its polls and their answers) as QUIC does with
//! independent packet loss `p`: a message lost `k` times in a row arrives `10 * (2^k - 1)` ms
//! late (a 10 ms probe timeout doubling per loss), the model `yard_control::host_liveness`
//! states its false-suspicion figures in.
//!
//! Because every agent's work shares this machine's cores with the members, the fan-out
//! latency here includes thousands of agents' decoding and applying on two cores; in a cluster
//! each agent does that on its own host. The CPU of every thread group is printed so a
//! saturated run shows itself.
//!
//! A benchmark: figures only (JSON on stdout, a table on stderr), never fails on a number.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::runtime::Runtime;
use yard::config::{LivenessSection, RaftSection};
use yard::diagnosis_control::{DiagnosisControl, DiagnosisSettings};
use yard::gateway_control::GatewayControl;
use yard::rpc::{AdminRequest, JoinRequest, Reply, Request, WatchBatch};
use yard::service::{Node, NodeParts};
use yard::tls::PeerRole;
use yard::transport::{BoxFut, Handler, MemNetwork, Target, Transport, TransportError};
use yard_actors::gateway::lease::LeaseConfig;
use yard_actors::health::HealthRegistry;
use yard_actors::liveness::Reachability;
use yard_control::follow::Follower;
use yard_raft_store::{Change, NodeId, StateMachineStore};

#[derive(Debug, Parser)]
#[command(
    about = "the control plane at many hosts in one process: leader CPU per write, watch fan-out, host liveness under loss"
)]
struct Args {
    /// Host counts to run (members included), each on a fresh cluster, in this order.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    hosts: Vec<usize>,
    /// Puts through the leader for the CPU-per-write figure.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
    /// Concurrent writers for those puts.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Paced puts for the fan-out figure.
    #[arg(long, default_value_t = 100)]
    fanout_writes: usize,
    /// Their rate, per second.
    #[arg(long, default_value_t = 2.0)]
    fanout_rate: f64,
    /// Quiet time over which the leader's idle CPU is read.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    idle: Duration,
    /// The host count that runs the liveness phase (0: none).
    #[arg(long, default_value_t = 5000)]
    liveness_hosts: usize,
    /// How long the lossy link lasts in the liveness phase.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    loss_duration: Duration,
    /// Percent of the lossy agent's packets lost.
    #[arg(long, default_value_t = 30.0)]
    loss: f64,
    /// Agents killed during the liveness phase, at even intervals.
    #[arg(long, default_value_t = 10)]
    kills: usize,
    /// Worker threads of the agents' shared runtime.
    #[arg(long, default_value_t = 2)]
    agent_workers: usize,
    /// Seed of the loss model.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Raft members: the roles core's defaults (3 voters, 2 replicas).
const MEMBERS: u64 = 5;

// The daemon's allocator, so the members' and agents' costs are the daemon's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
/// Agents' ids start here.
const AGENT_BASE: NodeId = 1000;
/// Joins in flight at once.
const JOINS_IN_FLIGHT: usize = 64;

fn addr(id: NodeId) -> String {
    // Hosts only from 198.18.0.0/16, 250 per /24.
    let n = id - 1;
    format!("198.18.{}.{}:7480", n / 250, n % 250 + 1)
}

// ---------------------------------------------------------------------------------------------
// CPU per thread group

/// CPU nanoseconds per thread group, from `/proc/self/task/*/{comm,schedstat}`.
fn cpu_by_group() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in dir.flatten() {
        let p = task.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        *out.entry(group_of(comm.trim())).or_insert(0) += ns;
    }
    out
}

fn group_of(comm: &str) -> String {
    if let Some(id) = comm.strip_prefix("member-") {
        return format!("member-{id}");
    }
    if comm.starts_with("agents") {
        return "agents".into();
    }
    if comm.starts_with("bench") || comm == "control-sim" {
        return "bench".into();
    }
    "other".into()
}

fn cpu_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(g, a)| {
            let b = before.get(g).copied().unwrap_or(0);
            (g.clone(), a.saturating_sub(b) as f64 / 1e9)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Members

/// Runs a member's side of every request on the member's own runtime.
struct OnRuntime {
    rt: tokio::runtime::Handle,
    node: Node,
}

/// Aborts the member's side when the caller gives up, as the QUIC server drops a stream.
struct AbortOnDrop(tokio::task::JoinHandle<Reply>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Handler for OnRuntime {
    fn handle(&self, role: PeerRole, req: Request) -> BoxFut<Reply> {
        let task = AbortOnDrop(self.rt.spawn(self.node.handle(role, req)));
        Box::pin(async move {
            let mut task = task;
            match (&mut task.0).await {
                Ok(r) => r,
                Err(e) => Reply::Error(format!("the member's task failed: {e}")),
            }
        })
    }
}

struct Member {
    id: NodeId,
    node: Node,
    rt: Runtime,
    _dir: tempfile::TempDir,
}

fn member_runtime(id: NodeId) -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(format!("member-{id}"))
        .enable_all()
        .build()
        .context("cannot build a member's runtime")
}

async fn start_member(net: &MemNetwork, id: NodeId, raft: &RaftSection) -> Result<Member> {
    let rt = member_runtime(id)?;
    let dir = tempfile::tempdir().context("cannot make a member's data dir")?;
    let path = dir.path().to_owned();
    let (net2, raft2) = (net.clone(), raft.clone());
    let node = rt
        .spawn(async move { build_member(&net2, id, &raft2, &path).await })
        .await
        .context("a member's start panicked")??;
    net.register(
        &addr(id),
        Arc::new(OnRuntime {
            rt: rt.handle().clone(),
            node: node.clone(),
        }),
    );
    {
        let _guard = rt.enter();
        tokio::spawn(yard::prevote::gate::run(node.clone()));
        tokio::spawn(yard::roles::autopilot::run(node.clone()));
        tokio::spawn(yard::roles::liveness::report(node.clone()));
        tokio::spawn(yard::roles::liveness::judge(node.clone()));
    }
    Ok(Member {
        id,
        node,
        rt,
        _dir: dir,
    })
}

async fn build_member(
    net: &MemNetwork,
    id: NodeId,
    raft: &RaftSection,
    dir: &std::path::Path,
) -> Result<Node> {
    let (log, sm) = yard_raft_store::open(dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let feed = sm.feed();
    let transport = net.transport(&addr(id), PeerRole::Node(id));
    let cfg = Arc::new(raft.to_openraft("sim")?);
    let net_factory = yard::raft_network::RaftNet {
        transport: transport.clone(),
        id,
        retry_after: Duration::from_millis(raft.heartbeat_ms),
        handover: yard::raft_network::Handover::default(),
    };
    let handover = net_factory.handover.clone();
    let r = yard_raft_store::Raft::new(id, cfg, net_factory, log, sm).await?;
    let rpc_timeout = Duration::from_millis(2_000);
    Ok(Node::new(NodeParts {
        id,
        name: format!("m{id}"),
        cluster: "sim".into(),
        addr: addr(id),
        raft: r,
        feed,
        transport,
        pki: Arc::new(yard::pki::PkiCell::new(yard::pki::Pki::without_files(
            None, "sim",
        ))),
        cert_validity: yard::tls::NODE_VALIDITY,
        handover,
        rpc_timeout,
        leader_wait: rpc_timeout + Duration::from_millis(raft.election_timeout_max_ms * 8),
        health: HealthRegistry::default(),
        reachability: Reachability::default(),
        gateway: Arc::new(GatewayControl::new(
            LeaseConfig {
                lease_ms: 90,
                margin_ms: 10,
            },
            Duration::from_millis(20),
            true,
        )),
        diagnosis: Arc::new(DiagnosisControl::new(DiagnosisSettings {
            analyzer: Default::default(),
            evaluate_every: Duration::from_millis(500),
            job_idle: Duration::from_secs(60),
            hook: Default::default(),
            total_budget_bytes: yard::diagnosis_control::DEFAULT_TOTAL_BUDGET,
        })),
        zone: String::new(),
        roles: raft.roles(),
        host_liveness: LivenessSection::default().hosts(),
        max_frame: yard::frame::DEFAULT_MAX_FRAME,
        // No CA here: forwarded operator writes are taken unsigned.
        operator_proofs: None,
    }))
}

fn leader_of(members: &[Member]) -> Option<NodeId> {
    members
        .iter()
        .find(|m| m.node.raft().metrics().borrow().state == openraft::ServerState::Leader)
        .map(|m| m.id)
}

fn term_of(members: &[Member]) -> u64 {
    members
        .iter()
        .map(|m| m.node.raft().metrics().borrow().current_term)
        .max()
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The lossy link

/// An agent's transport whose messages are delayed as QUIC retransmits lost packets.
struct Lossy {
    inner: Arc<dyn Transport>,
    /// Loss in millionths; 0 passes everything at once.
    loss_ppm: Arc<AtomicU32>,
    rng: Mutex<rand::rngs::StdRng>,
}

/// The first probe timeout (`max(3 * rtt, 10 ms)` at this link's sub-millisecond rtt).
const PTO: Duration = Duration::from_millis(10);

impl Lossy {
    /// How late one message arrives: each try is lost with `p`, and the k-th retry goes one
    /// doubling probe timeout after the previous one.
    fn delay(&self, p: f64) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut d = Duration::ZERO;
        let mut pto = PTO;
        // Bounded: 20 losses in a row is a 3-hour delay; nothing here waits that long.
        for _ in 0..20 {
            if !rng.gen_bool(p) {
                break;
            }
            d += pto;
            pto *= 2;
        }
        d
    }
}

impl Transport for Lossy {
    fn call(
        &self,
        target: Target,
        req: Request,
        timeout: Duration,
    ) -> BoxFut<Result<Reply, TransportError>> {
        let ppm = self.loss_ppm.load(Ordering::Relaxed);
        if ppm == 0 {
            return self.inner.call(target, req, timeout);
        }
        let p = f64::from(ppm) / 1e6;
        let (there, back) = (self.delay(p), self.delay(p));
        let inner = self.inner.clone();
        Box::pin(async move {
            let addr = target.addr.clone();
            let exchange = async move {
                tokio::time::sleep(there).await;
                let reply = inner.call(target, req, timeout).await;
                tokio::time::sleep(back).await;
                reply
            };
            let late = Err(TransportError::Timeout {
                addr,
                ms: timeout.as_millis(),
            });
            tokio::time::timeout(timeout, exchange)
                .await
                .unwrap_or(late)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Light agents

struct Agent {
    id: NodeId,
    transport: Arc<dyn Transport>,
    loss_ppm: Arc<AtomicU32>,
    store: StateMachineStore,
    /// (index the tables reached, when), one per apply that moved them.
    applied: Mutex<Vec<(u64, Instant)>>,
    stop: AtomicBool,
}

/// How an agent follows: the daemon's defaults.
#[derive(Clone)]
struct FollowSettings {
    hold: Duration,
    rpc_timeout: Duration,
    pace: Duration,
    seeds: Vec<String>,
}

/// The members an agent's tables name, with their addresses (`Node::watch_sources` on an
/// agent, whose tables always hold the newer membership).
fn sources(store: &StateMachineStore, me: NodeId) -> BTreeMap<NodeId, String> {
    store.feed().read(|d| {
        d.last_membership
            .membership()
            .nodes()
            .filter(|(id, _)| **id != me)
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    })
}

/// The agent's follow loop: `yard::roles::agent::follow` for a host that is no member, on a
/// light agent. Runs until `stop`.
async fn follow(agent: Arc<Agent>, settings: FollowSettings) {
    let epoch = Instant::now();
    let mut follower = Follower::default();
    let mut leader: Option<NodeId> = None;
    let mut seed_turn = agent.id as usize;
    let mut paced = false;
    let mut polled_at = tokio::time::Instant::now();
    // The members, read again only when the tables moved (the daemon reads them every poll,
    // on a host of its own; here 5,000 agents share two cores).
    let mut known: Option<(u64, BTreeMap<NodeId, String>, BTreeSet<NodeId>)> = None;
    while !agent.stop.load(Ordering::Relaxed) {
        let now_ms = epoch.elapsed().as_millis() as u64;
        let at = agent.store.feed().applied_index();
        if known.as_ref().is_none_or(|(i, _, _)| *i != at) {
            let s = sources(&agent.store, agent.id);
            let ids = s.keys().copied().collect();
            known = Some((at, s, ids));
        }
        let Some((_, sources, ids)) = known.as_ref() else {
            continue;
        };
        let (primary, backup) = match follower.targets(agent.id, ids, leader, now_ms) {
            Some(t) => (
                (
                    Some(t.primary),
                    Target::node(t.primary, sources[&t.primary].clone()),
                ),
                (
                    Some(t.backup),
                    Target::node(t.backup, sources[&t.backup].clone()),
                ),
            ),
            None => {
                seed_turn += 1;
                let seed = Target::any(settings.seeds[seed_turn % settings.seeds.len()].clone());
                ((None, seed.clone()), (None, seed))
            }
        };
        if std::mem::take(&mut paced) {
            tokio::time::sleep_until(polled_at + settings.pace).await;
        }
        polled_at = tokio::time::Instant::now();
        let req = Request::Watch {
            from: agent.store.feed().next_index(),
            hold_ms: settings.hold.as_millis() as u64,
        };
        let (answered_by, outcome) = poll(&agent, [&primary, &backup], req, &settings).await;
        let now_ms = epoch.elapsed().as_millis() as u64;
        let failure = match outcome {
            Ok(Reply::Watch(batch)) => {
                let bytes: usize = batch.entries.iter().map(|e| e.len()).sum();
                paced = !batch.entries.is_empty()
                    && batch.snapshot.is_none()
                    && bytes < yard::roles::watch::MAX_BATCH_BYTES / 2;
                if let Some((id, _)) = &batch.leader {
                    leader = Some(*id);
                }
                apply(&agent, batch).await.err()
            }
            Ok(Reply::Error(e)) => Some(e),
            Ok(other) => Some(format!("unexpected reply to a watch: {other:?}")),
            Err(e) => Some(e.to_string()),
        };
        let member = if answered_by == 0 {
            primary.0
        } else {
            backup.0
        };
        match (failure, member) {
            (None, Some(m)) => {
                if answered_by == 1 && primary.0 != Some(m) {
                    if let Some(p) = primary.0 {
                        follower.failed(p, now_ms);
                    }
                }
                follower.answered(m);
            }
            (None, None) => {}
            (Some(_), m) => {
                if let Some(m) = m {
                    follower.failed(m, now_ms);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One poll with the agent's nudge: a second poll to the backup when the first has not been
/// answered after two holds (`roles::agent`'s `poll`).
async fn poll(
    agent: &Agent,
    targets: [&(Option<NodeId>, Target); 2],
    req: Request,
    settings: &FollowSettings,
) -> (usize, Result<Reply, TransportError>) {
    let deadline = settings.hold + settings.rpc_timeout;
    let first = agent
        .transport
        .call(targets[0].1.clone(), req.clone(), deadline);
    tokio::pin!(first);
    tokio::select! {
        r = &mut first => (0, r),
        () = tokio::time::sleep(settings.hold * 2) => {
            let second = agent.transport.call(targets[1].1.clone(), req, deadline);
            tokio::select! {
                r = &mut first => (0, r),
                r = second => (1, r),
            }
        }
    }
}

async fn apply(agent: &Agent, batch: WatchBatch) -> Result<(), String> {
    let before = agent.store.feed().applied_index();
    if let Some(snapshot) = batch.snapshot {
        let s = agent.store.clone();
        tokio::task::spawn_blocking(move || s.install_watched(&snapshot))
            .await
            .map_err(|e| format!("installing a watched snapshot failed: {e}"))??;
    }
    if !batch.entries.is_empty() {
        agent.store.apply_watched(&batch.entries)?;
    }
    let after = agent.store.feed().applied_index();
    if after > before {
        agent
            .applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((after, Instant::now()));
    }
    Ok(())
}

async fn join(agent: &Agent, seed: String) -> Result<String, String> {
    let req = JoinRequest {
        id: agent.id,
        name: format!("a{}", agent.id),
        addr: addr(agent.id),
        zone: String::new(),
    };
    let mut last = String::new();
    for _ in 0..20 {
        match agent
            .transport
            .call(
                Target::any(seed.clone()),
                Request::Join(req.clone()),
                Duration::from_secs(30),
            )
            .await
        {
            Ok(Reply::Joined { role, .. }) => return Ok(role),
            Ok(Reply::Error(e)) => last = e,
            Ok(other) => last = format!("unexpected reply to a join: {other:?}"),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

// ---------------------------------------------------------------------------------------------
// Figures

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    json!({
        "n": v.len(),
        "p50": pct(&v, 0.5),
        "p99": pct(&v, 0.99),
        "max": v.last().copied().unwrap_or(f64::NAN),
    })
}

/// The first time in `stamps` (sorted by index) at which the index reached `i`.
fn reached(stamps: &[(u64, Instant)], i: u64) -> Option<Instant> {
    let k = stamps.partition_point(|(idx, _)| *idx < i);
    stamps.get(k).map(|(_, t)| *t)
}

// ---------------------------------------------------------------------------------------------
// One cluster

struct Cluster {
    net: MemNetwork,
    members: Vec<Member>,
    agents: Vec<Arc<Agent>>,
    agent_tasks: Vec<tokio::task::JoinHandle<()>>,
    agents_rt: Runtime,
    _agents_db_dir: tempfile::TempDir,
    /// CPU seconds per thread group while the agents joined, and how long that took.
    join_cpu: BTreeMap<String, f64>,
    join_secs: f64,
}

impl Cluster {
    fn leader(&self) -> Result<&Member> {
        let id = leader_of(&self.members).context("the cluster has no leader")?;
        Ok(&self.members[(id - 1) as usize])
    }

    fn shutdown(self) {
        for a in &self.agents {
            a.stop.store(true, Ordering::Relaxed);
        }
        for t in &self.agent_tasks {
            t.abort();
        }
        self.agents_rt.shutdown_background();
        for m in self.members {
            m.rt.shutdown_background();
        }
    }
}

async fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > limit {
            bail!("{what} did not happen within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn form(args: &Args, hosts: usize) -> Result<Cluster> {
    let net = MemNetwork::default();
    let raft = RaftSection::default();
    let mut members = Vec::new();
    let first = start_member(&net, 1, &raft).await?;
    {
        let n = first.node.clone();
        first
            .rt
            .spawn(async move { n.bootstrap().await })
            .await?
            .map_err(anyhow::Error::msg)?;
    }
    members.push(first);
    for id in 2..=MEMBERS {
        let m = start_member(&net, id, &raft).await?;
        let n = m.node.clone();
        let role =
            m.rt.spawn(async move { n.join(&addr(1), Duration::from_secs(30)).await })
                .await?
                .map_err(anyhow::Error::msg)?;
        eprintln!("control-sim: member {id} joined as {role}");
        members.push(m);
    }
    wait_until("five members", Duration::from_secs(30), || {
        members[0].node.member_ids().len() == MEMBERS as usize && leader_of(&members).is_some()
    })
    .await?;

    let agents_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.agent_workers)
        .max_blocking_threads(2)
        .thread_name("agents")
        .enable_all()
        .build()
        .context("cannot build the agents' runtime")?;
    // One temporary sled database under every agent's state machine: an agent never builds a
    // Raft snapshot, the only thing a state machine writes there.
    let db_dir = tempfile::tempdir().context("cannot make the agents' data dir")?;
    let db = sled::Config::new()
        .path(db_dir.path())
        .temporary(true)
        .flush_every_ms(None)
        .open()
        .context("cannot open the agents' sled database")?;
    let seeds: Vec<String> = (1..=MEMBERS).map(addr).collect();
    let settings = FollowSettings {
        hold: Duration::from_millis(LivenessSection::default().hold_ms),
        rpc_timeout: Duration::from_millis(2_000),
        pace: Duration::from_millis(raft.watch_pace_ms),
        seeds: seeds.clone(),
    };
    let n_agents = hosts.saturating_sub(MEMBERS as usize);
    let mut agents = Vec::with_capacity(n_agents);
    for k in 0..n_agents {
        let id = AGENT_BASE + 1 + k as u64;
        let loss_ppm = Arc::new(AtomicU32::new(0));
        let transport: Arc<dyn Transport> = Arc::new(Lossy {
            inner: net.transport(&addr(id), PeerRole::Node(id)),
            loss_ppm: loss_ppm.clone(),
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(args.seed ^ id)),
        });
        let store = StateMachineStore::new(db.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
        agents.push(Arc::new(Agent {
            id,
            transport,
            loss_ppm,
            store,
            applied: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }));
    }
    // Each agent joins through a member (forwarded to the leader), then follows at once, as
    // the daemon does; a bounded number of joins in flight.
    let started = Instant::now();
    let cpu_before = cpu_by_group();
    let mut tasks = Vec::with_capacity(n_agents);
    let mut failed = 0usize;
    for chunk in agents.chunks(JOINS_IN_FLIGHT) {
        let mut joins = Vec::new();
        for a in chunk {
            let (a, seed, s) = (
                a.clone(),
                seeds[a.id as usize % seeds.len()].clone(),
                settings.clone(),
            );
            joins.push(agents_rt.spawn(async move {
                let joined = join(&a, seed).await;
                let task = tokio::spawn(follow(a, s));
                (joined, task)
            }));
        }
        for j in joins {
            let (joined, task) = j.await?;
            if let Err(e) = joined {
                failed += 1;
                if failed <= 3 {
                    eprintln!("control-sim: an agent did not join: {e}");
                }
            }
            tasks.push(task);
        }
    }
    let join_cpu = cpu_delta(&cpu_before, &cpu_by_group());
    let join_secs = started.elapsed().as_secs_f64();
    eprintln!("control-sim: {n_agents} agents joined in {join_secs:.1} s ({failed} failed)");
    let cluster = Cluster {
        net,
        members,
        agents,
        agent_tasks: tasks,
        agents_rt,
        _agents_db_dir: db_dir,
        join_cpu,
        join_secs,
    };
    let target = cluster.leader()?.node.feed().applied_index();
    let agents = cluster.agents.clone();
    wait_until("every agent caught up", Duration::from_secs(300), || {
        agents
            .iter()
            .all(|a| a.store.feed().applied_index() >= target)
    })
    .await?;
    eprintln!(
        "control-sim: {} hosts formed and caught up in {:.1} s",
        hosts,
        started.elapsed().as_secs_f64()
    );
    Ok(cluster)
}

/// Puts through the leader's admin path, `clients` at a time; returns the seconds taken.
async fn burst(c: &Cluster, writes: usize, clients: usize, tag: &str) -> Result<(f64, usize)> {
    let leader = c.leader()?;
    let to = addr(leader.id);
    let start = Instant::now();
    let mut handles = Vec::new();
    let per = writes.div_ceil(clients.max(1));
    for w in 0..clients.max(1) {
        let t = c.net.transport("198.18.255.1:1", PeerRole::Admin);
        let to = to.clone();
        let tag = tag.to_owned();
        let n = per.min(writes.saturating_sub(w * per));
        handles.push(tokio::spawn(async move {
            let mut errors = 0usize;
            for k in 0..n {
                let req = Request::Admin(AdminRequest::KvPut {
                    key: format!("{tag}/{w}/{k}"),
                    value: "v".repeat(64),
                });
                match t
                    .call(Target::any(to.clone()), req, Duration::from_secs(10))
                    .await
                {
                    Ok(Reply::Admin(_)) => {}
                    _ => errors += 1,
                }
            }
            errors
        }));
    }
    let mut errors = 0;
    for h in handles {
        errors += h.await?;
    }
    Ok((start.elapsed().as_secs_f64(), errors))
}

/// Applied indexes and when each was reached, in order.
type Stamps = Arc<Mutex<Vec<(u64, Instant)>>>;

/// The leader's applied index over time, recorded on the leader's runtime.
fn record_leader_applies(m: &Member) -> (Stamps, tokio::task::JoinHandle<()>) {
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    let mut rx = m.node.feed().applied_changes();
    let task = m.rt.spawn(async move {
        while rx.changed().await.is_ok() {
            let i = *rx.borrow_and_update();
            o.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((i, Instant::now()));
        }
    });
    (out, task)
}

async fn fanout(c: &Cluster, args: &Args) -> Result<Value> {
    let leader = c.leader()?;
    let (stamps, recorder) = record_leader_applies(leader);
    let first = leader.node.feed().applied_index() + 1;
    let t = c.net.transport("198.18.255.2:1", PeerRole::Admin);
    let to = addr(leader.id);
    let period = Duration::from_secs_f64(1.0 / args.fanout_rate.max(0.01));
    let mut next = tokio::time::Instant::now();
    let mut errors = 0usize;
    for k in 0..args.fanout_writes {
        tokio::time::sleep_until(next).await;
        next += period;
        let req = Request::Admin(AdminRequest::KvPut {
            key: format!("fanout/{k}"),
            value: "v".repeat(64),
        });
        if !matches!(
            t.call(Target::any(to.clone()), req, Duration::from_secs(10))
                .await,
            Ok(Reply::Admin(_))
        ) {
            errors += 1;
        }
    }
    let last = leader.node.feed().applied_index();
    let agents = c.agents.clone();
    let caught_up = wait_until(
        "every agent applied the fan-out writes",
        Duration::from_secs(60),
        || {
            agents
                .iter()
                .all(|a| a.store.feed().applied_index() >= last)
        },
    )
    .await;
    recorder.abort();
    let stamps = stamps.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut all = Vec::new();
    let mut pairs = Vec::new();
    let mut missing = 0usize;
    let per_agent: Vec<Vec<(u64, Instant)>> = c
        .agents
        .iter()
        .map(|a| a.applied.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .collect();
    for i in first..=last {
        let Some(committed) = reached(&stamps, i) else {
            continue;
        };
        let mut worst = 0.0f64;
        for s in &per_agent {
            match reached(s, i) {
                Some(at) => {
                    let ms = at.saturating_duration_since(committed).as_secs_f64() * 1e3;
                    worst = worst.max(ms);
                    pairs.push(ms);
                }
                None => missing += 1,
            }
        }
        all.push(worst);
    }
    Ok(json!({
        "writes": args.fanout_writes,
        "rate_per_s": args.fanout_rate,
        "write_errors": errors,
        "entries": last + 1 - first,
        "all_agents_ms": summary(all),
        "per_agent_ms": summary(pairs),
        "missing": missing,
        "all_caught_up": caught_up.is_ok(),
    }))
}

/// Every `HostLiveness` commit the leader applies, with when, for the whole round.
struct Verdicts {
    commits: Arc<Mutex<Vec<(Instant, NodeId, bool)>>>,
    lagged: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Verdicts {
    fn record(leader: &Member) -> Self {
        let (_, mut changes) = leader.node.feed().subscribe();
        let commits: Arc<Mutex<Vec<(Instant, NodeId, bool)>>> = Arc::default();
        let lagged = Arc::new(AtomicBool::new(false));
        let (c, l) = (commits.clone(), lagged.clone());
        let task = tokio::spawn(async move {
            loop {
                match changes.recv().await {
                    Ok(Change::HostLiveness { id, alive, .. }) => c
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((Instant::now(), id, alive)),
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        l.store(true, Ordering::Relaxed)
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Self {
            commits,
            lagged,
            task,
        }
    }

    fn all(&self) -> Vec<(Instant, NodeId, bool)> {
        self.commits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Hosts committed dead since `from`.
    fn dead_since(&self, from: Instant) -> usize {
        self.all()
            .iter()
            .filter(|(t, _, alive)| *t >= from && !alive)
            .count()
    }
}

async fn liveness(c: &Cluster, args: &Args, verdicts: &Verdicts) -> Result<Value> {
    let term_before = term_of(&c.members);
    let lossy = c.agents.first().context("no agents")?.clone();
    let victims: Vec<Arc<Agent>> = c.agents.iter().rev().take(args.kills).cloned().collect();
    let ppm = (args.loss.clamp(0.0, 100.0) * 1e4) as u32;
    lossy.loss_ppm.store(ppm, Ordering::Relaxed);
    eprintln!(
        "control-sim: liveness: agent {} at {}% loss for {:?}, {} kills",
        lossy.id, args.loss, args.loss_duration, args.kills
    );
    let started = Instant::now();
    let step = args.loss_duration / (args.kills as u32 + 1);
    let mut killed: BTreeMap<NodeId, Instant> = BTreeMap::new();
    for v in &victims {
        tokio::time::sleep(step).await;
        v.stop.store(true, Ordering::Relaxed);
        let k = c.agents.iter().position(|a| a.id == v.id).unwrap_or(0);
        c.agent_tasks[k].abort();
        killed.insert(v.id, Instant::now());
    }
    tokio::time::sleep_until(tokio::time::Instant::from_std(started + args.loss_duration)).await;
    // Time for the last victim to be judged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    lossy.loss_ppm.store(0, Ordering::Relaxed);
    let commits: Vec<_> = verdicts
        .all()
        .into_iter()
        .filter(|(t, _, _)| *t >= started)
        .collect();
    let mut detect = Vec::new();
    let mut undetected = 0usize;
    for (id, at) in &killed {
        match commits
            .iter()
            .find(|(t, h, alive)| h == id && !alive && t >= at)
        {
            Some((t, _, _)) => detect.push(t.duration_since(*at).as_secs_f64() * 1e3),
            None => undetected += 1,
        }
    }
    let false_dead: Vec<NodeId> = commits
        .iter()
        .filter(|(_, h, alive)| !alive && !killed.contains_key(h))
        .map(|(_, h, _)| *h)
        .collect();
    let lossy_false = false_dead.iter().filter(|h| **h == lossy.id).count();
    Ok(json!({
        "hosts": c.members.len() + c.agents.len(),
        "loss_percent": args.loss,
        "loss_seconds": args.loss_duration.as_secs_f64(),
        "lossy_host": lossy.id,
        "kills": killed.len(),
        "detect_ms": summary(detect.clone()),
        "detect_ms_each": detect,
        "undetected": undetected,
        "false_suspicions": false_dead.len(),
        "false_suspicions_lossy_host": lossy_false,
        "false_suspected_hosts": false_dead,
        "feed_lagged": verdicts.lagged.load(Ordering::Relaxed),
        "term_changes": term_of(&c.members) - term_before,
    }))
}

async fn round(args: &Args, hosts: usize) -> Result<Value> {
    let c = form(args, hosts).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = c.leader()?.id;
    let lg = format!("member-{leader}");
    let term0 = term_of(&c.members);
    let verdicts = Verdicts::record(c.leader()?);
    let n_agents = c.agents.len().max(1) as f64;
    let join_leader_us = c.join_cpu.get(&lg).copied().unwrap_or(0.0) * 1e6 / n_agents;

    let b = cpu_by_group();
    tokio::time::sleep(args.idle).await;
    let idle = cpu_delta(&b, &cpu_by_group());
    let idle_s = args.idle.as_secs_f64();

    // The phases that measure time run before the write burst, whose load on the agents'
    // shared cores is the harness's own (each agent would have a host of its own).
    let b = cpu_by_group();
    let t = Instant::now();
    let fan = fanout(&c, args).await?;
    let fan_cpu = cpu_delta(&b, &cpu_by_group());
    let fan_dead = verdicts.dead_since(t);

    let live = if hosts == args.liveness_hosts {
        Some(liveness(&c, args, &verdicts).await?)
    } else {
        None
    };

    let b = cpu_by_group();
    let t = Instant::now();
    let (secs, errors) = burst(&c, args.writes, args.clients, &format!("burst{hosts}")).await?;
    let busy = cpu_delta(&b, &cpu_by_group());
    let burst_dead = verdicts.dead_since(t);
    let leader_s = busy.get(&lg).copied().unwrap_or(0.0);
    let leader_us = leader_s * 1e6 / args.writes as f64;
    // The leader's idle CPU over the burst's time taken out: what the writes themselves cost.
    let leader_idle_s = idle.get(&lg).copied().unwrap_or(0.0) / idle_s * secs;
    let leader_marginal_us = (leader_s - leader_idle_s) * 1e6 / args.writes as f64;
    let members_us = busy
        .iter()
        .filter(|(g, _)| g.starts_with("member-"))
        .map(|(_, v)| v)
        .sum::<f64>()
        * 1e6
        / args.writes as f64;
    verdicts.task.abort();
    let rss_mb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map_or(f64::NAN, |kb| kb / 1024.0);
    let out = json!({
        "hosts": hosts,
        "agents": c.agents.len(),
        "leader": leader,
        "term_changes": term_of(&c.members) - term0,
        "join_secs": c.join_secs,
        "join_cpu_s": c.join_cpu,
        "join_leader_cpu_us_per_join": join_leader_us,
        "idle_cpu_percent": idle.iter().map(|(g, v)| (g.clone(), 100.0 * v / idle_s)).collect::<BTreeMap<_, _>>(),
        "fanout": fan,
        "fanout_cpu_s": fan_cpu,
        "fanout_hosts_committed_dead": fan_dead,
        "liveness": live,
        "writes": args.writes,
        "clients": args.clients,
        "write_errors": errors,
        "writes_per_s": args.writes as f64 / secs,
        "leader_cpu_us_per_write": leader_us,
        "leader_marginal_cpu_us_per_write": leader_marginal_us,
        "members_cpu_us_per_write": members_us,
        "burst_cpu_s": busy,
        "burst_hosts_committed_dead": burst_dead,
        "rss_mb": rss_mb,
    });
    c.shutdown();
    Ok(out)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .thread_name("bench")
        .enable_all()
        .build()?;
    let rounds: Vec<Value> = rt.block_on(async {
        let mut out = Vec::new();
        for &h in &args.hosts {
            eprintln!("control-sim: {h} hosts");
            out.push(round(&args, h).await?);
        }
        Ok::<_, anyhow::Error>(out)
    })?;
    let per_write = |v: &Value| v["leader_cpu_us_per_write"].as_f64().unwrap_or(f64::NAN);
    let by_hosts: BTreeMap<usize, &Value> = rounds
        .iter()
        .map(|r| (r["hosts"].as_u64().unwrap_or(0) as usize, r))
        .collect();
    let (lo, hi) = (by_hosts.first_key_value(), by_hosts.last_key_value());
    let ratio = match (lo, hi) {
        (Some((_, a)), Some((_, b))) => per_write(b) / per_write(a),
        _ => f64::NAN,
    };
    eprintln!(
        "{:>6} {:>11} {:>12} {:>12} {:>8} {:>8} {:>8} {:>8} {:>10} {:>7}",
        "hosts",
        "leader us/w",
        "marginal us/w",
        "members us/w",
        "writes/s",
        "fan p50",
        "fan p99",
        "fan max",
        "join us/j",
        "rss MB"
    );
    for r in &rounds {
        let f = &r["fanout"]["all_agents_ms"];
        eprintln!(
            "{:>6} {:>11.1} {:>12.1} {:>12.1} {:>8.0} {:>8.1} {:>8.1} {:>8.1} {:>10.0} {:>7.0}",
            r["hosts"],
            per_write(r),
            r["leader_marginal_cpu_us_per_write"]
                .as_f64()
                .unwrap_or(f64::NAN),
            r["members_cpu_us_per_write"].as_f64().unwrap_or(f64::NAN),
            r["writes_per_s"].as_f64().unwrap_or(f64::NAN),
            f["p50"].as_f64().unwrap_or(f64::NAN),
            f["p99"].as_f64().unwrap_or(f64::NAN),
            f["max"].as_f64().unwrap_or(f64::NAN),
            r["join_leader_cpu_us_per_join"]
                .as_f64()
                .unwrap_or(f64::NAN),
            r["rss_mb"].as_f64().unwrap_or(f64::NAN),
        );
    }
    eprintln!("leader CPU per write, largest / smallest host count: {ratio:.2}");
    for r in &rounds {
        if let Some(l) = r["liveness"].as_object() {
            eprintln!(
                "liveness at {} hosts: detect p50 {:.0} ms, max {:.0} ms, {} undetected, {} false suspicions ({} on the lossy host) over {:.0} s",
                l["hosts"],
                l["detect_ms"]["p50"].as_f64().unwrap_or(f64::NAN),
                l["detect_ms"]["max"].as_f64().unwrap_or(f64::NAN),
                l["undetected"],
                l["false_suspicions"],
                l["false_suspicions_lossy_host"],
                l["loss_seconds"].as_f64().unwrap_or(f64::NAN),
            );
        }
    }
    println!(
        "{}",
        json!({
            "bench": "control-sim",
            "leader_cpu_per_write_ratio": ratio,
            "rounds": rounds,
        })
    );
    Ok(())
}
