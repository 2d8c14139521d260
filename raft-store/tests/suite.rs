//! openraft's storage conformance suite against the sled-backed log and state machine.

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use yard_raft_store::{LogStore, NodeId, StateMachineStore, TypeConfig};

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for SledBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, sm) = yard_raft_store::open(dir.path())?;
        Ok((dir, log, sm))
    }
}

#[test]
fn sled_store_passes_openraft_suite() {
    if let Err(e) = Suite::test_all(SledBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
