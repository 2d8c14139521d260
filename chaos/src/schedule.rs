//! Seeded fault schedules: which fault hits which hosts, when, and for how long.
//!
//! A schedule is a pure function of its [`ScheduleConfig`], so a failing CI run is reproduced by
//! rerunning with the seed it printed. Steps never overlap and are separated by recovery gaps, so
//! each fault's effect (and the cluster's recovery from it) can be told apart in the history.
//! At most a minority of hosts is ever faulted: with a majority still healthy the cluster must
//! stay available and linearizable, so any violation is a real bug, not an expected outage.

use std::fmt;
use std::time::Duration;

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The longest schedule allowed: chaos runs in CI must stay bounded.
pub const MAX_TOTAL: Duration = Duration::from_secs(600);

/// A kind of fault the runner knows how to inject and undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// `kill -9` the daemon, restart it when the step ends.
    Kill9,
    /// SIGSTOP the daemon, SIGCONT it when the step ends: a process that is alive but silent,
    /// the case leases exist for.
    Pause,
    /// Take the targets' network links down.
    LinkDown,
    /// Cut the targets off from every other host (they can still talk among themselves).
    Partition,
    /// Drop this percentage of the targets' packets.
    Loss { pct: u8 },
    /// Drop this percentage of the targets' control traffic (their QUIC/UDP port), in and out,
    /// at random; the data plane and ARP are untouched. The degraded control link that makes a
    /// live gateway look dead now and then.
    ControlLoss { pct: u8 },
    /// Drop everything the targets send on the control port while they still receive: one
    /// direction only, so a node hears the leader but is never heard.
    ControlOneway,
    /// The whole machine stalls: every yard daemon is SIGSTOPped together and SIGCONTed when
    /// the step ends (1 to 5 s). Targets are every host: this is not a minority fault, and the
    /// cluster is expected to be unavailable for its length and to recover right after.
    Stall,
    /// `kill -9` of the targets and, a third into the step, a stall of every other daemon
    /// ([`stall_within`]): the killed node's restart and the stall overlap on a loaded machine.
    Kill9Stall,
    /// The targets' links down and, a third into the step, a stall of every daemon.
    LinkDownStall,
}

impl FaultKind {
    /// Whether the fault pauses every daemon for the whole step.
    pub fn is_stall(self) -> bool {
        matches!(self, FaultKind::Stall)
    }
}

/// Mixed into the seed of the agents' draws (any constant: it only has to differ from 0).
const AGENT_STREAM: u64 = 0x6167_656e_7473;

/// The shortest and longest whole-machine stall.
pub const STALL_MIN: Duration = Duration::from_secs(1);
pub const STALL_MAX: Duration = Duration::from_secs(5);

/// For a fault with a stall inside it: when the stall starts (from the step's start) and how
/// long it lasts: a third into the step, a third of it long, within [`STALL_MIN`, `STALL_MAX`]
/// and ending before the step does.
pub fn stall_within(step: &Step) -> Option<(Duration, Duration)> {
    if !matches!(
        step.fault.kind,
        FaultKind::Kill9Stall | FaultKind::LinkDownStall
    ) {
        return None;
    }
    let offset = step.duration / 3;
    let len = (step.duration / 3).clamp(STALL_MIN, STALL_MAX);
    let len = len.min(step.duration.saturating_sub(offset));
    (!len.is_zero()).then_some((offset, len))
}

impl FaultKind {
    /// One of each kind, with the parameters the CI schedule uses.
    pub fn every() -> Vec<FaultKind> {
        vec![
            FaultKind::Kill9,
            FaultKind::Pause,
            FaultKind::LinkDown,
            FaultKind::Partition,
            FaultKind::Loss { pct: 30 },
            FaultKind::ControlLoss { pct: 40 },
            FaultKind::ControlOneway,
            FaultKind::Stall,
            FaultKind::Kill9Stall,
            FaultKind::LinkDownStall,
        ]
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::Kill9 => f.write_str("kill-9"),
            FaultKind::Pause => f.write_str("pause"),
            FaultKind::LinkDown => f.write_str("link-down"),
            FaultKind::Partition => f.write_str("partition"),
            FaultKind::Loss { pct } => write!(f, "loss-{pct}%"),
            FaultKind::ControlLoss { pct } => write!(f, "ctl-loss-{pct}%"),
            FaultKind::ControlOneway => f.write_str("ctl-oneway"),
            FaultKind::Stall => f.write_str("stall"),
            FaultKind::Kill9Stall => f.write_str("kill-9+stall"),
            FaultKind::LinkDownStall => f.write_str("link-down+stall"),
        }
    }
}

/// One fault on a set of hosts (indices `0..hosts`, sorted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub targets: Vec<usize>,
}

/// A fault held from `start` for `duration`, both measured from the start of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    #[serde(rename = "start_ms", with = "millis")]
    pub start: Duration,
    #[serde(rename = "duration_ms", with = "millis")]
    pub duration: Duration,
    pub fault: Fault,
}

impl Step {
    /// When the fault is lifted.
    pub fn end(&self) -> Duration {
        self.start + self.duration
    }
}

/// Inputs to [`generate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleConfig {
    pub seed: u64,
    pub hosts: usize,
    /// The run's length; every step ends by then, followed by at least `min_gap` of calm.
    #[serde(with = "millis")]
    pub total: Duration,
    pub kinds: Vec<FaultKind>,
    #[serde(with = "millis")]
    pub min_fault: Duration,
    #[serde(with = "millis")]
    pub max_fault: Duration,
    /// Calm time before the first fault, between faults and after the last one, long enough for
    /// the cluster to elect a leader and catch up.
    #[serde(with = "millis")]
    pub min_gap: Duration,
    #[serde(with = "millis")]
    pub max_gap: Duration,
    /// Agent hosts, numbered after the `hosts` the minority is drawn from (indices
    /// `hosts..hosts + agents`): each step's fault also takes a random subset of them, none to
    /// all, since no number of agents down costs the voters their quorum. Drawn from a
    /// generator of their own, so a seed's faults on the voters are the same with or without
    /// agents.
    #[serde(default)]
    pub agents: usize,
}

impl ScheduleConfig {
    /// A configuration with default fault and gap lengths (faults 5-30 s, gaps 5-20 s).
    pub fn new(seed: u64, hosts: usize, total: Duration, kinds: Vec<FaultKind>) -> Self {
        Self {
            seed,
            hosts,
            total,
            kinds,
            min_fault: Duration::from_secs(5),
            max_fault: Duration::from_secs(30),
            min_gap: Duration::from_secs(5),
            max_gap: Duration::from_secs(20),
            agents: 0,
        }
    }
}

/// A generated schedule, with the configuration that produced it so that it can be reproduced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub config: ScheduleConfig,
    pub steps: Vec<Step>,
}

impl Schedule {
    /// The same schedule with every host index `i` renamed `(i + k) % hosts`, `k` chosen so
    /// that the first step that takes its hosts out (a kill, pause, link down or partition)
    /// hits `target`; returns it and `k`. A seeded schedule knows host indices, not roles: this
    /// aims it at one (the host summing an aggregation job) without changing its shape, and the
    /// same seed and target give the same run.
    pub fn aimed_at(&self, target: usize) -> (Schedule, usize) {
        let n = self.config.hosts.max(1);
        let outage = |k: FaultKind| {
            matches!(
                k,
                FaultKind::Kill9
                    | FaultKind::Kill9Stall
                    | FaultKind::Pause
                    | FaultKind::LinkDown
                    | FaultKind::LinkDownStall
                    | FaultKind::Partition
            )
        };
        let k = self
            .steps
            .iter()
            .find(|s| outage(s.fault.kind))
            .and_then(|s| s.fault.targets.first())
            .map_or(0, |t| (target % n + n - t % n) % n);
        let mut out = self.clone();
        for s in &mut out.steps {
            for t in s.fault.targets.iter_mut().filter(|t| **t < n) {
                *t = (*t + k) % n;
            }
            s.fault.targets.sort_unstable();
        }
        (out, k)
    }

    /// Hosts faulted at instant `t` (a step covers `[start, end)`).
    pub fn faulted_at(&self, t: Duration) -> Vec<usize> {
        let mut hosts: Vec<usize> = self
            .steps
            .iter()
            .filter(|s| s.start <= t && t < s.end())
            .flat_map(|s| s.fault.targets.iter().copied())
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts
    }

    /// The most hosts a schedule may fault at once: a strict minority.
    pub fn max_faulty(hosts: usize) -> usize {
        hosts.saturating_sub(1) / 2
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "fault schedule: seed {}, {} hosts and {} agents, {:?} total, {} steps",
            c.seed,
            c.hosts,
            c.agents,
            c.total,
            self.steps.len()
        )?;
        for s in &self.steps {
            writeln!(
                f,
                "  {:>8.1}s .. {:>8.1}s  {:<10} hosts {:?}",
                s.start.as_secs_f64(),
                s.end().as_secs_f64(),
                s.fault.kind.to_string(),
                s.fault.targets
            )?;
        }
        Ok(())
    }
}

/// Why a schedule could not be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("a schedule may last at most {max:?}, not {total:?}")]
    TooLong { total: Duration, max: Duration },
    #[error("at least 3 hosts are needed to fault a minority, not {0}")]
    TooFewHosts(usize),
    #[error("no fault kinds to choose from")]
    NoKinds,
    #[error("packet loss must be between 1 and 100 percent, not {0}")]
    BadLoss(u8),
    #[error("fault and gap lengths must satisfy 0 < min <= max")]
    BadRange,
}

/// Generates the schedule for `config`: the same config always yields the same schedule.
///
/// Calm for a random gap, then a random fault of random length on a random minority of hosts,
/// then calm again, and so on while the next fault and a final gap still fit in `total`.
pub fn generate(config: &ScheduleConfig) -> Result<Schedule, ScheduleError> {
    if config.total > MAX_TOTAL {
        return Err(ScheduleError::TooLong {
            total: config.total,
            max: MAX_TOTAL,
        });
    }
    if config.hosts < 3 {
        return Err(ScheduleError::TooFewHosts(config.hosts));
    }
    if config.kinds.is_empty() {
        return Err(ScheduleError::NoKinds);
    }
    if let Some(pct) = config.kinds.iter().find_map(|k| match k {
        FaultKind::Loss { pct } | FaultKind::ControlLoss { pct } if *pct == 0 || *pct > 100 => {
            Some(*pct)
        }
        _ => None,
    }) {
        return Err(ScheduleError::BadLoss(pct));
    }
    if config.min_fault.is_zero()
        || config.min_fault > config.max_fault
        || config.min_gap.is_zero()
        || config.min_gap > config.max_gap
    {
        return Err(ScheduleError::BadRange);
    }

    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut agent_rng = ChaCha8Rng::seed_from_u64(config.seed ^ AGENT_STREAM);
    let max_faulty = Schedule::max_faulty(config.hosts);
    let mut steps = Vec::new();
    let mut t = random_between(&mut rng, config.min_gap, config.max_gap);
    while t + config.min_fault + config.min_gap <= config.total {
        // The longest fault that still leaves a final gap before the end.
        let room = config.total - config.min_gap - t;
        let mut duration = random_between(&mut rng, config.min_fault, config.max_fault.min(room));
        let kind = config.kinds[rng.gen_range(0..config.kinds.len())];
        let count = rng.gen_range(1..=max_faulty);
        let mut targets = sample(&mut rng, config.hosts, count).into_vec();
        targets.sort_unstable();
        if config.agents > 0 {
            let count = agent_rng.gen_range(0..=config.agents);
            let mut agents: Vec<usize> = sample(&mut agent_rng, config.agents, count)
                .into_iter()
                .map(|a| config.hosts + a)
                .collect();
            agents.sort_unstable();
            targets.extend(agents);
        }
        if kind.is_stall() {
            // A stall is short and hits every daemon (the draws above are kept, so that the
            // schedules of the other kinds do not depend on whether stalls are in the mix).
            duration = random_between(&mut rng, STALL_MIN, STALL_MAX.min(room));
            targets = (0..config.hosts + config.agents).collect();
        }
        steps.push(Step {
            start: t,
            duration,
            fault: Fault { kind, targets },
        });
        t += duration + random_between(&mut rng, config.min_gap, config.max_gap);
    }
    Ok(Schedule {
        config: config.clone(),
        steps,
    })
}

/// A uniformly random duration in `[lo, hi]`, at millisecond granularity so that schedules print
/// and serialize exactly.
fn random_between(rng: &mut ChaCha8Rng, lo: Duration, hi: Duration) -> Duration {
    let lo = lo.as_millis() as u64;
    let hi = (hi.as_millis() as u64).max(lo);
    Duration::from_millis(rng.gen_range(lo..=hi))
}

/// Serializes durations as whole milliseconds, which is how people read schedules.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod aimed_tests {
    use super::*;

    #[test]
    fn an_aimed_schedule_first_takes_out_the_target_and_keeps_its_shape() {
        let config = ScheduleConfig::new(7, 3, Duration::from_secs(120), FaultKind::every());
        let s = generate(&config).unwrap();
        for target in 0..3 {
            let (a, k) = s.aimed_at(target);
            assert_eq!(a.steps.len(), s.steps.len());
            let first = a
                .steps
                .iter()
                .find(|x| {
                    !matches!(
                        x.fault.kind,
                        FaultKind::Loss { .. }
                            | FaultKind::ControlLoss { .. }
                            | FaultKind::ControlOneway
                            | FaultKind::Stall
                    )
                })
                .unwrap();
            assert!(first.fault.targets.contains(&target), "{a}");
            for (x, y) in a.steps.iter().zip(&s.steps) {
                assert_eq!(
                    (x.start, x.duration, x.fault.kind),
                    (y.start, y.duration, y.fault.kind)
                );
                assert_eq!(x.fault.targets.len(), y.fault.targets.len());
                assert!(y
                    .fault
                    .targets
                    .iter()
                    .all(|t| x.fault.targets.contains(&((t + k) % 3))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use proptest::prelude::*;

    fn all_kinds() -> Vec<FaultKind> {
        FaultKind::every()
    }

    #[test]
    fn agents_are_faulted_beside_the_voters_without_changing_the_voters_faults() {
        let without = generate(&config(7, 3, 300)).unwrap();
        let mut with = config(7, 3, 300);
        with.agents = 4;
        let with = generate(&with).unwrap();
        assert_valid(&with);
        assert_eq!(without.steps.len(), with.steps.len());
        let mut agents_hit = BTreeSet::new();
        for (a, b) in without.steps.iter().zip(&with.steps) {
            assert_eq!(
                (a.start, a.duration, a.fault.kind),
                (b.start, b.duration, b.fault.kind)
            );
            if b.fault.kind.is_stall() {
                assert_eq!(b.fault.targets, (0..7).collect::<Vec<_>>());
                continue;
            }
            let voters: Vec<usize> = b.fault.targets.iter().copied().filter(|&t| t < 3).collect();
            assert_eq!(a.fault.targets, voters);
            agents_hit.extend(b.fault.targets.iter().copied().filter(|&t| t >= 3));
        }
        assert_eq!(
            agents_hit,
            (3..7).collect(),
            "every agent is faulted at some point"
        );
        // Aiming shifts the voters only.
        let (aimed, _) = with.aimed_at(2);
        for (a, b) in with.steps.iter().zip(&aimed.steps) {
            let agents = |s: &Step| {
                s.fault
                    .targets
                    .iter()
                    .copied()
                    .filter(|&t| t >= 3)
                    .collect::<Vec<_>>()
            };
            assert_eq!(agents(a), agents(b));
        }
    }

    fn config(seed: u64, hosts: usize, secs: u64) -> ScheduleConfig {
        ScheduleConfig::new(seed, hosts, Duration::from_secs(secs), all_kinds())
    }

    /// Checks every invariant a runner relies on.
    fn assert_valid(s: &Schedule) {
        let c = &s.config;
        let max = Schedule::max_faulty(c.hosts);
        let mut previous_end = Duration::ZERO;
        for (i, step) in s.steps.iter().enumerate() {
            assert!(!step.fault.targets.is_empty());
            if step.fault.kind.is_stall() {
                assert_eq!(
                    step.fault.targets.len(),
                    c.hosts + c.agents,
                    "a stall stops every daemon"
                );
                assert!(step.duration >= STALL_MIN.min(c.max_fault) && step.duration <= STALL_MAX);
                assert!(step.start >= previous_end + c.min_gap);
                previous_end = step.end();
                continue;
            }
            assert!(
                step.fault.targets.iter().filter(|&&h| h < c.hosts).count() <= max,
                "step {i} faults a majority"
            );
            if let Some((offset, len)) = stall_within(step) {
                assert!(
                    offset + len <= step.duration,
                    "step {i}'s stall outlasts it"
                );
                assert!(len <= STALL_MAX);
            }
            assert!(step.fault.targets.windows(2).all(|w| w[0] < w[1]));
            assert!(step.fault.targets.iter().all(|&h| h < c.hosts + c.agents));
            assert!(step.duration >= c.min_fault && step.duration <= c.max_fault);
            assert!(
                step.start >= previous_end + c.min_gap,
                "no recovery gap before step {i}"
            );
            assert!(c.kinds.contains(&step.fault.kind));
            previous_end = step.end();
        }
        assert!(previous_end + c.min_gap <= c.total || s.steps.is_empty());
        // Sample every step boundary: the faulted set only changes there.
        for step in s.steps.iter().filter(|st| !st.fault.kind.is_stall()) {
            for t in [step.start, step.end() - Duration::from_millis(1)] {
                let voters = s.faulted_at(t).into_iter().filter(|&h| h < c.hosts).count();
                assert!(voters <= max);
            }
        }
    }

    #[test]
    fn new_kinds_have_short_names_and_stalls_are_short_and_total() {
        let names: Vec<String> = all_kinds().iter().map(ToString::to_string).collect();
        assert_eq!(
            names[5..],
            [
                "ctl-loss-40%",
                "ctl-oneway",
                "stall",
                "kill-9+stall",
                "link-down+stall"
            ]
        );
        let mut c = config(7, 3, 300);
        c.kinds = vec![FaultKind::Stall, FaultKind::Kill9Stall];
        let s = generate(&c).unwrap();
        assert!(
            s.steps.iter().any(|st| st.fault.kind == FaultKind::Stall),
            "{s}"
        );
        assert!(s.steps.iter().any(|st| stall_within(st).is_some()), "{s}");
        assert_valid(&s);
    }

    #[test]
    fn same_seed_same_schedule() {
        let a = generate(&config(42, 5, 600)).unwrap();
        let b = generate(&config(42, 5, 600)).unwrap();
        let c = generate(&config(43, 5, 600)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.steps, c.steps);
        assert!(a.steps.len() > 5, "{a}");
    }

    #[test]
    fn three_hosts_fault_one_at_a_time_and_five_hosts_at_most_two() {
        for seed in 0..50 {
            let s = generate(&config(seed, 3, 300)).unwrap();
            assert!(s
                .steps
                .iter()
                .filter(|st| !st.fault.kind.is_stall())
                .all(|st| st.fault.targets.len() == 1));
            assert_valid(&s);
        }
        let mut saw_two = false;
        for seed in 0..50 {
            let s = generate(&config(seed, 5, 300)).unwrap();
            saw_two |= s.steps.iter().any(|st| st.fault.targets.len() == 2);
            assert_valid(&s);
        }
        assert!(saw_two);
    }

    #[test]
    fn rejects_bad_configs() {
        let e = |c: ScheduleConfig| generate(&c).unwrap_err();
        assert!(matches!(
            e(config(1, 5, 601)),
            ScheduleError::TooLong { .. }
        ));
        assert_eq!(e(config(1, 2, 60)), ScheduleError::TooFewHosts(2));
        let mut c = config(1, 3, 60);
        c.kinds.clear();
        assert_eq!(e(c), ScheduleError::NoKinds);
        let mut c = config(1, 3, 60);
        c.kinds = vec![FaultKind::Loss { pct: 0 }];
        assert_eq!(e(c), ScheduleError::BadLoss(0));
        let mut c = config(1, 3, 60);
        c.min_gap = Duration::from_secs(30);
        assert_eq!(e(c), ScheduleError::BadRange);
    }

    #[test]
    fn too_short_a_run_has_no_faults() {
        let s = generate(&config(1, 3, 8)).unwrap();
        assert!(s.steps.is_empty());
    }

    #[test]
    fn serializes_in_milliseconds() {
        let s = generate(&config(9, 3, 120)).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"start_ms\":"), "{json}");
        assert!(json.contains("\"kind\":"), "{json}");
        let back: Schedule = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert!(s.to_string().contains("hosts ["), "{s}");
    }

    proptest! {
        #[test]
        fn generated_schedules_are_valid(
            seed in any::<u64>(),
            hosts in 3usize..10,
            secs in 0u64..=600,
            kinds in prop::sample::subsequence(all_kinds(), 1..=10),
        ) {
            let c = ScheduleConfig::new(seed, hosts, Duration::from_secs(secs), kinds);
            let s = generate(&c).unwrap();
            assert_valid(&s);
            prop_assert_eq!(generate(&c).unwrap(), s);
        }
    }
}
