//! Certificates that renew themselves: every node asks for a new certificate for its key
//! before its own runs out ([`yard_control::cert_renewal`] decides when), and a node holding
//! the CA key signs such requests ([`Node::handle_renewal`]). The new certificate is written
//! over the old file and presented at once, without a restart ([`QuicTransport::reload`]);
//! `SIGHUP` makes the node re-read its certificate files the same way (an operator who
//! replaced them by hand).
//!
//! Why: certificates used to be valid until 4096, so one that left the cluster with a host
//! that was never removed worked for ever. Now it stops working within `tls.cert_validity_s`
//! (90 days by default), while every host that stays renews without an operator.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use yard_control::cert_renewal::{self, Step};
use yard_raft_store::NodeId;

use crate::pki::Pki;
use crate::rpc::{Reply, Request};
use crate::service::Node;
use crate::tls::{self, Identity, PeerRole, TlsError};
use crate::transport::{QuicTransport, Target};

/// How long the loop sleeps at most before looking at its certificate files again: a
/// certificate replaced there (a Kubernetes Secret rotated by its operator, `yard ca issue` run
/// by hand) is presented within this, and clock changes are noticed.
const RECHECK: Duration = Duration::from_secs(60);

/// Why a renewal attempt failed, in one sentence.
#[derive(Debug, thiserror::Error)]
pub enum RenewalError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot read the node's key file {path}: {source}")]
    Key {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no node holding the CA key signed a renewal: {0}")]
    NoSigner(String),
    #[error("the renewed certificate from node {signer} is not for this node's key or not signed by its active CA")]
    Foreign { signer: NodeId },
}

impl Node {
    /// Signs a renewed certificate for node `id` (the caller's certificate names it) over the
    /// key its request proves, with the name and address the cluster has for it.
    pub(crate) fn handle_renewal(&self, id: NodeId, csr: &[u8]) -> Reply {
        let p = &self.inner;
        let pki = p.pki.get();
        let Some(ca) = pki.signer.as_ref() else {
            return Reply::Error(format!(
                "node {} holds no CA key and cannot sign certificates",
                p.id
            ));
        };
        let known = p.feed.read(|d| {
            d.nodes.get(&id).map(|n| yard_raft_store::NodeInfo {
                name: n.name.clone(),
                addr: n.addr.clone(),
            })
        });
        let Some(info) = known.or_else(|| self.member(id)) else {
            return Reply::Error(format!("node {id} is not a host of this cluster"));
        };
        match ca.renew_node(
            &p.cluster,
            &info.name,
            id,
            &ips_of(&info.addr),
            p.cert_validity,
            csr,
        ) {
            Ok(cert) => {
                tracing::info!(node = id, name = %info.name, "signed a renewed node certificate");
                Reply::Renewed {
                    ca: ca.cert_pem.clone(),
                    cert,
                }
            }
            Err(e) => Reply::Error(format!("cannot renew node {id}'s certificate: {e}")),
        }
    }
}

/// The IP of a `host:port` address, for the certificate's IP SAN (a name gives none).
fn ips_of(addr: &str) -> Vec<IpAddr> {
    addr.parse::<std::net::SocketAddr>()
        .map(|a| vec![a.ip()])
        .unwrap_or_default()
}

/// This node's renewal loop: its certificate files, the transport that presents them, and the
/// node it asks signers through.
pub struct Renewer {
    pub node: Node,
    pub quic: Arc<QuicTransport>,
    pub tls_dir: PathBuf,
    pub name: String,
    /// What the files held when the transport and the node's PKI last took them (None: what
    /// the node started with, taken on the first look).
    pub presented: Option<Files>,
}

/// What the certificate files hold, as far as a change of them matters: the certificate, the
/// trusted CAs and the CA key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    leaf: Option<rustls::pki_types::CertificateDer<'static>>,
    trust: String,
    ca_key: Option<String>,
}

impl Files {
    fn of(identity: &Identity, pki: &Pki) -> Self {
        Self {
            leaf: identity.chain.first().cloned(),
            trust: identity.trust.pem(),
            ca_key: pki.signer.as_ref().map(|ca| ca.key_pem()),
        }
    }
}

/// How soon a renewal that a CA rollover asked for is tried again: the node holding the new CA
/// key may take its files a little after this node took the new bundle.
const ROLLOVER_RETRY: Duration = Duration::from_secs(2);

impl Renewer {
    /// Renews this node's certificate whenever [`cert_renewal::step_under`] says so, and reloads
    /// it on `SIGHUP`. Runs until the node stops.
    pub async fn run(mut self) {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler; certificate files are re-read only when renewed");
                None
            }
        };
        loop {
            let wait = self.tick().await;
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                Some(()) = async { hangup.as_mut()?.recv().await } => {
                    match self.reload(None).await {
                        Ok(until) => tracing::info!(valid_until = %humantime::format_rfc3339_seconds(until), "SIGHUP: reloaded the certificate files"),
                        Err(e) => tracing::error!(error = %e, "SIGHUP: kept the certificates in use"),
                    }
                }
            }
        }
    }

    /// One look at the certificate files: takes what changed there (a certificate, the CA
    /// bundle, the CA key), renews the certificate if due, and says how long to sleep.
    async fn tick(&mut self) -> Duration {
        let (identity, pki) = match self.load().await {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::error!(error = %e, "cannot read this node's certificate files");
                return RECHECK;
            }
        };
        let files = Files::of(&identity, &pki);
        if self.presented.as_ref().is_some_and(|p| *p != files) {
            match self.take(identity.clone(), pki) {
                Ok(until) => {
                    tracing::info!(valid_until = %humantime::format_rfc3339_seconds(until), trusted = identity.trust.len(), "the certificate files changed: took them")
                }
                Err(e) => {
                    tracing::error!(error = %e, "the certificate files changed but cannot be taken")
                }
            }
        }
        self.presented = Some(files);
        let Some(leaf) = identity.chain.first() else {
            return RECHECK;
        };
        let Some((before, after)) = tls::validity(leaf) else {
            tracing::error!("this node's certificate has no readable validity");
            return RECHECK;
        };
        let (before, after, now) = (unix_ms(before), unix_ms(after), unix_ms(SystemTime::now()));
        let by_active = identity.trust.is_active_issuer(leaf);
        let retry = Duration::from_millis(cert_renewal::retry_after_ms(before, after));
        let retry = if by_active {
            retry
        } else {
            retry.min(ROLLOVER_RETRY)
        };
        match cert_renewal::step_under(before, after, now, by_active) {
            Step::Wait { at_ms } => Duration::from_millis(at_ms - now).min(RECHECK),
            Step::Expired if self.node.inner.pki.get().signer.is_none() => {
                tracing::error!(
                    expired_ms_ago = now - after,
                    "this node's certificate expired and peers refuse it; join again with a new token or issue one with `yard ca issue`"
                );
                retry
            }
            Step::Renew | Step::Expired => match self.renew().await {
                Ok(until) => {
                    tracing::info!(valid_until = %humantime::format_rfc3339_seconds(until), by_active_ca = by_active, "renewed this node's certificate");
                    Duration::ZERO
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_ms = retry.as_millis() as u64, "certificate renewal failed; retrying");
                    retry
                }
            },
        }
    }

    /// Gets a renewed certificate (signed here when this node holds the CA key, which also
    /// revives an expired one), writes it over the old one and presents it.
    async fn renew(&mut self) -> Result<SystemTime, RenewalError> {
        let key_path = self.tls_dir.join(format!("{}.key", self.name));
        let key_pem = tokio::fs::read_to_string(&key_path)
            .await
            .map_err(|source| RenewalError::Key {
                path: key_path,
                source,
            })?;
        let csr = tls::renewal_request(&key_pem)?;
        let (identity, pki) = self.load().await?;
        let p = &self.node.inner;
        let cert = match &pki.signer {
            Some(ca) => ca.renew_node(
                &p.cluster,
                &self.name,
                p.id,
                &ips_of(&p.addr),
                p.cert_validity,
                &csr,
            )?,
            None => self.ask_signers(csr, &identity).await?,
        };
        tls::write_renewed_cert(&self.tls_dir, &self.name, &cert)?;
        self.reload(None).await
    }

    /// Asks the leader, then every other voter, to sign `csr`; the first certificate for this
    /// node by the active CA of `ours` wins.
    async fn ask_signers(&self, csr: Vec<u8>, ours: &Identity) -> Result<String, RenewalError> {
        let p = &self.node.inner;
        let mut signers: Vec<(NodeId, String)> = Vec::new();
        if let Some((id, info)) = self.node.known_leader() {
            signers.push((id, info.addr));
        }
        for id in self.node.voter_ids() {
            if let Some(info) = self.node.member(id) {
                if !signers.iter().any(|(s, _)| *s == id) {
                    signers.push((id, info.addr));
                }
            }
        }
        signers.retain(|(id, _)| *id != p.id);
        let mut why = Vec::new();
        for (signer, addr) in signers {
            let ask = Request::RenewCertificate { csr: csr.clone() };
            match p
                .transport
                .call(Target::node(signer, addr), ask, p.rpc_timeout)
                .await
            {
                Ok(Reply::Renewed { cert, .. }) => {
                    if issued_for(&cert, ours, &p.cluster, p.id) {
                        return Ok(cert);
                    }
                    why.push(RenewalError::Foreign { signer }.to_string());
                }
                Ok(Reply::Error(e)) => why.push(format!("node {signer}: {e}")),
                Ok(other) => why.push(format!("node {signer}: unexpected {other:?}")),
                Err(e) => why.push(format!("node {signer}: {e}")),
            }
        }
        if why.is_empty() {
            why.push("no voter is known".into());
        }
        Err(RenewalError::NoSigner(why.join("; ")))
    }

    /// Takes `identity` (or what the certificate files hold) from now on; returns the new
    /// expiry.
    async fn reload(&mut self, identity: Option<Identity>) -> Result<SystemTime, RenewalError> {
        let (identity, pki) = match identity {
            Some(identity) => {
                let pki = self.pki_of(&identity).await?;
                (identity, pki)
            }
            None => self.load().await?,
        };
        self.presented = Some(Files::of(&identity, &pki));
        Ok(self.take(identity, pki)?)
    }

    /// Presents `identity` and makes `pki` the node's: the transport's new handshakes, the
    /// signer, the operator-proof check and join tokens all use them from now on.
    fn take(&self, identity: Identity, pki: Pki) -> Result<SystemTime, TlsError> {
        self.quic.reload(&identity)?;
        self.node.inner.pki.set(pki);
        Ok(identity
            .chain
            .first()
            .and_then(tls::not_after)
            .unwrap_or(UNIX_EPOCH))
    }

    async fn pki_of(&self, identity: &Identity) -> Result<Pki, TlsError> {
        let (dir, identity) = (self.tls_dir.clone(), identity.clone());
        tokio::task::spawn_blocking(move || Pki::from_files(&identity, &dir))
            .await
            .unwrap_or_else(|e| Err(TlsError::Rustls(rustls::Error::General(e.to_string()))))
    }

    async fn load(&self) -> Result<(Identity, Pki), TlsError> {
        let (dir, name) = (self.tls_dir.clone(), self.name.clone());
        tokio::task::spawn_blocking(move || {
            let identity = Identity::load(&dir, &name)?;
            let pki = Pki::from_files(&identity, &dir)?;
            Ok((identity, pki))
        })
        .await
        .unwrap_or_else(|e| Err(TlsError::Rustls(rustls::Error::General(e.to_string()))))
    }
}

/// Whether PEM certificate `cert` names node `id` of `cluster`, is valid now under the active
/// CA of `ours` and is for `ours`'s key: a signer could otherwise hand a node a certificate it
/// cannot use (or one of a CA being retired), and the node would replace a working one with it.
fn issued_for(cert: &str, ours: &Identity, cluster: &str, id: NodeId) -> bool {
    use rustls::pki_types::pem::PemObject;
    let Ok(cert) = rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()) else {
        return false;
    };
    let spki = |c: &rustls::pki_types::CertificateDer<'_>| {
        x509_parser::parse_x509_certificate(c.as_ref())
            .ok()
            .map(|(_, p)| p.public_key().raw.to_vec())
    };
    let key_matches = matches!(
        (spki(&cert), ours.chain.first().and_then(spki)),
        (Some(a), Some(b)) if a == b
    );
    key_matches
        && tls::role_of(cluster, &cert) == PeerRole::Node(id)
        && ours.trust.is_active_issuer(&cert)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
