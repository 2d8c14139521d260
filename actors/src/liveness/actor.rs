//! The actix shell of liveness: a timer, probes through an injected prober, and the published
//! view. All decisions are in [`super::core`].

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::core::{Effect, Event, LivenessCore};
use super::Reachability;
use crate::health::HealthRegistry;

/// The membership as the shell sees it on each tick.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    pub leader: bool,
    pub members: BTreeSet<u64>,
}

/// What the node gives the shell to do I/O: read membership and probe a member. Probes run on
/// the node's tokio runtime (where QUIC lives), never on the actix arbiter.
pub trait Prober: Send + Sync + 'static {
    fn targets(&self) -> ProbeTarget;
    fn probe(&self, id: u64) -> Pin<Box<dyn Future<Output = bool> + Send>>;
}

pub struct LivenessActor {
    core: LivenessCore,
    interval: Duration,
    prober: Arc<dyn Prober>,
    view: Reachability,
    health: HealthRegistry,
}

impl LivenessActor {
    pub fn new(
        interval: Duration,
        misses: u32,
        prober: Arc<dyn Prober>,
        view: Reachability,
        health: HealthRegistry,
    ) -> Self {
        Self {
            core: LivenessCore::new(misses),
            interval,
            prober,
            view,
            health,
        }
    }

    fn run(&mut self, event: Event, ctx: &mut Context<Self>) {
        for effect in self.core.handle(event) {
            match effect {
                Effect::Probe { round, ids } => {
                    for id in ids {
                        let fut = self.prober.probe(id);
                        ctx.spawn(fut.into_actor(self).map(move |ok, act, ctx| {
                            act.run(Event::ProbeResult { id, round, ok }, ctx);
                        }));
                    }
                }
                Effect::Publish(view) => {
                    let down: Vec<u64> = view
                        .iter()
                        .filter(|(_, r)| !**r)
                        .map(|(id, _)| *id)
                        .collect();
                    tracing::info!(?down, members = view.len(), "reachability changed");
                    self.view.publish(view);
                }
            }
        }
    }
}

impl Actor for LivenessActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.health.report("liveness", true, "started");
        ctx.run_interval(self.interval, |act, ctx| {
            let t = act.prober.targets();
            let detail = if t.leader {
                format!("leader probing {} members", t.members.len())
            } else {
                "follower (idle)".to_owned()
            };
            act.health.report("liveness", true, detail);
            act.run(
                Event::Tick {
                    leader: t.leader,
                    members: t.members,
                },
                ctx,
            );
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.health.report("liveness", false, "stopped");
    }
}

impl Supervised for LivenessActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        tracing::warn!("liveness actor restarting");
    }
}
