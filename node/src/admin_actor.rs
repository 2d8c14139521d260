//! The admin actor: the door through which operators' cluster-management requests (status,
//! membership, tokens) enter a node. It admits at most a fixed number at once (see
//! [`yard_actors::admission`]), runs each on the node's tokio runtime (where Raft and QUIC
//! live, so the arbiter never blocks), and reports its load to the health registry. Key-value
//! requests, the data path, go straight to the node: the two cross-thread hops cost 60% of put
//! throughput when they went through here.

use std::time::Duration;

use actix::prelude::*;
use yard_actors::admission::Admission;
use yard_actors::health::HealthRegistry;

use crate::rpc::Reply;
use crate::service::Node;
pub use crate::service::ServeAdmin;

pub struct AdminActor {
    gate: Admission,
    node: Node,
    rt: tokio::runtime::Handle,
    health: HealthRegistry,
}

impl AdminActor {
    pub fn new(
        node: Node,
        limit: usize,
        rt: tokio::runtime::Handle,
        health: HealthRegistry,
    ) -> Self {
        Self {
            gate: Admission::new(limit),
            node,
            rt,
            health,
        }
    }

    fn report(&self) {
        let g = &self.gate;
        self.health.report(
            "admin",
            true,
            format!(
                "{} in flight of {}, {} served, {} refused busy",
                g.in_flight(),
                g.limit(),
                g.served(),
                g.refused()
            ),
        );
    }
}

impl Actor for AdminActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.report();
        ctx.run_interval(Duration::from_secs(1), |act, _| act.report());
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.health.report("admin", false, "stopped");
    }
}

impl Supervised for AdminActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        tracing::warn!("admin actor restarting");
        // Requests in flight when it stopped are no longer tracked by this gate.
        self.gate = Admission::new(self.gate.limit());
    }
}

impl Handler<ServeAdmin> for AdminActor {
    type Result = ResponseActFuture<Self, Reply>;

    fn handle(&mut self, msg: ServeAdmin, _: &mut Self::Context) -> Self::Result {
        if !self.gate.try_admit() {
            crate::metrics::METRICS.requests_refused.inc();
            let limit = self.gate.limit();
            return Box::pin(actix::fut::ready(Reply::Error(format!(
                "node busy: {limit} admin requests already in flight; retry shortly"
            ))));
        }
        let node = self.node.clone();
        let task = self
            .rt
            .spawn(async move { node.serve_operator(msg.req, msg.proof).await });
        Box::pin(
            async move {
                task.await
                    .unwrap_or_else(|e| Reply::Error(format!("admin request failed: {e}")))
            }
            .into_actor(self)
            .map(|reply, act, _| {
                act.gate.release();
                reply
            }),
        )
    }
}
