//! The admin client the CLI, the benchmark and the chaos workload use: QUIC with the admin
//! certificate, one connection per endpoint, trying the next endpoint when one is unreachable.

use std::path::Path;
use std::time::Duration;

use crate::rpc::{AdminReply, AdminRequest, Reply, Request};
use crate::tls::{self, Identity, Trust};
use crate::transport::{Quic, QuicTransport, Target, Transport, TransportError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
    #[error("cannot open a client socket: {0}")]
    Socket(std::io::Error),
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// The node refused or failed the request; it did not take effect.
    #[error("{0}")]
    Remote(String),
    /// The request may or may not have taken effect.
    #[error("{0}")]
    Indefinite(String),
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    #[error("no endpoint given")]
    NoEndpoint,
}

impl ClientError {
    /// Whether the request may have taken effect even though it failed (timeouts and lost
    /// connections): what a history checker must treat as unknown.
    pub fn is_indefinite(&self) -> bool {
        matches!(
            self,
            ClientError::Indefinite(_)
                | ClientError::Transport(
                    TransportError::Timeout { .. } | TransportError::Frame { .. }
                )
        )
    }
}

#[derive(Clone)]
pub struct AdminClient {
    transport: Quic,
    endpoints: Vec<String>,
    timeout: Duration,
    /// The endpoint that last answered: tried first, so a dead node costs one handshake
    /// timeout, not one per request. Shared by clones.
    preferred: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl AdminClient {
    /// Connects with `tls_dir`'s ca.crt and admin.crt/admin.key. `endpoints` is tried in order.
    pub fn new(
        endpoints: &[String],
        tls_dir: &Path,
        cluster: &str,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let identity = Identity::load(tls_dir, "admin")?;
        let client = tls::client_config(cluster, Trust::Ca(identity.ca.clone()), Some(&identity))?;
        Self::with_config(endpoints, client, cluster, timeout)
    }

    /// A client with an explicit QUIC client configuration (token redemption, tests).
    pub fn with_config(
        endpoints: &[String],
        client: quinn::ClientConfig,
        cluster: &str,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoint);
        }
        let endpoint = quinn::Endpoint::client(std::net::SocketAddr::from(([0, 0, 0, 0], 0)))
            .map_err(ClientError::Socket)?;
        let transport = Quic(QuicTransport::new(
            endpoint,
            client,
            cluster.to_owned(),
            crate::frame::DEFAULT_MAX_FRAME,
        ));
        Ok(Self {
            transport,
            endpoints: endpoints.to_vec(),
            timeout,
            preferred: Default::default(),
        })
    }

    /// Sends any request, trying each endpoint until one answers.
    pub async fn call(&self, req: Request) -> Result<Reply, ClientError> {
        use std::sync::atomic::Ordering;
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut last = None;
        for k in 0..n {
            let i = (first + k) % n;
            match self
                .transport
                .call(
                    Target::any(self.endpoints[i].clone()),
                    req.clone(),
                    self.timeout,
                )
                .await
            {
                Ok(reply) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(reply);
                }
                // Never sent, so trying the next endpoint cannot apply it twice.
                Err(e @ TransportError::Unreachable { .. }) if k + 1 < n => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map_or(ClientError::NoEndpoint, ClientError::Transport))
    }

    /// Sends an admin request and unwraps the reply.
    pub async fn admin(&self, req: AdminRequest) -> Result<AdminReply, ClientError> {
        match self.call(Request::Admin(req)).await? {
            Reply::Admin(r) => Ok(r),
            Reply::Error(e) => Err(ClientError::Remote(e)),
            Reply::Indefinite(e) => Err(ClientError::Indefinite(e)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}
