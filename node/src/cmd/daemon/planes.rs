//! The data planes a node opens before its actors start: the aggregator's XDP program and its
//! services, the gateway's XDP program, and the probe's socket and per-peer counters. Each
//! `open_*` returns what its actor needs, or `None` when the plane is disabled here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use yard::config::{Config, Offload, XdpMode};
use yard::service::Node;
use yard::transport::Transport;
use yard_actors::gateway::actor::DataPlane as _;
use yard_actors::gateway::actor::{
    GatewaySettings, GatewayView, Interface, LinuxInterface, Renewer,
};
use yard_actors::gateway::core::CoreConfig;
use yard_actors::gateway::dataplane::{Offload as DataPlaneOffload, XdpDataPlane};
use yard_actors::probe::actor::{PeerCounterSource, Reporter};
use yard_actors::probe::socket::{NodeIdentity, SharedProbe};

use super::adapters::{EbpfPeerCounters, LeaseRenewer, ProbeReporter};

/// The aggregator's program and what its actor reports through.
pub struct AggregatorPlane {
    pub program: yard_ebpf::Aggregator,
    pub view: yard_actors::aggregator::actor::AggView,
    pub stats_every: Duration,
    pub interface: String,
}

/// The gateway's program, interface and lease renewer.
pub struct GatewayPlane {
    pub settings: GatewaySettings,
    pub dataplane: XdpDataPlane,
    pub interface: LinuxInterface,
    pub renewer: Arc<dyn Renewer>,
    pub view: GatewayView,
}

/// The probe's shared buffer, its reporter and its per-peer counters.
pub struct ProbePlane {
    pub shared: SharedProbe,
    pub reporter: Arc<dyn Reporter>,
    pub counters: Option<Box<dyn PeerCounterSource>>,
    pub report_every: Duration,
}

/// What every node runs for aggregation, aggregating or not: the local agent socket workers
/// join through, the leader's placement loop, and bandwidth measurement (probes to the
/// aggregating hosts; a sink where this host aggregates).
pub async fn start_aggregation_services(cfg: &Config, node: &Node) -> anyhow::Result<()> {
    {
        let path = cfg.agg_socket();
        let access = cfg.agg_socket_access()?;
        let policy = yard::agg_agent::AgentPolicy::for_daemon(&access)
            .context("cannot read this process's credentials for the aggregation agent")?;
        let listener = yard::agg_agent::bind(&path, access)
            .with_context(|| format!("cannot listen on aggregator.socket {}", path.display()))?;
        tokio::spawn(yard::agg_agent::serve(listener, node.clone(), policy));
    }
    tokio::spawn(yard::agg_control::run(
        node.clone(),
        Duration::from_millis(cfg.aggregator.place_ms),
        Duration::from_millis(cfg.aggregator.worker_gone_ms),
    ));
    if let Ok(my_ip) = cfg.advertise_ip().parse::<std::net::Ipv4Addr>() {
        let settings = yard::agg_bandwidth::Settings {
            me: cfg.node.id,
            my_ip,
            port: cfg.aggregator.probe_port,
            bytes: cfg.aggregator.probe_bytes,
            every: Duration::from_millis(cfg.aggregator.probe_every_ms),
        };
        tokio::spawn(yard::agg_bandwidth::run(node.clone(), settings));
    }
    if cfg.aggregator.enabled {
        // On the node's own address only (the one it registers as an aggregating host, where
        // the probes come); it times only probes that open with a ticket this node gave a host.
        let ip: std::net::IpAddr = cfg.advertise_ip().parse().with_context(|| {
            format!(
                "the bandwidth sink needs node.advertise to be an IP address, not {}",
                cfg.advertise()
            )
        })?;
        let at = std::net::SocketAddr::new(ip, cfg.aggregator.probe_port);
        let sink = tokio::net::TcpListener::bind(at)
            .await
            .with_context(|| format!("cannot listen on aggregator.probe_port {at}"))?;
        tokio::spawn(yard::agg_bandwidth::serve_sink(
            sink,
            yard::agg_bandwidth::SinkLimits::default(),
            node.sink_tickets(),
        ));
    }
    Ok(())
}

/// Loads and attaches the aggregator's XDP program and registers this host as an aggregator;
/// with the aggregator disabled, takes this host out of the aggregating hosts whenever the
/// tables list it.
pub fn open_aggregator(cfg: &Config, node: &Node) -> anyhow::Result<Option<AggregatorPlane>> {
    if !cfg.aggregator.enabled {
        tokio::spawn(yard::agg_control::deregister_while_disabled(node.clone()));
        return Ok(None);
    }
    let a = &cfg.aggregator;
    let ip: std::net::Ipv4Addr = cfg.advertise_ip().parse().with_context(|| {
        format!(
            "the aggregator needs an IPv4 advertise address, not {}",
            cfg.advertise()
        )
    })?;
    let mut program = yard_ebpf::Aggregator::load(a.slots()).with_context(|| {
        format!(
            "cannot load the aggregator with {} MiB (aggregator.memory_mb)",
            a.memory_mb
        )
    })?;
    let mode = match a.xdp_mode {
        XdpMode::Native => yard_ebpf::XdpMode::Native,
        XdpMode::Generic => yard_ebpf::XdpMode::Generic,
    };
    program.attach(&a.interface, mode).with_context(|| {
        format!(
            "cannot attach the aggregator to aggregator.interface {}",
            a.interface
        )
    })?;
    tracing::info!(interface = %a.interface, slots = a.slots(), "aggregator data plane ready");
    let view = yard_actors::aggregator::actor::AggView::default();
    node.attach_aggregator(view.clone());
    tokio::spawn(register_aggregator(
        node.clone(),
        ip,
        a.slots(),
        a.cpu_millis(),
    ));
    Ok(Some(AggregatorPlane {
        program,
        view,
        stats_every: Duration::from_millis(a.stats_ms),
        interface: a.interface.clone(),
    }))
}

/// Loads (or adopts) the gateway's XDP program and builds its lease renewer.
pub fn open_gateway(
    cfg: &Config,
    node: &Node,
    transport: &Arc<dyn Transport>,
    rpc_timeout: Duration,
) -> anyhow::Result<Option<GatewayPlane>> {
    if !cfg.gateway.enabled {
        return Ok(None);
    }
    let g = &cfg.gateway;
    let iface = LinuxInterface::open(&g.interface)
        .with_context(|| format!("gateway.interface {} is not usable", g.interface))?;
    let mode = match g.xdp_mode {
        XdpMode::Native => yard_ebpf::XdpMode::Native,
        XdpMode::Generic => yard_ebpf::XdpMode::Generic,
    };
    let offload = match (g.offload, &g.offload_wire, &g.offload_port) {
        (Offload::None, _, _) => DataPlaneOffload::None,
        (Offload::Auto, _, _) => DataPlaneOffload::Auto,
        (Offload::Emulated, Some(wire), Some(port)) => DataPlaneOffload::Emulated {
            wire: wire.clone(),
            port: port.clone(),
        },
        (Offload::Emulated, _, _) => {
            bail!("gateway.offload_wire and gateway.offload_port must be set")
        }
    };
    let (dataplane, adopted) =
        XdpDataPlane::open(&g.pin_dir, &g.interface, mode, iface.mac(), g.mtu, &offload)
            .with_context(|| {
                format!(
                    "cannot load the gateway program on {} (pinned under {})",
                    g.interface,
                    g.pin_dir.display()
                )
            })?;
    let placement = dataplane.placement();
    if g.offload == Offload::Auto {
        // The one sentence the issue asks for: why hardware mode is not running.
        tracing::warn!(interface = %g.interface, reason = %placement, "gateway offload refused");
    }
    tracing::info!(interface = %g.interface, adopted, pin_dir = %g.pin_dir.display(), offload = ?g.offload, placement = %placement, "gateway data plane ready");
    if cfg.planner.enabled {
        // Sampled from the pinned counters, off the gateway actor's thread.
        tokio::spawn(yard::planner_report::report_rates(
            node.clone(),
            g.pin_dir.clone(),
            Duration::from_millis(cfg.planner.report_ms),
            cfg.planner.smoothing,
        ));
    }
    let view = GatewayView::default();
    node.attach_gateway(view.clone());
    let settings = GatewaySettings {
        node: cfg.node.id,
        renew_every: Duration::from_millis(cfg.liveness.interval_ms),
        core: CoreConfig {
            linger_ms: g.linger_ms,
            garp_repeats: g.garp_repeats,
            garp_interval_ms: g.garp_interval_ms,
            ..CoreConfig::default()
        },
    };
    let renewer: Arc<dyn Renewer> = Arc::new(LeaseRenewer {
        node: node.clone(),
        transport: transport.clone(),
        timeout: Duration::from_millis(cfg.liveness.lease_ms),
        // A call stuck on a dead voter's connection blocks renewals to its successor
        // (one call per voter at a time): bounded at 4 leases, within the new leader's
        // patience for nodes it never heard (`leader::UNHEARD_LEASES`).
        call_timeout: Duration::from_millis(4 * cfg.liveness.lease_ms).min(rpc_timeout),
        busy: Arc::default(),
        rt: tokio::runtime::Handle::current(),
    });
    Ok(Some(GatewayPlane {
        settings,
        dataplane,
        interface: iface,
        renewer,
        view,
    }))
}

/// Binds the probe's socket, attaches its per-peer counters and builds its reporter.
pub fn open_probe(
    cfg: &Config,
    node: &Node,
    transport: &Arc<dyn Transport>,
    rpc_timeout: Duration,
) -> anyhow::Result<Option<ProbePlane>> {
    if !cfg.probe.enabled {
        return Ok(None);
    }
    let path = cfg.probe_socket();
    let access = cfg.probe_socket_access()?;
    let listener = yard_actors::probe::socket::bind(&path, access)
        .with_context(|| format!("cannot listen on probe.socket {}", path.display()))?;
    let shared = SharedProbe::new(cfg.probe.buffer_events);
    shared.lock().ports.extend(cfg.probe.ports.iter().copied());
    let identity = NodeIdentity {
        name: cfg.node.name.clone(),
        addr: cfg.advertise_ip(),
    };
    tokio::spawn(yard_actors::probe::socket::serve(
        listener,
        shared.clone(),
        identity,
    ));
    node.attach_probe(shared.clone());
    let counters: Option<Box<dyn PeerCounterSource>> = if cfg.probe.interface.is_empty() {
        None
    } else {
        Some(Box::new(
            EbpfPeerCounters::attach(&cfg.probe.interface).with_context(|| {
                format!(
                    "cannot attach the probe's per-peer counters to probe.interface {}",
                    cfg.probe.interface
                )
            })?,
        ))
    };
    let reporter: Arc<dyn Reporter> = Arc::new(ProbeReporter {
        node: node.clone(),
        transport: transport.clone(),
        timeout: rpc_timeout,
        rt: tokio::runtime::Handle::current(),
    });
    tracing::info!(
        socket = %path.display(),
        mode = format_args!("{:o}", access.mode),
        group = ?access.group,
        ebpf = counters.is_some(),
        "probe ready"
    );
    Ok(Some(ProbePlane {
        shared,
        reporter,
        counters,
        report_every: Duration::from_millis(cfg.probe.report_ms),
    }))
}

/// Registers this host as an aggregator with `slots` slots and its CPU budget, retrying until a leader commits it
/// (the node may still be joining).
async fn register_aggregator(
    node: yard::service::Node,
    ip: std::net::Ipv4Addr,
    slots: u32,
    cpu_millis: u32,
) {
    use yard::rpc::{AdminRequest, AggRequest, Reply};
    let req = AdminRequest::Agg(AggRequest::Host {
        node: node.id(),
        ip,
        slots,
        cpu_millis,
    });
    loop {
        match node.serve_admin(req.clone()).await {
            Reply::Admin(_) => {
                tracing::info!(%ip, slots, "registered as an aggregator");
                return;
            }
            other => {
                tracing::debug!(reply = ?other, "aggregator registration not committed yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
