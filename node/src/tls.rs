//! The cluster's PKI: a CA made with rcgen, node certificates whose SAN `node-<id>.<cluster>`
//! names the node, admin certificates whose SAN `admin.<cluster>` carries the admin role, and
//! the rustls/quinn configurations that enforce them.
//!
//! Mutual TLS always: the server asks every client for a certificate from the cluster CA. A
//! client without one is let through the handshake only so it can present a join token; the
//! server then allows it nothing else (see [`PeerRole::Anonymous`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// ALPN protocol of every yard connection.
pub const ALPN: &[u8] = b"yard/1";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no valid PEM {what}")]
    Pem { path: PathBuf, what: &'static str },
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("tls configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("{0} already exists; refusing to overwrite a CA")]
    Exists(PathBuf),
    #[error("invalid certificate name {0:?}: use letters, digits and '-'")]
    BadName(String),
    #[error("the certificate signing request is malformed or its signature does not verify")]
    BadRequest,
    #[error("a certificate validity of {0:?} is too short; use at least 10s")]
    ShortValidity(std::time::Duration),
    #[error("{}/ca.key belongs to none of the CA certificates in its ca.crt", .0.display())]
    KeyMatchesNoCa(PathBuf),
}

/// How long a node certificate is valid by default (`tls.cert_validity_s`). The node renews
/// its own when a third of that is left ([`yard_control::cert_renewal`]), so a certificate that
/// leaves the cluster with a host that is never removed stops working within this period.
pub const NODE_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// How long an admin certificate is valid by default: a year, as kubeadm's are. Nothing renews
/// it; the operator issues a new one with `yard ca admin`.
pub const ADMIN_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long a cluster CA is valid: ten years, as kubeadm's. Rolling a CA over is an operation
/// of its own (a bundle with both CAs), not a renewal.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The shortest validity anything is signed with: a shorter one could expire between signing
/// and use on a loaded host, and is a mistake rather than a policy.
pub const MIN_VALIDITY: Duration = Duration::from_secs(10);

/// Gives `params` the window [now - skew, now + validity], where skew (a tenth of the validity,
/// at most five minutes) lets a peer whose clock is a little behind accept the certificate.
fn valid_for(params: &mut CertificateParams, validity: Duration) -> Result<(), TlsError> {
    if validity < MIN_VALIDITY {
        return Err(TlsError::ShortValidity(validity));
    }
    let skew = (validity / 10).min(Duration::from_secs(300));
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - skew;
    params.not_after = now + validity;
    Ok(())
}

/// When a certificate stops being valid, from its DER.
pub fn not_after(cert: &CertificateDer<'_>) -> Option<SystemTime> {
    validity(cert).map(|(_, after)| after)
}

/// A certificate's validity window [not before, not after], from its DER.
pub fn validity(cert: &CertificateDer<'_>) -> Option<(SystemTime, SystemTime)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let at = |secs: i64| {
        u64::try_from(secs)
            .ok()
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
    };
    let v = parsed.validity();
    Some((at(v.not_before.timestamp())?, at(v.not_after.timestamp())?))
}

/// A request for a renewed certificate: a CSR over the node's existing key. The key is kept,
/// not rotated: the node's QUIC stateless-reset and connection-id keys are derived from it
/// ([`endpoint_config`]), and a new key would make a restarted node unable to reset its
/// previous process's connections. The signer takes only the public key from the request; the
/// names come from what the cluster knows of the node.
pub fn renewal_request(key_pem: &str) -> Result<Vec<u8>, TlsError> {
    let key = KeyPair::from_pem(key_pem).map_err(|_| TlsError::BadRequest)?;
    let csr = CertificateParams::new(Vec::<String>::new())?.serialize_request(&key)?;
    Ok(csr.der().to_vec())
}

/// The SAN a node's certificate carries.
pub fn node_san(cluster: &str, id: u64) -> String {
    format!("node-{id}.{cluster}")
}

/// The SAN an admin certificate carries.
pub fn admin_san(cluster: &str) -> String {
    format!("admin.{cluster}")
}

/// Who is on the other end of a connection, from its verified client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    /// A cluster node; the id comes from its certificate.
    Node(u64),
    /// An operator's admin certificate.
    Admin,
    /// No client certificate: may only redeem a join token.
    Anonymous,
}

/// Reads the role from a DER client certificate already verified against the CA.
pub fn role_of(cluster: &str, cert: &CertificateDer<'_>) -> PeerRole {
    let admin = admin_san(cluster);
    for name in dns_sans(cert) {
        if name == admin {
            return PeerRole::Admin;
        }
        if let Some(id) = node_id_of_san(cluster, &name) {
            return PeerRole::Node(id);
        }
    }
    PeerRole::Anonymous
}

fn node_id_of_san(cluster: &str, san: &str) -> Option<u64> {
    san.strip_prefix("node-")?
        .strip_suffix(cluster)?
        .strip_suffix('.')?
        .parse()
        .ok()
}

fn dns_sans(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(s) => Some((*s).to_owned()),
            _ => None,
        })
        .collect()
}

/// SHA-256 of the CA certificate (DER), hex: what a join token pins.
pub fn ca_hash(ca: &CertificateDer<'_>) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, ca.as_ref()).as_ref())
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn write(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    write_file(path, contents.as_bytes(), secret)
}

/// Writes `contents` to `path` whole or not at all (see below); `secret`: mode 0600 from the
/// file's creation.
pub fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    // Every file is written to a new file and then renamed over the old one. A key's new file
    // is 0600 from its creation: writing in place and narrowing afterwards left a window in
    // which another local user could open it. A certificate is replaced whole because a
    // running node renews its own: a crash mid-write must leave the old one, not half of each.
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map_or("key".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        use std::io::Write;
        let mut file = if secret {
            create_secret(&tmp)?
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?
        };
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// Creates `path` for a secret: a new file (never one that exists, which another user could
/// have prepared) with mode 0600 given at creation, so it is never readable by others.
pub fn create_secret(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

fn check_name(name: &str) -> Result<(), TlsError> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(TlsError::BadName(name.to_owned()));
    }
    Ok(())
}

/// PEM strings of one certificate and its key.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CertPem {
    pub cert: String,
    pub key: String,
}

/// A loaded CA able to sign node and admin certificates.
pub struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
}

impl CertAuthority {
    /// Generates a new CA for `cluster`.
    pub fn generate(cluster: &str) -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        // The creation time in the name: during a rollover two CAs of one cluster are trusted
        // side by side, and an operator (and a path builder) tells them apart by subject.
        let made = time::OffsetDateTime::now_utc().unix_timestamp();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("yard cluster CA {cluster} {made}"),
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        valid_for(&mut params, CA_VALIDITY)?;
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads `ca.key` from `dir` and, from the bundle in `ca.crt`, the CA certificate of that
    /// key: during a rollover the bundle holds two CAs and the key says which one signs here.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let trust = load_trust(dir)?;
        let key_pem = String::from_utf8_lossy(&read(&dir.join("ca.key"))?).into_owned();
        Self::from_parts(&trust, &key_pem).map_err(|e| match e {
            TlsError::KeyMatchesNoCa(_) => TlsError::KeyMatchesNoCa(dir.to_owned()),
            _ => TlsError::Pem {
                path: dir.join("ca.key"),
                what: "private key",
            },
        })
    }

    /// The CA of `key_pem` among `trust`'s certificates.
    pub fn from_parts(trust: &TrustBundle, key_pem: &str) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(|_| TlsError::Pem {
            path: PathBuf::from("ca.key"),
            what: "private key",
        })?;
        let (der, pem) = trust
            .certs
            .iter()
            .find(|(der, _)| public_key_of(der).as_deref() == Some(key.public_key_raw()))
            .ok_or_else(|| TlsError::KeyMatchesNoCa(PathBuf::from(".")))?;
        let issuer = Issuer::from_ca_cert_der(der, key)?;
        Ok(Self {
            issuer,
            cert_pem: pem.clone(),
        })
    }

    /// [`ca_hash`] of this CA's certificate: how a bundle, a token and `yard ca rotate status`
    /// name it.
    pub fn cert_hash(&self) -> String {
        TrustBundle::of(&[&self.cert_pem]).map_or_else(String::new, |b| ca_hash(b.active()))
    }

    /// The CA's private key, PEM (what `yard ca rotate` moves between files).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The parameters of a leaf certificate: its names, both TLS uses and its validity.
    fn leaf(
        common_name: &str,
        dns: Vec<String>,
        ips: &[IpAddr],
        validity: Duration,
    ) -> Result<CertificateParams, TlsError> {
        let mut params = CertificateParams::new(dns)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        valid_for(&mut params, validity)?;
        Ok(params)
    }

    /// Signs a certificate with the given DNS and IP SANs for a new key.
    fn sign(
        &self,
        common_name: &str,
        dns: Vec<String>,
        ips: &[IpAddr],
        validity: Duration,
    ) -> Result<CertPem, TlsError> {
        let key = KeyPair::generate()?;
        let cert = Self::leaf(common_name, dns, ips, validity)?.signed_by(&key, &self.issuer)?;
        Ok(CertPem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// Signs a node certificate for a new key: SAN `node-<id>.<cluster>` plus `ips`.
    pub fn sign_node(
        &self,
        cluster: &str,
        name: &str,
        id: u64,
        ips: &[IpAddr],
        validity: Duration,
    ) -> Result<CertPem, TlsError> {
        check_name(name)?;
        self.sign(name, vec![node_san(cluster, id)], ips, validity)
    }

    /// Renews node `id`'s certificate for the key its renewal request `csr` proves: the
    /// request's signature must verify, and only its public key is used. The names are the
    /// caller's (what the cluster knows of the node), never the request's. Returns the PEM.
    pub fn renew_node(
        &self,
        cluster: &str,
        name: &str,
        id: u64,
        ips: &[IpAddr],
        validity: Duration,
        csr: &[u8],
    ) -> Result<String, TlsError> {
        check_name(name)?;
        let der = rustls::pki_types::CertificateSigningRequestDer::from(csr);
        let request = rcgen::CertificateSigningRequestParams::from_der(&der)
            .map_err(|_| TlsError::BadRequest)?;
        let params = Self::leaf(name, vec![node_san(cluster, id)], ips, validity)?;
        Ok(params.signed_by(&request.public_key, &self.issuer)?.pem())
    }

    /// Signs an admin certificate: SAN `admin.<cluster>`.
    pub fn sign_admin(&self, cluster: &str, validity: Duration) -> Result<CertPem, TlsError> {
        self.sign("yard admin", vec![admin_san(cluster)], &[], validity)
    }
}

/// `yard ca init`: writes ca.crt/ca.key and admin.crt/admin.key into `dir`; the admin
/// certificate is valid for `admin_validity`.
pub fn init_ca_dir(dir: &Path, cluster: &str, admin_validity: Duration) -> Result<(), TlsError> {
    if dir.join("ca.key").exists() {
        return Err(TlsError::Exists(dir.join("ca.key")));
    }
    let ca = CertAuthority::generate(cluster)?;
    write(&dir.join("ca.crt"), &ca.cert_pem, false)?;
    write(&dir.join("ca.key"), &ca.key_pem(), true)?;
    let admin = ca.sign_admin(cluster, admin_validity)?;
    write_cert(dir, "admin", &admin)
}

/// `yard ca admin`: writes a new admin.crt/admin.key signed by the CA in `dir`.
pub fn issue_admin_cert(dir: &Path, cluster: &str, validity: Duration) -> Result<(), TlsError> {
    let ca = CertAuthority::load(dir)?;
    let pem = ca.sign_admin(cluster, validity)?;
    write_cert(dir, "admin", &pem)
}

/// `yard ca issue`: writes `<name>.crt`/`<name>.key` signed by the CA in `dir`.
pub fn issue_node_cert(
    dir: &Path,
    cluster: &str,
    name: &str,
    id: u64,
    ips: &[IpAddr],
    validity: Duration,
) -> Result<(), TlsError> {
    let ca = CertAuthority::load(dir)?;
    let pem = ca.sign_node(cluster, name, id, ips, validity)?;
    write_cert(dir, name, &pem)
}

/// Writes a renewed `<name>.crt` into `dir` (the key stays: see [`renewal_request`]).
pub fn write_renewed_cert(dir: &Path, name: &str, cert_pem: &str) -> Result<(), TlsError> {
    write(&dir.join(format!("{name}.crt")), cert_pem, false)
}

/// Writes `<name>.crt` and `<name>.key` into `dir`.
pub fn write_cert(dir: &Path, name: &str, pem: &CertPem) -> Result<(), TlsError> {
    write(&dir.join(format!("{name}.crt")), &pem.cert, false)?;
    write(&dir.join(format!("{name}.key")), &pem.key, true)
}

/// Writes `ca.crt` into `dir`.
pub fn write_ca_cert(dir: &Path, pem: &str) -> Result<(), TlsError> {
    write(&dir.join("ca.crt"), pem, false)
}

/// The CA certificates a node trusts, as `ca.crt` holds them: one CA, or two while a CA is
/// rolled over (`yard ca rotate`). The first is the active CA, the one certificates are
/// signed by: a node whose certificate another CA of the bundle signed asks for a new one
/// (see [`TrustBundle::is_active_issuer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    /// Each CA as DER and as the PEM block it was read from.
    certs: Vec<(CertificateDer<'static>, String)>,
}

impl TrustBundle {
    /// Every `CERTIFICATE` block of `text`, in order; None without one or with one that is not
    /// a certificate.
    pub fn from_pem(text: &str) -> Option<Self> {
        const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
        const END: &str = "-----END CERTIFICATE-----";
        let mut certs = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find(BEGIN) {
            let end = rest[start..].find(END)? + start + END.len();
            let block = format!("{}\n", &rest[start..end]);
            let der = CertificateDer::from_pem_slice(block.as_bytes()).ok()?;
            certs.push((der, block));
            rest = &rest[end..];
        }
        (!certs.is_empty()).then_some(Self { certs })
    }

    /// A bundle of the CAs given as PEM, in this order (the first active).
    pub fn of(pems: &[&str]) -> Option<Self> {
        Self::from_pem(&pems.concat())
    }

    /// The active CA.
    pub fn active(&self) -> &CertificateDer<'static> {
        &self.certs[0].0
    }

    /// The CA certificates, the active one first.
    pub fn certs(&self) -> impl Iterator<Item = &CertificateDer<'static>> {
        self.certs.iter().map(|(der, _)| der)
    }

    /// Each CA's PEM block, the active one first.
    pub fn pems(&self) -> impl Iterator<Item = &str> {
        self.certs.iter().map(|(_, pem)| pem.as_str())
    }

    /// How many CAs are trusted.
    pub fn len(&self) -> usize {
        self.certs.len()
    }

    /// Never: a bundle holds at least one CA.
    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }

    /// [`ca_hash`] of each CA, the active one first.
    pub fn hashes(&self) -> Vec<String> {
        self.certs().map(|c| ca_hash(c)).collect()
    }

    /// What `ca.crt` holds: every CA's PEM block, the active one first.
    pub fn pem(&self) -> String {
        self.certs.iter().map(|(_, pem)| pem.as_str()).collect()
    }

    /// The hash of the bundle's CA that signed `cert` (valid now), if one did.
    pub fn issuer_of(&self, cert: &CertificateDer<'_>) -> Option<String> {
        self.certs
            .iter()
            .find(|(ca, _)| verify_client_cert_by(ca, cert))
            .map(|(ca, _)| ca_hash(ca))
    }

    /// Whether the active CA signed `cert`: a node presenting a certificate of another CA
    /// renews it, which is how certificates move to a new CA during a rollover.
    pub fn is_active_issuer(&self, cert: &CertificateDer<'_>) -> bool {
        verify_client_cert_by(self.active(), cert)
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut roots = RootCertStore::empty();
        for ca in self.certs() {
            roots.add(ca.clone())?;
        }
        Ok(Arc::new(roots))
    }
}

/// The public key a certificate carries (the key bytes, without the algorithm).
fn public_key_of(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .ok()
        .map(|(_, p)| p.public_key().subject_public_key.data.to_vec())
}

/// A certificate chain and key to present, plus the CAs to trust.
#[derive(Debug)]
pub struct Identity {
    pub trust: TrustBundle,
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            trust: self.trust.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// Loads the CA bundle from `dir/ca.crt`.
pub fn load_trust(dir: &Path) -> Result<TrustBundle, TlsError> {
    let path = dir.join("ca.crt");
    TrustBundle::from_pem(&String::from_utf8_lossy(&read(&path)?)).ok_or(TlsError::Pem {
        path,
        what: "certificate",
    })
}

impl Identity {
    /// Loads `ca.crt`, `<name>.crt` and `<name>.key` from `dir`. The CAs are appended to the
    /// chain so a token-holding joiner, which has only a CA's hash, can check it.
    pub fn load(dir: &Path, name: &str) -> Result<Self, TlsError> {
        let trust = load_trust(dir)?;
        let cert_path = dir.join(format!("{name}.crt"));
        let key_path = dir.join(format!("{name}.key"));
        let leaf =
            CertificateDer::from_pem_slice(&read(&cert_path)?).map_err(|_| TlsError::Pem {
                path: cert_path,
                what: "certificate",
            })?;
        let key = PrivateKeyDer::from_pem_slice(&read(&key_path)?).map_err(|_| TlsError::Pem {
            path: key_path,
            what: "private key",
        })?;
        let mut chain = vec![leaf];
        chain.extend(trust.certs().cloned());
        Ok(Self { chain, trust, key })
    }
}

/// The crypto provider of every TLS configuration the node builds (QUIC and the alert
/// webhook): `ring`, so the process carries one TLS implementation.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(std::time::Duration::from_millis(500)));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(std::time::Duration::from_secs(3)).expect("3 s fits"),
    ));
    t.max_concurrent_bidi_streams(1024u32.into());
    Arc::new(t)
}

/// Request streams a client may open before the server knows its role: what a peer without a
/// certificate keeps. `transport::serve` raises it for a certificate's holder once the
/// handshake named it (QUIC can raise a stream limit, never lower it).
pub const UNAUTHENTICATED_STREAMS: u32 = 4;

/// Bytes a client may have in flight on a connection before the server knows its role
/// (flow-control credit over all its streams): what a peer without a certificate keeps, so
/// that quinn buffers no more than this for it however many frames it starts and stalls.
pub const UNAUTHENTICATED_WINDOW: u32 = 64 * 1024;

/// The server side's QUIC settings: the client's transport, with the credit a client gets
/// before its role is known kept to what an anonymous peer needs (see [`UNAUTHENTICATED_STREAMS`]).
fn server_transport_config() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(std::time::Duration::from_millis(500)));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(std::time::Duration::from_secs(3)).expect("3 s fits"),
    ));
    t.max_concurrent_bidi_streams(UNAUTHENTICATED_STREAMS.into());
    t.max_concurrent_uni_streams(0u32.into());
    t.receive_window(UNAUTHENTICATED_WINDOW.into());
    Arc::new(t)
}

/// This node's QUIC endpoint settings: a stateless-reset key and a connection-id key derived
/// from the node's private key, the same in every incarnation of the node.
///
/// Why: a node killed and started again (a crash, an upgrade) knows none of its peers'
/// connections, and with a random key per process it cannot prove to them that they are gone.
/// They kept sending on the dead connection until QUIC's idle timeout (seconds), so a restarted
/// Raft leader heard no lease renewals and revoked the leases of nodes that were renewing all
/// along. With the key derived from the identity, the new process answers the first packet on
/// an old connection with a stateless reset (RFC 9000 §10.3) and the peer dials again at once.
/// quinn answers only packets whose connection id its generator recognises as its own, so the
/// generator's key is derived the same way. The keys stay secret: they are hashes of the
/// private key, which never leaves the node.
pub fn endpoint_config(identity: &Identity) -> quinn::EndpointConfig {
    let derive = |purpose: &[u8]| {
        let mut seed = ring::digest::Context::new(&ring::digest::SHA256);
        seed.update(purpose);
        seed.update(identity.key.secret_der());
        seed.finish()
    };
    let reset = derive(b"yard quic stateless reset key v1\0");
    let cid = derive(b"yard quic connection id key v1\0");
    let cid_key = u64::from_le_bytes(cid.as_ref()[..8].try_into().expect("a sha-256 has 8 bytes"));
    let mut cfg = quinn::EndpointConfig::new(Arc::new(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        reset.as_ref(),
    )));
    cfg.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    cfg
}

/// The server side: presents `identity`, asks every client for a CA-signed certificate but lets
/// certificate-less clients through to redeem a join token.
pub fn server_config(identity: &Identity) -> Result<quinn::ServerConfig, TlsError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        identity.trust.roots()?,
        provider(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(cfg)
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(server_transport_config());
    Ok(server)
}

/// Whether `cert` is valid now as a client certificate signed by one of `trust`'s CAs (what
/// every node checks when the holder connects).
pub fn verify_client_cert(trust: &TrustBundle, cert: &CertificateDer<'_>) -> bool {
    trust.roots().is_ok_and(|roots| verify_under(roots, cert))
}

fn verify_client_cert_by(ca: &CertificateDer<'static>, cert: &CertificateDer<'_>) -> bool {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).is_ok() && verify_under(Arc::new(roots), cert)
}

fn verify_under(roots: Arc<RootCertStore>, cert: &CertificateDer<'_>) -> bool {
    let Ok(verifier) =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider()).build()
    else {
        return false;
    };
    verifier
        .verify_client_cert(cert, &[], UnixTime::now())
        .is_ok()
}

/// How a client decides whom it trusts.
#[derive(Debug, Clone)]
pub enum Trust {
    /// The cluster's CA bundle.
    Ca(TrustBundle),
    /// Only the CA's SHA-256 (from a join token): the server must send the CA in its chain.
    CaHash(String),
}

/// The client side: trusts `trust`, presents `identity` if any, and accepts any server whose
/// certificate names a node of `cluster` (the exact node is then checked by SAN when dialling
/// by id, see [`expected_server_name`]).
pub fn client_config(
    cluster: &str,
    trust: Trust,
    identity: Option<&Identity>,
) -> Result<quinn::ClientConfig, TlsError> {
    let verifier = Arc::new(ClusterNodeVerifier {
        cluster: cluster.to_owned(),
        trust,
        provider: provider(),
    });
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut cfg = match identity {
        Some(id) => builder.with_client_auth_cert(id.chain.clone(), id.key.clone_key())?,
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(cfg)
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(transport_config());
    Ok(client)
}

/// The server name to dial: the target's SAN when its id is known, else a wildcard marker that
/// [`ClusterNodeVerifier`] resolves to whatever node SAN the certificate carries.
pub fn expected_server_name(cluster: &str, id: Option<u64>) -> String {
    match id {
        Some(id) => node_san(cluster, id),
        None => format!("any-node.{cluster}"),
    }
}

/// Verifies a server certificate against the cluster CA (or its pinned hash) and checks that it
/// names a node: exactly the expected node when dialled by id, any node otherwise. Never an
/// admin certificate.
#[derive(Debug)]
struct ClusterNodeVerifier {
    cluster: String,
    trust: Trust,
    provider: Arc<CryptoProvider>,
}

impl ClusterNodeVerifier {
    fn webpki(
        &self,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<Arc<WebPkiServerVerifier>, rustls::Error> {
        let roots = match &self.trust {
            Trust::Ca(trust) => trust.roots(),
            Trust::CaHash(hash) => {
                let ca = intermediates
                    .iter()
                    .find(|c| ca_hash(c) == *hash)
                    .ok_or_else(|| {
                        rustls::Error::General(
                            "server's CA does not match the join token's CA hash".into(),
                        )
                    })?;
                let mut roots = RootCertStore::empty();
                roots.add(ca.clone().into_owned())?;
                Ok(Arc::new(roots))
            }
        }
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        WebPkiServerVerifier::builder_with_provider(roots, self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))
    }
}

impl ServerCertVerifier for ClusterNodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let wanted = server_name.to_str();
        let any = expected_server_name(&self.cluster, None);
        let name = if wanted == any {
            match role_of(&self.cluster, end_entity) {
                PeerRole::Node(id) => node_san(&self.cluster, id),
                _ => {
                    return Err(rustls::Error::General(
                        "server certificate names no node of this cluster".into(),
                    ))
                }
            }
        } else {
            wanted.into_owned()
        };
        let name = ServerName::try_from(name).map_err(|e| rustls::Error::General(e.to_string()))?;
        self.webpki(intermediates)?.verify_server_cert(
            end_entity,
            intermediates,
            &name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 25: keys were written with the umask's mode and narrowed afterwards.
    #[test]
    fn a_key_file_is_0600_from_its_creation_and_after_rewrites() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let fresh = dir.path().join("fresh.key");
        let _file = create_secret(&fresh).unwrap();
        assert_eq!(
            mode(&fresh),
            0o600,
            "readable by others right after creation"
        );
        assert!(
            create_secret(&fresh).is_err(),
            "an existing file was reused"
        );

        // An existing key file of another mode is replaced, not written into.
        let key = dir.path().join("n1.key");
        std::fs::write(&key, "old").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&key, "new", true).unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "new");
        let pki = dir.path().join("pki");
        init_ca_dir(&pki, "yard", ADMIN_VALIDITY).unwrap();
        assert_eq!(mode(&pki.join("ca.key")), 0o600);
        assert_eq!(mode(&pki.join("admin.key")), 0o600);
        assert_eq!(
            std::fs::read_dir(&pki).unwrap().count(),
            4,
            "no temporary left"
        );
    }

    #[test]
    fn node_san_round_trips_and_rejects_other_clusters() {
        assert_eq!(node_id_of_san("yard", &node_san("yard", 42)), Some(42));
        assert_eq!(node_id_of_san("yard", "node-42.other"), None);
        assert_eq!(node_id_of_san("yard", "node-x.yard"), None);
        assert_eq!(node_id_of_san("yard", "admin.yard"), None);
    }

    #[test]
    fn roles_come_from_the_certificate() {
        let ca = CertAuthority::generate("yard").unwrap();
        let node = ca.sign_node("yard", "n1", 7, &[], NODE_VALIDITY).unwrap();
        let admin = ca.sign_admin("yard", ADMIN_VALIDITY).unwrap();
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(role_of("yard", &der(&node.cert)), PeerRole::Node(7));
        assert_eq!(role_of("yard", &der(&admin.cert)), PeerRole::Admin);
        assert_eq!(role_of("other", &der(&admin.cert)), PeerRole::Anonymous);
    }

    #[test]
    fn bad_names_are_refused() {
        let ca = CertAuthority::generate("yard").unwrap();
        assert!(matches!(
            ca.sign_node("yard", "../x", 1, &[], NODE_VALIDITY),
            Err(TlsError::BadName(_))
        ));
    }

    fn bundle(pem: &str) -> TrustBundle {
        TrustBundle::of(&[pem]).unwrap()
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    /// Issue 28: `ca.crt` may hold two CAs; the first is active, each verifies its own
    /// certificates, and a CA key picks its certificate from the bundle whatever the order.
    #[test]
    fn a_bundle_trusts_both_cas_and_the_key_picks_its_certificate() {
        let (old, new) = (
            CertAuthority::generate("yard").unwrap(),
            CertAuthority::generate("yard").unwrap(),
        );
        let both = TrustBundle::of(&[&new.cert_pem, &old.cert_pem]).unwrap();
        assert_eq!(both.len(), 2);
        assert_eq!(TrustBundle::from_pem(&both.pem()), Some(both.clone()));
        let by_old = der(&old
            .sign_node("yard", "n1", 1, &[], NODE_VALIDITY)
            .unwrap()
            .cert);
        let by_new = der(&new
            .sign_node("yard", "n1", 1, &[], NODE_VALIDITY)
            .unwrap()
            .cert);
        assert!(verify_client_cert(&both, &by_old) && verify_client_cert(&both, &by_new));
        assert!(both.is_active_issuer(&by_new) && !both.is_active_issuer(&by_old));
        assert_eq!(both.issuer_of(&by_old), Some(ca_hash(&der(&old.cert_pem))));
        assert!(!verify_client_cert(&bundle(&new.cert_pem), &by_old));
        for ca in [&old, &new] {
            let picked = CertAuthority::from_parts(&both, &ca.key_pem()).unwrap();
            assert_eq!(
                picked.cert_pem,
                TrustBundle::of(&[&ca.cert_pem]).unwrap().pem()
            );
        }
        let stranger = CertAuthority::generate("yard").unwrap();
        assert!(matches!(
            CertAuthority::from_parts(&both, &stranger.key_pem()),
            Err(TlsError::KeyMatchesNoCa(_))
        ));
        assert_eq!(TrustBundle::from_pem("no certificate here"), None);
    }

    /// Issue 25: `yard ca` issued every certificate valid until 4096.
    #[test]
    fn certificates_are_valid_for_what_they_were_signed_for() {
        let ca = CertAuthority::generate("yard").unwrap();
        let now = SystemTime::now();
        let node = ca.sign_node("yard", "n1", 7, &[], NODE_VALIDITY).unwrap();
        let (before, after) = validity(&der(&node.cert)).unwrap();
        let day = Duration::from_secs(24 * 3600);
        assert!(after > now + NODE_VALIDITY - day && after <= now + NODE_VALIDITY + day);
        assert!(before <= now && before + Duration::from_secs(301) >= now);
        let ca_after = not_after(&der(&ca.cert_pem)).unwrap();
        assert!(ca_after > now + CA_VALIDITY - day && ca_after < now + CA_VALIDITY + day);
        assert!(matches!(
            ca.sign_admin("yard", Duration::from_secs(9)),
            Err(TlsError::ShortValidity(_))
        ));
        assert!(verify_client_cert(&bundle(&ca.cert_pem), &der(&node.cert)));
    }

    /// A renewal keeps the node's key and takes the names the signer gives, not the request's.
    #[test]
    fn a_renewal_is_for_the_requests_key_and_the_signers_names() {
        let ca = CertAuthority::generate("yard").unwrap();
        let old = ca.sign_node("yard", "n1", 7, &[], NODE_VALIDITY).unwrap();
        // A request that asks for another node's name gets the one the signer gives.
        let key = KeyPair::from_pem(&old.key).unwrap();
        let mut params = CertificateParams::new(vec![node_san("yard", 1)]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "n-other");
        let csr = params.serialize_request(&key).unwrap().der().to_vec();
        let ip: IpAddr = "198.18.0.7".parse().unwrap();
        let renewed = ca
            .renew_node("yard", "n1", 7, &[ip], NODE_VALIDITY, &csr)
            .unwrap();
        let (old_der, new_der) = (der(&old.cert), der(&renewed));
        assert_eq!(role_of("yard", &new_der), PeerRole::Node(7));
        assert!(verify_client_cert(&bundle(&ca.cert_pem), &new_der));
        let spki = |c: &CertificateDer<'_>| {
            let (_, p) = x509_parser::parse_x509_certificate(c.as_ref()).unwrap();
            p.public_key().raw.to_vec()
        };
        assert_eq!(spki(&old_der), spki(&new_der), "the key changed");
        // The request made by the node itself works the same way.
        let own = renewal_request(&old.key).unwrap();
        assert!(ca
            .renew_node("yard", "n1", 7, &[], NODE_VALIDITY, &own)
            .is_ok());
        // A request whose signature does not verify is refused.
        let mut forged = own.clone();
        let last = forged.len() - 1;
        forged[last] ^= 0xff;
        assert!(matches!(
            ca.renew_node("yard", "n1", 7, &[], NODE_VALIDITY, &forged),
            Err(TlsError::BadRequest)
        ));
        // A certificate from another CA is not valid here.
        let other = CertAuthority::generate("yard").unwrap();
        assert!(!verify_client_cert(&bundle(&other.cert_pem), &new_der));
    }
}
