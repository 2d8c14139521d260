//! The actix shell of an aggregator host: follows the replicated aggregation tables through the
//! change feed, keeps the XDP program's job tables equal to what [`super::core::desired`] says
//! this host serves, and publishes the program's counters per job for `yard agg stats` and the
//! metrics. Every map write is a few syscalls per job and member, so they run on the arbiter.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::broadcast::error::RecvError;
use yard_ebpf::aggregator::MemberTiming;
use yard_ebpf::{error_chain, AggCounter, AggJobEntry, Aggregator, CounterValue};
use yard_raft_store::aggregation::AggTables;
use yard_raft_store::{Change, ChangeFeed, NodeId};

use super::bandwidth::Reading;
use super::core::{desired, diff, Effect};
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
    /// Parents' MACs as last resolved: kept while the kernel's entry comes and goes (the
    /// partial sums bypass the neighbour table, so nothing keeps it fresh).
    macs: BTreeMap<std::net::Ipv4Addr, [u8; 6]>,
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
        }
    }

    /// Fills each cluster aggregator's parent MAC from the neighbour table (asking the kernel
    /// to resolve those it lacks); returns whether one is still unknown.
    fn resolve_parents(&mut self, wanted: &mut BTreeMap<u32, AggJobEntry>) -> bool {
        let parents: Vec<std::net::Ipv4Addr> = wanted
            .values()
            .filter_map(|e| e.parent.map(|p| *p.addr.ip()))
            .filter(|ip| !self.macs.contains_key(ip))
            .collect();
        if !parents.is_empty() {
            self.macs
                .extend(crate::neigh::resolve(&parents, &self.iface));
        }
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
        let (data, rx) = self.feed.subscribe();
        self.sync(&data.aggregation);
        self.stream = Some(
            ctx.add_stream(futures::stream::unfold(rx, |mut rx| async move {
                match rx.recv().await {
                    Err(RecvError::Closed) => None,
                    other => Some((other, rx)),
                }
            })),
        );
    }

    /// Brings the program's tables to what `tables` says this host serves.
    fn sync(&mut self, tables: &AggTables) {
        let mut wanted = desired(tables, self.me);
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
                }
            }
        }
        self.report();
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
        ctx.run_interval(self.stats_every, |act, _| act.report());
        // A partial sum cannot go up before its parent's MAC is known: until every parent is
        // resolved, look again soon (the kernel answers the datagram resolve sent in a few ms).
        ctx.run_interval(Duration::from_millis(PARENT_RESOLVE_MS), |act, _| {
            let unresolved = act
                .served
                .values()
                .any(|e| e.parent.is_some_and(|p| p.mac == [0; 6]));
            if unresolved {
                let tables = act.feed.read(|d| d.aggregation.clone());
                act.sync(&tables);
            }
        });
    }
}

impl StreamHandler<Result<Change, RecvError>> for AggregatorActor {
    fn handle(&mut self, item: Result<Change, RecvError>, ctx: &mut Context<Self>) {
        match item {
            Ok(Change::Aggregation { tables, .. }) => self.sync(&tables),
            Ok(Change::Reset { .. }) | Err(RecvError::Lagged(_)) => {
                tracing::info!("aggregator resyncing from the tables");
                self.subscribe(ctx);
            }
            Ok(_) | Err(RecvError::Closed) => {}
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}
