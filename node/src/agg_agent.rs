//! The node-local aggregation agent: training processes on this host join their job through a
//! Unix socket (`[aggregator] socket`), so a worker needs no cluster credentials, and follow
//! its membership without polling.
//!
//! JSON lines, one object each:
//! - worker: `{"join": {"job": NAME, "rank": R, "addr": "IP:PORT"}}` (the address its UDP socket
//!   is bound to), first and once;
//! - node: `{"waiting": WHY}` until the job runs, then `{"membership": {...}}` each time it
//!   changes (job id, epoch, worker index, workers, aggregator, values, chunk_values, dtype),
//!   `{"failed": WHY}` or `{"gone": WHY}` when it ends (and closes), `{"error": WHY}` for a
//!   refused join (and closes);
//! - worker: `{"leave": true}` when it is done: the node answers `{"left": true}` and closes.
//!
//! A session that ends without a leave (or whose worker stops reading it for
//! [`SEND_DEADLINE`]) is a worker that died: the node reports the rank gone, until written,
//! and the tables fail the job naming it or, if it is elastic, go on without it at a new
//! epoch. This is the one place a worker's death is decided; the leader only commits it.
//!
//! Because a session can do that much (add to every worker's sums, and fail the job by
//! hanging up), a join is admitted only if, checked in this order, each refusal one sentence
//! on the socket before it closes (the node serves on):
//! - the peer (`SO_PEERCRED`) is the daemon's user or in the socket's group
//!   ([`AgentPolicy`]), whatever mode the socket file has;
//! - `join.addr` is an address of this host with a socket bound to it: results are sent
//!   there, so a session cannot point them at another machine, or at nothing;
//! - no other live session on this node holds the rank, and the tables do not give it to a
//!   worker on another host: a second session cannot replace the real worker, nor fail its
//!   job by hanging up;
//! - the node admits it like an admin request (`Node::serve_admitted`: the admin actor's
//!   in-flight limit), and the agent serves at most [`MAX_SESSIONS`] at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use yard_actors::aggregator::core::{worker_view, WorkerView};
use yard_actors::probe::socket::SocketAccess;
use yard_raft_store::aggregation::AggTables;
use yard_raft_store::{Change, NodeId};

use crate::rpc::{AdminRequest, AggRequest, Reply};
use crate::service::Node;

/// The longest line a worker may send.
const MAX_LINE: u64 = 4096;

/// Sessions served at once: each holds a task and a change-feed subscription, so a local
/// process opening connections in a loop must not grow them without bound. Far above the
/// workers one host runs (a GPU each, a few per job).
pub const MAX_SESSIONS: usize = 1024;

/// How long a connected peer has to send its join line before the session is dropped.
pub const JOIN_DEADLINE: Duration = Duration::from_secs(10);

/// How long one line to a worker may wait for the worker to read: the socket's buffer holds
/// many lines, so a write blocks this long only for a peer that stopped reading. Without it
/// such a peer held its session task, its rank and a session slot for ever.
pub const SEND_DEADLINE: Duration = Duration::from_secs(10);

/// What the agent needs of the cluster: the node's id, a way to make requests (admitted like
/// an admin peer's), and the aggregation tables with their changes. The node is the one
/// implementation outside tests.
pub trait Cluster: Clone + Send + Sync + 'static {
    fn node_id(&self) -> NodeId;
    fn request(&self, req: AdminRequest) -> impl Future<Output = Reply> + Send;
    fn subscribe(&self) -> (AggTables, broadcast::Receiver<Change>);
}

impl Cluster for Node {
    fn node_id(&self) -> NodeId {
        self.id()
    }

    fn request(&self, req: AdminRequest) -> impl Future<Output = Reply> + Send {
        let node = self.clone();
        async move { node.serve_admitted(req).await }
    }

    fn subscribe(&self) -> (AggTables, broadcast::Receiver<Change>) {
        // Only the aggregation tables are copied (under the lock), not the whole state.
        self.feed().subscribe_with(|d| d.aggregation.clone())
    }
}

/// A connected peer's credentials, from the kernel (`SO_PEERCRED`), plus its supplementary
/// groups (from `/proc`, empty if it has already exited).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    pub groups: Vec<u32>,
}

impl Peer {
    /// The peer at the other end of `stream`.
    pub fn of(stream: &UnixStream) -> std::io::Result<Peer> {
        let cred = stream.peer_cred()?;
        let groups = cred.pid().map(supplementary_groups).unwrap_or_default();
        Ok(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
            groups,
        })
    }

    fn pid_text(&self) -> String {
        self.pid.map_or_else(|| "unknown".into(), |p| p.to_string())
    }
}

/// The `Groups:` of `/proc/<pid>/status`.
fn supplementary_groups(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Who may use the agent: the daemon's user and members of the socket's group, the same
/// people the default socket mode (0o660) lets connect, checked on the peer's credentials so
/// that a wider mode (or a socket reached through a shared mount) does not widen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentPolicy {
    pub daemon_uid: u32,
    pub group: u32,
}

impl AgentPolicy {
    /// This daemon's policy: its effective user, and the socket's group (`access`), or its
    /// own group when none is configured.
    pub fn for_daemon(access: &SocketAccess) -> std::io::Result<AgentPolicy> {
        use std::os::unix::fs::MetadataExt;
        // /proc/self belongs to the process's effective user and group.
        let me = std::fs::metadata("/proc/self")?;
        Ok(AgentPolicy {
            daemon_uid: me.uid(),
            group: access.group.unwrap_or(me.gid()),
        })
    }

    /// Whether `peer` may use the agent, or why not.
    pub fn admit(&self, peer: &Peer) -> Result<(), String> {
        if peer.uid == self.daemon_uid
            || peer.gid == self.group
            || peer.groups.contains(&self.group)
        {
            return Ok(());
        }
        Err(format!(
            "uid {} (pid {}) may not use the aggregation agent: only uid {} and members of group {} may",
            peer.uid,
            peer.pid_text(),
            self.daemon_uid,
            self.group
        ))
    }
}

/// Whether `ip` is an address of this host (the kernel lets a socket bind it).
fn is_local(ip: Ipv4Addr) -> bool {
    UdpSocket::bind(SocketAddrV4::new(ip, 0)).is_ok()
}

/// Why `addr` cannot be a worker's address on this host, if it cannot: results are sent to it,
/// so it must be this host's, with the worker's socket already bound there.
pub fn check_addr(addr: SocketAddrV4) -> Result<(), String> {
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err(format!(
            "join.addr {addr} is not an address the aggregator can answer: bind the worker's socket to its host address and a port"
        ));
    }
    if !is_local(*addr.ip()) {
        return Err(format!(
            "join.addr {addr} is not an address of this host: a worker joins through the agent of the host it runs on"
        ));
    }
    // Binding succeeds only if no socket holds the port (workers do not share ports).
    if UdpSocket::bind(addr).is_ok() {
        return Err(format!(
            "nothing on this host is bound to join.addr {addr}: bind the worker's UDP socket before joining"
        ));
    }
    Ok(())
}

/// A job's rank, by job name.
type JobRank = (String, u16);

/// The ranks live sessions of this agent hold: the holder's pid.
#[derive(Debug, Clone, Default)]
pub struct Holders(Arc<Mutex<BTreeMap<JobRank, Option<i32>>>>);

/// A rank held by a session until it is dropped.
#[derive(Debug)]
pub struct Hold {
    holders: Holders,
    key: JobRank,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Ok(mut m) = self.holders.0.lock() {
            m.remove(&self.key);
        }
    }
}

impl Holders {
    /// Takes rank `rank` of `job` for `peer`'s session, or says which session has it.
    pub fn take(&self, job: &str, rank: u16, peer: &Peer) -> Result<Hold, String> {
        let mut m = self
            .0
            .lock()
            .map_err(|_| "the aggregation agent's rank table is unusable".to_string())?;
        let key = (job.to_owned(), rank);
        if let Some(pid) = m.get(&key) {
            return Err(format!(
                "rank {rank} of job {job} is already joined by another session on this host (pid {})",
                pid.map_or_else(|| "unknown".into(), |p| p.to_string())
            ));
        }
        m.insert(key.clone(), peer.pid);
        Ok(Hold {
            holders: self.clone(),
            key,
        })
    }

    /// Sessions live now.
    pub fn len(&self) -> usize {
        self.0.lock().map_or(0, |m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why the tables forbid `rank` of `job` to join from this host, if they do: it is the rank
/// of a worker at an address that is not this host's (a second process must not take over a
/// rank a live worker elsewhere holds).
pub fn held_elsewhere(tables: &AggTables, job: &str, rank: u16) -> Result<(), String> {
    match tables.jobs.get(job).and_then(|j| j.members.get(&rank)) {
        Some(a) if !is_local(*a.ip()) => Err(format!(
            "rank {rank} of job {job} is the worker at {a} on another host: a rank cannot be taken over"
        )),
        _ => Ok(()),
    }
}

/// The JSON a worker reads for `view`.
pub fn view_json(view: &WorkerView) -> Value {
    match view {
        WorkerView::Waiting => {
            json!({"waiting": "waiting for every rank to join and the leader to place the job"})
        }
        WorkerView::Running(m) => json!({"membership": {
            "job": m.job, "epoch": m.epoch, "worker": m.worker, "workers": m.workers,
            "aggregator": m.aggregator.to_string(), "values": m.geometry.values,
            "chunk_values": m.geometry.chunk_values, "dtype": m.dtype.name(),
            "token": m.token, "result_token": m.result_token,
        }}),
        WorkerView::Ring(r) => json!({"ring": {
            "job": r.job, "epoch": r.epoch, "rank": r.rank, "ranks": r.ranks,
        }}),
        WorkerView::Failed(why) => json!({"failed": why}),
        WorkerView::Gone => json!({"gone": "the job was deleted"}),
    }
}

/// Parses the join line: (job, rank, addr), or why not.
pub fn parse_join(line: &str) -> Result<(String, u16, std::net::SocketAddrV4), String> {
    let v: Value = serde_json::from_str(line)
        .map_err(|e| format!("the first line must be a JSON join request: {e}"))?;
    let j = v
        .get("join")
        .ok_or("the first line must be {\"join\": {\"job\": ..., \"rank\": ..., \"addr\": ...}}")?;
    let job = j["job"]
        .as_str()
        .ok_or("join.job must be a string")?
        .to_owned();
    let rank = j["rank"]
        .as_u64()
        .and_then(|r| u16::try_from(r).ok())
        .ok_or("join.rank must be an integer from 0 to 65535")?;
    let addr = j["addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .ok_or("join.addr must be the worker's IPv4 address and port, like \"198.18.0.4:40000\"")?;
    Ok((job, rank, addr))
}

/// Binds the agent's socket.
pub fn bind(path: &Path, access: SocketAccess) -> std::io::Result<UnixListener> {
    yard_actors::probe::socket::bind(path, access)
}

/// Accepts sessions until the process ends; an accept error (out of descriptors, say) is
/// logged and retried after a pause, never a busy loop.
pub async fn serve<C: Cluster>(listener: UnixListener, cluster: C, policy: AgentPolicy) {
    let holders = Holders::default();
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (cluster, holders, live) = (cluster.clone(), holders.clone(), live.clone());
                tokio::spawn(async move {
                    use std::sync::atomic::Ordering;
                    let n = live.fetch_add(1, Ordering::SeqCst);
                    session(stream, cluster, policy, holders, n < MAX_SESSIONS).await;
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "aggregation agent accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn send(w: &mut tokio::net::unix::OwnedWriteHalf, v: &Value) -> std::io::Result<()> {
    send_within(w, v, SEND_DEADLINE).await
}

/// Writes `v` as one line, failing if the worker does not take it within `deadline`.
async fn send_within(
    w: &mut tokio::net::unix::OwnedWriteHalf,
    v: &Value,
    deadline: Duration,
) -> std::io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    tokio::time::timeout(deadline, w.write_all(line.as_bytes()))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the worker did not read its session for {deadline:?}"),
            )
        })?
}

/// Whether the tables need no report that `rank` of `job` (the worker at `addr`) is gone: the
/// job is deleted or failed, or the rank is no longer that worker's (already reported gone,
/// or joined again from another address, whom a late report must not fail).
pub fn gone_settled(tables: &AggTables, job: &str, rank: u16, addr: SocketAddrV4) -> bool {
    tables
        .jobs
        .get(job)
        .is_none_or(|j| j.failed.is_some() || j.members.get(&rank) != Some(&addr))
}

/// Reports `rank` of `job` gone until the cluster writes it or the tables show it needs no
/// report ([`gone_settled`]), trying again after a growing pause: a report lost with a leader
/// change, or answered "unknown", would otherwise leave a dead worker in its job, and the
/// other workers waiting on it, for good. `WorkerGone` is idempotent in the tables.
async fn report_gone<C: Cluster>(
    cluster: &C,
    job: &str,
    rank: u16,
    addr: SocketAddrV4,
    reason: String,
) {
    let gone = AdminRequest::Agg(AggRequest::WorkerGone {
        name: job.to_owned(),
        rank,
        reason,
    });
    let mut failures = 0u32;
    loop {
        let why = match cluster.request(gone.clone()).await {
            Reply::Admin(_) => return,
            Reply::Error(why) | Reply::Indefinite(why) => why,
            other => format!("unexpected reply {other:?}"),
        };
        let (tables, _) = cluster.subscribe();
        if gone_settled(&tables, job, rank, addr) {
            return;
        }
        failures = failures.saturating_add(1);
        let after = yard_actors::aggregator::core::retry_after(failures);
        tracing::warn!(
            job = %job,
            rank,
            error = %why,
            failures,
            retry_in_ms = after.as_millis() as u64,
            "could not report the worker gone; retrying"
        );
        tokio::time::sleep(after).await;
    }
}

/// Reads one line of at most MAX_LINE bytes: `None` at the end of the stream.
async fn read_line(
    r: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = {
        let mut limited = tokio::io::AsyncReadExt::take(&mut *r, MAX_LINE);
        limited.read_until(b'\n', &mut buf).await?
    };
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && n as u64 >= MAX_LINE {
        return Err(std::io::Error::other(format!(
            "a line is longer than {MAX_LINE} bytes"
        )));
    }
    Ok(Some(String::from_utf8_lossy(&buf).trim().to_owned()))
}

/// Refuses a session: the reason to the peer, a warning and the refused-requests metric here.
async fn refuse(w: &mut tokio::net::unix::OwnedWriteHalf, peer: Option<&Peer>, why: String) {
    crate::metrics::METRICS.requests_refused.inc();
    tracing::warn!(
        uid = peer.map(|p| p.uid),
        pid = peer.and_then(|p| p.pid),
        reason = %why,
        "aggregation agent refused a session"
    );
    let _ = send(w, &json!({"error": why})).await;
}

async fn session<C: Cluster>(
    stream: UnixStream,
    cluster: C,
    policy: AgentPolicy,
    holders: Holders,
    room: bool,
) {
    let peer = Peer::of(&stream);
    let (r, mut w) = stream.into_split();
    if !room {
        let why =
            format!("the aggregation agent already serves {MAX_SESSIONS} sessions; retry shortly");
        return refuse(&mut w, peer.as_ref().ok(), why).await;
    }
    let peer = match peer {
        Ok(p) => p,
        Err(e) => {
            let why = format!("cannot read the peer's credentials: {e}");
            return refuse(&mut w, None, why).await;
        }
    };
    if let Err(why) = policy.admit(&peer) {
        return refuse(&mut w, Some(&peer), why).await;
    }
    let mut r = BufReader::new(r);
    let first = match tokio::time::timeout(JOIN_DEADLINE, read_line(&mut r)).await {
        Ok(Ok(Some(line))) => line,
        Ok(_) => return,
        Err(_) => {
            let why = format!("no join request within {} s", JOIN_DEADLINE.as_secs());
            return refuse(&mut w, Some(&peer), why).await;
        }
    };
    let (job, rank, addr) = match parse_join(&first).and_then(|j| {
        check_addr(j.2)?;
        Ok(j)
    }) {
        Ok(j) => j,
        Err(why) => return refuse(&mut w, Some(&peer), why).await,
    };
    let _hold = match holders.take(&job, rank, &peer) {
        Ok(h) => h,
        Err(why) => return refuse(&mut w, Some(&peer), why).await,
    };
    let (tables, _) = cluster.subscribe();
    if let Err(why) = held_elsewhere(&tables, &job, rank) {
        return refuse(&mut w, Some(&peer), why).await;
    }
    let join = AdminRequest::Agg(AggRequest::Join {
        name: job.clone(),
        rank,
        addr,
    });
    if let Reply::Error(why) | Reply::Indefinite(why) = cluster.request(join).await {
        let _ = send(&mut w, &json!({"error": why})).await;
        return;
    }
    tracing::info!(job = %job, rank, %addr, uid = peer.uid, pid = peer.pid, "worker joined through the agent");
    let (tables, mut rx) = cluster.subscribe();
    let mut last = worker_view(&tables, &job, rank);
    let mut left = false;
    let mut ended = false;
    if send(&mut w, &view_json(&last)).await.is_err() {
        ended = true;
    }
    while !ended {
        tokio::select! {
            line = read_line(&mut r) => match line {
                Ok(Some(l)) if serde_json::from_str::<Value>(&l).is_ok_and(|v| v["leave"] == true) => {
                    left = true;
                    let _ = send(&mut w, &json!({"left": true})).await;
                    break;
                }
                Ok(Some(_)) => {
                    let _ = send(&mut w, &json!({"error": "after the join, a worker only sends {\"leave\": true}"})).await;
                }
                Ok(None) | Err(_) => break,
            },
            change = rx.recv() => {
                let view = match change {
                    Ok(Change::Aggregation { tables, .. }) => worker_view(&tables, &job, rank),
                    Ok(Change::Reset { .. }) | Err(RecvError::Lagged(_)) => {
                        let (tables, fresh) = cluster.subscribe();
                        rx = fresh;
                        worker_view(&tables, &job, rank)
                    }
                    Ok(_) => continue,
                    Err(RecvError::Closed) => break,
                };
                if view != last {
                    ended = matches!(view, WorkerView::Failed(_) | WorkerView::Gone);
                    if send(&mut w, &view_json(&view)).await.is_err() {
                        break;
                    }
                    last = view;
                }
            }
        }
    }
    if left || ended {
        return;
    }
    let reason = format!(
        "its session with node {} ended without a goodbye: the worker exited or crashed",
        cluster.node_id()
    );
    tracing::warn!(job = %job, rank, pid = peer.pid, %reason, "worker gone");
    report_gone(&cluster, &job, rank, addr, reason).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::AdminReply;
    use tokio::io::AsyncBufReadExt;
    use yard_raft_store::aggregation::{AggCommand, Grouping, Quota};

    /// The cluster as the agent sees it: tables a join changes, and every request made.
    #[derive(Clone)]
    struct Fake {
        tables: Arc<Mutex<AggTables>>,
        changes: broadcast::Sender<Change>,
        requests: Arc<Mutex<Vec<AdminRequest>>>,
        /// WorkerGone reports answered "unknown outcome" before one is written.
        gone_unknown: Arc<Mutex<u32>>,
    }

    impl Fake {
        /// Job "train" of two workers, rank 1 already joined from `rank1`.
        fn new(rank1: SocketAddrV4) -> Fake {
            let mut t = AggTables::default();
            let create = AggCommand::Create {
                name: "train".into(),
                workers: 2,
                values: 10,
                dtype: 0,
                elastic: false,
                chunk_values: 10,
                colocate: false,
                quota: Quota {
                    job_bytes: 1 << 30,
                    cluster_bytes: 1 << 30,
                },
                grouping: Grouping::Flat,
                secret: [7; 16],
            };
            t.apply(&create, 1).unwrap();
            let join = AggCommand::Join {
                name: "train".into(),
                rank: 1,
                addr: rank1,
            };
            t.apply(&join, 2).unwrap();
            Fake {
                tables: Arc::new(Mutex::new(t)),
                changes: broadcast::channel(16).0,
                requests: Arc::default(),
                gone_unknown: Arc::default(),
            }
        }

        fn requests(&self) -> Vec<AdminRequest> {
            self.requests.lock().unwrap().clone()
        }
    }

    impl Cluster for Fake {
        fn node_id(&self) -> NodeId {
            1
        }

        fn request(&self, req: AdminRequest) -> impl Future<Output = Reply> + Send {
            self.requests.lock().unwrap().push(req.clone());
            let mut t = self.tables.lock().unwrap();
            let reply = match req {
                AdminRequest::Agg(AggRequest::Join { name, rank, addr }) => {
                    match t.apply(&AggCommand::Join { name, rank, addr }, 3) {
                        Ok(_) => {
                            let _ = self.changes.send(Change::Aggregation {
                                revision: 3,
                                tables: Arc::new(t.clone()),
                            });
                            Reply::Admin(AdminReply::Written { revision: 3 })
                        }
                        Err(why) => Reply::Error(why),
                    }
                }
                AdminRequest::Agg(AggRequest::WorkerGone { .. }) => {
                    let mut unknown = self.gone_unknown.lock().unwrap();
                    if *unknown > 0 {
                        *unknown -= 1;
                        Reply::Indefinite("the leader changed under the write".into())
                    } else {
                        Reply::Admin(AdminReply::Written { revision: 4 })
                    }
                }
                _ => Reply::Admin(AdminReply::Written { revision: 3 }),
            };
            std::future::ready(reply)
        }

        fn subscribe(&self) -> (AggTables, broadcast::Receiver<Change>) {
            (
                self.tables.lock().unwrap().clone(),
                self.changes.subscribe(),
            )
        }
    }

    /// This test process's own policy: it may use the agent.
    fn me() -> AgentPolicy {
        AgentPolicy::for_daemon(&SocketAccess::default()).unwrap()
    }

    /// Serves an agent for `fake` under `policy` on a fresh socket.
    fn agent(fake: &Fake, policy: AgentPolicy) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agg.sock");
        let listener = bind(&path, SocketAccess::default()).unwrap();
        tokio::spawn(serve(listener, fake.clone(), policy));
        (dir, path)
    }

    /// A session: connects, sends `line`, returns the reader and writer.
    async fn open(
        path: &Path,
        line: &str,
    ) -> (
        tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
        tokio::net::unix::OwnedWriteHalf,
    ) {
        let (r, mut w) = UnixStream::connect(path).await.unwrap().into_split();
        w.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        (BufReader::new(r).lines(), w)
    }

    async fn next(
        lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    ) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .expect("an answer within 5 s")
            .unwrap()
            .expect("a line before the end");
        serde_json::from_str(&line).unwrap()
    }

    fn join(rank: u16, addr: SocketAddrV4) -> String {
        json!({"join": {"job": "train", "rank": rank, "addr": addr.to_string()}}).to_string()
    }

    /// A bound UDP socket on loopback: a worker's.
    fn worker_socket() -> (UdpSocket, SocketAddrV4) {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(a) = s.local_addr().unwrap() else {
            unreachable!()
        };
        (s, a)
    }

    fn other_host() -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 255, 7), 40000)
    }

    /// Each refusal is one sentence on the socket, changes nothing in the cluster, and the
    /// agent goes on serving: a good join afterwards gets its view and leaves cleanly.
    #[tokio::test]
    async fn bad_joins_are_refused_in_one_sentence_and_the_agent_serves_on() {
        let fake = Fake::new(other_host());
        let (_dir, path) = agent(&fake, me());
        let (_kept, bound) = worker_socket();
        let unbound = {
            let (s, a) = worker_socket();
            drop(s);
            a
        };
        let cases = [
            (
                join(0, SocketAddrV4::new(Ipv4Addr::new(198, 18, 255, 9), 40000)),
                "join.addr 198.18.255.9:40000 is not an address of this host: a worker joins through the agent of the host it runs on".to_string(),
            ),
            (
                join(0, unbound),
                format!("nothing on this host is bound to join.addr {unbound}: bind the worker's UDP socket before joining"),
            ),
            (
                join(1, bound),
                "rank 1 of job train is the worker at 198.18.255.7:40000 on another host: a rank cannot be taken over".to_string(),
            ),
            (
                "not json".to_string(),
                "the first line must be a JSON join request: ".to_string(),
            ),
        ];
        for (line, want) in cases {
            let (mut lines, _w) = open(&path, &line).await;
            let got = next(&mut lines).await;
            let why = got["error"].as_str().unwrap_or_default();
            assert!(why.starts_with(&want), "{line}: {got}");
            assert!(!why.contains('\n'), "one line");
            assert!(lines.next_line().await.unwrap().is_none(), "{line}: closed");
        }
        assert!(fake.requests().is_empty(), "nothing reached the cluster");
        let (mut lines, mut w) = open(&path, &join(0, bound)).await;
        let view = next(&mut lines).await;
        assert!(view.get("waiting").is_some(), "{view}");
        w.write_all(b"{\"leave\": true}\n").await.unwrap();
        let mut saw_left = false;
        while let Ok(Some(l)) = lines.next_line().await {
            saw_left |= serde_json::from_str::<Value>(&l).unwrap() == json!({"left": true});
        }
        assert!(saw_left, "the good worker left cleanly");
        assert_eq!(fake.requests().len(), 1, "one join, and no worker gone");
    }

    /// A second session for a rank a live session holds is refused, and hanging up does not
    /// report the real worker gone (which would fail its job); once the holder leaves, the
    /// rank is free again.
    #[tokio::test]
    async fn a_second_session_cannot_take_a_live_workers_rank_nor_fail_its_job() {
        let fake = Fake::new(other_host());
        let (_dir, path) = agent(&fake, me());
        let (_real, real_addr) = worker_socket();
        let (mut real, mut real_w) = open(&path, &join(0, real_addr)).await;
        let first = next(&mut real).await;
        assert!(first.get("error").is_none(), "{first}");
        let (_other, other_addr) = worker_socket();
        for addr in [real_addr, other_addr] {
            let (mut lines, w) = open(&path, &join(0, addr)).await;
            let got = next(&mut lines).await;
            let why = got["error"].as_str().unwrap_or_default();
            assert!(
                why.starts_with(
                    "rank 0 of job train is already joined by another session on this host (pid "
                ),
                "{got}"
            );
            drop((lines, w));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let gone = fake
            .requests()
            .iter()
            .filter(|r| matches!(r, AdminRequest::Agg(AggRequest::WorkerGone { .. })))
            .count();
        assert_eq!(gone, 0, "the impostors' hang-ups reported nobody gone");
        real_w.write_all(b"{\"leave\": true}\n").await.unwrap();
        while real.next_line().await.unwrap().is_some() {}
        let (mut again, _w) = open(&path, &join(0, real_addr)).await;
        assert!(
            next(&mut again).await.get("error").is_none(),
            "free after the leave"
        );
    }

    /// A peer that is neither the daemon's user nor in the socket's group is refused, on its
    /// credentials, before it may send anything.
    #[tokio::test]
    async fn a_peer_outside_the_daemons_user_and_group_is_refused() {
        let fake = Fake::new(other_host());
        let mine = me();
        let policy = AgentPolicy {
            daemon_uid: mine.daemon_uid + 4242,
            group: mine.group + 4242,
        };
        let (_dir, path) = agent(&fake, policy);
        let (_s, addr) = worker_socket();
        let (mut lines, _w) = open(&path, &join(0, addr)).await;
        let got = next(&mut lines).await;
        let want = format!(
            "uid {} (pid {}) may not use the aggregation agent: only uid {} and members of group {} may",
            mine.daemon_uid,
            std::process::id(),
            policy.daemon_uid,
            policy.group
        );
        assert_eq!(got, json!({"error": want}));
        assert!(fake.requests().is_empty());
    }

    fn gone_reports(fake: &Fake) -> usize {
        fake.requests()
            .iter()
            .filter(|r| matches!(r, AdminRequest::Agg(AggRequest::WorkerGone { .. })))
            .count()
    }

    /// A worker that hangs up without a goodbye is reported gone; a report answered "unknown
    /// outcome" (a leader change under it) is sent again until one is written, then no more.
    #[tokio::test]
    async fn a_worker_gone_report_that_is_not_written_is_sent_again() {
        let fake = Fake::new(other_host());
        *fake.gone_unknown.lock().unwrap() = 2;
        let (_dir, path) = agent(&fake, me());
        let (_s, addr) = worker_socket();
        let (mut lines, w) = open(&path, &join(0, addr)).await;
        assert!(next(&mut lines).await.get("error").is_none());
        drop((lines, w));
        let start = std::time::Instant::now();
        while gone_reports(&fake) < 3 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{} reports in 5 s: a report that was not written was not sent again",
                gone_reports(&fake)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(gone_reports(&fake), 3, "none after the written one");
    }

    /// A line to a worker that never reads its session fails after its deadline (the session
    /// then ends) instead of holding the session task for ever.
    #[tokio::test]
    async fn a_send_to_a_worker_that_never_reads_times_out() {
        let (_never_read, stream) = UnixStream::pair().unwrap();
        let (_r, mut w) = stream.into_split();
        let line = json!({"waiting": "x".repeat(60_000)});
        let filled = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = send_within(&mut w, &line, Duration::from_millis(200)).await {
                    return e;
                }
            }
        })
        .await
        .expect("a send to a peer that never reads must fail, not wait for ever");
        assert_eq!(filled.kind(), std::io::ErrorKind::TimedOut, "{filled}");
    }

    #[test]
    fn a_gone_report_is_settled_once_the_rank_is_not_that_worker_s() {
        let fake = Fake::new(other_host());
        let mut t = fake.tables.lock().unwrap().clone();
        let at = other_host();
        assert!(
            !gone_settled(&t, "train", 1, at),
            "rank 1 is still the worker"
        );
        let elsewhere = SocketAddrV4::new(Ipv4Addr::new(198, 18, 255, 8), 40000);
        assert!(
            gone_settled(&t, "train", 1, elsewhere),
            "another worker's now"
        );
        assert!(gone_settled(&t, "nope", 1, at), "no such job");
        let gone = AggCommand::WorkerGone {
            name: "train".into(),
            rank: 1,
            reason: "it exited".into(),
        };
        t.apply(&gone, 3).unwrap();
        assert!(gone_settled(&t, "train", 1, at), "the job failed");
    }

    #[test]
    fn the_policy_admits_the_daemons_user_and_its_groups_members_only() {
        let policy = AgentPolicy {
            daemon_uid: 100,
            group: 200,
        };
        let peer = |uid, gid, groups: &[u32]| Peer {
            uid,
            gid,
            pid: Some(7),
            groups: groups.to_vec(),
        };
        assert!(
            policy.admit(&peer(100, 1, &[])).is_ok(),
            "the daemon's user"
        );
        assert!(policy.admit(&peer(5, 200, &[])).is_ok(), "primary group");
        assert!(
            policy.admit(&peer(5, 1, &[3, 200])).is_ok(),
            "supplementary group"
        );
        assert_eq!(
            policy.admit(&peer(0, 0, &[])).unwrap_err(),
            "uid 0 (pid 7) may not use the aggregation agent: only uid 100 and members of group 200 may"
        );
    }

    #[test]
    fn a_join_line_is_parsed_or_refused_in_one_sentence() {
        let (job, rank, addr) =
            parse_join(r#"{"join": {"job": "train", "rank": 3, "addr": "198.18.0.4:40000"}}"#)
                .unwrap();
        assert_eq!(
            (job.as_str(), rank, addr.to_string().as_str()),
            ("train", 3, "198.18.0.4:40000")
        );
        assert!(parse_join("hello")
            .unwrap_err()
            .starts_with("the first line must be a JSON join request"));
        assert_eq!(
            parse_join(r#"{"join": {"job": "t", "rank": 1, "addr": "nope"}}"#).unwrap_err(),
            "join.addr must be the worker's IPv4 address and port, like \"198.18.0.4:40000\""
        );
        assert_eq!(
            parse_join(r#"{"join": {"job": "t", "rank": -1, "addr": "198.18.0.4:1"}}"#)
                .unwrap_err(),
            "join.rank must be an integer from 0 to 65535"
        );
    }

    /// A worker's membership line carries its two frame tokens (issue 25 finding 6): without
    /// them its frames are foreign and its results ignored.
    #[test]
    fn a_membership_line_gives_the_worker_its_tokens() {
        let m = yard_agg::worker::Membership {
            job: 3,
            epoch: 2,
            worker: 1,
            workers: 2,
            aggregator: "198.18.0.1:7481".parse().unwrap(),
            geometry: yard_agg::wire::Geometry {
                values: 10,
                chunk_values: 10,
            },
            dtype: yard_agg::wire::Dtype::I32,
            token: 0xdead_beef,
            result_token: 7,
        };
        let v = view_json(&WorkerView::Running(m));
        assert_eq!(v["membership"]["token"], 0xdead_beefu32);
        assert_eq!(v["membership"]["result_token"], 7);
    }
}
