//! The probe's pure core: what local ranks reported since the last summary, held in bounded
//! memory and coalesced, then handed out as one compact batch per job for the analyzer.
//!
//! Bounded: at most `capacity` events wait. Heartbeats and per-peer progress are cumulative
//! ("alive at t", "moved b bytes so far"), so only the newest of each is kept and they never
//! count against the bound twice. Collective phases are the signal itself and are kept in order;
//! when the bound is hit the newest are dropped and counted (the reporting client is never
//! blocked: a training loop must not stall on its observer).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};

use yard_diagnosis::event::{Dir, Event, PgName, Rank};

/// One job's events for the analyzer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobBatch {
    pub job: String,
    pub events: Vec<Event>,
}

/// Counters the shell publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeStats {
    /// Events accepted from clients.
    pub accepted: u64,
    /// Events dropped because the buffer was full.
    pub dropped: u64,
    /// Events replaced by a newer cumulative one (heartbeats, peer progress).
    pub coalesced: u64,
    /// Events handed out in batches.
    pub reported: u64,
    /// Events waiting now.
    pub pending: usize,
}

type PeerKey = (Rank, PgName, u64, Rank, Dir);

#[derive(Debug, Default)]
struct JobBuffer {
    /// Membership, groups and collective phases, in arrival order.
    ordered: Vec<Event>,
    /// Newest heartbeat per rank.
    heartbeats: BTreeMap<Rank, Event>,
    /// Newest progress per (rank, pg, seq, peer, dir).
    peers: HashMap<PeerKey, Event>,
}

impl JobBuffer {
    fn len(&self) -> usize {
        self.ordered.len() + self.heartbeats.len() + self.peers.len()
    }
}

/// Finished jobs whose goodbyes are still replayed; beyond this the oldest is forgotten.
///
/// A finished job's exits are replayed so that a summary lost with them is made good, and so
/// that a fresh analyzer, hearing another node's groups list these ranks, knows they left
/// rather than waiting for them and calling them dead. Both matter for a short while after the
/// job ends (until one replay got through, or the job's other nodes finished too), so a small
/// window of recent jobs is enough; each costs one event per local rank.
pub const MAX_FINISHED_JOBS: usize = 64;

/// What a new analyzer needs to pick up a job mid-flight: who the local ranks are, their
/// groups, and each rank's latest collective phase per group (so an op already stuck when the
/// leader changed is still seen in flight). One entry per (rank, group): bounded by the job's
/// shape, not its length.
///
/// A rank that said goodbye is replayed as its goodbye only: replaying its introduction would
/// tell the analyzer a live process is there, and two seconds of silence later it would be
/// called dead.
#[derive(Debug, Default)]
struct Sticky {
    /// Local ranks still running.
    members: BTreeMap<(String, Rank), Event>,
    groups: BTreeMap<(String, PgName), Event>,
    /// Per job (looked up by `&str`, so the hot path allocates nothing).
    latest: HashMap<String, HashMap<(Rank, PgName), Event>>,
    /// The goodbye of every local rank that exited (and has not come back).
    exits: BTreeMap<(String, Rank), Event>,
    /// Jobs whose local ranks all exited, oldest first (at most [`MAX_FINISHED_JOBS`]): only
    /// their exits are kept.
    finished: VecDeque<String>,
}

impl Sticky {
    fn job_has_members(&self, job: &str) -> bool {
        self.members
            .range((job.to_owned(), 0)..=(job.to_owned(), Rank::MAX))
            .next()
            .is_some()
    }

    /// Drops everything of `job` but its exits: none of its local ranks runs any more.
    fn finish(&mut self, job: &str) {
        self.groups.retain(|(j, _), _| j != job);
        self.latest.remove(job);
        if !self.finished.iter().any(|j| j == job) {
            self.finished.push_back(job.to_owned());
        }
        while self.finished.len() > MAX_FINISHED_JOBS {
            if let Some(old) = self.finished.pop_front() {
                self.exits.retain(|(j, _), _| *j != old);
            }
        }
    }
}

/// The buffer of every local job.
#[derive(Debug)]
pub struct ProbeCore {
    capacity: usize,
    jobs: BTreeMap<String, JobBuffer>,
    pending: usize,
    stats: ProbeStats,
    sticky: Sticky,
}

impl ProbeCore {
    /// A core holding at most `capacity` events between summaries.
    pub fn new(capacity: usize) -> Self {
        ProbeCore {
            capacity: capacity.max(1),
            jobs: BTreeMap::new(),
            pending: 0,
            stats: ProbeStats::default(),
            sticky: Sticky::default(),
        }
    }

    /// Queues again what a new analyzer needs to know about every local job (members,
    /// groups, each rank's latest phase per group, and the goodbyes of ranks that exited):
    /// call it when the leader changed or a summary was lost.
    pub fn replay(&mut self) {
        let mut events: Vec<(String, Event)> = Vec::new();
        events.extend(
            self.sticky
                .members
                .iter()
                .map(|((j, _), e)| (j.clone(), e.clone())),
        );
        events.extend(
            self.sticky
                .groups
                .iter()
                .map(|((j, _), e)| (j.clone(), e.clone())),
        );
        let mut latest: Vec<_> = self
            .sticky
            .latest
            .iter()
            .flat_map(|(j, per)| per.iter().map(move |(k, e)| ((j, k), e)))
            .collect();
        latest.sort_by_key(|(k, _)| *k);
        events.extend(latest.into_iter().map(|((j, _), e)| (j.clone(), e.clone())));
        events.extend(
            self.sticky
                .exits
                .iter()
                .map(|((j, _), e)| (j.clone(), e.clone())),
        );
        for (job, ev) in events {
            self.push(&job, ev);
        }
    }

    /// Forgets a job's replay state altogether, goodbyes included.
    pub fn forget(&mut self, job: &str) {
        self.sticky.members.retain(|(j, _), _| j != job);
        self.sticky.groups.retain(|(j, _), _| j != job);
        self.sticky.latest.remove(job);
        self.sticky.exits.retain(|(j, _), _| j != job);
        self.sticky.finished.retain(|j| j != job);
    }

    /// Whether every local rank of `job` has exited (the job is replayed as its goodbyes).
    pub fn is_finished(&self, job: &str) -> bool {
        self.sticky.finished.iter().any(|j| j == job)
    }

    /// Takes one event of `job`; returns false if it was dropped for lack of room.
    pub fn push(&mut self, job: &str, event: Event) -> bool {
        self.remember(job, &event);
        let buf = match self.jobs.get_mut(job) {
            Some(buf) => buf,
            None => self.jobs.entry(job.to_owned()).or_default(),
        };
        let grew = match event {
            Event::Heartbeat { rank, .. } => {
                if self.pending >= self.capacity && !buf.heartbeats.contains_key(&rank) {
                    self.stats.dropped += 1;
                    return false;
                }
                match buf.heartbeats.insert(rank, event) {
                    Some(_) => {
                        self.stats.coalesced += 1;
                        false
                    }
                    None => true,
                }
            }
            Event::Peer(ref p) => {
                let key = (p.rank, p.pg.clone(), p.seq, p.peer, p.dir);
                match buf.peers.entry(key) {
                    Entry::Occupied(mut e) => {
                        e.insert(event);
                        self.stats.coalesced += 1;
                        false
                    }
                    Entry::Vacant(e) => {
                        if self.pending >= self.capacity {
                            self.stats.dropped += 1;
                            return false;
                        }
                        e.insert(event);
                        true
                    }
                }
            }
            _ => {
                if self.pending >= self.capacity {
                    self.stats.dropped += 1;
                    return false;
                }
                // A goodbye supersedes the rank's waiting heartbeat, which would otherwise
                // travel after it and look like a sign of life.
                if let Event::Exit { rank, .. } = event {
                    if buf.heartbeats.remove(&rank).is_some() {
                        self.pending -= 1;
                        self.stats.coalesced += 1;
                    }
                }
                buf.ordered.push(event);
                true
            }
        };
        self.stats.accepted += 1;
        if grew {
            self.pending += 1;
        }
        true
    }

    fn remember(&mut self, job: &str, event: &Event) {
        match event {
            Event::Member(m) => {
                // A new process for the rank: the job runs (again).
                self.sticky.exits.remove(&(job.to_owned(), m.rank));
                self.sticky.finished.retain(|j| j != job);
                self.sticky
                    .members
                    .insert((job.to_owned(), m.rank), event.clone());
            }
            Event::Exit { rank, .. } => {
                let rank = *rank;
                self.sticky.members.remove(&(job.to_owned(), rank));
                if let Some(per) = self.sticky.latest.get_mut(job) {
                    per.retain(|(r, _), _| *r != rank);
                }
                self.sticky
                    .exits
                    .insert((job.to_owned(), rank), event.clone());
                if !self.sticky.job_has_members(job) {
                    self.sticky.finish(job);
                }
            }
            // A finished job keeps only its goodbyes (a stray late event must not bring back
            // what a replay would then announce as live).
            Event::Group(g) if !self.is_finished(job) => {
                self.sticky
                    .groups
                    .insert((job.to_owned(), g.name.clone()), event.clone());
            }
            Event::Coll(c) => {
                let per = match self.sticky.latest.get_mut(job) {
                    Some(per) => per,
                    // Only a job's first collective gets here, so the check costs nothing on
                    // the hot path.
                    None if self.sticky.finished.iter().any(|j| j == job) => return,
                    None => self.sticky.latest.entry(job.to_owned()).or_default(),
                };
                per.insert((c.rank, c.pg.clone()), event.clone());
            }
            _ => {}
        }
    }

    /// Hands out everything waiting, one batch per job, at most `max_events` in all (the rest
    /// waits for the next summary). Within a job: ordered events first, then peer progress,
    /// then heartbeats, so a heartbeat never arrives before the collective it follows.
    pub fn drain(&mut self, max_events: usize) -> Vec<JobBatch> {
        let mut out = Vec::new();
        let mut budget = max_events;
        for (job, buf) in self.jobs.iter_mut() {
            if budget == 0 {
                break;
            }
            let mut events = Vec::new();
            let take = buf.ordered.len().min(budget);
            events.extend(buf.ordered.drain(..take));
            budget -= take;
            if buf.ordered.is_empty() && budget > 0 {
                let take = buf.peers.len().min(budget);
                let keys: Vec<PeerKey> = buf.peers.keys().take(take).cloned().collect();
                let mut peers: Vec<Event> =
                    keys.iter().filter_map(|k| buf.peers.remove(k)).collect();
                peers.sort_by_key(|e| match e {
                    Event::Peer(p) => (p.t_ns, p.rank),
                    _ => (0, 0),
                });
                budget -= peers.len();
                events.extend(peers);
            }
            if buf.ordered.is_empty() && buf.peers.is_empty() && budget > 0 {
                while budget > 0 {
                    let Some((_, hb)) = buf.heartbeats.pop_first() else {
                        break;
                    };
                    events.push(hb);
                    budget -= 1;
                }
            }
            if !events.is_empty() {
                out.push(JobBatch {
                    job: job.clone(),
                    events,
                });
            }
        }
        let handed: usize = out.iter().map(|b| b.events.len()).sum();
        self.pending -= handed;
        self.stats.reported += handed as u64;
        self.jobs.retain(|_, b| b.len() > 0);
        out
    }

    pub fn stats(&self) -> ProbeStats {
        ProbeStats {
            pending: self.pending,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use yard_diagnosis::event::{Coll, Dtype, Op, PeerProgress, Phase};

    fn coll(rank: Rank, seq: u64) -> Event {
        Event::Coll(Coll {
            rank,
            pg: "0".into(),
            seq,
            op: Op::AllReduce,
            dtype: Dtype::Float32,
            count: 1,
            bytes: 4,
            out_count: 0,
            peer: None,
            phase: Phase::Enqueue,
            t_ns: seq,
        })
    }

    fn peer(rank: Rank, bytes: u64) -> Event {
        Event::Peer(PeerProgress {
            rank,
            pg: "0".into(),
            seq: 1,
            peer: rank + 1,
            dir: Dir::Send,
            bytes,
            busy_ns: bytes,
            t_ns: bytes,
        })
    }

    #[test]
    fn cumulative_events_coalesce_to_the_newest() {
        let mut core = ProbeCore::new(100);
        for t in 0..10 {
            core.push("j", Event::Heartbeat { rank: 0, t_ns: t });
            core.push("j", peer(0, t));
        }
        core.push("j", coll(0, 1));
        let batches = core.drain(usize::MAX);
        assert_eq!(batches.len(), 1);
        let ev = &batches[0].events;
        assert_eq!(
            ev,
            &vec![
                coll(0, 1),
                peer(0, 9),
                Event::Heartbeat { rank: 0, t_ns: 9 }
            ]
        );
        assert_eq!(core.stats().coalesced, 18);
        assert_eq!(core.stats().pending, 0);
    }

    #[test]
    fn a_full_buffer_drops_and_counts_but_keeps_coalescing() {
        let mut core = ProbeCore::new(3);
        assert!(core.push("j", coll(0, 1)));
        assert!(core.push("j", Event::Heartbeat { rank: 0, t_ns: 1 }));
        assert!(core.push("j", coll(0, 2)));
        assert!(!core.push("j", coll(0, 3)), "full");
        assert!(
            core.push("j", Event::Heartbeat { rank: 0, t_ns: 2 }),
            "a newer heartbeat replaces the old one and needs no room"
        );
        assert!(!core.push("k", Event::Heartbeat { rank: 1, t_ns: 2 }));
        assert_eq!(core.stats().dropped, 2);
        assert_eq!(core.stats().pending, 3);
    }

    #[test]
    fn drain_respects_the_batch_limit_and_keeps_order() {
        let mut core = ProbeCore::new(100);
        for s in 0..10 {
            core.push("a", coll(0, s));
        }
        core.push("b", coll(1, 0));
        let first = core.drain(4);
        assert_eq!(first.len(), 1);
        assert_eq!(
            first[0].events,
            (0..4).map(|s| coll(0, s)).collect::<Vec<_>>()
        );
        let rest = core.drain(100);
        assert_eq!(
            rest[0].events,
            (4..10).map(|s| coll(0, s)).collect::<Vec<_>>()
        );
        assert_eq!(rest[1].job, "b");
        assert_eq!(core.stats().reported, 11);
    }

    #[test]
    fn replay_requeues_members_groups_and_each_ranks_latest_phase() {
        let mut core = ProbeCore::new(100);
        let group = Event::Group(yard_diagnosis::event::Group {
            name: "0".into(),
            desc: String::new(),
            ranks: vec![0, 1],
        });
        core.push("j", group.clone());
        for s in 0..5 {
            core.push("j", coll(0, s));
            core.push("j", coll(1, s));
        }
        core.drain(usize::MAX);
        core.replay();
        let again = core.drain(usize::MAX);
        assert_eq!(again[0].events, vec![group, coll(0, 4), coll(1, 4)]);
        core.forget("j");
        core.replay();
        assert!(core.drain(usize::MAX).is_empty());
    }

    fn member(rank: Rank, pid: u32) -> Event {
        Event::Member(yard_diagnosis::event::Member {
            rank,
            world_size: 4,
            host: "h1".into(),
            addr: "198.18.0.1".into(),
            nic: String::new(),
            switch: String::new(),
            pid,
        })
    }

    fn group(ranks: Vec<Rank>) -> Event {
        Event::Group(yard_diagnosis::event::Group {
            name: "0".into(),
            desc: String::new(),
            ranks,
        })
    }

    /// A job of ranks 0 and 1 on this node, run to the end: both said goodbye.
    fn finished_job(core: &mut ProbeCore) -> Vec<Event> {
        let mut sent = vec![member(0, 10), member(1, 11), group(vec![0, 1])];
        for s in 1..4 {
            for r in [0, 1] {
                sent.push(coll(r, s));
                let Event::Coll(mut end) = coll(r, s) else {
                    unreachable!()
                };
                end.phase = Phase::End;
                sent.push(Event::Coll(end));
            }
        }
        sent.push(Event::Exit { rank: 0, t_ns: 9 });
        sent.push(Event::Exit { rank: 1, t_ns: 9 });
        for ev in &sent {
            core.push("j", ev.clone());
        }
        sent
    }

    /// What an analyzer concludes `ms` milliseconds after it took `events` (all at t = 0).
    fn verdicts_after(
        a: &mut yard_diagnosis::analyzer::JobAnalyzer,
        events: &[Event],
        at: u64,
        ms: u64,
    ) -> Vec<yard_diagnosis::verdict::Verdict> {
        for ev in events {
            a.ingest(ev, at);
        }
        a.evaluate(at + ms * 1_000_000).to_vec()
    }

    fn batch_events(batches: Vec<JobBatch>) -> Vec<Event> {
        batches.into_iter().flat_map(|b| b.events).collect()
    }

    /// The bug of issue 10: a replay re-announced a finished job's ranks, and two seconds
    /// later every one of them was a dead process.
    #[test]
    fn a_replay_never_revives_a_finished_job() {
        let mut core = ProbeCore::new(100);
        finished_job(&mut core);
        assert!(core.is_finished("j"));
        let delivered = batch_events(core.drain(usize::MAX));
        core.replay();
        let replayed = batch_events(core.drain(usize::MAX));
        assert_eq!(
            replayed,
            vec![
                Event::Exit { rank: 0, t_ns: 9 },
                Event::Exit { rank: 1, t_ns: 9 }
            ],
            "a finished job is replayed as its goodbyes only"
        );

        // A new leader's analyzer, which also hears another node's group naming these ranks
        // (ranks 2 and 3 still run there and keep heartbeating).
        let cfg = yard_diagnosis::analyzer::Config::default();
        let mut fresh = yard_diagnosis::analyzer::JobAnalyzer::new("j", cfg.clone());
        let other_node = vec![
            member(2, 20),
            member(3, 21),
            group(vec![0, 1, 2, 3]),
            Event::Heartbeat { rank: 2, t_ns: 1 },
            Event::Heartbeat { rank: 3, t_ns: 1 },
        ];
        let mut events = replayed.clone();
        events.extend(other_node);
        verdicts_after(&mut fresh, &events, 0, 0);
        let later = [
            Event::Heartbeat { rank: 2, t_ns: 2 },
            Event::Heartbeat { rank: 3, t_ns: 2 },
        ];
        let vs = verdicts_after(&mut fresh, &later, 5_000_000_000, 0);
        assert!(
            vs.is_empty(),
            "a new leader calls finished ranks dead: {vs:#?}"
        );

        // The leader that saw the job end, taking the replay after a lost summary.
        let mut same = yard_diagnosis::analyzer::JobAnalyzer::new("j", cfg);
        verdicts_after(&mut same, &delivered, 0, 0);
        let vs = verdicts_after(&mut same, &replayed, 1_000_000_000, 5_000);
        assert!(
            vs.is_empty(),
            "the same leader calls finished ranks dead: {vs:#?}"
        );
    }

    /// The summary that carried the goodbyes was lost: the replay brings them again.
    #[test]
    fn a_lost_goodbye_is_replayed() {
        let mut core = ProbeCore::new(100);
        finished_job(&mut core);
        let mut lost = batch_events(core.drain(usize::MAX));
        lost.retain(|e| !matches!(e, Event::Exit { .. }));
        core.replay();
        let replayed = batch_events(core.drain(usize::MAX));
        let mut a = yard_diagnosis::analyzer::JobAnalyzer::new(
            "j",
            yard_diagnosis::analyzer::Config::default(),
        );
        verdicts_after(&mut a, &lost, 0, 0);
        let vs = verdicts_after(&mut a, &replayed, 100_000_000, 5_000);
        assert!(vs.is_empty(), "{vs:#?}");
    }

    #[test]
    fn an_exited_rank_is_replayed_as_its_goodbye_while_the_others_run() {
        let mut core = ProbeCore::new(100);
        for ev in [
            member(0, 10),
            member(1, 11),
            group(vec![0, 1]),
            coll(0, 1),
            coll(1, 1),
            Event::Exit { rank: 0, t_ns: 5 },
        ] {
            core.push("j", ev);
        }
        assert!(!core.is_finished("j"));
        core.drain(usize::MAX);
        core.replay();
        assert_eq!(
            batch_events(core.drain(usize::MAX)),
            vec![
                member(1, 11),
                group(vec![0, 1]),
                coll(1, 1),
                Event::Exit { rank: 0, t_ns: 5 }
            ]
        );
    }

    #[test]
    fn a_finished_job_that_starts_again_is_replayed_in_full() {
        let mut core = ProbeCore::new(100);
        finished_job(&mut core);
        core.push("j", member(0, 30));
        core.push("j", group(vec![0, 1]));
        assert!(!core.is_finished("j"));
        core.drain(usize::MAX);
        core.replay();
        assert_eq!(
            batch_events(core.drain(usize::MAX)),
            vec![
                member(0, 30),
                group(vec![0, 1]),
                Event::Exit { rank: 1, t_ns: 9 }
            ]
        );
    }

    #[test]
    fn finished_jobs_are_bounded() {
        let mut core = ProbeCore::new(10_000);
        for i in 0..MAX_FINISHED_JOBS + 3 {
            let job = format!("j{i:03}");
            core.push(&job, member(0, 1));
            core.push(&job, Event::Exit { rank: 0, t_ns: 1 });
        }
        core.drain(usize::MAX);
        core.replay();
        let batches = core.drain(usize::MAX);
        assert_eq!(batches.len(), MAX_FINISHED_JOBS);
        assert_eq!(
            batches[0].job, "j003",
            "the oldest finished jobs are forgotten"
        );
        assert!(!core.is_finished("j000"));
    }

    #[test]
    fn an_exit_supersedes_the_ranks_waiting_heartbeat() {
        let mut core = ProbeCore::new(10);
        core.push("j", Event::Heartbeat { rank: 0, t_ns: 1 });
        core.push("j", Event::Heartbeat { rank: 1, t_ns: 1 });
        core.push("j", Event::Exit { rank: 0, t_ns: 2 });
        let out = core.drain(usize::MAX);
        assert_eq!(
            out[0].events,
            vec![
                Event::Exit { rank: 0, t_ns: 2 },
                Event::Heartbeat { rank: 1, t_ns: 1 }
            ]
        );
        assert_eq!(core.stats().pending, 0);
    }

    proptest! {
        #[test]
        fn pending_never_exceeds_capacity_and_accounts_for_every_event(
            ops in proptest::collection::vec((0u8..3, 0u32..4, 0u64..50), 0..400),
            cap in 1usize..40,
            drain_every in 1usize..50,
        ) {
            let mut core = ProbeCore::new(cap);
            let mut out = 0u64;
            for (i, (kind, rank, v)) in ops.iter().enumerate() {
                let ev = match kind {
                    0 => coll(*rank, *v),
                    1 => Event::Heartbeat { rank: *rank, t_ns: *v },
                    _ => peer(*rank, *v),
                };
                core.push("j", ev);
                prop_assert!(core.stats().pending <= cap);
                if i % drain_every == 0 {
                    out += core.drain(usize::MAX).iter().map(|b| b.events.len() as u64).sum::<u64>();
                }
            }
            out += core.drain(usize::MAX).iter().map(|b| b.events.len() as u64).sum::<u64>();
            let s = core.stats();
            prop_assert_eq!(s.accepted + s.dropped, ops.len() as u64);
            prop_assert_eq!(s.accepted, out + s.coalesced);
            prop_assert_eq!(s.pending, 0);
        }
    }
}
