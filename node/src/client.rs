//! The admin client the CLI, the benchmark and the chaos workload use: QUIC with the admin
//! certificate, one connection per endpoint, trying the next endpoint when one is unreachable.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use yard_raft_store::SessionTag;

use crate::operator_proof::Signer;
use crate::rpc::{AdminReply, AdminRequest, Reply, Request};
use crate::tls::{self, Identity, Trust};
use crate::transport::{Quic, QuicTransport, Target, TransportError};

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

/// How long a handshake with one endpoint may take while another endpoint is still to be tried
/// in this pass. A handshake on any network a cluster runs on takes milliseconds, a dead
/// endpoint never answers; the last endpoint of a pass gets the whole remaining time (a loaded
/// host's handshake can take longer than this).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1_000);
/// Pause between two attempts of a tagged write that met an unknown outcome everywhere.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// The client's session: what tags its key-value writes so that each applies at most once
/// however often it is sent (see `yard_raft_store::session`). Shared by clones.
#[derive(Debug)]
struct Session {
    /// The random client id and the next sequence number.
    state: Mutex<SessionState>,
}

#[derive(Debug)]
struct SessionState {
    client: u64,
    next_seq: u64,
    /// Writes sent and not yet finished: the lowest is what the state machine must still keep.
    in_flight: BTreeSet<u64>,
}

impl Session {
    fn new() -> Self {
        Self {
            state: Mutex::new(SessionState {
                client: rand::random(),
                next_seq: 1,
                in_flight: BTreeSet::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tags a new write; the guard finishes it when dropped (a caller that gives up on the
    /// future, e.g. by its own timeout, counts as an unknown outcome).
    fn begin(self: &Arc<Self>) -> InFlight {
        InFlight {
            tag: self.tag(),
            session: self.clone(),
            maybe_applied: true,
        }
    }

    fn tag(&self) -> SessionTag {
        let mut st = self.lock();
        let seq = st.next_seq;
        st.next_seq += 1;
        st.in_flight.insert(seq);
        SessionTag {
            client: st.client,
            seq,
            first_unacked: st.in_flight.first().copied().unwrap_or(seq),
        }
    }

    /// The write is answered or given up on: it is never sent again, so the state machine may
    /// forget its reply. After an unknown outcome the session starts afresh, so a session the
    /// cluster expired (the usual cause) is not used again.
    fn finish(&self, tag: &SessionTag, indefinite: bool) {
        let mut st = self.lock();
        if st.client != tag.client {
            return;
        }
        st.in_flight.remove(&tag.seq);
        if indefinite && st.in_flight.is_empty() {
            *st = SessionState {
                client: rand::random(),
                next_seq: 1,
                in_flight: BTreeSet::new(),
            };
        }
    }
}

/// A tagged write in flight; finished (so the state machine may forget its reply) when dropped.
struct InFlight {
    tag: SessionTag,
    session: Arc<Session>,
    /// Whether it may have applied without the client learning so.
    maybe_applied: bool,
}

impl InFlight {
    fn done(mut self, maybe_applied: bool) {
        self.maybe_applied = maybe_applied;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.session.finish(&self.tag, self.maybe_applied);
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
    session: Arc<Session>,
    /// Signs every operator request with the admin key (`crate::operator_proof`), so a node
    /// that forwards it to the leader can prove an operator asked.
    signer: Option<Arc<Signer>>,
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
        let client =
            tls::client_config(cluster, Trust::Ca(identity.trust.clone()), Some(&identity))?;
        let mut admin = Self::with_config(endpoints, client, cluster, timeout)?;
        match Signer::new(cluster, &identity.chain[0], &identity.key) {
            Ok(signer) => admin.signer = Some(Arc::new(signer)),
            // Requests still work where they are served; a forwarded write is refused.
            Err(e) => tracing::warn!(error = %e, "operator requests go unsigned"),
        }
        Ok(admin)
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
            session: Arc::new(Session::new()),
            signer: None,
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
            let handshake = if k + 1 < n {
                CONNECT_TIMEOUT
            } else {
                self.timeout
            };
            match self
                .transport
                .clone()
                .call_bounded(
                    Target::any(self.endpoints[i].clone()),
                    req.clone(),
                    self.timeout,
                    handshake,
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

    /// A key-value write, tagged with this client's session and sent until an endpoint answers
    /// or the timeout passes: on every endpoint in turn after a lost connection, a timeout or an
    /// unknown outcome, since a tagged write applies at most once however often it arrives. So
    /// a leader's death costs the client an election, never an error.
    async fn write_once(&self, req: AdminRequest) -> Result<AdminReply, ClientError> {
        use std::sync::atomic::Ordering;
        let write = self.session.begin();
        let tag = write.tag;
        let deadline = Instant::now() + self.timeout;
        let n = self.endpoints.len();
        let mut i = self.preferred.load(Ordering::Relaxed) % n;
        let mut last = ClientError::NoEndpoint;
        // Whether any attempt may have reached a node (anything but a failed handshake).
        let mut maybe_sent = false;
        // Signed until a node of an earlier release cannot decode it.
        let mut sign = true;
        for attempt in 0.. {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let request = self.operator_request(Some(tag), &req, sign);
            // Short handshakes while the first pass has endpoints left to try.
            let handshake = if attempt + 1 < n {
                CONNECT_TIMEOUT
            } else {
                remaining
            };
            let reply = self
                .transport
                .clone()
                .call_bounded(
                    Target::any(self.endpoints[i].clone()),
                    request,
                    remaining,
                    handshake,
                )
                .await;
            last = match reply {
                // A node of an earlier release: nothing was served; it takes the write
                // unsigned.
                Ok(Reply::Error(e)) if sign && crate::frame::is_undecodable(&e) => {
                    sign = false;
                    continue;
                }
                Ok(Reply::Admin(r)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    write.done(false);
                    return Ok(r);
                }
                // A refusal: this attempt did not take effect (an earlier one that reached a
                // node may have).
                Ok(Reply::Error(e)) => {
                    write.done(maybe_sent);
                    return Err(if maybe_sent {
                        ClientError::Indefinite(format!(
                            "{e} (an earlier attempt may have applied)"
                        ))
                    } else {
                        ClientError::Remote(e)
                    });
                }
                Ok(Reply::Indefinite(e)) => ClientError::Indefinite(e),
                Ok(other) => {
                    write.done(true);
                    return Err(ClientError::Unexpected(format!("{other:?}")));
                }
                Err(e) => ClientError::Transport(e),
            };
            maybe_sent |= !matches!(
                last,
                ClientError::Transport(TransportError::Unreachable { .. })
            );
            tracing::debug!(endpoint = %self.endpoints[i], error = %last, "tagged write not answered; trying again");
            i = (i + 1) % n;
            if Instant::now() + RETRY_PAUSE >= deadline {
                break;
            }
            if i == self.preferred.load(Ordering::Relaxed) % n {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
        write.done(maybe_sent);
        Err(match last {
            e if !maybe_sent => e,
            e => ClientError::Indefinite(format!(
                "no endpoint confirmed the write within {} ms, so it may or may not have applied: {e}",
                self.timeout.as_millis()
            )),
        })
    }

    /// `req` as this client sends it: signed when `sign` and the client has a key that signs,
    /// plain otherwise.
    fn operator_request(&self, tag: Option<SessionTag>, req: &AdminRequest, sign: bool) -> Request {
        let proof = match self.signer.as_ref().filter(|_| sign) {
            Some(signer) => match signer.sign(tag.as_ref(), req, crate::service::now_unix_ms()) {
                Ok(proof) => Some(proof),
                Err(e) => {
                    tracing::warn!(error = %e, "sending an operator request unsigned");
                    None
                }
            },
            None => None,
        };
        match (proof, tag) {
            (Some(proof), tag) => Request::SignedAdmin {
                tag,
                req: req.clone(),
                proof,
            },
            (None, Some(tag)) => Request::AdminOnce {
                tag,
                req: req.clone(),
            },
            (None, None) => Request::Admin(req.clone()),
        }
    }

    /// Closes the client's connections and tells the nodes (a CLI process calls this before it
    /// exits): a request it gave up on is then dropped by the node serving it.
    pub async fn close(&self) {
        self.transport.0.close().await;
    }

    /// Sends an admin request and unwraps the reply. Key-value writes carry the client's
    /// session (see [`write_once`](Self::write_once)).
    pub async fn admin(&self, req: AdminRequest) -> Result<AdminReply, ClientError> {
        if req.is_kv() && !req.is_read_only() {
            return self.write_once(req).await;
        }
        let mut reply = self.call(self.operator_request(None, &req, true)).await?;
        if matches!(&reply, Reply::Error(e) if crate::frame::is_undecodable(e)) {
            // A node of an earlier release: nothing was served; it takes the request unsigned.
            reply = self.call(Request::Admin(req)).await?;
        }
        match reply {
            Reply::Admin(r) => Ok(r),
            Reply::Error(e) => Err(ClientError::Remote(e)),
            Reply::Indefinite(e) => Err(ClientError::Indefinite(e)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_in_flight_hold_back_the_acknowledgement_and_an_abandoned_one_starts_a_new_session() {
        let session = Arc::new(Session::new());
        let a = session.begin();
        let b = session.begin();
        assert_eq!((a.tag.seq, a.tag.first_unacked), (1, 1));
        assert_eq!((b.tag.seq, b.tag.first_unacked), (2, 1));
        a.done(false);
        let c = session.begin();
        assert_eq!((c.tag.seq, c.tag.first_unacked), (3, 2));
        let client = c.tag.client;
        b.done(false);
        // Dropped unfinished (its caller gave up): it may still apply, so once nothing else is
        // in flight the client starts a session the cluster has never seen.
        drop(c);
        let d = session.begin();
        assert_ne!(d.tag.client, client);
        assert_eq!((d.tag.seq, d.tag.first_unacked), (1, 1));
    }
}
