//! The analyzer's home on the Raft leader: probe summaries from every node come in here, one
//! [`JobAnalyzer`] per job turns them into verdicts, and each change of a job's verdict set is
//! committed through Raft (so any node answers `yard diagnose`), exported as metrics and sent
//! to the alert hook.
//!
//! A new leader starts with empty analyzers; nodes replay what a fresh analyzer needs (members,
//! groups, each rank's latest phase) when they see the leader change. Until a job has been
//! watched for a warm-up period, this leader never clears verdicts its predecessor committed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openraft::ServerState;
use yard_actors::probe::core::JobBatch;
use yard_diagnosis::analyzer::{Config as AnalyzerConfig, JobAnalyzer};
use yard_diagnosis::event::{Coll, Event, Member};
use yard_diagnosis::verdict::Verdict;
use yard_raft_store::diagnosis::DiagnosisCommand;
use yard_raft_store::{ChangeFeed, Command, Raft};

use crate::alert::AlertHook;
use crate::metrics::{Family, METRICS};

/// Members kept per job for naming ranks in pictures (more are counted, not stored).
const MAX_MEMBERS_KEPT: usize = 65_536;

/// Settings of the leader's analyzer loop.
#[derive(Debug, Clone)]
pub struct DiagnosisSettings {
    pub analyzer: AnalyzerConfig,
    pub evaluate_every: Duration,
    pub job_idle: Duration,
    pub hook: AlertHook,
}

struct Job {
    analyzer: JobAnalyzer,
    members: BTreeMap<u32, Member>,
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

#[derive(Default)]
struct State {
    term: Option<u64>,
    jobs: HashMap<String, Job>,
    events_total: u64,
    verdicts_raised: u64,
    commit_failures: u64,
}

/// The leader-side diagnosis service.
pub struct DiagnosisControl {
    settings: DiagnosisSettings,
    epoch: Instant,
    state: Mutex<State>,
}

impl DiagnosisControl {
    pub fn new(settings: DiagnosisSettings) -> Self {
        Self {
            settings,
            epoch: Instant::now(),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The analyzer's clock: nanoseconds since this control started (monotonic).
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Starts afresh when this node leads in a new term: whichever of the first summary and
    /// the first evaluation sees the term first, so a summary that arrives right after the
    /// election (the nodes' replays do) is kept, not cleared by the loop's first tick.
    fn enter_term(st: &mut State, term: u64) {
        if st.term != Some(term) {
            tracing::info!(term, "analyzer: leading");
            st.term = Some(term);
            st.jobs.clear();
        }
    }

    /// Takes one node's summary while this node leads in `term` (the service checks).
    pub fn ingest(&self, term: u64, batches: Vec<JobBatch>) {
        let now = self.now_ns();
        let wall = Instant::now();
        let cfg = &self.settings.analyzer;
        let mut st = self.state();
        Self::enter_term(&mut st, term);
        for batch in batches {
            let job = st.jobs.entry(batch.job.clone()).or_insert_with(|| {
                tracing::info!(job = %batch.job, "analyzer: new job");
                Job {
                    analyzer: JobAnalyzer::new(batch.job.clone(), cfg.clone()),
                    members: BTreeMap::new(),
                    last_event: wall,
                    since: wall,
                    committed: None,
                    events: 0,
                }
            });
            job.last_event = wall;
            job.events += batch.events.len() as u64;
            for ev in &batch.events {
                if let Event::Member(m) = ev {
                    if job.members.len() < MAX_MEMBERS_KEPT || job.members.contains_key(&m.rank) {
                        job.members.insert(m.rank, m.clone());
                    }
                }
                job.analyzer.ingest(ev, now);
            }
            st.events_total += batch.events.len() as u64;
        }
    }

    /// The collective records and members around a job's top verdict (for `--svg`), if this
    /// leader watches the job.
    pub fn window(&self, job: &str, verdict: Option<&Verdict>) -> Option<(Vec<Coll>, Vec<Member>)> {
        let st = self.state();
        let j = st.jobs.get(job)?;
        let colls = verdict.map(|v| j.analyzer.window(v)).unwrap_or_default();
        let mut ranks: Vec<u32> = colls.iter().map(|c| c.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let members = ranks
            .iter()
            .filter_map(|r| j.members.get(r).cloned())
            .collect();
        Some((colls, members))
    }

    /// The leader loop: re-evaluates every job and commits changed verdict sets.
    pub async fn run(self: Arc<Self>, raft: Raft, feed: ChangeFeed) {
        let warmup = Duration::from_nanos(
            self.settings
                .analyzer
                .hang_floor_ns
                .max(self.settings.analyzer.heartbeat_timeout_ns)
                * 2,
        );
        loop {
            tokio::time::sleep(self.settings.evaluate_every).await;
            let m = raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                let mut st = self.state();
                if st.term.take().is_some() {
                    tracing::info!("analyzer: no longer leading; dropping job state");
                }
                st.jobs.clear();
                continue;
            }
            let commits = {
                // The pass is what grows with jobs and ranks; the commits after it wait on Raft.
                let _pass_timer = METRICS.analyzer_pass.start_timer();
                let mut st = self.state();
                Self::enter_term(&mut st, m.current_term);
                let idle = self.settings.job_idle;
                st.jobs.retain(|name, j| {
                    let keep = j.last_event.elapsed() < idle;
                    if !keep {
                        tracing::info!(job = %name, "analyzer: job idle; forgetting it");
                    }
                    keep
                });
                let now = self.now_ns();
                let mut commits = Vec::new();
                for (name, job) in st.jobs.iter_mut() {
                    let verdicts = job.analyzer.evaluate(now).to_vec();
                    let keys: Vec<VerdictKey> = verdicts.iter().map(Verdict::key).collect();
                    if job.committed.as_ref() == Some(&keys) {
                        continue;
                    }
                    if verdicts.is_empty() && job.committed.is_none() {
                        // Nothing seen by this leader yet: clear a predecessor's verdicts only
                        // after watching the job long enough to have seen a fault if any.
                        let stored = feed.read(|d| {
                            d.diagnosis
                                .jobs
                                .get(name)
                                .is_some_and(|j| !j.verdicts.is_empty())
                        });
                        if stored && job.since.elapsed() < warmup {
                            continue;
                        }
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
                    commits.push((name.clone(), verdicts, keys, new));
                }
                commits
            };
            for (job, verdicts, keys, new) in commits {
                let cmd = Command::Diagnosis(DiagnosisCommand::SetVerdicts {
                    job: job.clone(),
                    verdicts: verdicts.clone(),
                    now_unix_ms: now_unix_ms(),
                });
                match raft.client_write(cmd).await {
                    Ok(_) => {
                        let mut st = self.state();
                        if let Some(j) = st.jobs.get_mut(&job) {
                            j.committed = Some(keys);
                        }
                        st.verdicts_raised += new.len() as u64;
                        drop(st);
                        for v in &new {
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
                                self.settings.hook.fire(&job, body.to_string());
                            }
                        }
                        if verdicts.is_empty() {
                            tracing::info!(job = %job, "diagnosis: job healthy again");
                        }
                    }
                    Err(e) => {
                        self.state().commit_failures += 1;
                        tracing::warn!(job = %job, error = %e, "cannot commit verdicts");
                    }
                }
            }
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
        let (events, raised, failures, jobs) = {
            let st = self.state();
            (
                st.events_total,
                st.verdicts_raised,
                st.commit_failures,
                st.jobs.len(),
            )
        };
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
                help: "the analyzer on this node: events taken, verdicts raised, commit failures, jobs watched (non-zero only while leading)",
                kind: "gauge",
                samples: vec![
                    ("what=\"events\"".into(), events as f64),
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
