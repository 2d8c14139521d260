//! The analyzer's home on the Raft leader: probe summaries from every node come in here, one
//! [`JobAnalyzer`] per job turns them into verdicts, and each change of a job's verdict set is
//! committed through Raft (so any node answers `yard diagnose`), exported as metrics and sent
//! to the alert hook.
//!
//! A new leader starts with empty analyzers; nodes replay what a fresh analyzer needs (members,
//! groups, each rank's latest phase) when they see the leader change. Until a job has been
//! watched for a warm-up period, this leader never clears verdicts its predecessor committed.
//!
//! Summaries and analysis are kept apart so that neither waits on the other: a summary only
//! joins an inbox (a short lock, on the runtime), and each pass, on a blocking thread, takes
//! the inbox into the analyzers and evaluates them. An analysis pass grows with jobs and ranks
//! (tens of milliseconds at 16k ranks); on the runtime, or under a lock that summaries take,
//! it would hold up Raft's heartbeats and every request behind it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openraft::ServerState;
use yard_actors::probe::core::JobBatch;
use yard_diagnosis::analyzer::{Config as AnalyzerConfig, JobAnalyzer, Rejected};
use yard_diagnosis::event::{Coll, Member};
use yard_diagnosis::verdict::Verdict;
use yard_raft_store::diagnosis::DiagnosisCommand;
use yard_raft_store::{ChangeFeed, Command, Raft};

use crate::alert::AlertHook;
use crate::metrics::{Family, METRICS};

/// Settings of the leader's analyzer loop.
#[derive(Debug, Clone)]
pub struct DiagnosisSettings {
    pub analyzer: AnalyzerConfig,
    pub evaluate_every: Duration,
    pub job_idle: Duration,
    pub hook: AlertHook,
    /// Most heap bytes all jobs' analyzers may hold together (each job also has its own
    /// budget, in `analyzer`): a new job or an event past it is refused.
    pub total_budget_bytes: usize,
}

/// The default total budget: 2 GiB, four 16,384-rank jobs at their full per-job budget or
/// many more small ones, on the leader only.
pub const DEFAULT_TOTAL_BUDGET: usize = 2 << 30;

struct Job {
    analyzer: JobAnalyzer,
    last_event: Instant,
    /// When this leader started watching the job.
    since: Instant,
    /// Keys of the verdicts this leader last committed.
    committed: Option<Vec<VerdictKey>>,
    events: u64,
}

type VerdictKey = (
    yard_diagnosis::verdict::Class,
    yard_diagnosis::verdict::Subtype,
    Vec<u32>,
    Vec<yard_diagnosis::verdict::Link>,
    Option<String>,
);

/// One node's summary as it arrived: analysed by the next pass, at its arrival time.
struct Arrival {
    term: u64,
    now_ns: u64,
    wall: Instant,
    batches: Vec<JobBatch>,
}

/// What summaries write into; never held across analysis.
#[derive(Default)]
struct Inbox {
    arrivals: Vec<Arrival>,
}

/// The analyzers; only passes and `window` (both on blocking threads) take it.
#[derive(Default)]
struct Analysis {
    term: Option<u64>,
    jobs: HashMap<String, Job>,
}

impl Analysis {
    /// Heap bytes all jobs hold, by their analyzers' estimates plus the map's entries.
    fn footprint(&self) -> usize {
        self.jobs
            .iter()
            .map(|(name, j)| job_overhead(name) + j.analyzer.footprint())
            .sum()
    }
}

/// What a job costs the leader besides its analyzer's footprint: its entry in the job map.
fn job_overhead(name: &str) -> usize {
    std::mem::size_of::<(String, Job)>() + name.len() + 2
}

/// A changed verdict set of one job, to be committed.
struct Commit {
    job: String,
    verdicts: Vec<Verdict>,
    keys: Vec<VerdictKey>,
    /// The verdicts not in the set this leader last committed (logged and sent to the hook).
    new: Vec<Verdict>,
}

/// The leader-side diagnosis service.
pub struct DiagnosisControl {
    settings: DiagnosisSettings,
    epoch: Instant,
    inbox: Mutex<Inbox>,
    analysis: Mutex<Analysis>,
    events_total: AtomicU64,
    verdicts_raised: AtomicU64,
    commit_failures: AtomicU64,
    jobs_watched: AtomicU64,
    /// Events refused for naming a rank outside their job's world.
    events_rejected: AtomicU64,
    /// Events refused because their job, or all jobs together, would exceed a memory budget.
    events_over_budget: AtomicU64,
    /// Jobs not started because all jobs together were at their memory budget.
    jobs_refused: AtomicU64,
    /// Heap bytes the analyzers held after the last pass (by their estimate).
    bytes: AtomicU64,
}

/// A job's refused events are logged at the first and then every this many (one bad client
/// can send thousands a second).
const LOG_REJECTED_EVERY: u64 = 1000;

impl DiagnosisControl {
    pub fn new(settings: DiagnosisSettings) -> Self {
        Self {
            settings,
            epoch: Instant::now(),
            inbox: Mutex::default(),
            analysis: Mutex::default(),
            events_total: AtomicU64::new(0),
            verdicts_raised: AtomicU64::new(0),
            commit_failures: AtomicU64::new(0),
            jobs_watched: AtomicU64::new(0),
            events_rejected: AtomicU64::new(0),
            events_over_budget: AtomicU64::new(0),
            jobs_refused: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn analysis(&self) -> MutexGuard<'_, Analysis> {
        self.analysis.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The analyzer's clock: nanoseconds since this control started (monotonic).
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Starts afresh when this node leads in a new term. Summaries carry the term they arrived
    /// in, so one that arrives right after the election (the nodes' replays do), before the
    /// term's first pass, is kept, not cleared by that pass.
    fn enter_term(a: &mut Analysis, term: u64) {
        if a.term != Some(term) {
            tracing::info!(term, "analyzer: leading");
            a.term = Some(term);
            a.jobs.clear();
        }
    }

    /// Takes one node's summary while this node leads in `term` (the service checks). Only
    /// queues it: never waits on an analysis pass.
    pub fn ingest(&self, term: u64, batches: Vec<JobBatch>) {
        let events: usize = batches.iter().map(|b| b.events.len()).sum();
        let arrival = Arrival {
            term,
            now_ns: self.now_ns(),
            wall: Instant::now(),
            batches,
        };
        self.inbox().arrivals.push(arrival);
        self.events_total
            .fetch_add(events as u64, Ordering::Relaxed);
    }

    /// Feeds queued summaries of `term` into the analyzers (older terms' are dropped, newer
    /// ones wait for their term's pass).
    fn take_arrivals(&self, a: &mut Analysis, term: u64) {
        let arrivals = {
            let mut inbox = self.inbox();
            let (mine, later): (Vec<Arrival>, Vec<Arrival>) = std::mem::take(&mut inbox.arrivals)
                .into_iter()
                .filter(|r| r.term >= term)
                .partition(|r| r.term == term);
            inbox.arrivals = later;
            mine
        };
        let cfg = &self.settings.analyzer;
        let budget = self.settings.total_budget_bytes;
        let mut total = a.footprint();
        for arrival in arrivals {
            for batch in arrival.batches {
                if !a.jobs.contains_key(&batch.job) {
                    let analyzer = JobAnalyzer::new(batch.job.clone(), cfg.clone());
                    let cost = job_overhead(&batch.job) + analyzer.footprint();
                    if total.saturating_add(cost) > budget {
                        let refused = self.jobs_refused.fetch_add(1, Ordering::Relaxed) + 1;
                        self.events_over_budget
                            .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
                        if refused % LOG_REJECTED_EVERY == 1 {
                            tracing::warn!(job = %batch.job, refused, held = total, budget, "analyzer: new job refused: all jobs together are at the analyzer's memory budget");
                        }
                        continue;
                    }
                    tracing::info!(job = %batch.job, "analyzer: new job");
                    total += cost;
                    a.jobs.insert(
                        batch.job.clone(),
                        Job {
                            analyzer,
                            last_event: arrival.wall,
                            since: arrival.wall,
                            committed: None,
                            events: 0,
                        },
                    );
                }
                let Some(job) = a.jobs.get_mut(&batch.job) else {
                    continue;
                };
                job.last_event = arrival.wall;
                job.events += batch.events.len() as u64;
                for ev in &batch.events {
                    let before = job.analyzer.footprint();
                    // This job's share: what it holds plus what all jobs have left.
                    let limit = before.saturating_add(budget.saturating_sub(total));
                    let result = job.analyzer.try_ingest_within(ev, arrival.now_ns, limit);
                    total = (total + job.analyzer.footprint()).saturating_sub(before);
                    let Err(e) = result else { continue };
                    let over = matches!(e, Rejected::OverBudget { .. });
                    let counter = if over {
                        &self.events_over_budget
                    } else {
                        &self.events_rejected
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let rejected = job.analyzer.rejected_events();
                    if rejected % LOG_REJECTED_EVERY == 1 {
                        tracing::warn!(job = %batch.job, rejected, over_budget = over, error = %e, "analyzer: event refused");
                    }
                }
            }
        }
    }

    /// One analysis pass for `term` (on a blocking thread): records what the last commits
    /// achieved, takes the queued summaries, forgets idle jobs, evaluates every job and
    /// returns the verdict sets that changed. `stored_verdicts(job)` says whether the
    /// replicated table holds verdicts for the job (a predecessor's, maybe).
    fn pass(
        &self,
        term: u64,
        committed: Vec<(String, Vec<VerdictKey>)>,
        warmup: Duration,
        stored_verdicts: impl Fn(&str) -> bool,
    ) -> Vec<Commit> {
        let _pass_timer = METRICS.analyzer_pass.start_timer();
        let mut a = self.analysis();
        Self::enter_term(&mut a, term);
        for (job, keys) in committed {
            if let Some(j) = a.jobs.get_mut(&job) {
                j.committed = Some(keys);
            }
        }
        self.take_arrivals(&mut a, term);
        let idle = self.settings.job_idle;
        a.jobs.retain(|name, j| {
            let keep = j.last_event.elapsed() < idle;
            if !keep {
                tracing::info!(job = %name, "analyzer: job idle; forgetting it");
            }
            keep
        });
        self.jobs_watched
            .store(a.jobs.len() as u64, Ordering::Relaxed);
        let now = self.now_ns();
        let mut commits = Vec::new();
        for (name, job) in &mut a.jobs {
            let verdicts = job.analyzer.evaluate(now).to_vec();
            let keys: Vec<VerdictKey> = verdicts.iter().map(Verdict::key).collect();
            if job.committed.as_ref() == Some(&keys) {
                continue;
            }
            // Nothing seen by this leader yet: clear a predecessor's verdicts only after
            // watching the job long enough to have seen a fault if any.
            if verdicts.is_empty()
                && job.committed.is_none()
                && job.since.elapsed() < warmup
                && stored_verdicts(name)
            {
                continue;
            }
            let new: Vec<Verdict> = verdicts
                .iter()
                .filter(|v| {
                    job.committed
                        .as_ref()
                        .is_none_or(|old| !old.contains(&v.key()))
                })
                .cloned()
                .collect();
            commits.push(Commit {
                job: name.clone(),
                verdicts,
                keys,
                new,
            });
        }
        self.bytes.store(a.footprint() as u64, Ordering::Relaxed);
        commits
    }

    /// Drops every job and queued summary: this node no longer leads.
    fn stop_leading(&self) {
        self.inbox().arrivals.clear();
        let mut a = self.analysis();
        if a.term.take().is_some() {
            tracing::info!("analyzer: no longer leading; dropping job state");
        }
        a.jobs.clear();
        self.jobs_watched.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
    }

    /// The collective records and members around a job's top verdict (for `--svg`), if this
    /// leader watches the job. Waits for a running pass: call it off the runtime.
    pub fn window(&self, job: &str, verdict: Option<&Verdict>) -> Option<(Vec<Coll>, Vec<Member>)> {
        let a = self.analysis();
        let j = a.jobs.get(job)?;
        let colls = verdict.map(|v| j.analyzer.window(v)).unwrap_or_default();
        let mut ranks: Vec<u32> = colls.iter().map(|c| c.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let members = ranks
            .iter()
            .filter_map(|&r| j.analyzer.member(r).cloned())
            .collect();
        Some((colls, members))
    }

    /// The leader loop: re-evaluates every job (off the runtime) and commits changed verdict
    /// sets.
    pub async fn run(self: Arc<Self>, raft: Raft, feed: ChangeFeed) {
        let warmup = Duration::from_nanos(
            self.settings
                .analyzer
                .hang_floor_ns
                .max(self.settings.analyzer.heartbeat_timeout_ns)
                * 2,
        );
        // What the last pass's commits achieved, for the next pass to record.
        let mut committed: Vec<(String, Vec<VerdictKey>)> = Vec::new();
        let mut leading = false;
        loop {
            tokio::time::sleep(self.settings.evaluate_every).await;
            let m = raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                if std::mem::take(&mut leading) {
                    committed.clear();
                    let this = self.clone();
                    let _ = tokio::task::spawn_blocking(move || this.stop_leading()).await;
                }
                crate::raft_wait::wait_leading(&raft, crate::raft_wait::IDLE_RECHECK).await;
                continue;
            }
            leading = true;
            let this = self.clone();
            let pass_feed = feed.clone();
            let done = std::mem::take(&mut committed);
            let pass = tokio::task::spawn_blocking(move || {
                this.pass(m.current_term, done, warmup, |job| {
                    pass_feed.read(|d| {
                        d.diagnosis
                            .jobs
                            .get(job)
                            .is_some_and(|j| !j.verdicts.is_empty())
                    })
                })
            });
            let commits = match pass.await {
                Ok(commits) => commits,
                Err(e) => {
                    tracing::error!(error = %e, "analysis pass failed");
                    continue;
                }
            };
            for c in commits {
                let cmd = Command::Diagnosis(DiagnosisCommand::SetVerdicts {
                    job: c.job.clone(),
                    verdicts: c.verdicts.clone(),
                    now_unix_ms: now_unix_ms(),
                });
                match raft.client_write(cmd).await {
                    Ok(_) => {
                        self.verdicts_raised
                            .fetch_add(c.new.len() as u64, Ordering::Relaxed);
                        self.announce(&c);
                        committed.push((c.job, c.keys));
                    }
                    Err(e) => {
                        self.commit_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(job = %c.job, error = %e, "cannot commit verdicts");
                    }
                }
            }
        }
    }

    /// Logs a committed verdict set's new verdicts and sends each to the alert hook.
    fn announce(&self, c: &Commit) {
        let job = &c.job;
        for v in &c.new {
            tracing::warn!(
                job = %job,
                class = %v.class,
                subtype = %v.subtype,
                culprits = ?v.culprits,
                links = ?v.links.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
                confidence = v.confidence,
                "diagnosis verdict"
            );
            if !self.settings.hook.is_empty() {
                let body = serde_json::json!({"job": job, "verdict": v});
                self.settings.hook.fire(job, body.to_string());
            }
        }
        if c.verdicts.is_empty() {
            tracing::info!(job = %job, "diagnosis: job healthy again");
        }
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl DiagnosisControl {
    /// Metric families: the analyzer's own counters (non-zero on the leader) and every job's
    /// current verdicts from the replicated table (the same on every node).
    pub fn families(&self, feed: &ChangeFeed) -> Vec<Family> {
        let (events, raised, failures, jobs, rejected) = (
            self.events_total.load(Ordering::Relaxed),
            self.verdicts_raised.load(Ordering::Relaxed),
            self.commit_failures.load(Ordering::Relaxed),
            self.jobs_watched.load(Ordering::Relaxed),
            self.events_rejected.load(Ordering::Relaxed),
        );
        let (over_budget, jobs_refused, bytes) = (
            self.events_over_budget.load(Ordering::Relaxed),
            self.jobs_refused.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        );
        let verdicts = feed.read(|d| {
            let mut counts: BTreeMap<String, f64> = BTreeMap::new();
            for (job, j) in &d.diagnosis.jobs {
                for v in &j.verdicts {
                    let labels = format!(
                        "job=\"{}\",class=\"{}\",subtype=\"{}\"",
                        escape_label(job),
                        v.class,
                        v.subtype
                    );
                    *counts.entry(labels).or_default() += 1.0;
                }
            }
            counts.into_iter().collect::<Vec<_>>()
        });
        vec![
            Family {
                name: "yard_diagnosis_verdicts",
                help: "current diagnosis verdicts per job, class and subtype",
                kind: "gauge",
                samples: verdicts,
            },
            Family {
                name: "yard_analyzer_state",
                help: "the analyzer on this node: events taken, events refused (a rank outside the job's world), events refused over a memory budget, jobs refused over the total budget, bytes held (estimate), verdicts raised, commit failures, jobs watched (non-zero only while leading)",
                kind: "gauge",
                samples: vec![
                    ("what=\"events\"".into(), events as f64),
                    ("what=\"events_rejected\"".into(), rejected as f64),
                    ("what=\"events_over_budget\"".into(), over_budget as f64),
                    ("what=\"jobs_refused\"".into(), jobs_refused as f64),
                    ("what=\"bytes\"".into(), bytes as f64),
                    ("what=\"verdicts_raised\"".into(), raised as f64),
                    ("what=\"commit_failures\"".into(), failures as f64),
                    ("what=\"jobs\"".into(), jobs as f64),
                ],
            },
        ]
    }
}

/// Prometheus label values escape backslash, quote and newline.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use yard_diagnosis::event::Event;

    fn control() -> Arc<DiagnosisControl> {
        Arc::new(DiagnosisControl::new(DiagnosisSettings {
            analyzer: AnalyzerConfig::default(),
            evaluate_every: Duration::from_millis(100),
            job_idle: Duration::from_secs(600),
            hook: AlertHook::default(),
            total_budget_bytes: DEFAULT_TOTAL_BUDGET,
        }))
    }

    fn summary(job: &str) -> Vec<JobBatch> {
        vec![JobBatch {
            job: job.into(),
            events: vec![Event::Heartbeat { rank: 0, t_ns: 1 }],
        }]
    }

    fn watched(c: &DiagnosisControl) -> Vec<String> {
        let mut jobs: Vec<String> = c.analysis().jobs.keys().cloned().collect();
        jobs.sort();
        jobs
    }

    #[test]
    fn a_summary_never_waits_on_an_analysis_pass() {
        let c = control();
        // An analysis pass in progress holds the analyzers.
        let pass = c.analysis();
        let (done, finished) = std::sync::mpsc::channel();
        let ingesting = c.clone();
        let t = std::thread::spawn(move || {
            ingesting.ingest(3, summary("train"));
            done.send(()).unwrap();
        });
        assert!(
            finished.recv_timeout(Duration::from_secs(10)).is_ok(),
            "ingest waited for the analysis pass"
        );
        drop(pass);
        t.join().unwrap();
        assert_eq!(c.families_counter("events"), 1.0);
    }

    #[test]
    fn a_pass_takes_its_terms_summaries_keeps_later_ones_and_drops_older_ones() {
        let c = control();
        // A replay that arrived right after the election, before the term's first pass.
        c.ingest(5, summary("replayed"));
        c.ingest(4, summary("stale"));
        c.ingest(6, summary("next-term"));
        let commits = c.pass(5, Vec::new(), Duration::ZERO, |_| false);
        assert_eq!(watched(&c), ["replayed"]);
        // The job's first (empty) verdict set is recorded once, then only changes are.
        assert_eq!(commits.len(), 1);
        assert_eq!(commits[0].job, "replayed");
        assert!(commits[0].verdicts.is_empty() && commits[0].new.is_empty());
        let done = vec![(commits[0].job.clone(), commits[0].keys.clone())];
        assert!(c.pass(5, done, Duration::ZERO, |_| false).is_empty());
        // The next term starts afresh and takes what arrived in it.
        c.pass(6, Vec::new(), Duration::ZERO, |_| false);
        assert_eq!(watched(&c), ["next-term"]);
        c.stop_leading();
        assert!(watched(&c).is_empty());
        assert_eq!(c.families_counter("jobs"), 0.0);
    }

    #[test]
    fn a_new_leader_keeps_its_predecessors_verdicts_through_the_warm_up() {
        let c = control();
        c.ingest(7, summary("train"));
        let hour = Duration::from_secs(3600);
        assert!(
            c.pass(7, Vec::new(), hour, |job| job == "train").is_empty(),
            "cleared a predecessor's verdicts before watching the job for the warm-up"
        );
        // Nothing stored: the job's (empty) set is recorded at once.
        assert_eq!(c.pass(7, Vec::new(), hour, |_| false).len(), 1);
    }

    fn member(rank: u32) -> Event {
        Event::Member(Member {
            rank,
            world_size: 2,
            host: "h1".into(),
            addr: "198.18.0.1".into(),
            nic: String::new(),
            switch: String::new(),
            pid: 100 + rank,
        })
    }

    fn batch(job: &str, events: Vec<Event>) -> Vec<JobBatch> {
        vec![JobBatch {
            job: job.into(),
            events,
        }]
    }

    fn quick() -> Arc<DiagnosisControl> {
        Arc::new(DiagnosisControl::new(DiagnosisSettings {
            analyzer: AnalyzerConfig {
                heartbeat_timeout_ns: 20_000_000,
                ..AnalyzerConfig::default()
            },
            evaluate_every: Duration::from_millis(100),
            job_idle: Duration::from_secs(600),
            hook: AlertHook::default(),
            total_budget_bytes: DEFAULT_TOTAL_BUDGET,
        }))
    }

    /// Issue 10: after a node's replay (its summary lost, or before this fix, any replay)
    /// re-announced the ranks of a finished job, the leader committed every one of them as
    /// a dead process and sent each to the alert hook.
    #[test]
    fn a_replay_of_a_finished_job_raises_no_dead_process() {
        let c = quick();
        c.ingest(
            1,
            batch(
                "done",
                vec![
                    member(0),
                    member(1),
                    Event::Exit { rank: 0, t_ns: 5 },
                    Event::Exit { rank: 1, t_ns: 5 },
                ],
            ),
        );
        let first = c.pass(1, Vec::new(), Duration::ZERO, |_| false);
        assert!(first.iter().all(|c| c.verdicts.is_empty()));
        let done: Vec<_> = first.into_iter().map(|c| (c.job, c.keys)).collect();
        // A replay as a node sends it: introductions again (older nodes) and goodbyes.
        c.ingest(
            1,
            batch(
                "done",
                vec![
                    member(0),
                    member(1),
                    Event::Exit { rank: 0, t_ns: 5 },
                    member(1),
                ],
            ),
        );
        c.pass(1, done, Duration::ZERO, |_| false);
        std::thread::sleep(Duration::from_millis(60));
        let later = c.pass(1, Vec::new(), Duration::ZERO, |_| false);
        let dead: Vec<&Verdict> = later.iter().flat_map(|c| &c.new).collect();
        assert!(
            dead.is_empty(),
            "a finished job's ranks were called dead: {dead:#?}"
        );
    }

    /// Issue 10: one event with rank 1,048,575 grew its job to a million rank entries.
    #[test]
    fn an_event_outside_the_jobs_world_is_refused_and_counted() {
        let c = quick();
        c.ingest(
            1,
            batch(
                "j",
                vec![
                    member(0),
                    Event::Heartbeat {
                        rank: 1_048_575,
                        t_ns: 1,
                    },
                ],
            ),
        );
        c.pass(1, Vec::new(), Duration::ZERO, |_| false);
        assert_eq!(c.families_counter("events_rejected"), 1.0);
        let a = c.analysis();
        assert!(a.jobs["j"].analyzer.retained_records() < 100);
    }

    /// Issue 25: the leader's job map had no cap and each job's rank table was sized to the
    /// highest rank seen, so job names and one large rank number grew the leader's memory
    /// without bound.
    #[test]
    fn ten_thousand_jobs_and_a_rank_near_2_pow_20_stay_under_the_total_budget() {
        let budget = 2 << 20;
        let c = Arc::new(DiagnosisControl::new(DiagnosisSettings {
            total_budget_bytes: budget,
            ..control().settings.clone()
        }));
        let mut batches = vec![JobBatch {
            job: "big".into(),
            events: vec![
                Event::Member(Member {
                    world_size: 1 << 20,
                    ..match member((1 << 20) - 1) {
                        Event::Member(m) => m,
                        _ => unreachable!(),
                    }
                }),
                Event::Heartbeat {
                    rank: (1 << 20) - 1,
                    t_ns: 1,
                },
            ],
        }];
        batches.extend((0..10_000).map(|i| JobBatch {
            job: format!("job-{i}"),
            events: vec![member(0), Event::Heartbeat { rank: 1, t_ns: 1 }],
        }));
        c.ingest(1, batches);
        c.pass(1, Vec::new(), Duration::ZERO, |_| false);
        let held = c.analysis().footprint();
        assert!(
            held <= budget,
            "{held} bytes held over a {budget}-byte budget"
        );
        assert!(c.analysis().jobs.contains_key("big"));
        let refused = c.jobs_refused.load(Ordering::Relaxed);
        assert!(refused > 0 && refused < 10_000, "{refused} jobs refused");
        assert_eq!(c.families_counter("jobs") as u64 + refused, 10_001);
        assert!(c.events_over_budget.load(Ordering::Relaxed) >= 2 * refused);
        // A job already watched still takes its events.
        c.ingest(1, batch("big", vec![Event::Heartbeat { rank: 0, t_ns: 2 }]));
        c.pass(1, Vec::new(), Duration::ZERO, |_| false);
        assert!(c.analysis().jobs["big"]
            .analyzer
            .member((1 << 20) - 1)
            .is_some());
    }

    impl DiagnosisControl {
        /// One sample of `yard_analyzer_state`, as a scrape reads it.
        fn families_counter(&self, what: &str) -> f64 {
            match what {
                "events" => self.events_total.load(Ordering::Relaxed) as f64,
                "jobs" => self.jobs_watched.load(Ordering::Relaxed) as f64,
                "events_rejected" => self.events_rejected.load(Ordering::Relaxed) as f64,
                _ => unreachable!("no such sample"),
            }
        }
    }
}
