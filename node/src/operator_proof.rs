//! An operator's signature that travels with its request.
//!
//! A follower or an agent forwards an operator's request to the leader over its own
//! connection, so the leader sees the forwarder's node certificate, not the admin's. Without
//! more, a compromised host (its key in an attacker's hands) could do any admin work by
//! forwarding requests no operator made. So the `yard` CLI signs every request with the admin
//! key it already presents in TLS: the signature covers the cluster's name, the request, its
//! session tag, a time and a random nonce, and carries the admin certificate. The leader takes
//! a forwarded operator write only with a proof that verifies: the certificate is an admin
//! certificate of this cluster's CA valid now, the signature matches, the time is within
//! [`MAX_SKEW_MS`] of the leader's clock, and the nonce was not used before (an untagged write;
//! a tagged write applies at most once by its tag, which the signature covers).
//!
//! What the proof does not cover: reads (every host holds the tables anyway) and the requests a
//! daemon makes about itself, which admission ties to the forwarder
//! (`crate::admission::needs_operator_proof`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{
    EcdsaKeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use yard_raft_store::SessionTag;

use crate::pki::{Pki, PkiCell};
use crate::rpc::AdminRequest;
use crate::tls::{self, PeerRole, TrustBundle};

/// How far a proof's time may be from the verifying node's clock, either way: the longest a
/// captured proof can be replayed for a tagged write, and how long nonces are remembered.
pub const MAX_SKEW_MS: u64 = 60_000;

/// The most nonces a leader remembers at once (two skew windows of untagged operator writes);
/// past it, new untagged writes are refused until old nonces age out.
pub const MAX_REMEMBERED: usize = 100_000;

/// What the signature is over, so a signature for one purpose is never one for another.
const DOMAIN: &[u8] = b"yard operator request v1\0";

tokio::task_local! {
    /// The proof of the operator request the current task serves, if it came with one: the
    /// forwarding code sends it on with the request. A task-local because the request passes
    /// through some twenty handlers between the dispatcher and the one place that forwards.
    pub static FORWARD_PROOF: Option<Arc<OperatorProof>>;
}

/// The proof of the current task's operator request, if any (see [`FORWARD_PROOF`]).
pub fn current() -> Option<Arc<OperatorProof>> {
    FORWARD_PROOF.try_with(Clone::clone).ok().flatten()
}

/// An operator's signature over one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorProof {
    /// The admin certificate (DER) whose key signed.
    pub cert: Vec<u8>,
    /// When the CLI signed, Unix milliseconds.
    pub issued_unix_ms: u64,
    /// Random, so that two equal requests have different proofs.
    pub nonce: [u8; 16],
    /// ECDSA P-256 with SHA-256 (ASN.1 DER) over the request's signed form.
    pub signature: Vec<u8>,
}

/// Why a proof could not be made or was refused; each renders as one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the admin key cannot sign requests: only ECDSA P-256 keys in PKCS#8 (what `yard ca` issues) can")]
    KeyType,
    #[error("the request does not encode for signing: {0}")]
    Encode(String),
    #[error("the system's random source failed")]
    Random,
    #[error("the operator's certificate is not an admin certificate of this cluster valid now")]
    NotAdmin,
    #[error("the operator's signature does not match the request")]
    BadSignature,
    #[error("the operator's request was signed {skew_ms} ms away from this node's clock, more than {max_ms} ms (are the clocks synchronised?)")]
    Skewed { skew_ms: u64, max_ms: u64 },
    #[error("the operator's request was already served once; a proof is good for one request")]
    Replayed,
    #[error(
        "more than {0} operator writes were signed in the last two minutes; try again shortly"
    )]
    TooMany(usize),
    #[error("the operator's signature could not be checked")]
    Unchecked,
}

/// The bytes a proof signs.
fn signed_form(
    cluster: &str,
    tag: Option<&SessionTag>,
    req: &AdminRequest,
    issued_unix_ms: u64,
    nonce: &[u8; 16],
) -> Result<Vec<u8>, ProofError> {
    let body = bincode::serde::encode_to_vec((tag, req), bincode::config::standard())
        .map_err(|e| ProofError::Encode(e.to_string()))?;
    let mut msg = Vec::with_capacity(DOMAIN.len() + cluster.len() + 25 + body.len());
    msg.extend_from_slice(DOMAIN);
    msg.extend_from_slice(cluster.as_bytes());
    msg.push(0);
    msg.extend_from_slice(&issued_unix_ms.to_be_bytes());
    msg.extend_from_slice(nonce);
    msg.extend_from_slice(&body);
    Ok(msg)
}

/// Signs requests with the operator's admin key (the CLI's side).
pub struct Signer {
    key: EcdsaKeyPair,
    cert: Vec<u8>,
    cluster: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl Signer {
    /// A signer for the admin certificate `cert` and its `key`.
    pub fn new(
        cluster: &str,
        cert: &CertificateDer<'_>,
        key: &PrivateKeyDer<'_>,
    ) -> Result<Self, ProofError> {
        let PrivateKeyDer::Pkcs8(pkcs8) = key else {
            return Err(ProofError::KeyType);
        };
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            pkcs8.secret_pkcs8_der(),
            &rng,
        )
        .map_err(|_| ProofError::KeyType)?;
        Ok(Self {
            key,
            cert: cert.as_ref().to_vec(),
            cluster: cluster.to_owned(),
            rng,
        })
    }

    /// A proof for `req` (with its session `tag`, if it is a tagged write), signed now.
    pub fn sign(
        &self,
        tag: Option<&SessionTag>,
        req: &AdminRequest,
        now_unix_ms: u64,
    ) -> Result<OperatorProof, ProofError> {
        let mut nonce = [0u8; 16];
        self.rng.fill(&mut nonce).map_err(|_| ProofError::Random)?;
        let msg = signed_form(&self.cluster, tag, req, now_unix_ms, &nonce)?;
        let signature = self
            .key
            .sign(&self.rng, &msg)
            .map_err(|_| ProofError::Random)?;
        Ok(OperatorProof {
            cert: self.cert.clone(),
            issued_unix_ms: now_unix_ms,
            nonce,
            signature: signature.as_ref().to_vec(),
        })
    }
}

/// Checks `proof` for `req`: an admin certificate of `cluster` signed by `ca` and valid now,
/// a matching signature, and a time within [`MAX_SKEW_MS`] of `now_unix_ms`. Replays are the
/// [`NonceBook`]'s to catch.
pub fn verify(
    ca: &TrustBundle,
    cluster: &str,
    proof: &OperatorProof,
    tag: Option<&SessionTag>,
    req: &AdminRequest,
    now_unix_ms: u64,
) -> Result<(), ProofError> {
    in_time(proof, now_unix_ms)?;
    let admin = admin_key(ca, cluster, &proof.cert, now_unix_ms)?;
    check_signature(&admin.public_key, cluster, proof, tag, req)
}

/// Whether `proof` was made within [`MAX_SKEW_MS`] of `now_unix_ms`, either way.
fn in_time(proof: &OperatorProof, now_unix_ms: u64) -> Result<(), ProofError> {
    let skew_ms = now_unix_ms.abs_diff(proof.issued_unix_ms);
    if skew_ms > MAX_SKEW_MS {
        return Err(ProofError::Skewed {
            skew_ms,
            max_ms: MAX_SKEW_MS,
        });
    }
    Ok(())
}

/// The CAs of `pki`; a node without certificate files takes no operator proof.
fn trust_of(pki: &Pki) -> Result<&TrustBundle, ProofError> {
    pki.trust.as_ref().ok_or(ProofError::NotAdmin)
}

/// An admin certificate that verified: its public key, and when it stops being valid.
#[derive(Debug, Clone)]
struct Admin {
    public_key: Vec<u8>,
    not_after_unix_ms: u64,
}

/// The public key of `cert` if it is an admin certificate of `cluster` signed by `ca`, valid
/// now by the system clock and at `now_unix_ms`.
fn admin_key(
    ca: &TrustBundle,
    cluster: &str,
    cert: &[u8],
    now_unix_ms: u64,
) -> Result<Admin, ProofError> {
    let der = CertificateDer::from(cert);
    if !tls::verify_client_cert(ca, &der) || tls::role_of(cluster, &der) != PeerRole::Admin {
        return Err(ProofError::NotAdmin);
    }
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert).map_err(|_| ProofError::NotAdmin)?;
    let not_after = parsed.validity().not_after.timestamp();
    let not_after_unix_ms = u64::try_from(not_after).unwrap_or(0).saturating_mul(1000);
    if now_unix_ms >= not_after_unix_ms {
        return Err(ProofError::NotAdmin);
    }
    Ok(Admin {
        public_key: parsed.public_key().subject_public_key.data.to_vec(),
        not_after_unix_ms,
    })
}

fn check_signature(
    public_key: &[u8],
    cluster: &str,
    proof: &OperatorProof,
    tag: Option<&SessionTag>,
    req: &AdminRequest,
) -> Result<(), ProofError> {
    let msg = signed_form(cluster, tag, req, proof.issued_unix_ms, &proof.nonce)?;
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, public_key)
        .verify(&msg, &proof.signature)
        .map_err(|_| ProofError::BadSignature)
}

/// The most admin certificates a node remembers as verified.
const ADMINS_REMEMBERED: usize = 64;

/// The nonces of the untagged operator writes a leader served in the last two skew windows.
#[derive(Debug, Default)]
pub struct NonceBook {
    /// Nonce -> when it may be forgotten (its proof's time plus the skew window).
    seen: HashMap<[u8; 16], u64>,
    /// The same, ordered by when each may be forgotten.
    by_expiry: BTreeSet<(u64, [u8; 16])>,
}

impl NonceBook {
    /// Records `proof`'s nonce, or refuses it if it was seen within the window or the book is
    /// full; forgets the nonces whose proofs can no longer pass the time check.
    pub fn admit(&mut self, proof: &OperatorProof, now_unix_ms: u64) -> Result<(), ProofError> {
        while let Some(&(expiry, nonce)) = self.by_expiry.first() {
            if expiry >= now_unix_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.seen.remove(&nonce);
        }
        if self.seen.contains_key(&proof.nonce) {
            return Err(ProofError::Replayed);
        }
        if self.seen.len() >= MAX_REMEMBERED {
            return Err(ProofError::TooMany(MAX_REMEMBERED));
        }
        let expiry = proof.issued_unix_ms.saturating_add(MAX_SKEW_MS);
        self.seen.insert(proof.nonce, expiry);
        self.by_expiry.insert((expiry, proof.nonce));
        Ok(())
    }

    /// How many nonces are remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// What a node checks forwarded operator requests with.
#[derive(Debug)]
pub struct ProofCheck {
    /// The node's PKI: the CAs an admin certificate must come from, as they are now.
    pki: Arc<PkiCell>,
    cluster: String,
    nonces: Mutex<NonceBook>,
    /// Admin certificates already verified against the CAs, until their expiry: the chain check
    /// is an ECDSA verification and a parse, as costly as the request's own signature, and an
    /// operator's certificate is the same for every request it makes (admin certificates are
    /// not revoked, only expire). Kept for one generation of the PKI: an admin certificate of
    /// a CA the operator stopped trusting is refused from its next request on.
    admins: Mutex<Admins>,
}

#[derive(Debug, Default)]
struct Admins {
    /// The generation the certificates were verified under.
    under: Option<usize>,
    known: HashMap<Vec<u8>, Admin>,
}

impl ProofCheck {
    /// Checks against the CAs `pki` trusts (whatever they are at the time of a check) and the
    /// cluster's name.
    pub fn new(pki: Arc<PkiCell>, cluster: &str) -> Self {
        Self {
            pki,
            cluster: cluster.to_owned(),
            nonces: Mutex::new(NonceBook::default()),
            admins: Mutex::new(Admins::default()),
        }
    }

    /// [`verify`] (with admin certificates remembered), then, for an untagged request, the
    /// [`NonceBook`].
    pub fn check(
        &self,
        proof: &OperatorProof,
        tag: Option<&SessionTag>,
        req: &AdminRequest,
        now_unix_ms: u64,
    ) -> Result<(), ProofError> {
        in_time(proof, now_unix_ms)?;
        let pki = self.pki.get();
        let generation = Arc::as_ptr(&pki) as usize;
        let known = {
            let mut admins = self.admins.lock().unwrap_or_else(|e| e.into_inner());
            if admins.under != Some(generation) {
                *admins = Admins {
                    under: Some(generation),
                    known: HashMap::new(),
                };
            }
            admins
                .known
                .get(&proof.cert)
                .filter(|a| now_unix_ms < a.not_after_unix_ms)
                .cloned()
        };
        let admin = match known {
            Some(admin) => admin,
            None => {
                let admin = admin_key(trust_of(&pki)?, &self.cluster, &proof.cert, now_unix_ms)?;
                let mut admins = self.admins.lock().unwrap_or_else(|e| e.into_inner());
                if admins.under == Some(generation) {
                    if admins.known.len() >= ADMINS_REMEMBERED {
                        admins.known.clear();
                    }
                    admins.known.insert(proof.cert.clone(), admin.clone());
                }
                admin
            }
        };
        check_signature(&admin.public_key, &self.cluster, proof, tag, req)?;
        if tag.is_none() {
            self.nonces
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .admit(proof, now_unix_ms)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls_pki_types::pem::PemObject;

    use super::*;
    use crate::tls::CertAuthority;

    const NOW: u64 = 1_796_000_000_000;

    struct Cluster {
        ca: TrustBundle,
        signer: Signer,
        authority: CertAuthority,
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn cluster(name: &str) -> Cluster {
        let authority = CertAuthority::generate(name).unwrap();
        let admin = authority
            .sign_admin(name, Duration::from_secs(3600))
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(admin.key.as_bytes()).unwrap();
        let signer = Signer::new(name, &der(&admin.cert), &key).unwrap();
        Cluster {
            ca: TrustBundle::of(&[&authority.cert_pem]).unwrap(),
            signer,
            authority,
        }
    }

    fn cell(c: &Cluster) -> Arc<PkiCell> {
        Arc::new(PkiCell::new(Pki {
            ca_hashes: c.ca.hashes(),
            trust: Some(c.ca.clone()),
            signer: None,
            presented: None,
        }))
    }

    fn put(value: &str) -> AdminRequest {
        AdminRequest::KvPut {
            key: "k".into(),
            value: value.into(),
        }
    }

    #[test]
    fn a_signed_request_verifies_and_any_change_to_it_does_not() {
        let c = cluster("c1");
        let tag = SessionTag {
            client: 7,
            seq: 3,
            first_unacked: 3,
        };
        let proof = c.signer.sign(Some(&tag), &put("a"), NOW).unwrap();
        assert_eq!(
            verify(&c.ca, "c1", &proof, Some(&tag), &put("a"), NOW),
            Ok(())
        );
        let bad = Err(ProofError::BadSignature);
        assert_eq!(verify(&c.ca, "c1", &proof, Some(&tag), &put("b"), NOW), bad);
        assert_eq!(verify(&c.ca, "c1", &proof, None, &put("a"), NOW), bad);
        let retagged = SessionTag { seq: 4, ..tag };
        assert_eq!(
            verify(&c.ca, "c1", &proof, Some(&retagged), &put("a"), NOW),
            bad
        );
        let mut late = proof.clone();
        late.issued_unix_ms += 1;
        assert_eq!(verify(&c.ca, "c1", &late, Some(&tag), &put("a"), NOW), bad);
    }

    #[test]
    fn a_node_certificate_or_another_clusters_admin_proves_nothing() {
        let c = cluster("c1");
        let other = cluster("c1");
        let proof = other.signer.sign(None, &put("a"), NOW).unwrap();
        assert_eq!(
            verify(&c.ca, "c1", &proof, None, &put("a"), NOW),
            Err(ProofError::NotAdmin),
            "an admin certificate of another CA"
        );
        let node = c
            .authority
            .sign_node("c1", "n3", 3, &[], Duration::from_secs(3600))
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(node.key.as_bytes()).unwrap();
        let host = Signer::new("c1", &der(&node.cert), &key).unwrap();
        let proof = host.sign(None, &put("a"), NOW).unwrap();
        assert_eq!(
            verify(&c.ca, "c1", &proof, None, &put("a"), NOW),
            Err(ProofError::NotAdmin),
            "a host's own certificate"
        );
    }

    #[test]
    fn a_proof_from_far_away_in_time_is_refused() {
        let c = cluster("c1");
        let proof = c.signer.sign(None, &put("a"), NOW).unwrap();
        assert!(verify(&c.ca, "c1", &proof, None, &put("a"), NOW + MAX_SKEW_MS).is_ok());
        assert!(matches!(
            verify(&c.ca, "c1", &proof, None, &put("a"), NOW + MAX_SKEW_MS + 1),
            Err(ProofError::Skewed { .. })
        ));
        assert!(matches!(
            verify(&c.ca, "c1", &proof, None, &put("a"), NOW - MAX_SKEW_MS - 1),
            Err(ProofError::Skewed { .. })
        ));
    }

    #[test]
    fn an_untagged_proof_serves_once_and_is_forgotten_after_its_window() {
        let c = cluster("c1");
        let check = ProofCheck::new(cell(&c), "c1");
        let req = AdminRequest::MembersRemove { id: 4 };
        let proof = c.signer.sign(None, &req, NOW).unwrap();
        assert_eq!(check.check(&proof, None, &req, NOW), Ok(()));
        assert_eq!(
            check.check(&proof, None, &req, NOW + 1),
            Err(ProofError::Replayed)
        );
        let mut book = NonceBook::default();
        book.admit(&proof, NOW).unwrap();
        book.admit(&c.signer.sign(None, &req, NOW + 10).unwrap(), NOW + 10)
            .unwrap();
        assert_eq!(book.len(), 2);
        let later = c.signer.sign(None, &req, NOW + MAX_SKEW_MS + 5).unwrap();
        book.admit(&later, NOW + MAX_SKEW_MS + 5).unwrap();
        assert_eq!(book.len(), 2, "the first nonce aged out");
    }

    /// Issue 28: once a CA rollover drops the CA an admin certificate came from, the check
    /// refuses the certificate from the next request on, though it verified and was remembered.
    #[test]
    fn an_admin_certificate_of_a_dropped_ca_is_refused_though_it_was_remembered() {
        let c = cluster("c1");
        let next = CertAuthority::generate("c1").unwrap();
        let pki_of = |trust: TrustBundle| Pki {
            ca_hashes: trust.hashes(),
            trust: Some(trust),
            signer: None,
            presented: None,
        };
        let both = TrustBundle::of(&[&c.authority.cert_pem, &next.cert_pem]).unwrap();
        let pki = Arc::new(PkiCell::new(pki_of(both)));
        let check = ProofCheck::new(pki.clone(), "c1");
        let first = c.signer.sign(None, &put("a"), NOW).unwrap();
        assert_eq!(check.check(&first, None, &put("a"), NOW), Ok(()));
        pki.set(pki_of(TrustBundle::of(&[&next.cert_pem]).unwrap()));
        let second = c.signer.sign(None, &put("b"), NOW + 1).unwrap();
        assert_eq!(
            check.check(&second, None, &put("b"), NOW + 1),
            Err(ProofError::NotAdmin)
        );
    }

    #[test]
    fn a_remembered_admin_certificate_still_needs_a_matching_signature() {
        let c = cluster("c1");
        let check = ProofCheck::new(cell(&c), "c1");
        let first = c.signer.sign(None, &put("a"), NOW).unwrap();
        check.check(&first, None, &put("a"), NOW).unwrap();
        let mut forged = c.signer.sign(None, &put("b"), NOW).unwrap();
        forged.signature = first.signature.clone();
        assert_eq!(
            check.check(&forged, None, &put("b"), NOW),
            Err(ProofError::BadSignature)
        );
        // Past the certificate's expiry (an hour from now) the cache does not vouch for it.
        let now = crate::service::now_unix_ms();
        check
            .check(
                &c.signer.sign(None, &put("c"), now).unwrap(),
                None,
                &put("c"),
                now,
            )
            .unwrap();
        let later = now + 7_200_000;
        let expired = c.signer.sign(None, &put("d"), later).unwrap();
        assert_eq!(
            check.check(&expired, None, &put("d"), later),
            Err(ProofError::NotAdmin)
        );
    }

    #[test]
    fn a_tagged_write_may_arrive_twice_with_one_proof() {
        let c = cluster("c1");
        let check = ProofCheck::new(cell(&c), "c1");
        let tag = SessionTag {
            client: 1,
            seq: 1,
            first_unacked: 1,
        };
        let proof = c.signer.sign(Some(&tag), &put("a"), NOW).unwrap();
        assert_eq!(check.check(&proof, Some(&tag), &put("a"), NOW), Ok(()));
        assert_eq!(check.check(&proof, Some(&tag), &put("a"), NOW + 5), Ok(()));
    }
}
