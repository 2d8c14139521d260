//! The daemon's process wiring: configuration, logging, certificates, the QUIC endpoint, Raft,
//! the request handler, metrics, the actix actor system, bootstrap or join, and a graceful stop
//! on SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use anyhow::{bail, Context};
use yard::admin_actor::AdminActor;
use yard::alert::AlertHook;
use yard::client::AdminClient;
use yard::config::{Config, LogFormat, Offload, XdpMode};
use yard::diagnosis_control::{DiagnosisControl, DiagnosisSettings};
use yard::gateway_control::GatewayControl;
use yard::http::{Endpoints, NodeReadiness};
use yard::planner_control::PlannerSettings;
use yard::rpc::{RedeemRequest, Reply, Request};
use yard::service::{Node, NodeParts, RaftGauges};
use yard::tls::PeerRole;
use yard::tls::{self, CertAuthority, Identity, Trust};
use yard::transport::{self, Handler as _, Quic, QuicTransport, Target, Transport};
use yard_actors::gateway::actor::DataPlane as _;
use yard_actors::gateway::actor::{
    GatewayActor, GatewaySettings, GatewayView, Interface, LinuxInterface, PrepareRestart,
    RenewFuture, Renewer,
};
use yard_actors::gateway::core::CoreConfig;
use yard_actors::gateway::damping::DampingConfig;
use yard_actors::gateway::dataplane::{Offload as DataPlaneOffload, XdpDataPlane};
use yard_actors::gateway::lease::{quorum_grant, LeaseConfig};
use yard_actors::health::HealthRegistry;
use yard_actors::liveness::{LivenessActor, ProbeTarget, Prober, Reachability};
use yard_actors::probe::actor::{
    PeerCounterSource, PeerSample, ProbeActor, ReportFuture, Reporter,
};
use yard_actors::probe::core::JobBatch;
use yard_actors::probe::socket::{NodeIdentity, SharedProbe};
use yard_raft_store::NodeId;

pub struct StartArgs {
    pub config: Option<PathBuf>,
    pub bootstrap: bool,
    pub join: Option<String>,
    pub token: Option<String>,
    pub log_json: bool,
}

pub fn start(args: StartArgs) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    init_logging(&cfg, args.log_json)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.node.worker_threads)
        .enable_all()
        .thread_name("yard-rt")
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(run(cfg, args))
}

fn init_logging(cfg: &Config, json: bool) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("YARD_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cfg.log.level))
        .context("log.level is not a valid tracing filter")?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json || cfg.log.format == LogFormat::Json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

/// Makes sure this node has a certificate: present already, generated for the embedded
/// default, or obtained by redeeming a join token.
async fn ensure_certificates(cfg: &Config, args: &StartArgs, tls_dir: &Path) -> anyhow::Result<()> {
    let cert = tls_dir.join(format!("{}.crt", cfg.node.name));
    if cert.exists() {
        return Ok(());
    }
    let ip = cfg.node.listen.ip();
    if let (Some(token), Some(seed)) = (&args.token, &args.join) {
        let hash = token
            .rsplit('.')
            .next()
            .filter(|h| h.len() == 64)
            .context("join token is malformed; expected <id>.<secret>.<ca-hash>")?;
        let client_cfg =
            tls::client_config(&cfg.node.cluster, Trust::CaHash(hash.to_owned()), None)?;
        let client = AdminClient::with_config(
            std::slice::from_ref(seed),
            client_cfg,
            &cfg.node.cluster,
            Duration::from_secs(10),
        )?;
        let req = Request::RedeemToken(RedeemRequest {
            token: token.clone(),
            id: cfg.node.id,
            name: cfg.node.name.clone(),
            ips: vec![ip],
        });
        match client
            .call(req)
            .await
            .with_context(|| format!("cannot redeem the join token at {seed}"))?
        {
            Reply::Certificate { ca, cert } => {
                tls::write_ca_cert(tls_dir, &ca)?;
                tls::write_cert(tls_dir, &cfg.node.name, &cert)?;
                tracing::info!(dir = %tls_dir.display(), "obtained a node certificate with the join token");
                return Ok(());
            }
            Reply::Error(e) => bail!("join token refused: {e}"),
            other => bail!("unexpected reply to a token redemption: {other:?}"),
        }
    }
    if cfg.tls.dir.is_none() && args.join.is_none() {
        // The embedded default: a self-contained cluster with its own CA in the data dir.
        if !tls_dir.join("ca.key").exists() {
            tls::init_ca_dir(tls_dir, &cfg.node.cluster)?;
            tracing::info!(dir = %tls_dir.display(), "generated a cluster CA");
        }
        tls::issue_node_cert(
            tls_dir,
            &cfg.node.cluster,
            &cfg.node.name,
            cfg.node.id,
            &[ip],
        )?;
        return Ok(());
    }
    bail!(
        "no certificate {} for node {}: issue one with `yard ca issue` or join with --token",
        cert.display(),
        cfg.node.name
    )
}

async fn run(cfg: Config, args: StartArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cfg.node.data_dir).with_context(|| {
        format!(
            "cannot create node.data_dir {}",
            cfg.node.data_dir.display()
        )
    })?;
    let tls_dir = cfg.tls_dir();
    ensure_certificates(&cfg, &args, &tls_dir).await?;
    let identity = Identity::load(&tls_dir, &cfg.node.name)?;
    let ca = if tls_dir.join("ca.key").exists() {
        Some(Arc::new(CertAuthority::load(&tls_dir)?))
    } else {
        None
    };
    let cluster = cfg.node.cluster.clone();
    let server_cfg = tls::server_config(&identity)?;
    let client_cfg = tls::client_config(&cluster, Trust::Ca(identity.ca.clone()), Some(&identity))?;
    let endpoint = yard::transport::bind_node_endpoint(cfg.node.listen, &identity, server_cfg)
        .with_context(|| format!("cannot listen on node.listen {}", cfg.node.listen))?;
    let max_frame = cfg.transport.max_frame_bytes;
    let transport: Arc<dyn Transport> = Arc::new(Quic(QuicTransport::new(
        endpoint.clone(),
        client_cfg,
        cluster.clone(),
        max_frame,
    )));

    let (log, sm) = yard_raft_store::open(&cfg.node.data_dir.join("raft"))
        .context("cannot open the raft store")?;
    let feed = sm.feed();
    // An agent applies what its watch brings into the same store Raft would.
    let agent_store = sm.clone();
    let raft_cfg = Arc::new(cfg.raft.to_openraft(&cluster)?);
    let net = yard::raft_network::RaftNet {
        transport: transport.clone(),
        id: cfg.node.id,
        retry_after: Duration::from_millis(cfg.raft.heartbeat_ms),
    };
    let raft = yard_raft_store::Raft::new(cfg.node.id, raft_cfg, net, log, sm)
        .await
        .context("cannot start raft")?;

    let health = HealthRegistry::default();
    let reachability = Reachability::default();
    let rpc_timeout = Duration::from_millis(cfg.transport.rpc_timeout_ms);
    let renew_every = Duration::from_millis(cfg.liveness.interval_ms);
    let mut control = GatewayControl::new(
        LeaseConfig {
            lease_ms: cfg.liveness.lease_ms,
            margin_ms: cfg.liveness.lease_margin_ms,
        },
        renew_every,
        cfg.gateway.leader_holds_vips,
    )
    .with_damping(DampingConfig {
        holddown_ms: cfg.gateway.holddown_ms,
        max_holddown_ms: cfg.gateway.holddown_max_ms,
        half_life_ms: cfg.gateway.holddown_half_life_ms,
    })
    .with_state_file(cfg.node.data_dir.join("gateway-revocations.json"))
    .map_err(anyhow::Error::msg)?;
    if cfg.planner.enabled {
        control = control.with_planner(PlannerSettings::from_config(&cfg.planner));
    }
    let gateway_control = Arc::new(control);
    let diagnosis_control = Arc::new(DiagnosisControl::new(DiagnosisSettings {
        analyzer: cfg.analyzer.to_core(),
        evaluate_every: Duration::from_millis(cfg.analyzer.evaluate_ms),
        job_idle: Duration::from_millis(cfg.analyzer.job_idle_ms),
        hook: AlertHook {
            command: cfg.analyzer.alert_command.clone(),
            webhook: webhook_client(&cfg)?,
        },
    }));
    let node = Node::new(NodeParts {
        id: cfg.node.id,
        name: cfg.node.name.clone(),
        cluster: cluster.clone(),
        addr: cfg.advertise(),
        raft: raft.clone(),
        feed,
        transport: transport.clone(),
        ca,
        ca_hash: tls::ca_hash(&identity.ca),
        rpc_timeout,
        // Long enough for one forward to time out on a dead leader and one more attempt after
        // an election.
        leader_wait: rpc_timeout + Duration::from_millis(cfg.raft.election_timeout_max_ms * 8),
        health: health.clone(),
        reachability: reachability.clone(),
        gateway: gateway_control.clone(),
        diagnosis: diagnosis_control.clone(),
        zone: cfg.node.zone.clone(),
        roles: cfg.raft.roles(),
        host_liveness: cfg.liveness.hosts(),
    });
    {
        let (raft, feed) = (raft.clone(), node.feed().clone());
        tokio::spawn(diagnosis_control.run(raft, feed));
    }
    let control = {
        let node = node.clone();
        tokio::spawn(async move { gateway_control.run(node).await })
    };
    let prevote = tokio::spawn(yard::prevote::run(node.clone()));
    let autopilot = tokio::spawn(yard::roles::autopilot::run(node.clone()));
    let host_reports = tokio::spawn(yard::roles::liveness::report(node.clone()));
    let host_judge = tokio::spawn(yard::roles::liveness::judge(node.clone()));
    node.set_agg_quota(cfg.aggregator.quota());
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
        let at = std::net::SocketAddr::from(([0, 0, 0, 0], cfg.aggregator.probe_port));
        let sink = tokio::net::TcpListener::bind(at)
            .await
            .with_context(|| format!("cannot listen on aggregator.probe_port {at}"))?;
        tokio::spawn(yard::agg_bandwidth::serve_sink(sink));
    }
    let aggregator = if cfg.aggregator.enabled {
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
        Some((
            program,
            view,
            Duration::from_millis(a.stats_ms),
            a.interface.clone(),
        ))
    } else {
        tokio::spawn(yard::agg_control::deregister_while_disabled(node.clone()));
        None
    };
    let gateway = if cfg.gateway.enabled {
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
            tokio::spawn(yard::planner_control::report_rates(
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
            renew_every,
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
        Some((settings, dataplane, iface, renewer, view))
    } else {
        None
    };
    let probe = if cfg.probe.enabled {
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
        Some((
            shared,
            reporter,
            counters,
            Duration::from_millis(cfg.probe.report_ms),
        ))
    } else {
        None
    };
    let probe_addr = cfg.advertise_ip();
    let server = tokio::spawn(transport::serve(
        endpoint.clone(),
        Arc::new(node.clone()),
        cluster.clone(),
        max_frame,
    ));
    if let Some(addr) = cfg.metrics.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on metrics.listen {addr}"))?;
        // Each actor this process starts must have reported before the node counts as ready.
        let mut expected_actors = vec!["admin", "liveness"];
        if cfg.gateway.enabled {
            expected_actors.push("gateway");
        }
        if cfg.probe.enabled {
            expected_actors.push("probe");
        }
        if cfg.aggregator.enabled {
            expected_actors.push("aggregator");
        }
        let endpoints = Endpoints {
            gauges: Arc::new(RaftGauges(node.clone())),
            readiness: Arc::new(NodeReadiness {
                node: node.clone(),
                expected_actors,
            }),
        };
        tokio::spawn(async move {
            if let Err(e) = yard::http::serve(listener, endpoints).await {
                tracing::error!(error = %e, %addr, "the metrics port stopped serving");
            }
        });
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    tracing::info!(id = cfg.node.id, listen = %cfg.node.listen, advertise = %cfg.advertise(), "node started");

    let prober = Arc::new(RaftProber {
        node: node.clone(),
        transport: transport.clone(),
        timeout: Duration::from_millis(cfg.liveness.interval_ms.max(100)),
        rt: tokio::runtime::Handle::current(),
    });
    let (interval, misses) = (
        Duration::from_millis(cfg.liveness.interval_ms),
        cfg.liveness.misses,
    );
    let (admin_node, rt, admin_health) = (
        node.clone(),
        tokio::runtime::Handle::current(),
        health.clone(),
    );
    let admin_limit = cfg.admin.max_in_flight;
    let (gateway_feed, gateway_health) = (node.feed().clone(), health.clone());
    let restart_grace_ms = cfg.gateway.restart_grace_ms;
    let probe_health = health.clone();
    let (agg_feed, agg_health, agg_node) = (node.feed().clone(), health.clone(), cfg.node.id);
    let (actors, (admin, gateway_actor)) = ActorSystem::start(move || {
        if let Some((program, view, every, iface)) = aggregator {
            yard_actors::aggregator::actor::AggregatorActor::new(
                agg_node,
                Box::new(program),
                agg_feed,
                view,
                agg_health,
                every,
                iface,
            )
            .start();
        }
        if let Some((shared, reporter, counters, every)) = probe {
            ProbeActor::new(shared, reporter, counters, probe_addr, every, probe_health).start();
        }
        let gateway_actor = gateway.map(|(settings, dataplane, iface, renewer, view)| {
            GatewayActor::new(
                settings,
                Box::new(dataplane),
                Box::new(iface),
                renewer,
                gateway_feed,
                view,
                gateway_health,
            )
            .start()
        });
        actix::Supervisor::start(move |_| {
            LivenessActor::new(interval, misses, prober, reachability, health)
        });
        let admin = actix::Supervisor::start(move |_| {
            AdminActor::new(admin_node, admin_limit, rt, admin_health)
        })
        .recipient();
        (admin, gateway_actor)
    })?;
    node.attach_admin(admin);

    let agent_file = cfg.node.data_dir.join("agent-seeds");
    let follow = |seeds: Vec<String>| {
        let settings = yard::roles::agent::Settings {
            hold: Duration::from_millis(cfg.liveness.hold_ms),
            rpc_timeout,
            pace: Duration::from_millis(cfg.raft.watch_pace_ms),
            seeds,
        };
        tokio::spawn(yard::roles::agent::follow(
            node.clone(),
            agent_store.clone(),
            settings,
        ));
    };
    let start_cluster = async {
        if let Some(seed) = &args.join {
            // Logged once the signal handlers below are installed (this block runs inside the
            // select): from here a SIGTERM stops the node.
            tracing::info!(seed = %seed, "joining the cluster");
            let role = node
                .join(seed, Duration::from_secs(120))
                .await
                .map_err(anyhow::Error::msg)?;
            if role == yard_control::roles::Role::Agent {
                // Remembered, so a restart without --join follows again.
                std::fs::write(&agent_file, format!("{seed}\n"))
                    .with_context(|| format!("cannot write {}", agent_file.display()))?;
            }
            follow(vec![seed.clone()]);
            Ok(())
        } else if agent_file.exists() && !node.raft().is_initialized().await? {
            let seeds: Vec<String> = std::fs::read_to_string(&agent_file)
                .with_context(|| format!("cannot read {}", agent_file.display()))?
                .lines()
                .map(str::to_owned)
                .filter(|l| !l.is_empty())
                .collect();
            tracing::info!(?seeds, "resuming as an agent");
            follow(seeds);
            Ok(())
        } else if args.bootstrap || args.config.is_none() {
            follow(Vec::new());
            node.bootstrap().await.map_err(anyhow::Error::msg)
        } else {
            if node.raft().is_initialized().await? {
                tracing::info!("resuming from the store");
                follow(Vec::new());
            } else {
                tracing::warn!("the store is empty and neither --bootstrap nor --join was given: waiting to be added by a leader");
            }
            Ok(())
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // A signal while joining (or bootstrapping) stops the node at once: the join may be
    // retrying a seed nobody answers for minutes, and an operator's SIGTERM must not wait for it
    // nor for a second signal.
    let stopped_early = tokio::select! {
        r = start_cluster => { r?; false }
        _ = term.recv() => { tracing::info!("SIGTERM before the node joined: stopping"); true }
        _ = tokio::signal::ctrl_c() => { tracing::info!("interrupt before the node joined: stopping"); true }
    };
    if !stopped_early {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupt: stopping"),
        }
    }
    // A planned stop: the pinned program keeps forwarding; with a grace it also keeps answering
    // for this node's VIPs, so a restart moves none of them.
    if let (Some(gw), true) = (&gateway_actor, restart_grace_ms > 0) {
        let asked = gw.send(PrepareRestart {
            grace_ms: restart_grace_ms,
        });
        match tokio::time::timeout(Duration::from_secs(2), asked).await {
            Ok(Ok(true)) => {}
            _ => {
                tracing::warn!("no restart grace: this node's vips move to others after one lease")
            }
        }
    }
    actors.stop();
    control.abort();
    prevote.abort();
    autopilot.abort();
    host_reports.abort();
    host_judge.abort();
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft did not shut down cleanly");
    }
    endpoint.close(0u32.into(), b"shutdown");
    server.abort();
    tracing::info!("stopped");
    Ok(())
}

/// The alert webhook's client, when one is configured (the URL and CA file were checked when
/// the config loaded; building the TLS client can still fail).
fn webhook_client(cfg: &Config) -> anyhow::Result<Option<Arc<yard::alert::WebhookClient>>> {
    let Some(url) = cfg.analyzer.alert_webhook.as_deref() else {
        return Ok(None);
    };
    let webhook = yard::alert::parse_webhook(url).context("analyzer.alert_webhook is invalid")?;
    // Only the host is logged: receivers such as chat hooks keep their secret in the path.
    let (host, https) = (
        webhook.uri.host().unwrap_or_default().to_owned(),
        webhook.is_https(),
    );
    let client = yard::alert::WebhookClient::new(webhook, cfg.analyzer.alert_webhook_ca.as_deref())
        .context("cannot set up the alert webhook's client")?;
    tracing::info!(host, https, "alert webhook configured");
    Ok(Some(Arc::new(client)))
}

/// Renews this node's gateway lease with every voter, on the node's runtime; asks the leader
/// for restart graces.
#[derive(Clone)]
struct LeaseRenewer {
    node: Node,
    transport: Arc<dyn Transport>,
    /// A renewal round's time, and the grace request's.
    timeout: Duration,
    /// One call to one voter.
    call_timeout: Duration,
    /// Voters with a renewal call still running.
    busy: Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>,
    rt: tokio::runtime::Handle,
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
struct ProbeReporter {
    node: Node,
    transport: Arc<dyn Transport>,
    timeout: Duration,
    rt: tokio::runtime::Handle,
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
struct EbpfPeerCounters(yard_ebpf::peers::PeerCounters);

impl EbpfPeerCounters {
    fn attach(interface: &str) -> anyhow::Result<Self> {
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
struct RaftProber {
    node: Node,
    transport: Arc<dyn Transport>,
    timeout: Duration,
    rt: tokio::runtime::Handle,
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
}

/// The actix system on its own thread, hosting the actors under supervision.
struct ActorSystem {
    system: actix::System,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ActorSystem {
    /// Starts the actix system on its own thread and runs `start_actors` inside it; returns
    /// what that returns (addresses of the actors it started).
    fn start<T: Send + 'static>(
        start_actors: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<(Self, T)> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("yard-actors".into())
            .spawn(move || {
                let system = actix::System::new();
                let started = system.block_on(async { start_actors() });
                let _ = tx.send((actix::System::current(), started));
                if let Err(e) = system.run() {
                    tracing::error!(error = %e, "actor system failed");
                }
            })
            .context("cannot start the actor thread")?;
        let (system, started) = rx.recv().context("the actor system did not start")?;
        Ok((
            Self {
                system,
                thread: Some(thread),
            },
            started,
        ))
    }

    fn stop(mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
