//! The node's HTTP port (`metrics.listen`): `GET /metrics` (the Prometheus exposition),
//! `GET /healthz` (the process is alive and serving: a Kubernetes liveness probe) and
//! `GET /readyz` (the node knows a Raft leader and its actors are healthy: a readiness probe,
//! 503 with the reason otherwise), on axum.
//!
//! Readiness is decided by [`readiness`], a pure function of what the node knows, so the
//! decision is tested without a cluster.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use yard_raft_store::NodeId;

use crate::metrics::{GaugeSource, CONTENT_TYPE, METRICS};
use crate::rpc::ActorHealth;
use crate::service::Node;

/// Whether the node should receive work, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// One lowercase sentence saying what is missing.
    NotReady(String),
}

/// The readiness decision: ready only once a Raft leader is known, every actor in `expected`
/// has reported, and every actor that reported is healthy. `actors` is what `yard status`
/// shows (Raft's own entry included).
pub fn readiness(leader: Option<NodeId>, expected: &[&str], actors: &[ActorHealth]) -> Readiness {
    if leader.is_none() {
        return Readiness::NotReady("no raft leader is known yet".into());
    }
    if let Some(missing) = expected
        .iter()
        .find(|name| !actors.iter().any(|a| a.name == **name))
    {
        return Readiness::NotReady(format!("actor {missing} has not reported yet"));
    }
    if let Some(sick) = actors.iter().find(|a| !a.healthy) {
        return Readiness::NotReady(format!("actor {} is unhealthy: {}", sick.name, sick.detail));
    }
    Readiness::Ready
}

/// What `/readyz` asks.
pub trait ReadinessSource: Send + Sync + 'static {
    fn readiness(&self) -> Readiness;
}

/// A node's readiness from its own status (leader and actors' health) and the actors this
/// process runs, which must each have reported once before the node counts as ready.
pub struct NodeReadiness {
    pub node: Node,
    pub expected_actors: Vec<&'static str>,
}

impl ReadinessSource for NodeReadiness {
    fn readiness(&self) -> Readiness {
        let status = self.node.local_status();
        readiness(status.leader, &self.expected_actors, &status.actors)
    }
}

/// What the HTTP port serves from.
#[derive(Clone)]
pub struct Endpoints {
    pub gauges: Arc<dyn GaugeSource>,
    pub readiness: Arc<dyn ReadinessSource>,
}

/// The routes: `/metrics`, `/healthz`, `/readyz`; anything else is 404.
pub fn router(endpoints: Endpoints) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(endpoints)
}

/// Serves [`router`] on `listener` until the task is dropped or the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, endpoints: Endpoints) -> std::io::Result<()> {
    axum::serve(listener, router(endpoints)).await
}

async fn metrics(State(e): State<Endpoints>) -> Response {
    // Rendering reads locks and raft metrics briefly; it never waits on the network.
    match METRICS.render(e.gauges.as_ref()) {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "metrics scrape failed");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response()
        }
    }
}

/// Answering at all is the liveness signal: the runtime that serves this also runs Raft and
/// the transport.
async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(e): State<Endpoints>) -> Response {
    match e.readiness.readiness() {
        Readiness::Ready => "ready\n".into_response(),
        Readiness::NotReady(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn not_found() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "not found: this port serves /metrics, /healthz and /readyz\n",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(name: &str, healthy: bool, detail: &str) -> ActorHealth {
        ActorHealth {
            name: name.into(),
            healthy,
            detail: detail.into(),
        }
    }

    #[test]
    fn ready_only_with_a_leader_and_healthy_actors() {
        let healthy = [
            actor("raft", true, "Follower, leader 1"),
            actor("admin", true, "0 in flight"),
            actor("liveness", true, "started"),
        ];
        assert_eq!(
            readiness(Some(1), &["admin", "liveness"], &healthy),
            Readiness::Ready
        );
        assert_eq!(
            readiness(None, &["admin"], &healthy),
            Readiness::NotReady("no raft leader is known yet".into())
        );
        assert_eq!(
            readiness(Some(1), &["admin", "gateway"], &healthy),
            Readiness::NotReady("actor gateway has not reported yet".into())
        );
        let fenced = [
            actor("raft", true, "Leader, leader 1"),
            actor("gateway", false, "lease lapsed: serving nothing"),
        ];
        assert_eq!(
            readiness(Some(1), &["gateway"], &fenced),
            Readiness::NotReady("actor gateway is unhealthy: lease lapsed: serving nothing".into())
        );
        // No leader outweighs everything else: it is the first thing an operator must fix.
        assert_eq!(
            readiness(None, &["gateway"], &fenced),
            Readiness::NotReady("no raft leader is known yet".into())
        );
    }
}
