//! The replicated state of a Switchyard cluster: openraft's type configuration, the versioned
//! command set, the deterministic state machine, and the sled-backed log and state-machine
//! storage that openraft drives.
//!
//! The pure part (`state`) decides what every command does; the storage part (`log_store`,
//! `state_machine`) only persists and replays it, so the same `apply` runs on every node.

// openraft's storage traits fix the error type to its own (large) `StorageError`; boxing it in
// our helpers would only add conversions at every trait boundary.
#![allow(clippy::result_large_err)]

use std::io::Cursor;

pub mod aggregation;
pub mod backup;
pub mod capacity;
pub mod codec;
pub mod command;
pub mod diagnosis;
pub mod earlier_tables;
pub mod gateway;
pub mod log_store;
pub mod session;
pub mod state;
pub mod state_machine;
pub mod version;
pub mod watch;

pub use command::{BoundToken, Command, JoinToken, NodeInfo, NodeMeta, Response, Versioned};
pub use gateway::{GatewayChange, GatewayCommand, GatewayTables};
pub use log_store::LogStore;
pub use session::SessionTag;
pub use state::{Change, StateMachineData};
pub use state_machine::{ChangeFeed, StateMachineStore, WatchedApply};

openraft::declare_raft_types!(
    /// The openraft type configuration every Switchyard node uses.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft handle specialised to Switchyard's types.
pub type Raft = openraft::Raft<TypeConfig>;
/// A node identifier.
pub type NodeId = u64;

/// Opens (or creates) the sled database under `dir` and returns the log and state-machine
/// stores that share it.
pub fn open(
    dir: &std::path::Path,
) -> Result<(LogStore, StateMachineStore), openraft::StorageError<NodeId>> {
    let db = sled::Config::new()
        .path(dir)
        .cache_capacity(16 * 1024 * 1024)
        .open()
        .map_err(|e| {
            codec::storage_io(openraft::ErrorSubject::Store, openraft::ErrorVerb::Read, &e)
        })?;
    let log = LogStore::new(db.clone())?;
    let sm = StateMachineStore::new(db)?;
    Ok((log, sm))
}
