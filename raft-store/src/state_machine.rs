//! The state-machine side of the store: the tables live in memory (they are what every read
//! serves) and the latest snapshot lives in sled. After `kill -9` a node restores the snapshot
//! and openraft replays the durable log from there (`read_committed`), so nothing acknowledged
//! is lost and nothing is applied twice.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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
            }),
        };
        if let Some(stored) = store.load_snapshot()? {
            let data: StateMachineData = decode(&stored.data)
                .map_err(|e| storage_io(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))?;
            *store.write() = data;
        }
        Ok(store)
    }

    /// A read handle sharing these tables.
    pub fn feed(&self) -> ChangeFeed {
        ChangeFeed {
            inner: self.inner.clone(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, StateMachineData> {
        self.inner.data.write().unwrap_or_else(|e| e.into_inner())
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
        let mut data = self.write();
        let mut responses = Vec::new();
        for entry in entries {
            let (response, changes) = data.apply_entry(&entry);
            for change in changes {
                // No subscribers is fine: the feed is for whoever listens.
                let _ = self.inner.feed.send(change);
            }
            responses.push(response);
        }
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
        *data = new_data;
        let _ = self.inner.feed.send(Change::Reset {
            revision: data.revision,
        });
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
