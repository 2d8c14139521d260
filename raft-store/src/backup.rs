//! Backups of the replicated state (`yard snapshot save | status | restore`): one file holding
//! the tables at one revision, checked by a SHA-256 over everything before it, and how such a
//! file seeds a new one-node cluster.
//!
//! The file: the magic `YARDSNAP`, the format (u32, big-endian), the cluster-wide revision and
//! the log index it stands at (u64 each), the cluster name (u32 length, UTF-8), the encoded
//! tables (u64 length, [`crate::codec`]), and the SHA-256 of all of that. A reader refuses a
//! newer format by name, a truncated file by its length and a corrupted one by the checksum,
//! each in one sentence, before decoding anything.

use std::collections::BTreeMap;

use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};

use crate::codec::{decode, encode};
use crate::{NodeId, NodeInfo, StateMachineData};

/// The format this release writes and the newest it reads.
pub const FORMAT: u32 = 1;

const MAGIC: &[u8; 8] = b"YARDSNAP";
const SHA256_LEN: usize = 32;

/// Why a snapshot file was refused; each renders as one sentence.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackupError {
    #[error("this is not a yard snapshot file")]
    NotASnapshot,
    #[error("the snapshot file is format {found}; this yard reads formats up to {supported}")]
    NewerFormat { found: u32, supported: u32 },
    #[error("the snapshot file is truncated: {have} bytes of {want}")]
    Truncated { have: usize, want: usize },
    #[error("the snapshot file is corrupted: its checksum does not match its contents")]
    Checksum,
    #[error("the snapshot's tables do not decode: {0}")]
    Decode(String),
    #[error("the tables cannot be encoded: {0}")]
    Encode(String),
}

/// A decoded snapshot file.
#[derive(Debug, Clone)]
pub struct Backup {
    pub format: u32,
    pub cluster: String,
    /// The cluster-wide revision of the tables.
    pub revision: u64,
    /// The Raft log index the tables stand at.
    pub index: u64,
    /// Hex SHA-256 of the file (its last 32 bytes).
    pub sha256: String,
    pub data: StateMachineData,
}

fn sha256(bytes: &[u8]) -> [u8; SHA256_LEN] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().try_into().expect("a sha-256 is 32 bytes")
}

/// Encodes `data` of cluster `cluster` as a snapshot file.
pub fn encode_backup(cluster: &str, data: &StateMachineData) -> Result<Vec<u8>, BackupError> {
    let tables = encode(data).map_err(|e| BackupError::Encode(e.to_string()))?;
    let mut out = Vec::with_capacity(tables.len() + 80 + cluster.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_be_bytes());
    out.extend_from_slice(&data.revision.to_be_bytes());
    out.extend_from_slice(&data.last_applied.map_or(0, |l| l.index).to_be_bytes());
    out.extend_from_slice(&(cluster.len() as u32).to_be_bytes());
    out.extend_from_slice(cluster.as_bytes());
    out.extend_from_slice(&(tables.len() as u64).to_be_bytes());
    out.extend_from_slice(&tables);
    let sum = sha256(&out);
    out.extend_from_slice(&sum);
    Ok(out)
}

/// Reads fixed-size fields off the front of a byte slice, failing as truncated.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, want: usize) -> Result<&'a [u8], BackupError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err(BackupError::Truncated {
                have: self.bytes.len(),
                want: want.max(self.at.saturating_add(n)),
            });
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, BackupError> {
        Ok(u32::from_be_bytes(
            self.take(4, 0)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, BackupError> {
        Ok(u64::from_be_bytes(
            self.take(8, 0)?.try_into().expect("8 bytes"),
        ))
    }
}

/// Decodes and checks a snapshot file.
pub fn decode_backup(bytes: &[u8]) -> Result<Backup, BackupError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(BackupError::NotASnapshot);
    }
    let mut r = Reader { bytes, at: 0 };
    r.take(MAGIC.len(), 0)?;
    let format = r.u32()?;
    if format > FORMAT {
        return Err(BackupError::NewerFormat {
            found: format,
            supported: FORMAT,
        });
    }
    let revision = r.u64()?;
    let index = r.u64()?;
    let name_len = r.u32()? as usize;
    let cluster =
        String::from_utf8(r.take(name_len, 0)?.to_vec()).map_err(|_| BackupError::Checksum)?;
    let tables_len = usize::try_from(r.u64()?).map_err(|_| BackupError::Checksum)?;
    let want = r.at.saturating_add(tables_len).saturating_add(SHA256_LEN);
    let tables = r.take(tables_len, want)?;
    let body_end = r.at;
    let sum = r.take(SHA256_LEN, want)?;
    if r.at != bytes.len() || sha256(&bytes[..body_end]) != sum {
        return Err(BackupError::Checksum);
    }
    let data: StateMachineData = decode(tables).map_err(|e| BackupError::Decode(e.to_string()))?;
    Ok(Backup {
        format,
        cluster,
        revision,
        index,
        sha256: sum.iter().map(|b| format!("{b:02x}")).collect(),
        data,
    })
}

/// The tables of a backup as a new one-node cluster's first state: node `id` (at `info`) its
/// only voter, at the backup's log index. What belonged to the old cluster's hosts is left
/// behind: its hosts, liveness verdicts, join tokens, revoked ids, client sessions, gateway
/// drains, restart graces and VIP owners, and the aggregation hosts and bandwidth figures
/// (the new cluster's hosts register and measure again). The data is kept: the key-value store
/// with its revisions, the VIPs and endpoints, the aggregation jobs and the analyzer's verdicts.
pub fn for_new_cluster(mut data: StateMachineData, id: NodeId, info: NodeInfo) -> StateMachineData {
    let index = data.last_applied.map_or(0, |l| l.index).max(1);
    // Term 1 led by the new node: the new cluster's first election is term 2 or later.
    let log_id = LogId::new(CommittedLeaderId::new(1, id), index);
    let membership = Membership::new(
        vec![[id].into_iter().collect()],
        BTreeMap::from([(id, info)]),
    );
    data.last_applied = Some(log_id);
    data.last_membership = StoredMembership::new(Some(log_id), membership);
    data.nodes.clear();
    data.tokens.clear();
    data.bound_tokens.clear();
    data.revoked.clear();
    data.hosts_down.clear();
    data.sessions = Default::default();
    data.gateway.draining.clear();
    data.gateway.graces.clear();
    for record in data.gateway.vips.values_mut() {
        *record = Default::default();
    }
    data.aggregation.hosts.clear();
    data.aggregation.bandwidth.clear();
    data.aggregation.remeasure.clear();
    data
}

/// Why a restore did not happen; each renders as one sentence.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{0} already holds data; restore into a new, empty data directory")]
    NotEmpty(std::path::PathBuf),
    #[error("cannot write the raft store in {path}: {reason}")]
    Store {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// Writes `data` (from [`for_new_cluster`]) as the Raft store in `dir`, which must not hold
/// one: the tables become the store's snapshot and the log starts after it, so a node started
/// on `dir` serves them as the only voter of a new cluster.
pub async fn restore(dir: &std::path::Path, data: StateMachineData) -> Result<(), RestoreError> {
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(RestoreError::NotEmpty(dir.to_owned()));
    }
    let store_err = |e: openraft::StorageError<NodeId>| RestoreError::Store {
        path: dir.to_owned(),
        reason: e.to_string(),
    };
    let (log, sm) = crate::open(dir).map_err(store_err)?;
    let Some(log_id) = data.last_applied else {
        return Err(RestoreError::Store {
            path: dir.to_owned(),
            reason: "the tables stand at no log index".into(),
        });
    };
    sm.seed(data).await.map_err(store_err)?;
    log.seed_purged(log_id).await.map_err(store_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;

    fn tables() -> StateMachineData {
        let mut d = StateMachineData::default();
        for i in 0..50 {
            d.apply_command(&Command::Put {
                key: format!("k{i}"),
                value: format!("v{i}"),
            });
        }
        d.last_applied = Some(LogId::new(CommittedLeaderId::new(3, 2), 77));
        d
    }

    #[test]
    fn a_file_round_trips_with_its_revision_and_index() {
        let bytes = encode_backup("yard", &tables()).unwrap();
        let b = decode_backup(&bytes).unwrap();
        assert_eq!((b.format, b.revision, b.index), (FORMAT, 50, 77));
        assert_eq!(b.cluster, "yard");
        assert_eq!(b.data.kv.len(), 50);
        assert_eq!(b.sha256.len(), 64);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused_in_one_sentence() {
        let bytes = encode_backup("yard", &tables()).unwrap();
        for len in 0..bytes.len() {
            let err = decode_backup(&bytes[..len]).unwrap_err();
            assert!(
                matches!(
                    err,
                    BackupError::NotASnapshot
                        | BackupError::Truncated { .. }
                        | BackupError::Checksum
                ),
                "{len}: {err}"
            );
        }
        assert!(matches!(
            decode_backup(&bytes[..bytes.len() - 1]).unwrap_err(),
            BackupError::Truncated { have, want } if want == bytes.len() && have == bytes.len() - 1
        ));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(decode_backup(&bad).is_err(), "a flip at {at} was accepted");
        }
    }

    #[test]
    fn a_newer_format_is_named() {
        let mut bytes = encode_backup("yard", &tables()).unwrap();
        bytes[8..12].copy_from_slice(&(FORMAT + 1).to_be_bytes());
        assert_eq!(
            decode_backup(&bytes).unwrap_err().to_string(),
            format!(
                "the snapshot file is format {}; this yard reads formats up to {FORMAT}",
                FORMAT + 1
            )
        );
        assert_eq!(
            decode_backup(b"not a snapshot at all")
                .unwrap_err()
                .to_string(),
            "this is not a yard snapshot file"
        );
    }

    #[test]
    fn a_new_cluster_keeps_the_data_and_leaves_the_old_hosts() {
        let mut d = tables();
        d.revoked.insert(4);
        d.nodes.insert(
            4,
            crate::NodeMeta {
                id: 4,
                name: "n4".into(),
                addr: "198.18.0.4:7480".into(),
                roles: vec![],
                labels: vec![],
            },
        );
        let info = NodeInfo {
            addr: "198.18.0.9:7480".into(),
            name: "n9".into(),
        };
        let fresh = for_new_cluster(d, 9, info);
        assert_eq!(fresh.kv.len(), 50);
        assert_eq!(fresh.revision, 50);
        assert!(fresh.nodes.is_empty() && fresh.revoked.is_empty());
        let voters: Vec<_> = fresh.last_membership.membership().voter_ids().collect();
        assert_eq!(voters, vec![9]);
        assert_eq!(fresh.last_applied.unwrap().index, 77);
    }
}
