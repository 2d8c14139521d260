//! `yard ca rotate`: moving a cluster to a new CA with no failed request, in three steps an
//! operator runs on the CA directory, each followed by handing its files to the nodes (they
//! take changed files within a minute, at once on `SIGHUP`; `crate::renewal`):
//!
//! 1. `begin`: a new CA is made (`ca.next.key`) and `ca.crt` becomes the bundle [old, new].
//!    Every node given it trusts both CAs; the old one still signs.
//! 2. `switch`: `ca.key` becomes the new CA's key, `ca.crt` the bundle [new, old], and the admin
//!    certificate is issued again by the new CA. Nodes holding the key sign with the new CA,
//!    and every node, finding its certificate signed by a CA that is no longer the bundle's
//!    first, renews it from them at once.
//! 3. `finish`: `ca.crt` holds the new CA alone. Once the nodes take it, a certificate of the
//!    old CA opens no connection.
//!
//! Why this order: a node must trust a CA before any peer presents a certificate of it (step
//! 1 before 2), and a CA may be dropped only once nothing presents its certificates (`yard ca
//! rotate status`, which `finish` checks, between 2 and 3). This is the bundle rollover
//! Kubernetes documents for its CA; etcd takes the same bundle in its `--trusted-ca-file`.
//!
//! Which step a directory is in is decided from the files alone ([`phase`]), so a step
//! interrupted half way is run again to completion.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tls::{self, CertAuthority, TlsError, TrustBundle};

/// The file that holds the new CA's key between `begin` and `switch`.
pub const NEXT_KEY: &str = "ca.next.key";

#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("{0}")]
    Step(String),
}

/// Where a CA directory stands in a rollover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// One CA, no rollover under way.
    Settled,
    /// `begin` done: [old, new] trusted, the old CA signs (`switch` may have been interrupted
    /// after writing the new key: `key_written`).
    Trusting { key_written: bool },
    /// `switch` done: [new, old] trusted, the new CA signs.
    Switched,
}

/// The phase from what the directory holds: how many CAs `ca.crt` has, which of them
/// `ca.key` belongs to, and which `ca.next.key` belongs to (None: no such file).
pub fn phase(cas: usize, key: usize, next: Option<usize>) -> Result<Phase, String> {
    match (cas, key, next) {
        (1, 0, None) => Ok(Phase::Settled),
        (2, 0, Some(1)) => Ok(Phase::Trusting { key_written: false }),
        (2, 1, Some(1)) => Ok(Phase::Trusting { key_written: true }),
        (2, 0, None) => Ok(Phase::Switched),
        _ => {
            let which = |i: usize| {
                if i < cas {
                    format!("CA {}", i + 1)
                } else {
                    "none of them".into()
                }
            };
            Err(format!(
                "the CA directory is in no state of a rollover (ca.crt holds {cas} CAs, ca.key belongs to {}{}); restore it from a backup",
                which(key),
                next.map_or(String::new(), |n| format!(", ca.next.key to {}", which(n)))
            ))
        }
    }
}

/// The directory's CAs and phase.
struct Dir {
    path: PathBuf,
    trust: TrustBundle,
    signer: CertAuthority,
    next: Option<CertAuthority>,
    phase: Phase,
}

impl Dir {
    fn read(path: &Path) -> Result<Self, RotationError> {
        let trust = tls::load_trust(path)?;
        let signer = CertAuthority::load(path)?;
        let next_path = path.join(NEXT_KEY);
        let next = if next_path.exists() {
            let pem = std::fs::read_to_string(&next_path).map_err(|source| TlsError::Read {
                path: next_path.clone(),
                source,
            })?;
            Some(CertAuthority::from_parts(&trust, &pem)?)
        } else {
            None
        };
        let index = |ca: &CertAuthority| {
            let hash = ca.cert_hash();
            trust
                .hashes()
                .iter()
                .position(|h| *h == hash)
                .unwrap_or(usize::MAX)
        };
        let phase = phase(trust.len(), index(&signer), next.as_ref().map(index))
            .map_err(RotationError::Step)?;
        Ok(Self {
            path: path.to_owned(),
            trust,
            signer,
            next,
            phase,
        })
    }

    fn write(&self, name: &str, contents: &str, secret: bool) -> Result<(), RotationError> {
        Ok(tls::write_file(
            &self.path.join(name),
            contents.as_bytes(),
            secret,
        )?)
    }
}

/// What a step did, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The CA hashes `ca.crt` now holds, the active one first.
    pub trusted: Vec<String>,
}

/// `yard ca rotate begin`: makes the new CA and trusts it beside the old one.
pub fn begin(dir: &Path, cluster: &str) -> Result<Done, RotationError> {
    let d = Dir::read(dir)?;
    if d.phase != Phase::Settled {
        return Err(RotationError::Step(
            "a CA rollover is already under way in this directory; go on with `yard ca rotate switch` or `finish`".into(),
        ));
    }
    let next = CertAuthority::generate(cluster)?;
    let trust = TrustBundle::of(&[&d.trust.pem(), &next.cert_pem])
        .ok_or_else(|| RotationError::Step("the new CA bundle does not parse".into()))?;
    // The key before the bundle: a directory with the key and no bundle entry for it is in
    // no phase and says so, one with the bundle and no key would have lost the new CA.
    d.write(NEXT_KEY, &next.key_pem(), true)?;
    d.write("ca.crt", &trust.pem(), false)?;
    Ok(Done {
        trusted: trust.hashes(),
    })
}

/// `yard ca rotate switch`: the new CA signs from now on; the admin certificate is issued
/// again by it, valid for `admin_validity`.
pub fn switch(dir: &Path, cluster: &str, admin_validity: Duration) -> Result<Done, RotationError> {
    let d = Dir::read(dir)?;
    let key_written = match d.phase {
        Phase::Trusting { key_written } => key_written,
        Phase::Settled => {
            return Err(RotationError::Step(
                "no CA rollover is under way in this directory; start one with `yard ca rotate begin`".into(),
            ))
        }
        Phase::Switched => {
            return Err(RotationError::Step(
                "the new CA already signs; when every node presents its certificate, run `yard ca rotate finish`".into(),
            ))
        }
    };
    let next = d
        .next
        .as_ref()
        .expect("a directory trusting two CAs has the next key");
    // In this phase the bundle is [old, new] (see [`phase`]); `ca.key` may already be new.
    let old = d.trust.pems().next().expect("a bundle holds a CA");
    let trust = TrustBundle::of(&[&next.cert_pem, old])
        .ok_or_else(|| RotationError::Step("the new CA bundle does not parse".into()))?;
    if !key_written {
        d.write("ca.key", &next.key_pem(), true)?;
    }
    d.write("ca.crt", &trust.pem(), false)?;
    let admin = next.sign_admin(cluster, admin_validity)?;
    tls::write_cert(dir, "admin", &admin)?;
    std::fs::remove_file(dir.join(NEXT_KEY)).map_err(|source| TlsError::Write {
        path: dir.join(NEXT_KEY),
        source,
    })?;
    Ok(Done {
        trusted: trust.hashes(),
    })
}

/// `yard ca rotate finish`: only the new CA is trusted.
pub fn finish(dir: &Path) -> Result<Done, RotationError> {
    let d = Dir::read(dir)?;
    if d.phase != Phase::Switched {
        return Err(RotationError::Step(match d.phase {
            Phase::Settled => "no CA rollover is under way in this directory".into(),
            _ => "the old CA still signs: run `yard ca rotate switch` first".into(),
        }));
    }
    let trust = TrustBundle::of(&[&d.signer.cert_pem])
        .ok_or_else(|| RotationError::Step("the CA certificate does not parse".into()))?;
    d.write("ca.crt", &trust.pem(), false)?;
    Ok(Done {
        trusted: trust.hashes(),
    })
}

/// The active CA's hash of the directory, and the hash of the CA a rollover retires (the
/// bundle's second, after `switch`): what `finish` checks the nodes against.
pub fn hashes(dir: &Path) -> Result<(String, Option<String>), RotationError> {
    let d = Dir::read(dir)?;
    let hashes = d.trust.hashes();
    Ok((hashes[0].clone(), hashes.get(1).cloned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phase_comes_from_the_files_and_nothing_else_is_a_phase() {
        assert_eq!(phase(1, 0, None), Ok(Phase::Settled));
        assert_eq!(
            phase(2, 0, Some(1)),
            Ok(Phase::Trusting { key_written: false })
        );
        assert_eq!(
            phase(2, 1, Some(1)),
            Ok(Phase::Trusting { key_written: true })
        );
        assert_eq!(phase(2, 0, None), Ok(Phase::Switched));
        for odd in [
            (1, 0, Some(0)),
            (2, 1, None),
            (2, 0, Some(0)),
            (3, 0, None),
            (1, usize::MAX, None),
        ] {
            assert!(phase(odd.0, odd.1, odd.2).is_err(), "{odd:?}");
        }
    }

    fn hash(pem: &str) -> String {
        TrustBundle::of(&[pem]).unwrap().hashes().remove(0)
    }

    /// The three steps on a directory made by `yard ca init`, each refused out of order, and
    /// what each certificate verifies under at each step.
    #[test]
    fn a_rollover_trusts_both_then_signs_with_the_new_then_drops_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        tls::init_ca_dir(d, "c1", Duration::from_secs(3600)).unwrap();
        let old = CertAuthority::load(d).unwrap();
        let old_node = old
            .sign_node("c1", "n1", 1, &[], tls::NODE_VALIDITY)
            .unwrap();
        let der = |pem: &str| {
            use rustls::pki_types::pem::PemObject;
            rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
        };
        assert!(matches!(
            switch(d, "c1", Duration::from_secs(3600)),
            Err(RotationError::Step(_))
        ));
        assert!(matches!(finish(d), Err(RotationError::Step(_))));

        let begun = begin(d, "c1").unwrap();
        assert_eq!(begun.trusted.len(), 2);
        assert_eq!(begun.trusted[0], hash(&old.cert_pem));
        assert!(matches!(begin(d, "c1"), Err(RotationError::Step(_))));
        // The old CA still signs; both are trusted.
        let signer = CertAuthority::load(d).unwrap();
        assert_eq!(hash(&signer.cert_pem), hash(&old.cert_pem));
        let trust = tls::load_trust(d).unwrap();
        assert!(trust.is_active_issuer(&der(&old_node.cert)));

        let switched = switch(d, "c1", Duration::from_secs(3600)).unwrap();
        assert_eq!(
            switched.trusted,
            vec![begun.trusted[1].clone(), begun.trusted[0].clone()]
        );
        assert!(!d.join(NEXT_KEY).exists());
        let new = CertAuthority::load(d).unwrap();
        assert_eq!(hash(&new.cert_pem), begun.trusted[1]);
        let trust = tls::load_trust(d).unwrap();
        // A certificate of the old CA is still accepted but no longer the active CA's: its
        // holder renews it.
        assert!(tls::verify_client_cert(&trust, &der(&old_node.cert)));
        assert!(!trust.is_active_issuer(&der(&old_node.cert)));
        let admin = tls::Identity::load(d, "admin").unwrap();
        assert!(trust.is_active_issuer(&admin.chain[0]));
        assert_eq!(
            hashes(d).unwrap(),
            (begun.trusted[1].clone(), Some(begun.trusted[0].clone()))
        );

        let finished = finish(d).unwrap();
        assert_eq!(finished.trusted, vec![begun.trusted[1].clone()]);
        let trust = tls::load_trust(d).unwrap();
        assert!(!tls::verify_client_cert(&trust, &der(&old_node.cert)));
        let new_node = new
            .sign_node("c1", "n1", 1, &[], tls::NODE_VALIDITY)
            .unwrap();
        assert!(tls::verify_client_cert(&trust, &der(&new_node.cert)));
        // And the directory is settled again: a next rollover may begin.
        assert_eq!(begin(d, "c1").unwrap().trusted[0], begun.trusted[1]);
    }

    /// A `switch` cut short after writing the new key is run again to completion.
    #[test]
    fn an_interrupted_switch_completes_when_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        tls::init_ca_dir(d, "c1", Duration::from_secs(3600)).unwrap();
        let begun = begin(d, "c1").unwrap();
        let next = std::fs::read_to_string(d.join(NEXT_KEY)).unwrap();
        tls::write_file(&d.join("ca.key"), next.as_bytes(), true).unwrap();
        let switched = switch(d, "c1", Duration::from_secs(3600)).unwrap();
        assert_eq!(switched.trusted[0], begun.trusted[1]);
        finish(d).unwrap();
    }
}
