//! The actix shell of an aggregator host: follows the replicated aggregation tables through the
//! change feed, keeps the XDP program's job tables equal to what [`super::core::desired`] says
//! this host serves, and publishes the program's counters per job for `yard agg stats` and the
//! metrics. Every map write is a few syscalls per job and member, so they run on the arbiter.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::broadcast::error::RecvError;
use yard_ebpf::aggregator::MemberTiming;
use yard_ebpf::{error_chain, AggCounter, AggJobEntry, Aggregator, CounterValue};
use yard_raft_store::aggregation::AggTables;
use yard_raft_store::{Change, ChangeFeed, NodeId};

use super::bandwidth::Reading;
use super::core::{desired, diff, parent_macs, retry_after, stale_counters, Effect};
use crate::health::HealthRegistry;

/// How often the shell looks for a parent MAC it lacks.
const PARENT_RESOLVE_MS: u64 = 100;

/// What the actor needs of the XDP program: the real one is [`yard_ebpf::Aggregator`].
pub trait AggDataPlane: Send {
    fn set_job(&mut self, entry: &AggJobEntry) -> Result<(), String>;
    fn remove_job(&mut self, id: u32) -> Result<(), String>;
    /// Counters by reason, summed over CPUs.
    fn counters(&self) -> Result<Vec<(AggCounter, CounterValue)>, String>;
    /// One job's counters by reason.
    fn job_counters(&self, id: u32) -> Result<Vec<(AggCounter, CounterValue)>, String>;
    fn slot_count(&self) -> u32;
    /// One job's arrival timing of its first `workers` members, by worker index (none by
    /// default: a data plane that does not time frames gives no bandwidth figures).
    fn member_timing(
        &self,
        _id: u32,
        _workers: usize,
    ) -> Result<Vec<(usize, MemberTiming)>, String> {
        Ok(Vec::new())
    }
    /// The jobs with per-job counters in the kernel (none by default).
    fn counted_jobs(&self) -> Result<BTreeSet<u32>, String> {
        Ok(BTreeSet::new())
    }
    /// Deletes one job's per-job counters.
    fn forget_counters(&mut self, _id: u32) -> Result<(), String> {
        Ok(())
    }
}

impl AggDataPlane for Aggregator {
    fn set_job(&mut self, entry: &AggJobEntry) -> Result<(), String> {
        Aggregator::set_job(self, entry).map_err(|e| error_chain(&e))
    }
    fn remove_job(&mut self, id: u32) -> Result<(), String> {
        Aggregator::remove_job(self, id).map_err(|e| error_chain(&e))
    }
    fn counters(&self) -> Result<Vec<(AggCounter, CounterValue)>, String> {
        Aggregator::counters(self).map_err(|e| error_chain(&e))
    }
    fn job_counters(&self, id: u32) -> Result<Vec<(AggCounter, CounterValue)>, String> {
        Aggregator::job_counters(self, id).map_err(|e| error_chain(&e))
    }
    fn slot_count(&self) -> u32 {
        Aggregator::slot_count(self)
    }
    fn member_timing(&self, id: u32, workers: usize) -> Result<Vec<(usize, MemberTiming)>, String> {
        Aggregator::member_timing(self, id, workers).map_err(|e| error_chain(&e))
    }
    fn counted_jobs(&self) -> Result<BTreeSet<u32>, String> {
        Aggregator::counted_jobs(self).map_err(|e| error_chain(&e))
    }
    fn forget_counters(&mut self, id: u32) -> Result<(), String> {
        Aggregator::forget_job_counters(self, id).map_err(|e| error_chain(&e))
    }
}

/// One served job as the stats show it (and `yard agg stats` carries it).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobStats {
    pub id: u32,
    pub epoch: u32,
    pub workers: usize,
    /// Slots the job holds, and their bytes of kernel memory.
    pub slots: u64,
    pub bytes: u64,
    /// This host's level in the job's tree: `"root"` (also a flat job's only aggregator) or
    /// `"cluster"` (it sends its partial sums to a parent), so the counters can be graphed by
    /// level.
    pub level: String,
    /// (counter name, packets, bytes)
    pub counters: Vec<(String, u64, u64)>,
    /// Each member's arrival timing, cumulative: what this host's drift watch compares with
    /// its baselines (`super::bandwidth::Drift`).
    pub links: Vec<Reading>,
}

/// What this host's aggregator is doing, for status, `yard agg stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AggSnapshot {
    pub node: NodeId,
    pub slot_count: u32,
    pub jobs: Vec<JobStats>,
    /// (counter name, packets, bytes) over every job and frame.
    pub counters: Vec<(String, u64, u64)>,
    /// Table writes that failed since start.
    pub errors: u64,
    pub last_error: Option<String>,
}

/// A shared, read-mostly view of the actor's snapshot.
#[derive(Debug, Clone, Default)]
pub struct AggView {
    inner: Arc<RwLock<AggSnapshot>>,
}

impl AggView {
    pub fn snapshot(&self) -> AggSnapshot {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn publish(&self, s: AggSnapshot) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = s;
    }
}

/// The aggregator host's actor.
pub struct AggregatorActor {
    me: NodeId,
    dp: Box<dyn AggDataPlane>,
    feed: ChangeFeed,
    view: AggView,
    health: HealthRegistry,
    served: BTreeMap<u32, AggJobEntry>,
    stream: Option<SpawnHandle>,
    errors: u64,
    last_error: Option<String>,
    stats_every: Duration,
    /// The interface the program is attached to: parents' MACs are looked up on it.
    iface: String,
    /// Parents' MACs as last resolved ([`parent_macs`]): kept while the kernel's entry comes
    /// and goes, replaced when the kernel has a new one, dropped when no longer a parent.
    macs: BTreeMap<Ipv4Addr, [u8; 6]>,
    /// The tables as the change feed last gave them: a retry or a parent's resolution syncs
    /// to them again without copying the tables out of the state machine.
    tables: Arc<AggTables>,
    /// Syncs in a row that had a failed table write, and the retry scheduled for them.
    failures: u32,
    retry: Option<SpawnHandle>,
}

impl AggregatorActor {
    pub fn new(
        me: NodeId,
        dp: Box<dyn AggDataPlane>,
        feed: ChangeFeed,
        view: AggView,
        health: HealthRegistry,
        stats_every: Duration,
        iface: String,
    ) -> Self {
        AggregatorActor {
            me,
            dp,
            feed,
            view,
            health,
            served: BTreeMap::new(),
            stream: None,
            errors: 0,
            last_error: None,
            stats_every,
            iface,
            macs: BTreeMap::new(),
            tables: Arc::default(),
            failures: 0,
            retry: None,
        }
    }

    /// Fills each cluster aggregator's parent MAC from the neighbour table (asking the kernel
    /// to resolve those it lacks); returns whether one is still unknown.
    fn resolve_parents(&mut self, wanted: &mut BTreeMap<u32, AggJobEntry>) -> bool {
        let parents: BTreeSet<Ipv4Addr> = wanted
            .values()
            .filter_map(|e| e.parent.map(|p| *p.addr.ip()))
            .collect();
        let kernel = if parents.is_empty() {
            BTreeMap::new()
        } else {
            let list: Vec<Ipv4Addr> = parents.iter().copied().collect();
            crate::neigh::resolve(&list, &self.iface)
        };
        self.macs = parent_macs(&self.macs, &parents, &kernel);
        let mut missing = false;
        for parent in wanted.values_mut().filter_map(|e| e.parent.as_mut()) {
            match self.macs.get(parent.addr.ip()) {
                Some(mac) => parent.mac = *mac,
                None => missing = true,
            }
        }
        missing
    }

    fn subscribe(&mut self, ctx: &mut Context<Self>) {
        if let Some(old) = self.stream.take() {
            ctx.cancel_future(old);
        }
        // Only the aggregation tables are copied under the lock, not the whole state.
        let (tables, rx) = self.feed.subscribe_with(|d| d.aggregation.clone());
        self.tables = Arc::new(tables);
        self.sync(ctx);
        self.stream = Some(
            ctx.add_stream(futures::stream::unfold(rx, |mut rx| async move {
                match rx.recv().await {
                    Err(RecvError::Closed) => None,
                    other => Some((other, rx)),
                }
            })),
        );
    }

    /// Brings the program's tables to what the latest tables say this host serves; if a write
    /// fails, syncs again after [`retry_after`] (the tables may not change again for a long
    /// time: a running job's entry would stay missing until they did).
    fn sync(&mut self, ctx: &mut Context<Self>) {
        let mut wanted = desired(&self.tables, self.me);
        let mut failed = false;
        if self.resolve_parents(&mut wanted) {
            tracing::debug!("a cluster aggregator's parent is not resolved yet");
        }
        for effect in diff(&self.served, &wanted) {
            let (result, id) = match &effect {
                Effect::Set(entry) => (self.dp.set_job(entry), entry.id),
                Effect::Remove(id) => (self.dp.remove_job(*id), *id),
            };
            match result {
                Ok(()) => match effect {
                    Effect::Set(entry) => {
                        tracing::info!(
                            job = entry.id,
                            epoch = entry.epoch,
                            workers = entry.members.len(),
                            base = entry.base,
                            "aggregating job"
                        );
                        self.served.insert(id, entry);
                    }
                    Effect::Remove(id) => {
                        tracing::info!(job = id, "no longer aggregating job");
                        self.served.remove(&id);
                    }
                },
                Err(e) => {
                    tracing::warn!(job = id, error = %e, "aggregator table write failed");
                    self.errors += 1;
                    self.last_error = Some(e);
                    failed = true;
                }
            }
        }
        if failed {
            self.failures = self.failures.saturating_add(1);
            if self.retry.is_none() {
                let after = retry_after(self.failures);
                tracing::info!(
                    failures = self.failures,
                    retry_in_ms = after.as_millis() as u64,
                    "retrying the failed aggregator table writes"
                );
                self.retry = Some(ctx.run_later(after, |act, ctx| {
                    act.retry = None;
                    act.sync(ctx);
                }));
            }
        } else {
            self.failures = 0;
            if let Some(retry) = self.retry.take() {
                ctx.cancel_future(retry);
            }
        }
        self.report();
    }

    /// Deletes the per-job counters no served job owns: `remove_job` deletes a job's, but a
    /// frame that was being counted as the job went can add one back. On the stats tick only,
    /// since listing the table is a syscall per entry.
    fn sweep_counters(&mut self) {
        let counted = match self.dp.counted_jobs() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the per-job counters");
                return;
            }
        };
        for id in stale_counters(&counted, &self.served) {
            if let Err(e) = self.dp.forget_counters(id) {
                tracing::warn!(job = id, error = %e, "cannot delete a gone job's counters");
            }
        }
    }

    fn report(&mut self) {
        let rows = |v: Vec<(AggCounter, CounterValue)>| {
            v.into_iter()
                .map(|(c, v)| (c.name().to_string(), v.packets, v.bytes))
                .collect::<Vec<_>>()
        };
        let mut jobs = Vec::new();
        for (id, e) in &self.served {
            let counters = self.dp.job_counters(*id).map(rows).unwrap_or_default();
            let links = self
                .dp
                .member_timing(*id, e.members.len())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(w, t)| {
                    Some(Reading {
                        job: *id,
                        addr: *e.members.get(w)?,
                        busy_ns: t.busy_ns,
                        bytes: t.bytes,
                    })
                })
                .collect();
            jobs.push(JobStats {
                id: *id,
                epoch: e.epoch,
                workers: e.members.len(),
                slots: e.slots(),
                bytes: e.slots() * yard_ebpf::aggregator::SLOT_BYTES,
                level: if e.parent.is_some() {
                    "cluster"
                } else {
                    "root"
                }
                .to_string(),
                counters,
                links,
            });
        }
        let counters = self.dp.counters().map(rows);
        let healthy = counters.is_ok();
        let detail = match &counters {
            Ok(_) => format!("serving {} jobs", jobs.len()),
            Err(e) => format!("cannot read the aggregator's counters: {e}"),
        };
        self.health.report("aggregator", healthy, detail);
        self.view.publish(AggSnapshot {
            node: self.me,
            slot_count: self.dp.slot_count(),
            jobs,
            counters: counters.unwrap_or_default(),
            errors: self.errors,
            last_error: self.last_error.clone(),
        });
    }
}

impl Actor for AggregatorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.subscribe(ctx);
        // A cluster aggregator also looks its parent's MAC up again each time (a replaced
        // parent host or NIC is followed), through a sync: a changed MAC rewrites the entry.
        ctx.run_interval(self.stats_every, |act, ctx| {
            act.sweep_counters();
            if act.served.values().any(|e| e.parent.is_some()) {
                act.sync(ctx);
            } else {
                act.report();
            }
        });
        // A partial sum cannot go up before its parent's MAC is known: until every parent is
        // resolved, look again soon (the kernel answers the datagram resolve sent in a few ms).
        ctx.run_interval(Duration::from_millis(PARENT_RESOLVE_MS), |act, ctx| {
            let unresolved = act
                .served
                .values()
                .any(|e| e.parent.is_some_and(|p| p.mac == [0; 6]));
            if unresolved {
                act.sync(ctx);
            }
        });
    }
}

impl StreamHandler<Result<Change, RecvError>> for AggregatorActor {
    fn handle(&mut self, item: Result<Change, RecvError>, ctx: &mut Context<Self>) {
        match item {
            Ok(Change::Aggregation { tables, .. }) => {
                self.tables = tables;
                self.sync(ctx);
            }
            Ok(Change::Reset { .. }) | Err(RecvError::Lagged(_)) => {
                tracing::info!("aggregator resyncing from the tables");
                self.subscribe(ctx);
            }
            Ok(_) | Err(RecvError::Closed) => {}
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddrV4;
    use std::sync::Mutex;
    use std::time::Instant;

    use openraft::storage::RaftStateMachine;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    use yard_raft_store::aggregation::{AggCommand, Grouping, Placement, Quota};
    use yard_raft_store::{Command, NodeMeta, StateMachineStore, TypeConfig};

    use super::*;

    const ME: NodeId = 1;

    /// A data plane whose first `fail` job writes fail; what it holds, by job id, and the
    /// jobs it has per-job counters for.
    struct Flaky {
        fail: u32,
        jobs: Arc<Mutex<BTreeMap<u32, AggJobEntry>>>,
        counted: Arc<Mutex<BTreeSet<u32>>>,
    }

    impl AggDataPlane for Flaky {
        fn set_job(&mut self, entry: &AggJobEntry) -> Result<(), String> {
            if self.fail > 0 {
                self.fail -= 1;
                return Err("the map is full".into());
            }
            self.jobs.lock().unwrap().insert(entry.id, entry.clone());
            Ok(())
        }
        fn remove_job(&mut self, id: u32) -> Result<(), String> {
            self.jobs.lock().unwrap().remove(&id);
            Ok(())
        }
        fn counters(&self) -> Result<Vec<(AggCounter, CounterValue)>, String> {
            Ok(Vec::new())
        }
        fn job_counters(&self, _: u32) -> Result<Vec<(AggCounter, CounterValue)>, String> {
            Ok(Vec::new())
        }
        fn slot_count(&self) -> u32 {
            100
        }
        fn counted_jobs(&self) -> Result<BTreeSet<u32>, String> {
            Ok(self.counted.lock().unwrap().clone())
        }
        fn forget_counters(&mut self, id: u32) -> Result<(), String> {
            self.counted.lock().unwrap().remove(&id);
            Ok(())
        }
    }

    fn entry(index: u64, cmd: AggCommand) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command::Aggregation(cmd)),
        }
    }

    /// A store whose tables run job "a" (two workers) on this host.
    async fn store_running_a_job(dir: &std::path::Path) -> StateMachineStore {
        let (_log, mut sm) = yard_raft_store::open(dir).unwrap();
        let worker = |rank: u16| SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000 + rank);
        let cmds = vec![
            AggCommand::Host {
                node: ME,
                ip: Ipv4Addr::new(198, 18, 0, 1),
                slots: 100,
                cpu_millis: 1000,
            },
            AggCommand::Create {
                name: "a".into(),
                workers: 2,
                values: 1000,
                dtype: 0,
                elastic: false,
                chunk_values: 360,
                colocate: false,
                quota: Quota {
                    job_bytes: 1 << 30,
                    cluster_bytes: 1 << 30,
                },
                grouping: Grouping::Flat,
                secret: [7; 16],
            },
            AggCommand::Join {
                name: "a".into(),
                rank: 0,
                addr: worker(0),
            },
            AggCommand::Join {
                name: "a".into(),
                rank: 1,
                addr: worker(1),
            },
        ];
        let entries: Vec<_> = cmds
            .into_iter()
            .enumerate()
            .map(|(i, c)| entry(i as u64 + 2, c))
            .collect();
        // The host aggregates only as a member.
        let member = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
            payload: EntryPayload::Normal(Command::SetNode(NodeMeta {
                id: ME,
                name: "n1".into(),
                addr: "198.18.0.1:7480".into(),
                ..NodeMeta::default()
            })),
        };
        sm.apply(std::iter::once(member).chain(entries))
            .await
            .unwrap();
        let expect_epoch = sm.feed().read(|d| d.aggregation.jobs["a"].epoch);
        let place = AggCommand::Place {
            name: "a".into(),
            expect_epoch,
            placement: Placement { node: ME, base: 0 },
        };
        sm.apply([entry(6, place)]).await.unwrap();
        sm
    }

    /// A table write that fails is written again on its own, with the tables unchanged
    /// since: the job is served once the data plane takes it.
    #[actix_rt::test]
    async fn a_failed_table_write_is_retried_without_a_new_change() {
        let dir = tempfile::tempdir().unwrap();
        let sm = store_running_a_job(dir.path()).await;
        let feed = sm.feed();
        assert!(
            feed.read(|d| d.aggregation.jobs["a"].running()),
            "the job runs in the tables"
        );
        let jobs = Arc::default();
        let view = AggView::default();
        let _actor = AggregatorActor::new(
            ME,
            Box::new(Flaky {
                fail: 2,
                jobs: Arc::clone(&jobs),
                counted: Arc::default(),
            }),
            feed,
            view.clone(),
            HealthRegistry::default(),
            Duration::from_secs(3600),
            "lo".into(),
        )
        .start();
        let start = Instant::now();
        while jobs.lock().unwrap().is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the failed write was not retried: {:?}",
                view.snapshot()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let snap = view.snapshot();
        assert_eq!(snap.errors, 2, "two failed writes before the third took");
        assert_eq!(snap.jobs.len(), 1, "{snap:?}");
    }

    /// Counters the kernel holds for a job this host does not serve (a frame counted as the
    /// job was removed) are deleted on the stats tick; the served job's are kept.
    #[actix_rt::test]
    async fn counters_of_a_job_not_served_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let sm = store_running_a_job(dir.path()).await;
        let feed = sm.feed();
        let served = feed.read(|d| d.aggregation.jobs["a"].id);
        let counted = Arc::new(Mutex::new(BTreeSet::from([served, 99])));
        let _actor = AggregatorActor::new(
            ME,
            Box::new(Flaky {
                fail: 0,
                jobs: Arc::default(),
                counted: Arc::clone(&counted),
            }),
            feed,
            AggView::default(),
            HealthRegistry::default(),
            Duration::from_millis(20),
            "lo".into(),
        )
        .start();
        let start = Instant::now();
        while counted.lock().unwrap().contains(&99) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "a gone job's counters were not swept"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*counted.lock().unwrap(), BTreeSet::from([served]));
    }
}
