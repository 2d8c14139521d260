//! What a node trusts, signs with and presents, read from its certificate files and replaced
//! whole when they change (`crate::renewal` looks every minute and on `SIGHUP`).
//!
//! Why one cell: a CA rollover (`yard ca rotate`) changes the trusted CAs, the signing key and
//! the node's certificate while the node serves. Every reader (the QUIC configurations, the
//! operator-proof check, token joins and renewals) must see the same generation, and none may
//! keep the CA an operator removed.

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::pki_types::CertificateDer;

use crate::tls::{self, CertAuthority, Identity, TlsError, TrustBundle};

/// One generation of this node's PKI.
pub struct Pki {
    /// The CAs this node trusts, the active one first (None: an in-memory test cluster).
    pub trust: Option<TrustBundle>,
    /// Hashes of the trusted CAs, the active one first: what a join token must carry.
    pub ca_hashes: Vec<String>,
    /// Present on nodes that hold `ca.key`: only they sign certificates.
    pub signer: Option<Arc<CertAuthority>>,
    /// The certificate this node presents.
    pub presented: Option<CertificateDer<'static>>,
}

impl Pki {
    /// What `identity` and the CA key in `dir` (if there is one) give.
    pub fn from_files(identity: &Identity, dir: &Path) -> Result<Self, TlsError> {
        let key = dir.join("ca.key");
        let signer = if key.exists() {
            let pem = std::fs::read_to_string(&key).map_err(|source| TlsError::Read {
                path: key.clone(),
                source,
            })?;
            Some(Arc::new(
                CertAuthority::from_parts(&identity.trust, &pem).map_err(|e| match e {
                    TlsError::KeyMatchesNoCa(_) => TlsError::KeyMatchesNoCa(dir.to_owned()),
                    e => e,
                })?,
            ))
        } else {
            None
        };
        Ok(Self {
            ca_hashes: identity.trust.hashes(),
            trust: Some(identity.trust.clone()),
            signer,
            presented: identity.chain.first().cloned(),
        })
    }

    /// A node without certificate files (in-memory clusters): tokens carry `ca_hash`.
    pub fn without_files(signer: Option<Arc<CertAuthority>>, ca_hash: &str) -> Self {
        Self {
            trust: None,
            ca_hashes: vec![ca_hash.to_owned()],
            signer,
            presented: None,
        }
    }

    /// The active CA's hash: what a token made now carries.
    pub fn active_hash(&self) -> &str {
        self.ca_hashes.first().map_or("", String::as_str)
    }

    /// What a node that signs a certificate hands over as the CAs to trust: the whole bundle,
    /// so a host joining during a rollover trusts both CAs.
    pub fn trust_pem(&self) -> Option<String> {
        match (&self.trust, &self.signer) {
            (Some(trust), _) => Some(trust.pem()),
            (None, Some(ca)) => Some(ca.cert_pem.clone()),
            (None, None) => None,
        }
    }

    /// This node's answer to `yard ca rotate status`.
    pub fn report(&self) -> PkiReport {
        let trust = self.trust.as_ref();
        PkiReport {
            trusted: self.ca_hashes.clone(),
            issuer: self
                .presented
                .as_ref()
                .zip(trust)
                .and_then(|(leaf, trust)| trust.issuer_of(leaf)),
            not_after_unix: self
                .presented
                .as_ref()
                .and_then(tls::not_after)
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
            signs_with: self.signer.as_ref().map(|ca| ca.cert_hash()),
        }
    }
}

/// What a node tells `yard ca rotate status` about its PKI.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PkiReport {
    /// The CAs it trusts, the active one first.
    pub trusted: Vec<String>,
    /// The CA that signed the certificate it presents (None: none it trusts, or expired).
    pub issuer: Option<String>,
    /// When that certificate expires (Unix seconds).
    pub not_after_unix: u64,
    /// The CA whose key it holds and signs with, if it holds one.
    pub signs_with: Option<String>,
}

/// The node's current [`Pki`], swapped whole.
pub struct PkiCell(RwLock<Arc<Pki>>);

impl PkiCell {
    pub fn new(pki: Pki) -> Self {
        Self(RwLock::new(Arc::new(pki)))
    }

    /// The current generation.
    pub fn get(&self) -> Arc<Pki> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `pki` the current generation.
    pub fn set(&self, pki: Pki) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pki);
    }
}

impl std::fmt::Debug for PkiCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PkiCell")
            .field("ca_hashes", &self.get().ca_hashes)
            .finish()
    }
}
