//! The Raft log in sled: tree `logs` keyed by big-endian index, tree `log_meta` for the vote,
//! the committed id and the last purged id. A batch plus `flush_async` is the durability point,
//! so openraft's append callback fires only once the entries would survive `kill -9`.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogId, RaftLogReader, StorageError,
    Vote,
};
use serde::{de::DeserializeOwned, Serialize};

use crate::codec::{decode, encode, storage_io};
use crate::{NodeId, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

/// The most encoded entry bytes one AppendEntries carries unless the node sets its own budget
/// ([`LogStore::with_payload_budget`]): half of the node's default 16 MiB frame.
pub const DEFAULT_PAYLOAD_BUDGET: usize = 8 * 1024 * 1024;

/// The sled-backed Raft log. Cheap to clone: the trees are shared handles.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    logs: sled::Tree,
    meta: sled::Tree,
    /// The most encoded entry bytes [`RaftLogReader::limited_get_log_entries`] hands openraft
    /// for one AppendEntries (always at least one entry).
    payload_budget: usize,
}

impl LogStore {
    /// Opens the log trees in `db`.
    pub fn new(db: sled::Db) -> Result<Self, StorageError<NodeId>> {
        let open = |name: &str| {
            db.open_tree(name)
                .map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Read, &e))
        };
        Ok(Self {
            logs: open("logs")?,
            meta: open("log_meta")?,
            db,
            payload_budget: DEFAULT_PAYLOAD_BUDGET,
        })
    }

    /// Bounds each AppendEntries payload to `bytes` of encoded entries (and at least one).
    ///
    /// Why: openraft 0.9 bounds a payload only by its count of entries (`max_payload_entries`),
    /// so 300 large entries made one request far above the transport's frame limit, which the
    /// follower refuses unread: replication to it stalled for good. Entries are stored in the
    /// wire's encoding, so their stored length is what they add to the frame.
    pub fn with_payload_budget(mut self, bytes: usize) -> Self {
        self.payload_budget = bytes.max(1);
        self
    }

    /// Marks the (empty) log as purged up to `log_id`: the log of a cluster seeded from a
    /// backup whose tables stand at that index ([`crate::backup::restore`]).
    pub async fn seed_purged(&self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.put_meta(LAST_PURGED, &log_id).await
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError<NodeId>> {
        let Some(bytes) = self
            .meta
            .get(key)
            .map_err(|e| storage_io(ErrorSubject::Store, ErrorVerb::Read, &e))?
        else {
            return Ok(None);
        };
        decode(&bytes)
            .map(Some)
            .map_err(|e| storage_io(ErrorSubject::Store, ErrorVerb::Read, &e))
    }

    async fn put_meta<T: Serialize>(
        &self,
        key: &[u8],
        value: &T,
    ) -> Result<(), StorageError<NodeId>> {
        let bytes =
            encode(value).map_err(|e| storage_io(ErrorSubject::Store, ErrorVerb::Write, &e))?;
        self.meta
            .insert(key, bytes)
            .map_err(|e| storage_io(ErrorSubject::Store, ErrorVerb::Write, &e))?;
        self.flush(ErrorSubject::Store).await
    }

    async fn flush(&self, subject: ErrorSubject<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(|e| storage_io(subject, ErrorVerb::Write, &e))
    }

    fn last_entry_id(&self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        let Some((_, bytes)) = self
            .logs
            .last()
            .map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Read, &e))?
        else {
            return Ok(None);
        };
        let entry: Entry<TypeConfig> =
            decode(&bytes).map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Read, &e))?;
        Ok(Some(*entry.get_log_id()))
    }
}

fn bound_key(b: Bound<&u64>) -> Bound<[u8; 8]> {
    match b {
        Bound::Included(i) => Bound::Included(i.to_be_bytes()),
        Bound::Excluded(i) => Bound::Excluded(i.to_be_bytes()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let range = (bound_key(range.start_bound()), bound_key(range.end_bound()));
        self.logs
            .range(range)
            .map(|item| {
                let (_, bytes) =
                    item.map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Read, &e))?;
                decode(&bytes).map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Read, &e))
            })
            .collect()
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        for item in self.logs.range(start.to_be_bytes()..end.to_be_bytes()) {
            let (_, raw) = item.map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Read, &e))?;
            bytes = bytes.saturating_add(raw.len());
            if !entries.is_empty() && bytes > self.payload_budget {
                break;
            }
            entries.push(
                decode(&raw).map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Read, &e))?,
            );
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_purged_log_id = self.get_meta::<LogId<NodeId>>(LAST_PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.put_meta(VOTE, vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.get_meta(VOTE)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        // Not flushed on its own: a lost committed id is only a slower restart, never lost data.
        let bytes = encode(&committed)
            .map_err(|e| storage_io(ErrorSubject::Store, ErrorVerb::Write, &e))?;
        self.meta
            .insert(COMMITTED, bytes)
            .map_err(|e| storage_io(ErrorSubject::Store, ErrorVerb::Write, &e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes =
                encode(&entry).map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Write, &e))?;
            batch.insert(&entry.get_log_id().index.to_be_bytes(), bytes);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Write, &e))?;
        let flushed = self.db.flush_async().await.map(|_| ());
        callback.log_io_completed(flushed.map_err(std::io::Error::other));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut batch = sled::Batch::default();
        for key in self.logs.range(log_id.index.to_be_bytes()..).keys() {
            let key = key.map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Delete, &e))?;
            batch.remove(key);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Delete, &e))?;
        self.flush(ErrorSubject::Logs).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        // Record the purge point first: a crash between the two steps leaves extra entries,
        // which are harmless, never a gap.
        self.put_meta(LAST_PURGED, &log_id).await?;
        let mut batch = sled::Batch::default();
        for key in self.logs.range(..=log_id.index.to_be_bytes()).keys() {
            let key = key.map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Delete, &e))?;
            batch.remove(key);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| storage_io(ErrorSubject::Logs, ErrorVerb::Delete, &e))?;
        Ok(())
    }
}
