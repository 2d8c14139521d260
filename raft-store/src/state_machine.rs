//! The state-machine side of the store: the tables live in memory (they are what every read
//! serves) and the latest snapshot lives in sled. After `kill -9` a node restores the snapshot
//! and openraft replays the durable log from there (`read_committed`), so nothing acknowledged
//! is lost and nothing is applied twice.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::codec::{decode, encode, storage_io};
use crate::command::{NodeInfo, Response};
use crate::state::{Change, StateMachineData};
use crate::watch::{Encoded, Since, WatchLog};
use crate::{NodeId, TypeConfig};

const CURRENT: &[u8] = b"current";
/// How many changes a slow subscriber may fall behind before it must resync.
const FEED_CAPACITY: usize = 4096;

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, NodeInfo>,
    data: Vec<u8>,
}

struct Inner {
    data: RwLock<StateMachineData>,
    snapshots: sled::Tree,
    db: sled::Db,
    feed: broadcast::Sender<Change>,
    snapshot_seq: AtomicU64,
    /// Recent entries for agents' watches (`crate::watch`).
    watch: Mutex<WatchLog>,
    /// The index the tables stand at, for watches waiting on the next entry.
    applied: tokio::sync::watch::Sender<u64>,
    /// The tables encoded at some index, shared by every watcher that needs a snapshot while
    /// the watch log still continues from it (a replica restarting under a thousand agents
    /// encodes once, not once per agent).
    watch_snapshot: Mutex<Option<(u64, Encoded)>>,
}

fn index_of(data: &StateMachineData) -> u64 {
    data.last_applied.map_or(0, |l| l.index)
}

impl Inner {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, StateMachineData> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    fn watch_log(&self) -> std::sync::MutexGuard<'_, WatchLog> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `entry` unless the tables already hold it, publishing its changes and keeping
    /// it for watchers. The check makes applying idempotent by log index, which is what lets a
    /// host that followed the log as an agent become a Raft member later: openraft replays
    /// the entries the agent already applied, and they are skipped here (Raft's log matching
    /// makes them the same entries).
    fn apply_one(
        &self,
        data: &mut StateMachineData,
        watch: &mut WatchLog,
        entry: &Entry<TypeConfig>,
        encoded: Option<Encoded>,
    ) -> Response {
        if data
            .last_applied
            .is_some_and(|last| entry.log_id.index <= last.index)
        {
            return Response::None;
        }
        let (response, changes) = data.apply_entry(entry);
        for change in changes {
            // No subscribers is fine: the feed is for whoever listens.
            let _ = self.feed.send(change);
        }
        match encoded {
            Some(e) => watch.push(entry.log_id.index, e),
            // Not kept (an agent's apply, or an entry that would not encode): a watcher asking
            // from before the next kept entry resyncs from a snapshot rather than skip it.
            None => watch.clear(),
        }
        response
    }

    /// Replaces the tables with `new_data` (a snapshot) and tells every subscriber to resync.
    fn replace(&self, data: &mut StateMachineData, new_data: StateMachineData) {
        *data = new_data;
        self.watch_log().clear();
        let _ = self.feed.send(Change::Reset {
            revision: data.revision,
        });
        self.applied.send_replace(index_of(data));
    }
}

/// The replicated state machine. Cheap to clone; clones share the tables.
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Arc<Inner>,
}

/// A read handle for actors and the admin server: consistent reads and the change feed.
#[derive(Clone)]
pub struct ChangeFeed {
    inner: Arc<Inner>,
}

impl ChangeFeed {
    /// Runs `f` over the current tables.
    pub fn read<T>(&self, f: impl FnOnce(&StateMachineData) -> T) -> T {
        f(&self.inner.data.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many receivers of the change feed are alive: an actor must hold one, however often it
    /// resyncs (tests check that a resync drops the old one).
    pub fn receivers(&self) -> usize {
        self.inner.feed.receiver_count()
    }

    /// The current tables and a receiver of every change after them. Taken under one lock, so no
    /// change falls between the two. A receiver that lags (`RecvError::Lagged`) subscribes again.
    pub fn subscribe(&self) -> (StateMachineData, broadcast::Receiver<Change>) {
        let data = self.inner.data.read().unwrap_or_else(|e| e.into_inner());
        (data.clone(), self.inner.feed.subscribe())
    }

    /// Like [`ChangeFeed::subscribe`], but takes only what `f` makes of the tables (under the
    /// same lock, so no change falls between the two): a subscriber that follows one table
    /// does not copy every other one, the KV store included, each time it (re)subscribes.
    pub fn subscribe_with<T>(
        &self,
        f: impl FnOnce(&StateMachineData) -> T,
    ) -> (T, broadcast::Receiver<Change>) {
        let data = self.inner.data.read().unwrap_or_else(|e| e.into_inner());
        (f(&data), self.inner.feed.subscribe())
    }

    /// The log index a watcher of these tables asks from next.
    pub fn next_index(&self) -> u64 {
        self.read(|d| d.last_applied.map_or(0, |l| l.index + 1))
    }

    /// The log index the tables stand at (0 before anything was applied).
    pub fn applied_index(&self) -> u64 {
        *self.inner.applied.borrow()
    }

    /// A receiver that wakes when the applied index moves (a watch waiting for entries).
    pub fn applied_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.applied.subscribe()
    }

    /// What a watcher asking from log index `from` gets, at most about `max_bytes` of entries.
    pub fn watch_since(&self, from: u64, max_bytes: usize) -> Since {
        let applied = self.applied_index();
        self.inner.watch_log().since(from, applied, max_bytes)
    }

    /// The tables encoded for a watcher whose index the watch log no longer holds, and the
    /// index they stand at. Reuses the last encoding while the watch log still continues from
    /// it. Encoding grows with the tables: call it off the async runtime.
    pub fn watch_snapshot(&self) -> Result<(u64, Encoded), String> {
        let mut cached = self
            .inner
            .watch_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let first = self.inner.watch_log().first_index();
        if let Some((index, bytes)) = cached.as_ref() {
            if first.is_some_and(|f| f <= index + 1) {
                return Ok((*index, bytes.clone()));
            }
        }
        let data = self
            .inner
            .data
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let bytes = Arc::new(encode(&data).map_err(|e| format!("cannot encode the tables: {e}"))?);
        let index = index_of(&data);
        *cached = Some((index, bytes.clone()));
        Ok((index, bytes))
    }
}

impl StateMachineStore {
    /// Opens the snapshot tree in `db` and restores the tables from the last snapshot, if any.
    pub fn new(db: sled::Db) -> Result<Self, StorageError<NodeId>> {
        let snapshots = db
            .open_tree("snapshots")
            .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))?;
        let (feed, _) = broadcast::channel(FEED_CAPACITY);
        let store = Self {
            inner: Arc::new(Inner {
                data: RwLock::new(StateMachineData::default()),
                snapshots,
                db,
                feed,
                snapshot_seq: AtomicU64::new(0),
                watch: Mutex::new(WatchLog::default()),
                applied: tokio::sync::watch::Sender::new(0),
                watch_snapshot: Mutex::new(None),
            }),
        };
        if let Some(stored) = store.load_snapshot()? {
            let data: StateMachineData = decode(&stored.data)
                .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))?;
            store.inner.applied.send_replace(index_of(&data));
            *store.write() = data;
        }
        Ok(store)
    }

    /// Applies entries an agent received from a replica's watch (encoded as the watch log
    /// keeps them) and returns the index the tables now stand at. Entries the tables already
    /// hold are skipped; a malformed one stops the batch with an error and applies nothing
    /// after it. An agent serves no watch, so it keeps no watch log (thousands of agents would
    /// each hold one for nothing); made a replica, it fills one from the entries Raft applies
    /// from then on, and a watcher asking it for older ones gets its tables.
    pub fn apply_watched(&self, encoded: &[Encoded]) -> Result<WatchedApply, String> {
        let mut decoded = Vec::with_capacity(encoded.len());
        for bytes in encoded {
            let entry: Entry<TypeConfig> =
                decode(bytes).map_err(|e| format!("a watched entry does not decode: {e}"))?;
            decoded.push(entry);
        }
        let mut data = self.write();
        let mut watch = self.inner.watch_log();
        let mut stamps_unix_ms = Vec::new();
        for entry in &decoded {
            let next = index_of(&data) + 1;
            if data.last_applied.is_some() && entry.log_id.index > next {
                return Err(format!(
                    "the watch skipped from index {} to {}",
                    next - 1,
                    entry.log_id.index
                ));
            }
            let before = index_of(&data);
            self.inner.apply_one(&mut data, &mut watch, entry, None);
            if index_of(&data) > before {
                if let openraft::EntryPayload::Normal(cmd) = &entry.payload {
                    stamps(cmd, &mut stamps_unix_ms);
                }
            }
        }
        drop(watch);
        let index = index_of(&data);
        self.inner.applied.send_replace(index);
        Ok(WatchedApply {
            index,
            stamps_unix_ms,
        })
    }

    /// Replaces an agent's tables with a replica's snapshot (from [`ChangeFeed::watch_snapshot`])
    /// unless they are already at least as new; returns the index the tables stand at.
    pub fn install_watched(&self, bytes: &[u8]) -> Result<u64, String> {
        let new_data: StateMachineData =
            decode(bytes).map_err(|e| format!("a watched snapshot does not decode: {e}"))?;
        let mut data = self.write();
        if index_of(&new_data) > index_of(&data) || data.last_applied.is_none() {
            self.inner.replace(&mut data, new_data);
        }
        Ok(index_of(&data))
    }

    /// A read handle sharing these tables.
    pub fn feed(&self) -> ChangeFeed {
        ChangeFeed {
            inner: self.inner.clone(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, StateMachineData> {
        self.inner.write()
    }

    /// Stores `data` as the current snapshot and serves it: the first state of a cluster
    /// seeded from a backup ([`crate::backup::restore`]).
    pub async fn seed(&self, data: StateMachineData) -> Result<(), StorageError<NodeId>> {
        let bytes = encode(&data)
            .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Write, &e))?;
        let meta = SnapshotMeta {
            last_log_id: data.last_applied,
            last_membership: data.last_membership.clone(),
            snapshot_id: format!("restored-{}", index_of(&data)),
        };
        self.save_snapshot(&StoredSnapshot { meta, data: bytes })
            .await?;
        let mut tables = self.write();
        self.inner.replace(&mut tables, data);
        Ok(())
    }

    fn load_snapshot(&self) -> Result<Option<StoredSnapshot>, StorageError<NodeId>> {
        let Some(bytes) = self
            .inner
            .snapshots
            .get(CURRENT)
            .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))?
        else {
            return Ok(None);
        };
        decode(&bytes)
            .map(Some)
            .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))
    }

    async fn save_snapshot(&self, stored: &StoredSnapshot) -> Result<(), StorageError<NodeId>> {
        let subject = || ErrorSubject::Snapshot(Some(stored.meta.signature()));
        let bytes = encode(stored).map_err(|e| storage_io(subject(), ErrorVerb::Write, &e))?;
        self.inner
            .snapshots
            .insert(CURRENT, bytes)
            .map_err(|e| storage_io(subject(), ErrorVerb::Write, &e))?;
        // The log may be purged right after this returns: the snapshot must be on disk first.
        self.inner
            .db
            .flush_async()
            .await
            .map_err(|e| storage_io(subject(), ErrorVerb::Write, &e))?;
        Ok(())
    }
}

/// What applying a watched batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedApply {
    /// The index the tables now stand at.
    pub index: u64,
    /// The proposers' wall-clock stamps of the session-tagged writes applied (how long a
    /// write took to reach this agent).
    pub stamps_unix_ms: Vec<u64>,
}

/// The stamps of the session-tagged writes in `cmd` (one level of batching).
fn stamps(cmd: &crate::Command, out: &mut Vec<u64>) {
    match cmd {
        crate::Command::Once { now_unix_ms, .. } => out.push(*now_unix_ms),
        crate::Command::Batch(cmds) => {
            for c in cmds {
                if let crate::Command::Once { now_unix_ms, .. } = c {
                    out.push(*now_unix_ms);
                }
            }
        }
        _ => {}
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        // Off the runtime: with one runtime worker (the node's default) an encoding that grows
        // with the state would hold back heartbeats and every other task meanwhile. The tables
        // are copied under the read lock and encoded after it, so applying waits for the copy
        // only, not for the encoding.
        let inner = self.inner.clone();
        let (bytes, last_log_id, last_membership) = tokio::task::spawn_blocking(move || {
            let data = inner.data.read().unwrap_or_else(|e| e.into_inner()).clone();
            encode(&data).map(|bytes| (bytes, data.last_applied, data.last_membership))
        })
        .await
        .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Write, &e))?
        .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Write, &e))?;
        let seq = self.inner.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match last_log_id {
            Some(id) => format!("{}-{}-{seq}", id.leader_id, id.index),
            None => format!("none-{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: bytes,
        };
        self.save_snapshot(&stored).await?;
        tracing::info!(snapshot = %meta.snapshot_id, bytes = stored.data.len(), "built snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, NodeInfo>), StorageError<NodeId>>
    {
        let data = self.inner.data.read().unwrap_or_else(|e| e.into_inner());
        Ok((data.last_applied, data.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Encoded for watchers before the tables are locked, so readers wait for the apply only.
        let entries: Vec<(Entry<TypeConfig>, Option<Encoded>)> = entries
            .into_iter()
            .map(|e| {
                let encoded = encode(&e).ok().map(Arc::new);
                (e, encoded)
            })
            .collect();
        let mut data = self.write();
        let mut watch = self.inner.watch_log();
        let mut responses = Vec::with_capacity(entries.len());
        for (entry, encoded) in entries {
            responses.push(self.inner.apply_one(&mut data, &mut watch, &entry, encoded));
        }
        drop(watch);
        self.inner.applied.send_replace(index_of(&data));
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, NodeInfo>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let subject = || ErrorSubject::Snapshot(Some(meta.signature()));
        // Decoded off the runtime, for the reason `build_snapshot` encodes off it.
        let (bytes, decoded) = tokio::task::spawn_blocking(move || {
            let bytes = snapshot.into_inner();
            let decoded = decode::<StateMachineData>(&bytes);
            (bytes, decoded)
        })
        .await
        .map_err(|e| storage_io(subject(), ErrorVerb::Read, &e))?;
        let mut new_data = decoded.map_err(|e| storage_io(subject(), ErrorVerb::Read, &e))?;
        new_data.last_applied = meta.last_log_id;
        new_data.last_membership = meta.last_membership.clone();
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: bytes,
        };
        self.save_snapshot(&stored).await?;
        let mut data = self.write();
        if index_of(&new_data) <= index_of(&data) && data.last_applied.is_some() {
            // A host that followed the log as an agent already holds these tables and more;
            // going back would replay changes its actors have acted on. openraft's replay of
            // the entries after the snapshot is skipped by `apply_one`.
            tracing::info!(snapshot = %meta.snapshot_id, applied = index_of(&data), "kept newer tables than the snapshot");
            return Ok(());
        }
        self.inner.replace(&mut data, new_data);
        tracing::info!(snapshot = %meta.snapshot_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(self.load_snapshot()?.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
