//! The actix system on its own thread and the actors it hosts: the data planes' actors (when
//! their plane is open here), the liveness actor and the admin actor. Their I/O runs on the
//! node's tokio runtime; an arbiter never blocks.

use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use anyhow::Context;
use yard::admin_actor::AdminActor;
use yard::config::Config;
use yard::service::Node;
use yard::transport::Transport;
use yard_actors::gateway::actor::GatewayActor;
use yard_actors::liveness::LivenessActor;
use yard_actors::probe::actor::ProbeActor;

use super::adapters::RaftProber;
use super::planes::{AggregatorPlane, GatewayPlane, ProbePlane};
use super::Shared;

/// The data planes opened on this node, each handed to its actor.
pub struct Planes {
    pub aggregator: Option<AggregatorPlane>,
    pub gateway: Option<GatewayPlane>,
    pub probe: Option<ProbePlane>,
}

/// Starts the actor system and its actors, and routes operators' requests through the admin
/// actor from then on. Returns the system (to stop it) and the gateway actor, if any (a
/// planned stop asks it for a restart grace).
pub fn start(
    cfg: &Config,
    node: &Node,
    transport: &Arc<dyn Transport>,
    shared: &Shared,
    planes: Planes,
) -> anyhow::Result<(ActorSystem, Option<actix::Addr<GatewayActor>>)> {
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
    let (admin_node, rt) = (node.clone(), tokio::runtime::Handle::current());
    let admin_limit = cfg.admin.max_in_flight;
    let (feed, health, reachability) = (
        node.feed().clone(),
        shared.health.clone(),
        shared.reachability.clone(),
    );
    let (me, probe_addr) = (cfg.node.id, cfg.advertise_ip());
    let (system, (admin, gateway_actor)) = ActorSystem::start(move || {
        if let Some(a) = planes.aggregator {
            yard_actors::aggregator::actor::AggregatorActor::new(
                me,
                Box::new(a.program),
                feed.clone(),
                a.view,
                health.clone(),
                a.stats_every,
                a.interface,
            )
            .start();
        }
        if let Some(p) = planes.probe {
            ProbeActor::new(
                p.shared,
                p.reporter,
                p.counters,
                probe_addr,
                p.report_every,
                health.clone(),
            )
            .start();
        }
        let gateway_actor = planes.gateway.map(|g| {
            GatewayActor::new(
                g.settings,
                Box::new(g.dataplane),
                Box::new(g.interface),
                g.renewer,
                feed,
                g.view,
                health.clone(),
            )
            .start()
        });
        let liveness_health = health.clone();
        actix::Supervisor::start(move |_| {
            LivenessActor::new(interval, misses, prober, reachability, liveness_health)
        });
        let admin =
            actix::Supervisor::start(move |_| AdminActor::new(admin_node, admin_limit, rt, health))
                .recipient();
        (admin, gateway_actor)
    })?;
    node.attach_admin(admin);
    Ok((system, gateway_actor))
}

/// The actix system on its own thread, hosting the actors under supervision.
pub struct ActorSystem {
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

    pub fn stop(mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
