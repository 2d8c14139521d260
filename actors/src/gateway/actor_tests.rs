//! The shell against fakes: a real store and change feed, an in-memory data plane, an interface
//! whose address changes are slow, and a leader that grants every renewal at once.

use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Instant;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use yard_raft_store::gateway::{GatewayCommand, VipChange, VipRecord};
use yard_raft_store::{Command, StateMachineStore, TypeConfig};

use super::*;

const ME: NodeId = 1;

fn vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 255, n)
}

/// An in-memory data plane on a clock that starts at 1 s.
struct FakeDataPlane {
    start: Instant,
}

impl DataPlane for FakeDataPlane {
    fn now_ms(&self) -> u64 {
        1_000 + self.start.elapsed().as_millis() as u64
    }
    fn set_lease(&mut self, _: u64) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn put_vip(&mut self, _: Ipv4Addr, _: Serve) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn remove_vip(&mut self, _: Ipv4Addr) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn put_endpoint(&mut self, _: &Endpoint) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn remove_endpoint(&mut self, _: &EndpointKey) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn put_source(&mut self, _: u32, _: Ipv4Addr) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn remove_source(&mut self, _: u32, _: Ipv4Addr) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn put_host(&mut self, _: Ipv4Addr, _: [u8; 6]) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn remove_host(&mut self, _: Ipv4Addr) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn counters(&self) -> Result<Vec<CounterRow>, DataPlaneError> {
        Ok(Vec::new())
    }
    fn adopted(&self) -> Result<Adopted, DataPlaneError> {
        Ok(Adopted::default())
    }
}

/// Address additions as they happened: (vip, the thread that ran them).
type Added = Arc<Mutex<Vec<(Ipv4Addr, ThreadId)>>>;

/// An interface whose `add_address` takes `delay`, like a fork/exec of `ip` on a loaded host.
struct SlowInterface {
    delay: Duration,
    added: Added,
}

impl Interface for SlowInterface {
    fn mac(&self) -> [u8; 6] {
        [2, 0, 0, 0, 0, 1]
    }
    fn add_address(&mut self, vip: Ipv4Addr) -> Result<(), DataPlaneError> {
        std::thread::sleep(self.delay);
        self.added
            .lock()
            .unwrap()
            .push((vip, std::thread::current().id()));
        Ok(())
    }
    fn remove_address(&mut self, _: Ipv4Addr) -> Result<(), DataPlaneError> {
        std::thread::sleep(self.delay);
        Ok(())
    }
    fn addresses(&self) -> Result<Vec<Ipv4Addr>, DataPlaneError> {
        Ok(Vec::new())
    }
    fn send_frame(&mut self, _: &[u8]) -> Result<(), DataPlaneError> {
        Ok(())
    }
    fn resolve(&mut self, _: &[Ipv4Addr]) -> BTreeMap<Ipv4Addr, [u8; 6]> {
        BTreeMap::new()
    }
}

/// A leader that grants 1 s to every renewal, at revision 0.
struct Granting;

impl Renewer for Granting {
    fn renew(&self, _: u64, _: u64) -> RenewFuture {
        Box::pin(async { Some((1_000, 0)) })
    }
    fn grace(&self, _: u64, _: u64) -> RenewFuture {
        Box::pin(async { Some((1_000, 0)) })
    }
}

fn entry(index: u64, cmd: GatewayCommand) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Command::Gateway(cmd)),
    }
}

/// A store whose table gives `vip(1)` to this node.
async fn store_owning_a_vip(dir: &std::path::Path) -> StateMachineStore {
    let (_log, mut sm) = yard_raft_store::open(dir).unwrap();
    sm.apply([
        entry(1, GatewayCommand::AddVips(vec![vip(1)])),
        entry(
            2,
            GatewayCommand::Assign(vec![VipChange {
                vip: vip(1),
                expect: VipRecord::default(),
                set: VipRecord {
                    owner: Some(ME),
                    ..VipRecord::default()
                },
            }]),
        ),
    ])
    .await
    .unwrap();
    sm
}

fn start_actor(feed: ChangeFeed, delay: Duration, added: Added) -> Addr<GatewayActor> {
    GatewayActor::new(
        GatewaySettings {
            node: ME,
            renew_every: Duration::from_millis(10),
            core: CoreConfig::default(),
        },
        Box::new(FakeDataPlane {
            start: Instant::now(),
        }),
        Box::new(SlowInterface { delay, added }),
        Arc::new(Granting),
        feed,
        GatewayView::default(),
        HealthRegistry::default(),
    )
    .start()
}

async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[actix_rt::test]
async fn a_resync_keeps_exactly_one_feed_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = store_owning_a_vip(dir.path()).await;
    let feed = sm.feed();
    let added = Added::default();
    let _actor = start_actor(feed.clone(), Duration::ZERO, added.clone());
    wait_for("the first subscription", Duration::from_secs(5), || {
        feed.receivers() == 1 && !added.lock().unwrap().is_empty()
    })
    .await;
    // Each installed snapshot sends every subscriber a Reset, and each resyncs.
    for _ in 0..3 {
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        sm.install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        feed.receivers(),
        1,
        "a resync must replace the subscription"
    );
}

/// Minimal actor sharing the gateway's arbiter: how long it takes to answer is how long the
/// arbiter is blocked.
struct Echo;

impl Actor for Echo {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
struct Ping;

impl Handler<Ping> for Echo {
    type Result = ();
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}

#[actix_rt::test]
async fn slow_address_changes_do_not_block_the_arbiter() {
    let dir = tempfile::tempdir().unwrap();
    let sm = store_owning_a_vip(dir.path()).await;
    let added = Added::default();
    let arbiter = std::thread::current().id();
    let echo = Echo.start();
    let _actor = start_actor(sm.feed(), Duration::from_millis(200), added.clone());
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    // Ping through the taking of the VIP (a 200 ms `add_address`) and a while after it.
    let mut done_at = None;
    while done_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(300)) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the vip was never added"
        );
        let sent = Instant::now();
        echo.send(Ping).await.unwrap();
        worst = worst.max(sent.elapsed());
        if done_at.is_none() && !added.lock().unwrap().is_empty() {
            done_at = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let added = added.lock().unwrap().clone();
    assert_eq!(added.len(), 1, "{added:?}");
    assert_eq!(added[0].0, vip(1));
    assert_ne!(
        added[0].1, arbiter,
        "the address was added on the arbiter's thread"
    );
    assert!(
        worst < Duration::from_millis(50),
        "a message waited {worst:?} on the gateway's arbiter"
    );
}
