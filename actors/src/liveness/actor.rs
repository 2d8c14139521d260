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
    /// Resolves once this node leads, or after `max` at most. Only a leader probes, so a
    /// follower's actor waits here instead of ticking at the probe interval for nothing (on
    /// every agent and follower, 50 wake-ups a second).
    fn until_leading(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The longest a follower's actor waits before it looks at its role again on its own.
const FOLLOWER_RECHECK: Duration = Duration::from_secs(1);

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

    /// One probe interval: the core's tick, then the next one, at the interval while this node
    /// leads and once it leads otherwise.
    fn tick(&mut self, ctx: &mut Context<Self>) {
        let t = self.prober.targets();
        let leader = t.leader;
        let detail = if leader {
            format!("leader probing {} members", t.members.len())
        } else {
            "follower (idle)".to_owned()
        };
        self.health.report("liveness", true, detail);
        self.run(
            Event::Tick {
                leader,
                members: t.members,
            },
            ctx,
        );
        if leader {
            ctx.run_later(self.interval, |act, ctx| act.tick(ctx));
        } else {
            let wait = self.prober.until_leading(FOLLOWER_RECHECK);
            ctx.spawn(wait.into_actor(self).map(|(), act, ctx| act.tick(ctx)));
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
        self.tick(ctx);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::*;

    /// A node whose leadership the test flips, counting what the actor asks of it.
    #[derive(Default)]
    struct Node {
        leader: AtomicBool,
        targets: AtomicU64,
        probes: AtomicU64,
        leads: tokio::sync::Notify,
    }

    struct Shared(Arc<Node>);

    impl Prober for Shared {
        fn targets(&self) -> ProbeTarget {
            self.0.targets.fetch_add(1, Ordering::SeqCst);
            ProbeTarget {
                leader: self.0.leader.load(Ordering::SeqCst),
                members: [2, 3].into(),
            }
        }

        fn probe(&self, _id: u64) -> Pin<Box<dyn Future<Output = bool> + Send>> {
            self.0.probes.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { true })
        }

        fn until_leading(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
            let node = self.0.clone();
            Box::pin(async move {
                let leads = node.leads.notified();
                if !node.leader.load(Ordering::SeqCst) {
                    let _ = tokio::time::timeout(max, leads).await;
                }
            })
        }
    }

    #[actix_rt::test]
    async fn a_follower_waits_for_leadership_instead_of_ticking_and_probes_as_soon_as_it_leads() {
        let node = Arc::new(Node::default());
        let view = Reachability::default();
        LivenessActor::new(
            Duration::from_millis(10),
            3,
            Arc::new(Shared(node.clone())),
            view.clone(),
            HealthRegistry::default(),
        )
        .start();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // At the 10 ms interval a follower looked 30 times; waiting, it looked once.
        let looked = node.targets.load(Ordering::SeqCst);
        assert!(
            looked <= 2,
            "a follower looked at its role {looked} times in 300 ms"
        );
        assert_eq!(node.probes.load(Ordering::SeqCst), 0);

        node.leader.store(true, Ordering::SeqCst);
        node.leads.notify_waiters();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let probes = node.probes.load(Ordering::SeqCst);
        assert!(
            probes >= 2 * 5,
            "a leader probed its two members {probes} times in 200 ms at a 10 ms interval"
        );
        assert_eq!(view.snapshot(), [(2, true), (3, true)].into());
    }
}
