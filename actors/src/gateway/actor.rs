//! The actix shell of a gateway node: subscribes to the replicated tables, renews the lease
//! with the voters, runs the timers, and executes the core's effects on the data plane (XDP
//! maps), the interface (VIP addresses, gratuitous ARP) and the neighbour table. Every decision
//! is in [`super::core`].

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::Ipv4Addr;
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::broadcast::error::RecvError;
use yard_raft_store::gateway::{Endpoint, EndpointKey};
use yard_raft_store::{Change, ChangeFeed, NodeId};

use super::announce::{garp_frame, PacketSender};
use super::core::{CoreConfig, Effect, Event, NodeCore, Serve};
use crate::health::HealthRegistry;

/// One XDP counter: (name, packets, bytes), summed over CPUs.
pub type CounterRow = (&'static str, u64, u64);

/// A failed data-plane or interface operation.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DataPlaneError(pub String);

/// The XDP side as the shell drives it (implemented over `yard_ebpf::Gateway`).
pub trait DataPlane: Send + 'static {
    /// The data plane's clock (CLOCK_MONOTONIC) in ms: lease deadlines are written in it.
    fn now_ms(&self) -> u64;
    fn set_lease(&mut self, deadline_ms: u64) -> Result<(), DataPlaneError>;
    fn put_vip(&mut self, vip: Ipv4Addr, serve: Serve) -> Result<(), DataPlaneError>;
    fn remove_vip(&mut self, vip: Ipv4Addr) -> Result<(), DataPlaneError>;
    fn put_endpoint(&mut self, ep: &Endpoint) -> Result<(), DataPlaneError>;
    fn remove_endpoint(&mut self, key: &EndpointKey) -> Result<(), DataPlaneError>;
    /// Accept tunnel frames for `vni` from the outer source `source`.
    fn put_source(&mut self, vni: u32, source: Ipv4Addr) -> Result<(), DataPlaneError>;
    fn remove_source(&mut self, vni: u32, source: Ipv4Addr) -> Result<(), DataPlaneError>;
    fn put_host(&mut self, host: Ipv4Addr, mac: [u8; 6]) -> Result<(), DataPlaneError>;
    fn remove_host(&mut self, host: Ipv4Addr) -> Result<(), DataPlaneError>;
    fn counters(&self) -> Result<Vec<CounterRow>, DataPlaneError>;
    /// What a previous daemon left programmed: VIPs, the lease deadline (ms), endpoints and
    /// sources.
    fn adopted(&self) -> Result<Adopted, DataPlaneError>;
    /// Where the forwarding function runs, in one sentence for the actor's health (the
    /// `[gateway] offload` outcome); empty when there is nothing to say.
    fn placement(&self) -> String {
        String::new()
    }
}

/// The interface the VIPs live on.
pub trait Interface: Send + 'static {
    fn mac(&self) -> [u8; 6];
    fn add_address(&mut self, vip: Ipv4Addr) -> Result<(), DataPlaneError>;
    fn remove_address(&mut self, vip: Ipv4Addr) -> Result<(), DataPlaneError>;
    /// The /32 VIP addresses currently on the interface (adopted on restart).
    fn addresses(&self) -> Result<Vec<Ipv4Addr>, DataPlaneError>;
    fn send_frame(&mut self, frame: &[u8]) -> Result<(), DataPlaneError>;
    fn resolve(&mut self, hosts: &[Ipv4Addr]) -> BTreeMap<Ipv4Addr, [u8; 6]>;
}

/// What a restarted daemon finds in the pinned maps.
#[derive(Debug, Clone, Default)]
pub struct Adopted {
    pub vips: Vec<(Ipv4Addr, Serve)>,
    pub deadline_ms: u64,
    pub endpoints: Vec<Endpoint>,
    /// The (VNI, outer source) pairs tunnel frames are accepted from.
    pub sources: Vec<(u32, Ipv4Addr)>,
}

/// Renewal rounds in flight at most (each ends within a lease).
const MAX_ROUNDS: u32 = 8;

/// A lease grant: (granted ms, the highest applied revision among the granters).
pub type Grant = (u64, u64);

/// A renewal in flight.
pub type RenewFuture = Pin<Box<dyn Future<Output = Option<Grant>> + Send>>;

/// Sends lease renewal rounds to the voters on the node's runtime, reporting the applied
/// revision; a round's grant needs a majority (`super::lease::quorum_grant`).
pub trait Renewer: Send + Sync + 'static {
    /// The granted milliseconds and the granters' highest applied revision, or `None` (no
    /// majority granted in time).
    /// `lease_left_ms`: how long the data plane still serves on its current deadline (the
    /// leader ends a restart grace only once that is back to an ordinary lease).
    fn renew(&self, applied: u64, lease_left_ms: u64) -> RenewFuture;
    /// Asks for a restart grace of `grace_ms` (the leader commits it before granting).
    fn grace(&self, applied: u64, grace_ms: u64) -> RenewFuture;
}

/// Sent by the daemon before a planned stop: ask the leader for a restart grace and write it
/// into the data plane, so the VIPs stay answered (and unmoved) while no daemon runs. Answers
/// whether the grace was granted.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct PrepareRestart {
    pub grace_ms: u64,
}

/// What `yard gateway stats` and the metrics show, published by the shell.
#[derive(Debug, Clone, Default)]
pub struct GatewaySnapshot {
    pub node: NodeId,
    pub lease_remaining_ms: u64,
    pub fenced: bool,
    pub vips: Vec<(Ipv4Addr, Serve)>,
    /// Owned VIPs answered for and since when (data-plane clock, ms).
    pub owned_since: Vec<(Ipv4Addr, u64)>,
    /// The data-plane clock when this snapshot was taken.
    pub now_ms: u64,
    pub endpoints: usize,
    pub counters: Vec<CounterRow>,
    pub revision: u64,
    pub errors: u64,
}

/// Shared view of the snapshot (shell writes, status/metrics read).
#[derive(Debug, Clone, Default)]
pub struct GatewayView {
    inner: Arc<RwLock<GatewaySnapshot>>,
}

impl GatewayView {
    pub fn snapshot(&self) -> GatewaySnapshot {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the snapshot whole: for a data plane other than the actor's (a tool, a test of
    /// what status and metrics make of a snapshot).
    pub fn publish(&self, snapshot: GatewaySnapshot) {
        self.update(|s| *s = snapshot);
    }

    fn update(&self, f: impl FnOnce(&mut GatewaySnapshot)) {
        f(&mut self.inner.write().unwrap_or_else(|e| e.into_inner()));
    }
}

/// The shell's settings.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub node: NodeId,
    /// Renewal and tick period.
    pub renew_every: Duration,
    pub core: CoreConfig,
}

/// Work for the interface thread: everything that forks `ip`, reads `/proc` or writes a packet
/// socket, in the order the core asked for it.
enum IfaceOp {
    Add(Ipv4Addr),
    Remove(Ipv4Addr),
    Announce {
        vip: Ipv4Addr,
        repeat: u32,
    },
    /// Look up the hosts gathered in [`IfaceQueue::resolve`].
    Resolve,
}

/// What the interface thread reports back to the actor.
#[derive(Debug, Message)]
#[rtype(result = "()")]
enum IfaceReport {
    Resolved { host: Ipv4Addr, mac: [u8; 6] },
    Failed(String),
}

/// The shell's end of the interface thread.
struct IfaceQueue {
    ops: mpsc::Sender<IfaceOp>,
    /// Hosts to look up at the next [`IfaceOp::Resolve`]: lookups asked for while one is queued
    /// merge into it, so a slow interface thread never accumulates a backlog of them.
    resolve: Arc<Mutex<BTreeSet<Ipv4Addr>>>,
}

/// Before the actor starts the interface is held here; once started, a dedicated thread owns
/// it. Fork/exec of `ip` and `/proc/net/arp` reads take milliseconds to hundreds of them on a
/// loaded machine, and the arbiter they would block is shared with liveness and admin.
enum IfaceSlot {
    Idle(Box<dyn Interface>),
    Running(IfaceQueue),
    Gone,
}

/// The interface thread: executes ops in order until the actor drops its sender.
fn iface_thread(
    mut iface: Box<dyn Interface>,
    ops: mpsc::Receiver<IfaceOp>,
    resolve: Arc<Mutex<BTreeSet<Ipv4Addr>>>,
    reports: Recipient<IfaceReport>,
) {
    let mac = iface.mac();
    let fail = |e: DataPlaneError| reports.do_send(IfaceReport::Failed(e.0));
    while let Ok(op) = ops.recv() {
        match op {
            IfaceOp::Add(vip) => iface.add_address(vip).unwrap_or_else(fail),
            IfaceOp::Remove(vip) => iface.remove_address(vip).unwrap_or_else(fail),
            IfaceOp::Announce { vip, repeat } => {
                let sent = iface
                    .send_frame(&garp_frame(mac, vip, false))
                    .and_then(|()| iface.send_frame(&garp_frame(mac, vip, true)));
                match sent {
                    Ok(()) => tracing::info!(%vip, repeat, "gateway announced"),
                    Err(e) => fail(e),
                }
            }
            IfaceOp::Resolve => {
                let hosts: Vec<Ipv4Addr> =
                    std::mem::take(&mut *resolve.lock().unwrap_or_else(|e| e.into_inner()))
                        .into_iter()
                        .collect();
                if hosts.is_empty() {
                    continue;
                }
                for (host, mac) in iface.resolve(&hosts) {
                    reports.do_send(IfaceReport::Resolved { host, mac });
                }
            }
        }
    }
}

pub struct GatewayActor {
    core: NodeCore,
    settings: GatewaySettings,
    dataplane: Box<dyn DataPlane>,
    iface: IfaceSlot,
    renewer: Arc<dyn Renewer>,
    feed: ChangeFeed,
    view: GatewayView,
    health: HealthRegistry,
    /// The change-feed stream: exactly one at a time. A resync cancels it before subscribing
    /// again (it used to add a stream per resync, doubling the subscriptions each time).
    stream: Option<SpawnHandle>,
    /// Renewal rounds in flight. Rounds overlap: one waiting on a slow voter must not delay
    /// the next renewal to the others (the leader counts a node lapsed after a lease without
    /// a renewal at its own voter).
    renewing: u32,
    /// The send time of the latest grant taken: an older round answering after a newer one
    /// is ignored (it would shorten the deadline).
    taken_sent_ms: u64,
    /// Whether the tables are followed yet: only once they are as new as the leader's (first
    /// grant), so a restarted daemon never acts on a store still replaying its log — until
    /// then the pinned maps keep forwarding with what they hold.
    synced: bool,
    /// A planned stop asked for a restart grace: no more ordinary renewals.
    restarting: bool,
    ticks: u64,
    errors: u64,
}

impl GatewayActor {
    pub fn new(
        settings: GatewaySettings,
        dataplane: Box<dyn DataPlane>,
        iface: Box<dyn Interface>,
        renewer: Arc<dyn Renewer>,
        feed: ChangeFeed,
        view: GatewayView,
        health: HealthRegistry,
    ) -> Self {
        let mut core = NodeCore::new(settings.node, settings.core.clone());
        match (dataplane.adopted(), iface.addresses()) {
            (Ok(adopted), Ok(addrs)) => {
                let Adopted {
                    vips,
                    deadline_ms: deadline,
                    endpoints,
                    sources,
                } = adopted;
                if !vips.is_empty() || !endpoints.is_empty() {
                    tracing::info!(
                        vips = vips.len(),
                        endpoints = endpoints.len(),
                        "gateway adopting pinned state"
                    );
                }
                // Only addresses of VIPs the maps hold are ours: another /32 on the interface
                // belongs to someone else and is never touched.
                let addrs: Vec<Ipv4Addr> = addrs
                    .into_iter()
                    .filter(|a| vips.iter().any(|(v, _)| v == a))
                    .collect();
                core.adopt(vips, addrs, deadline, endpoints, sources);
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "gateway cannot read the pinned state; starting clean")
            }
        }
        Self {
            core,
            settings,
            dataplane,
            iface: IfaceSlot::Idle(iface),
            renewer,
            feed,
            view,
            health,
            stream: None,
            renewing: 0,
            taken_sent_ms: 0,
            synced: false,
            restarting: false,
            ticks: 0,
            errors: 0,
        }
    }

    fn subscribe(&mut self, ctx: &mut Context<Self>) {
        if let Some(old) = self.stream.take() {
            ctx.cancel_future(old);
        }
        let (data, rx) = self.feed.subscribe();
        let now_ms = self.dataplane.now_ms();
        let revision = data.gateway.revision;
        self.run(
            Event::Reset {
                tables: Box::new(data.gateway),
                revision,
                now_ms,
            },
            ctx,
        );
        self.stream = Some(
            ctx.add_stream(futures::stream::unfold(rx, |mut rx| async move {
                let item = rx.recv().await;
                match item {
                    Err(RecvError::Closed) => None,
                    other => Some((other, rx)),
                }
            })),
        );
    }

    /// Queues `op` for the interface thread (never blocks).
    fn queue_iface(&self, op: IfaceOp) -> Result<(), DataPlaneError> {
        match &self.iface {
            IfaceSlot::Running(q) => q
                .ops
                .send(op)
                .map_err(|_| DataPlaneError("the interface thread has stopped".into())),
            _ => Err(DataPlaneError("the interface thread is not running".into())),
        }
    }

    /// Hands the interface to its own thread; reports come back as messages.
    fn start_iface(&mut self, ctx: &mut Context<Self>) {
        let IfaceSlot::Idle(iface) = std::mem::replace(&mut self.iface, IfaceSlot::Gone) else {
            return;
        };
        let (tx, rx) = mpsc::channel();
        let resolve = Arc::new(Mutex::new(BTreeSet::new()));
        let (r, reports) = (resolve.clone(), ctx.address().recipient());
        match std::thread::Builder::new()
            .name("yard-gw-iface".into())
            .spawn(move || iface_thread(iface, rx, r, reports))
        {
            Ok(_) => self.iface = IfaceSlot::Running(IfaceQueue { ops: tx, resolve }),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the gateway interface thread");
                self.errors += 1;
            }
        }
    }

    fn run(&mut self, event: Event, _ctx: &mut Context<Self>) {
        for effect in self.core.handle(event) {
            if let Err(e) = self.execute(effect) {
                self.errors += 1;
                tracing::warn!(error = %e, "gateway effect failed");
            }
        }
    }

    fn execute(&mut self, effect: Effect) -> Result<(), DataPlaneError> {
        match effect {
            Effect::SetLease { deadline_ms } => self.dataplane.set_lease(deadline_ms),
            Effect::PutVip { vip, serve } => self.dataplane.put_vip(vip, serve),
            Effect::RemoveVip { vip } => self.dataplane.remove_vip(vip),
            Effect::AddAddress { vip } => self.queue_iface(IfaceOp::Add(vip)),
            Effect::RemoveAddress { vip } => self.queue_iface(IfaceOp::Remove(vip)),
            Effect::Announce { vip, repeat } => self.queue_iface(IfaceOp::Announce { vip, repeat }),
            Effect::Taken { vip, revision } => {
                let now_ms = self.dataplane.now_ms();
                tracing::info!(%vip, revision, now_ms, "gateway vip taken");
                Ok(())
            }
            Effect::PutEndpoint(ep) => self.dataplane.put_endpoint(&ep),
            Effect::RemoveEndpoint(key) => self.dataplane.remove_endpoint(&key),
            Effect::PutSource { vni, source } => self.dataplane.put_source(vni, source),
            Effect::RemoveSource { vni, source } => self.dataplane.remove_source(vni, source),
            Effect::Resolve(hosts) => {
                let IfaceSlot::Running(q) = &self.iface else {
                    return Err(DataPlaneError("the interface thread is not running".into()));
                };
                let mut pending = q.resolve.lock().unwrap_or_else(|e| e.into_inner());
                let queued = !pending.is_empty();
                pending.extend(hosts);
                drop(pending);
                if queued {
                    Ok(())
                } else {
                    self.queue_iface(IfaceOp::Resolve)
                }
            }
            Effect::PutHost { host, mac } => self.dataplane.put_host(host, mac),
            Effect::RemoveHost { host } => self.dataplane.remove_host(host),
            Effect::Fenced(true) => {
                let (deadline_ms, now_ms) = (self.core.deadline_ms(), self.dataplane.now_ms());
                tracing::warn!(
                    deadline_ms,
                    now_ms,
                    "gateway fenced: the lease lapsed, no vip is answered for"
                );
                Ok(())
            }
            Effect::Fenced(false) => {
                tracing::info!("gateway lease held");
                Ok(())
            }
        }
    }

    /// A lease grant for a request sent at `sent_ms` reaches the core.
    fn take_grant(
        &mut self,
        sent_ms: u64,
        (granted_ms, leader_revision): Grant,
        ctx: &mut Context<Self>,
    ) {
        let now_ms = self.dataplane.now_ms();
        self.run(
            Event::Granted {
                sent_ms,
                granted_ms,
                leader_revision,
                now_ms,
            },
            ctx,
        );
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        self.ticks += 1;
        let now_ms = self.dataplane.now_ms();
        if self.renewing < MAX_ROUNDS && !self.restarting {
            self.renewing += 1;
            let sent_ms = now_ms;
            let left = self.core.deadline_ms().saturating_sub(now_ms);
            let applied = super::core::reported_revision(
                self.synced,
                left == 0,
                self.core.revision(),
                self.feed.read(|d| d.gateway.revision),
            );
            let fut = self.renewer.renew(applied, left);
            ctx.spawn(fut.into_actor(self).map(move |granted, act, ctx| {
                act.renewing -= 1;
                if act.restarting || sent_ms < act.taken_sent_ms {
                    return;
                }
                if let Some((granted_ms, leader_revision)) = granted {
                    if !act.synced {
                        if act.feed.read(|d| d.gateway.revision) < leader_revision {
                            return;
                        }
                        act.synced = true;
                        tracing::info!(revision = leader_revision, "gateway following the tables");
                        act.subscribe(ctx);
                    }
                    act.taken_sent_ms = sent_ms;
                    act.take_grant(sent_ms, (granted_ms, leader_revision), ctx);
                }
            }));
        }
        if self.synced {
            self.run(Event::Tick { now_ms }, ctx);
        }
        self.publish(now_ms);
    }

    fn publish(&mut self, now_ms: u64) {
        let counters = if self.ticks % 10 == 1 {
            self.dataplane.counters().ok()
        } else {
            None
        };
        let deadline = self.core.deadline_ms();
        let serving: Vec<(Ipv4Addr, Serve)> =
            self.core.serving().iter().map(|(v, s)| (*v, *s)).collect();
        let owned_since: Vec<(Ipv4Addr, u64)> = self
            .core
            .owned_since()
            .iter()
            .map(|(v, t)| (*v, *t))
            .collect();
        let (endpoints, revision, errors, node) = (
            self.core.endpoint_count(),
            self.core.revision(),
            self.errors,
            self.settings.node,
        );
        self.view.update(|s| {
            s.node = node;
            s.lease_remaining_ms = deadline.saturating_sub(now_ms);
            s.fenced = now_ms >= deadline;
            s.vips = serving;
            s.owned_since = owned_since;
            s.now_ms = now_ms;
            s.endpoints = endpoints;
            s.revision = revision;
            s.errors = errors;
            if let Some(c) = counters {
                s.counters = c;
            }
        });
        let owned = self
            .core
            .serving()
            .values()
            .filter(|s| **s == Serve::Owned)
            .count();
        let lease_ok = now_ms < deadline;
        self.health.report("gateway", lease_ok, {
            let state = if lease_ok {
                format!("lease held, {owned} vips owned, {endpoints} endpoints")
            } else {
                "lease lapsed: serving nothing".to_owned()
            };
            match self.dataplane.placement() {
                p if p.is_empty() => state,
                p => format!("{state}; {p}"),
            }
        });
    }
}

impl Handler<PrepareRestart> for GatewayActor {
    type Result = ResponseActFuture<Self, bool>;

    fn handle(&mut self, msg: PrepareRestart, _: &mut Context<Self>) -> Self::Result {
        // No ordinary renewal from now on: a late one must not cut the grace short.
        self.restarting = true;
        let sent_ms = self.dataplane.now_ms();
        let fut = self.renewer.grace(self.core.revision(), msg.grace_ms);
        Box::pin(fut.into_actor(self).map(move |granted, act, ctx| {
            let Some((granted_ms, leader_revision)) = granted else {
                tracing::warn!("gateway restart grace refused; the vips will move if the restart outlasts the lease");
                return false;
            };
            act.taken_sent_ms = act.taken_sent_ms.max(sent_ms);
            act.take_grant(sent_ms, (granted_ms, leader_revision), ctx);
            tracing::info!(granted_ms, "gateway keeps its vips through the restart");
            true
        }))
    }
}

impl Handler<IfaceReport> for GatewayActor {
    type Result = ();

    fn handle(&mut self, report: IfaceReport, ctx: &mut Context<Self>) {
        match report {
            IfaceReport::Resolved { host, mac } => self.run(Event::HostResolved { host, mac }, ctx),
            IfaceReport::Failed(e) => {
                self.errors += 1;
                tracing::warn!(error = %e, "gateway interface operation failed");
            }
        }
    }
}

impl StreamHandler<Result<Change, RecvError>> for GatewayActor {
    fn handle(&mut self, item: Result<Change, RecvError>, ctx: &mut Context<Self>) {
        let now_ms = self.dataplane.now_ms();
        match item {
            Ok(Change::Gateway { revision, changes }) => {
                for change in changes.iter() {
                    self.run(
                        Event::Changed {
                            revision,
                            change: change.clone(),
                            now_ms,
                        },
                        ctx,
                    );
                }
            }
            Ok(Change::Reset { .. }) | Err(RecvError::Lagged(_)) => {
                tracing::info!("gateway resyncing from the tables");
                self.subscribe(ctx);
            }
            Ok(_) | Err(RecvError::Closed) => {}
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Actor for GatewayActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.health.report("gateway", false, "starting");
        self.start_iface(ctx);
        ctx.run_interval(self.settings.renew_every, |act, ctx| act.tick(ctx));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.health.report("gateway", false, "stopped");
    }
}

impl Supervised for GatewayActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        tracing::warn!("gateway actor restarting");
    }
}

/// The interface over Linux: addresses through `ip`, frames through a packet socket, MACs from
/// sysfs and the neighbour table.
pub struct LinuxInterface {
    name: String,
    mac: [u8; 6],
    sender: PacketSender,
}

impl LinuxInterface {
    pub fn open(name: &str) -> Result<Self, DataPlaneError> {
        let sys = |f: &str| {
            std::fs::read_to_string(format!("/sys/class/net/{name}/{f}"))
                .map(|s| s.trim().to_owned())
                .map_err(|e| DataPlaneError(format!("cannot read {f} of interface {name}: {e}")))
        };
        let mac = crate::neigh::parse_mac(&sys("address")?)
            .ok_or_else(|| DataPlaneError(format!("interface {name} has no ethernet address")))?;
        let ifindex: u32 = sys("ifindex")?
            .parse()
            .map_err(|_| DataPlaneError(format!("interface {name} has a bad ifindex")))?;
        let sender = PacketSender::open(ifindex)
            .map_err(|e| DataPlaneError(format!("cannot open a packet socket on {name}: {e}")))?;
        // The XDP program hands a frame for a compute host it has no MAC for to the stack,
        // addressed to this interface's MAC and sourced from the VIP: the kernel must forward
        // it (resolving the host on the way) and accept a local source address on it. Only
        // this interface's settings change, and only once nftables confines them to that
        // (`kernel_path`): otherwise the node would route anything the fabric sends it.
        match super::kernel_path::confine(name) {
            Ok(()) => {
                for (key, value) in [("forwarding", "1"), ("accept_local", "1")] {
                    let path = format!("/proc/sys/net/ipv4/conf/{name}/{key}");
                    if let Err(e) = std::fs::write(&path, value) {
                        tracing::warn!(path, error = %e, "cannot enable the kernel path for unresolved hosts: their first frames will be lost");
                    }
                }
            }
            Err(e) => tracing::warn!(
                interface = name,
                error = %e,
                "the kernel path for unresolved hosts stays off (forwarding and accept_local are not enabled without the nftables table that confines them): their first frames will be lost"
            ),
        }
        Ok(Self {
            name: name.to_owned(),
            mac,
            sender,
        })
    }

    fn ip(&self, args: &[&str]) -> Result<String, DataPlaneError> {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| DataPlaneError(format!("cannot run ip: {e}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(DataPlaneError(format!(
                "ip {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }
}

impl Interface for LinuxInterface {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn add_address(&mut self, vip: Ipv4Addr) -> Result<(), DataPlaneError> {
        // `replace` is idempotent: an address left by a previous daemon is not an error.
        self.ip(&["addr", "replace", &format!("{vip}/32"), "dev", &self.name])
            .map(drop)
    }

    fn remove_address(&mut self, vip: Ipv4Addr) -> Result<(), DataPlaneError> {
        match self.ip(&["addr", "del", &format!("{vip}/32"), "dev", &self.name]) {
            Ok(_) => Ok(()),
            Err(e) if e.0.contains("Cannot assign") => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn addresses(&self) -> Result<Vec<Ipv4Addr>, DataPlaneError> {
        let out = self.ip(&["-o", "-4", "addr", "show", "dev", &self.name])?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace().skip_while(|w| *w != "inet").skip(1);
                it.next()?.strip_suffix("/32")?.parse().ok()
            })
            .collect())
    }

    fn send_frame(&mut self, frame: &[u8]) -> Result<(), DataPlaneError> {
        self.sender
            .send(frame)
            .map_err(|e| DataPlaneError(format!("cannot send on {}: {e}", self.name)))
    }

    fn resolve(&mut self, hosts: &[Ipv4Addr]) -> BTreeMap<Ipv4Addr, [u8; 6]> {
        crate::neigh::resolve(hosts, &self.name)
    }
}

#[cfg(test)]
#[path = "actor_tests.rs"]
mod tests;
