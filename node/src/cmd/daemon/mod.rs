//! The daemon's process wiring: configuration, logging, certificates, the QUIC endpoint, Raft,
//! the node, its control loops, the data planes and their actors, bootstrap or join, and a
//! graceful stop on SIGTERM. [`run`] reads as the order a node starts in; each step is a
//! function here or in a submodule:
//! - `planes`: the aggregator, gateway and probe data planes, opened before the actors start;
//! - `actors`: the actix system on its own thread and the actors it hosts;
//! - `enter`: how this host enters its cluster (join, bootstrap, resume), decided by a pure
//!   function;
//! - `adapters`: the actors' traits implemented over this node.

mod actors;
mod adapters;
mod enter;
mod planes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use yard::alert::AlertHook;
use yard::client::AdminClient;
use yard::config::{Config, LogFormat};
use yard::diagnosis_control::{DiagnosisControl, DiagnosisSettings};
use yard::gateway_control::GatewayControl;
use yard::gauges::RaftGauges;
use yard::http::{Endpoints, NodeReadiness};
use yard::planner_control::PlannerSettings;
use yard::rpc::{RedeemRequest, Reply, Request};
use yard::service::{Node, NodeParts};
use yard::tls::{self, Identity, Trust};
use yard::transport::{self, Quic, QuicTransport, Transport};
use yard_actors::gateway::actor::PrepareRestart;
use yard_actors::gateway::damping::DampingConfig;
use yard_actors::gateway::lease::LeaseConfig;
use yard_actors::health::HealthRegistry;
use yard_actors::liveness::Reachability;

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
            tls::init_ca_dir(tls_dir, &cfg.node.cluster, tls::ADMIN_VALIDITY)?;
            tracing::info!(dir = %tls_dir.display(), "generated a cluster CA");
        }
        tls::issue_node_cert(
            tls_dir,
            &cfg.node.cluster,
            &cfg.node.name,
            cfg.node.id,
            &[ip],
            cfg.tls.cert_validity(),
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
    let prepared = yard::data_dir::prepare(&cfg.node.data_dir).with_context(|| {
        format!(
            "cannot create node.data_dir {}",
            cfg.node.data_dir.display()
        )
    })?;
    if let yard::data_dir::Prepared::Narrowed { was } = prepared {
        tracing::warn!(dir = %cfg.node.data_dir.display(), was = format_args!("{was:o}"), "data directory was open to other users; narrowed it to 0700");
    }
    let net = open_network(&cfg, &args).await?;
    let (log, sm) = yard_raft_store::open(&cfg.node.data_dir.join("raft"))
        .context("cannot open the raft store")?;
    let budgets = yard::limits::RaftBudgets::for_frame(cfg.transport.max_frame_bytes);
    let log = log.with_payload_budget(budgets.append_bytes);
    let feed = sm.feed();
    // An agent applies what its watch brings into the same store Raft would.
    let agent_store = sm.clone();
    let raft_cfg = Arc::new(
        cfg.raft
            .to_openraft_within(&cfg.node.cluster, cfg.transport.max_frame_bytes)?,
    );
    let raft_net = yard::raft_network::RaftNet {
        transport: net.transport.clone(),
        id: cfg.node.id,
        retry_after: Duration::from_millis(cfg.raft.heartbeat_ms),
        handover: yard::raft_network::Handover::default(),
    };
    let handover = raft_net.handover.clone();
    let raft = yard_raft_store::Raft::new(cfg.node.id, raft_cfg, raft_net, log, sm)
        .await
        .context("cannot start raft")?;
    let shared = Shared {
        health: HealthRegistry::default(),
        reachability: Reachability::default(),
        rpc_timeout: Duration::from_millis(cfg.transport.rpc_timeout_ms),
        handover,
    };
    let (node, gateway_control, diagnosis_control) =
        build_node(&cfg, &net, raft.clone(), feed, &shared)?;
    let mut loops = ControlLoops::spawn(&node, gateway_control, diagnosis_control);
    loops.0.push(tokio::spawn(
        yard::renewal::Renewer {
            node: node.clone(),
            quic: net.quic.clone(),
            tls_dir: cfg.tls_dir(),
            name: cfg.node.name.clone(),
            presented: None,
        }
        .run(),
    ));

    planes::start_aggregation_services(&cfg, &node).await?;
    let aggregator = planes::open_aggregator(&cfg, &node)?;
    let gateway = planes::open_gateway(&cfg, &node, &net.transport, shared.rpc_timeout)?;
    let probe = planes::open_probe(&cfg, &node, &net.transport, shared.rpc_timeout)?;
    let server = tokio::spawn(transport::serve(
        net.endpoint.clone(),
        Arc::new(node.clone()),
        cfg.node.cluster.clone(),
        transport::ServeLimits::from(&cfg.transport),
    ));
    serve_metrics(&cfg, &node).await?;
    tracing::info!(id = cfg.node.id, listen = %cfg.node.listen, advertise = %cfg.advertise(), "node started");

    let planes = actors::Planes {
        aggregator,
        gateway,
        probe,
    };
    let (actor_system, gateway_actor) =
        actors::start(&cfg, &node, &net.transport, &shared, planes)?;

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // A signal while joining (or bootstrapping) stops the node at once: the join may be
    // retrying a seed nobody answers for minutes, and an operator's SIGTERM must not wait for it
    // nor for a second signal.
    let stopped_early = tokio::select! {
        r = enter::enter_cluster(&cfg, &args, &node, &agent_store, shared.rpc_timeout) => { r?; false }
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
    let restart_grace_ms = cfg.gateway.restart_grace_ms;
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
    actor_system.stop();
    loops.abort();
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft did not shut down cleanly");
    }
    net.endpoint.close(0u32.into(), b"shutdown");
    server.abort();
    tracing::info!("stopped");
    Ok(())
}

/// What several steps of the start share.
struct Shared {
    health: HealthRegistry,
    reachability: Reachability,
    rpc_timeout: Duration,
    /// The node's and its Raft network's side of a leadership handover.
    handover: yard::raft_network::Handover,
}

/// This node's QUIC endpoint and the transport over it, with its certificates.
struct Network {
    endpoint: quinn::Endpoint,
    transport: Arc<dyn Transport>,
    /// The same transport, for presenting a renewed certificate.
    quic: Arc<QuicTransport>,
    /// What the node trusts, signs with and presents; the renewal loop replaces it.
    pki: Arc<yard::pki::PkiCell>,
}

/// Makes sure this node has its certificates, then binds the QUIC endpoint.
async fn open_network(cfg: &Config, args: &StartArgs) -> anyhow::Result<Network> {
    let tls_dir = cfg.tls_dir();
    ensure_certificates(cfg, args, &tls_dir).await?;
    let identity = Identity::load(&tls_dir, &cfg.node.name)?;
    let holds_ca = tls_dir.join("ca.key").exists();
    if let Some(expired) = identity
        .chain
        .first()
        .and_then(tls::not_after)
        .filter(|at| *at <= std::time::SystemTime::now() && !holds_ca)
    {
        bail!(
            "the certificate {}/{}.crt expired at {}; remove it and join again with a new token, or issue one with `yard ca issue`",
            tls_dir.display(),
            cfg.node.name,
            humantime::format_rfc3339_seconds(expired)
        );
    }
    let pki = Arc::new(yard::pki::PkiCell::new(yard::pki::Pki::from_files(
        &identity, &tls_dir,
    )?));
    let cluster = cfg.node.cluster.clone();
    let server_cfg = tls::server_config(&identity)?;
    let client_cfg =
        tls::client_config(&cluster, Trust::Ca(identity.trust.clone()), Some(&identity))?;
    let endpoint = yard::transport::bind_node_endpoint(cfg.node.listen, &identity, server_cfg)
        .with_context(|| format!("cannot listen on node.listen {}", cfg.node.listen))?;
    let quic = QuicTransport::new(
        endpoint.clone(),
        client_cfg,
        cluster,
        cfg.transport.max_frame_bytes,
    );
    let transport: Arc<dyn Transport> = Arc::new(Quic(quic.clone()));
    Ok(Network {
        endpoint,
        transport,
        quic,
        pki,
    })
}

/// The node over `raft`, with the leader-side controls it holds (gateway leases and placement,
/// the analyzer), which its loops run.
fn build_node(
    cfg: &Config,
    net: &Network,
    raft: yard_raft_store::Raft,
    feed: yard_raft_store::ChangeFeed,
    shared: &Shared,
) -> anyhow::Result<(Node, Arc<GatewayControl>, Arc<DiagnosisControl>)> {
    let mut control = GatewayControl::new(
        LeaseConfig {
            lease_ms: cfg.liveness.lease_ms,
            margin_ms: cfg.liveness.lease_margin_ms,
        },
        Duration::from_millis(cfg.liveness.interval_ms),
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
            webhook: webhook_client(cfg)?,
        },
        total_budget_bytes: cfg.analyzer.total_budget_bytes(),
    }));
    let node = Node::new(NodeParts {
        id: cfg.node.id,
        name: cfg.node.name.clone(),
        cluster: cfg.node.cluster.clone(),
        addr: cfg.advertise(),
        raft,
        feed,
        transport: net.transport.clone(),
        pki: net.pki.clone(),
        cert_validity: cfg.tls.cert_validity(),
        handover: shared.handover.clone(),
        rpc_timeout: shared.rpc_timeout,
        // Long enough for one forward to time out on a dead leader and one more attempt after
        // an election.
        leader_wait: shared.rpc_timeout
            + Duration::from_millis(cfg.raft.election_timeout_max_ms * 8),
        health: shared.health.clone(),
        reachability: shared.reachability.clone(),
        gateway: gateway_control.clone(),
        diagnosis: diagnosis_control.clone(),
        zone: cfg.node.zone.clone(),
        roles: cfg.raft.roles(),
        host_liveness: cfg.liveness.hosts(),
        max_frame: cfg.transport.max_frame_bytes,
        operator_proofs: (!cfg.admin.unsigned_forwarding).then(|| {
            Arc::new(yard::operator_proof::ProofCheck::new(
                net.pki.clone(),
                &cfg.node.cluster,
            ))
        }),
    });
    node.set_agg_quota(cfg.aggregator.quota());
    Ok((node, gateway_control, diagnosis_control))
}

/// The loops every node runs and that act only while their condition holds (leading, being
/// a member): each executes a pure core's decisions.
struct ControlLoops(Vec<tokio::task::JoinHandle<()>>);

impl ControlLoops {
    fn spawn(node: &Node, gateway: Arc<GatewayControl>, diagnosis: Arc<DiagnosisControl>) -> Self {
        let (raft, feed) = (node.raft().clone(), node.feed().clone());
        let gateway_node = node.clone();
        Self(vec![
            tokio::spawn(async move { diagnosis.run(raft, feed).await }),
            tokio::spawn(async move { gateway.run(gateway_node).await }),
            tokio::spawn(yard::prevote::gate::run(node.clone())),
            tokio::spawn(yard::roles::autopilot::run(node.clone())),
            tokio::spawn(yard::roles::cluster_level::run(node.clone())),
            tokio::spawn(yard::roles::liveness::report(node.clone())),
            tokio::spawn(yard::roles::liveness::judge(node.clone())),
        ])
    }

    fn abort(self) {
        for task in self.0 {
            task.abort();
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` when `metrics.listen` is set.
async fn serve_metrics(cfg: &Config, node: &Node) -> anyhow::Result<()> {
    let Some(addr) = cfg.metrics.listen else {
        return Ok(());
    };
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
