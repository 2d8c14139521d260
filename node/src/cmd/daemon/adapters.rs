//! The adapters between the actors' traits and this node: the gateway's lease renewals, the
//! probe's summaries and per-peer counters, the liveness actor's probes of Raft peers. Each
//! runs its I/O on the node's tokio runtime, never on an actix arbiter.

use std::sync::Arc;
use std::time::Duration;

use yard::rpc::{Reply, Request};
use yard::service::Node;
use yard::tls::PeerRole;
use yard::transport::{Handler as _, Target, Transport};
use yard_actors::gateway::actor::{RenewFuture, Renewer};
use yard_actors::gateway::lease::quorum_grant;
use yard_actors::liveness::{ProbeTarget, Prober};
use yard_actors::probe::actor::{PeerCounterSource, PeerSample, ReportFuture, Reporter};
use yard_actors::probe::core::JobBatch;
use yard_raft_store::NodeId;

/// Renews this node's gateway lease with every voter, on the node's runtime; asks the leader
/// for restart graces.
#[derive(Clone)]
pub struct LeaseRenewer {
    pub node: Node,
    pub transport: Arc<dyn Transport>,
    /// A renewal round's time, and the grace request's.
    pub timeout: Duration,
    /// One call to one voter.
    pub call_timeout: Duration,
    /// Voters with a renewal call still running.
    pub busy: Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>,
    pub rt: tokio::runtime::Handle,
}

impl LeaseRenewer {
    /// Sends `req` to the leader this node knows of (straight to its own handler when it
    /// leads) and returns the grant, if any.
    fn ask(&self, req: Request) -> RenewFuture {
        let (node, transport, timeout) = (self.node.clone(), self.transport.clone(), self.timeout);
        let task = self.rt.spawn(async move {
            let (leader, info) = node.known_leader()?;
            let reply = if leader == node.id() {
                Ok(node.handle(PeerRole::Node(leader), req).await)
            } else {
                let addr = info.addr;
                transport
                    .call(Target::node(leader, addr), req, timeout)
                    .await
            };
            match reply {
                Ok(Reply::LeaseGranted {
                    granted_ms,
                    revision,
                }) => Some((granted_ms, revision)),
                Ok(other) => {
                    tracing::debug!(?other, "gateway lease not granted");
                    None
                }
                Err(e) => {
                    tracing::debug!(error = %e, "gateway lease request failed");
                    None
                }
            }
        });
        Box::pin(async move { task.await.ok().flatten() })
    }

    /// One renewal round: `req` to every voter in parallel; the round's grant as soon as a
    /// majority granted (`lease::quorum_grant`), `None` once that cannot happen any more or the
    /// round's time (`self.timeout`, one lease) is up.
    ///
    /// Each call runs in a task of its own to its end (`call_timeout`), also after the round
    /// returned: cancelling the slowest voter's call at every round would abort its connection
    /// mid-handshake each time, so it would never connect (and the aborted handshakes cost both
    /// sides CPU). A voter whose previous call is still running is skipped for this round, so a
    /// dead voter costs one call at a time.
    fn round(&self, req: Request) -> RenewFuture {
        let (node, timeout, call_timeout, busy) = (
            self.node.clone(),
            self.timeout,
            self.call_timeout,
            self.busy.clone(),
        );
        let task = self.rt.spawn(async move {
            let voters = node.voter_ids();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            for voter in voters.iter().copied() {
                if !busy.lock().unwrap_or_else(|e| e.into_inner()).insert(voter) {
                    continue;
                }
                let (node, req, tx, busy) = (node.clone(), req.clone(), tx.clone(), busy.clone());
                tokio::spawn(async move {
                    let reply = node.call_node(voter, req, call_timeout).await;
                    busy.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&voter);
                    let _ = tx.send(reply);
                });
            }
            drop(tx);
            let mut grants = Vec::new();
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => return None,
                    reply = rx.recv() => {
                        // Every call answered: no majority this round.
                        let reply = reply?;
                        if let Ok(Reply::LeaseGranted { granted_ms, revision }) = reply {
                            grants.push((granted_ms, revision));
                        }
                        if let Some(grant) = quorum_grant(voters.len(), &grants) {
                            return Some(grant);
                        }
                    }
                }
            }
        });
        Box::pin(async move { task.await.ok().flatten() })
    }
}

impl Renewer for LeaseRenewer {
    fn renew(&self, applied: u64, lease_left_ms: u64) -> RenewFuture {
        self.round(Request::GatewayRenew {
            applied,
            lease_left_ms,
        })
    }

    /// Asked again every 150 ms until granted or `GRACE_ASK` is up: a planned restart soon
    /// after a leader change reaches a leader that may not yet lead the gateway (it refuses),
    /// and one refused ask would cost the node its VIPs for a restart of a second.
    fn grace(&self, applied: u64, grace_ms: u64) -> RenewFuture {
        const GRACE_ASK: Duration = Duration::from_millis(1_500);
        let this = self.clone();
        Box::pin(async move {
            let began = tokio::time::Instant::now();
            loop {
                if let Some(grant) = this.ask(Request::GatewayGrace { applied, grace_ms }).await {
                    return Some(grant);
                }
                if began.elapsed() >= GRACE_ASK {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
    }
}

/// Sends probe summaries to the leader (straight to this node's own handler when it leads).
pub struct ProbeReporter {
    pub node: Node,
    pub transport: Arc<dyn Transport>,
    pub timeout: Duration,
    pub rt: tokio::runtime::Handle,
}

impl Reporter for ProbeReporter {
    fn report(&self, batches: Vec<JobBatch>) -> ReportFuture {
        let (node, transport, timeout) = (self.node.clone(), self.transport.clone(), self.timeout);
        let task = self.rt.spawn(async move {
            let (leader, info) = node
                .known_leader()
                .ok_or_else(|| "no leader is known".to_owned())?;
            let req = Request::ProbeReport { batches };
            let reply = if leader == node.id() {
                node.handle(PeerRole::Node(leader), req).await
            } else {
                let addr = info.addr;
                transport
                    .call(Target::node(leader, addr), req, timeout)
                    .await
                    .map_err(|e| e.to_string())?
            };
            match reply {
                Reply::ProbeAccepted => Ok(leader),
                Reply::Error(e) => Err(e),
                other => Err(format!("unexpected reply to a probe report: {other:?}")),
            }
        });
        Box::pin(async move {
            task.await
                .unwrap_or_else(|e| Err(format!("probe report task failed: {e}")))
        })
    }
}

/// The eBPF per-peer counters on the probe's interface.
pub struct EbpfPeerCounters(yard_ebpf::peers::PeerCounters);

impl EbpfPeerCounters {
    pub fn attach(interface: &str) -> anyhow::Result<Self> {
        let mut counters = yard_ebpf::peers::PeerCounters::load()?;
        counters.attach(interface)?;
        Ok(Self(counters))
    }
}

impl PeerCounterSource for EbpfPeerCounters {
    fn set_ports(&mut self, ports: &[u16]) -> Result<(), String> {
        self.0.set_ports(ports).map_err(|e| e.to_string())
    }

    fn read(&mut self) -> Result<Vec<PeerSample>, String> {
        let stats = self.0.read().map_err(|e| e.to_string())?;
        let mut per_peer: std::collections::BTreeMap<std::net::Ipv4Addr, PeerSample> =
            Default::default();
        for st in stats {
            let e = per_peer.entry(st.peer).or_insert(PeerSample {
                peer: st.peer,
                tx_bytes: 0,
                rx_bytes: 0,
                tx_packets: 0,
                rx_packets: 0,
                last_rx_ns: 0,
            });
            match st.dir {
                yard_ebpf::peers::Direction::Egress => {
                    e.tx_bytes += st.bytes;
                    e.tx_packets += st.packets;
                }
                yard_ebpf::peers::Direction::Ingress => {
                    e.rx_bytes += st.bytes;
                    e.rx_packets += st.packets;
                    e.last_rx_ns = e.last_rx_ns.max(st.last_ns);
                }
            }
        }
        Ok(per_peer.into_values().collect())
    }
}

/// Probes members over the node's own transport, on the node's runtime.
pub struct RaftProber {
    pub node: Node,
    pub transport: Arc<dyn Transport>,
    pub timeout: Duration,
    pub rt: tokio::runtime::Handle,
}

impl Prober for RaftProber {
    fn targets(&self) -> ProbeTarget {
        let mut members = self.node.member_ids();
        members.remove(&self.node.id());
        ProbeTarget {
            leader: self.node.raft().metrics().borrow().state == openraft::ServerState::Leader,
            members,
        }
    }

    fn probe(
        &self,
        id: NodeId,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
        let addr = self.node.member(id).map(|n| n.addr);
        let transport = self.transport.clone();
        let timeout = self.timeout;
        let task = self.rt.spawn(async move {
            let Some(addr) = addr else { return false };
            yard::metrics::METRICS.liveness_probes.inc();
            let ok = matches!(transport.call(Target::node(id, addr), Request::Probe, timeout).await, Ok(Reply::Pong { id: got }) if got == id);
            if !ok {
                yard::metrics::METRICS.liveness_probe_failures.inc();
            }
            ok
        });
        Box::pin(async move { task.await.unwrap_or(false) })
    }

    fn until_leading(
        &self,
        max: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let node = self.node.clone();
        let task = self
            .rt
            .spawn(async move { yard::raft_wait::wait_leading(node.raft(), max).await });
        Box::pin(async move {
            let _ = task.await;
        })
    }
}
