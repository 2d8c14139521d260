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

mod change_feed {
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    use yard_raft_store::{Change, Command, TypeConfig};

    fn entry(index: u64, cmd: Command) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(cmd),
        }
    }

    fn put(k: &str, v: &str) -> Command {
        Command::Put {
            key: k.into(),
            value: v.into(),
        }
    }

    #[tokio::test]
    async fn subscribers_see_every_change_after_their_snapshot_and_a_reset_on_install() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = yard_raft_store::open(dir.path()).unwrap();
        let feed = sm.feed();
        sm.apply([entry(1, put("a", "1"))]).await.unwrap();
        let (seen, mut rx) = feed.subscribe();
        assert_eq!(seen.kv["a"].value, "1");
        sm.apply([
            entry(2, put("b", "2")),
            entry(3, Command::Delete { key: "a".into() }),
        ])
        .await
        .unwrap();
        assert_eq!(
            rx.recv().await.unwrap(),
            Change::Kv {
                revision: 2,
                key: "b".into(),
                value: Some("2".into())
            }
        );
        assert_eq!(
            rx.recv().await.unwrap(),
            Change::Kv {
                revision: 3,
                key: "a".into(),
                value: None
            }
        );
        // A snapshot from elsewhere replaces everything: subscribers are told to resync.
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let dir2 = tempfile::tempdir().unwrap();
        let (_log2, mut other) = yard_raft_store::open(dir2.path()).unwrap();
        let (_, mut rx2) = other.feed().subscribe();
        other
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(rx2.recv().await.unwrap(), Change::Reset { revision: 3 });
        assert_eq!(other.feed().read(|d| d.kv["b"].value.clone()), "2");
    }

    /// Opens the store in `dir` again in the same process, waiting out the file lock the
    /// dropped store's sled threads may hold for a moment after the drop (seen once in CI under
    /// load: "could not acquire lock"). A restarted daemon is a new process and never waits.
    async fn reopen(
        dir: &std::path::Path,
    ) -> (
        yard_raft_store::LogStore,
        yard_raft_store::StateMachineStore,
    ) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match yard_raft_store::open(dir) {
                Ok(stores) => return stores,
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("cannot reopen the store: {e}"),
            }
        }
    }

    #[tokio::test]
    async fn state_survives_reopen_from_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (_log, mut sm) = yard_raft_store::open(dir.path()).unwrap();
            sm.apply([entry(1, put("a", "1"))]).await.unwrap();
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
        }
        let (_log, mut sm) = reopen(dir.path()).await;
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
        assert_eq!(sm.feed().read(|d| d.kv["a"].value.clone()), "1");
    }
}
