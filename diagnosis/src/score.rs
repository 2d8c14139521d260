//! Scoring the analyzer against the simulator's ground truth (notes §4.3): run a catalogue of
//! simulated jobs through a live [`JobAnalyzer`] (or, for hangs and mismatches, through their
//! Flight Recorder dumps offline), record what it said and when, and summarise per class:
//! top-1 accuracy, precision and recall of the blamed ranks and links, false alarms per
//! simulated hour on healthy and control jobs, and time to detect and to locate.

use crate::analyzer::{analyze_trace, Config, JobAnalyzer};
use crate::event::Rank;
use crate::import::fr::to_trace;
use crate::sim::{
    fr_dumps, simulate, simulate_into, Fault, Label, LabelLink, MismatchKind, SimError, SimSpec,
    Topology,
};
use crate::verdict::{Link, LinkKind, Verdict};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;

/// How often the live analyzer is asked for verdicts (simulated time).
pub const EVAL_INTERVAL_NS: u64 = 100_000_000;

const HOUR_NS: f64 = 3_600e9;

/// True positives, false positives and false negatives of one set comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub tp: u32,
    pub fp: u32,
    pub fn_: u32,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.tp += other.tp;
        self.fp += other.fp;
        self.fn_ += other.fn_;
    }

    /// `None` when nothing was claimed.
    pub fn precision(&self) -> Option<f64> {
        ratio(self.tp, self.tp + self.fp)
    }

    /// `None` when there was nothing to find.
    pub fn recall(&self) -> Option<f64> {
        ratio(self.tp, self.tp + self.fn_)
    }

    pub fn f1(&self) -> Option<f64> {
        let (p, r) = (self.precision()?, self.recall()?);
        if p + r == 0.0 {
            Some(0.0)
        } else {
            Some(2.0 * p * r / (p + r))
        }
    }
}

fn ratio(num: u32, den: u32) -> Option<f64> {
    (den > 0).then(|| f64::from(num) / f64::from(den))
}

/// What the analyzer did on one scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub name: String,
    /// `Label::category` of the ground truth.
    pub category: String,
    pub label: Label,
    /// Scored from Flight Recorder dumps instead of the live event stream.
    pub offline: bool,
    /// Simulated time the analyzer watched.
    pub simulated_ns: u64,
    /// From onset to the first verdict raised at or after it.
    pub detect_ns: Option<u64>,
    /// From onset to the first time the top verdict matched the ground truth.
    pub locate_ns: Option<u64>,
    /// The verdicts at the end, root cause first.
    pub final_verdicts: Vec<Verdict>,
    /// "class/subtype" of the top final verdict, "none" if there was none.
    pub predicted: String,
    /// The top final verdict matches the label's class and culprits or links; for a healthy job
    /// or a control, there is no final verdict.
    pub top1_correct: bool,
    /// Culprit ranks of the top final verdict against the label's.
    pub culprits: Counts,
    /// Links of the top final verdict against the label's.
    pub links: Counts,
    /// Verdicts raised on a healthy job or control, or before the fault's onset.
    pub false_alarms: u32,
}

/// Runs one scenario through a live analyzer: each event is ingested at its delivery time and
/// verdicts are read every [`EVAL_INTERVAL_NS`] of simulated time.
pub fn run_scenario(spec: &SimSpec, cfg: &Config) -> Result<Outcome, SimError> {
    let topo = Topology::new(spec)?;
    let mut analyzer = JobAnalyzer::new(spec.job.clone(), cfg.clone());
    let mut history = History::default();
    let mut next_eval = spec.epoch_ns + EVAL_INTERVAL_NS;
    let summary = simulate_into(spec, &mut |t, ev| {
        while next_eval <= t {
            history.observe(next_eval, analyzer.evaluate(next_eval));
            next_eval += EVAL_INTERVAL_NS;
        }
        analyzer.ingest(ev, t);
    })?;
    while next_eval <= summary.end_ns + EVAL_INTERVAL_NS {
        history.observe(next_eval, analyzer.evaluate(next_eval));
        next_eval += EVAL_INTERVAL_NS;
    }
    let simulated_ns = summary.end_ns.saturating_sub(spec.epoch_ns);
    Ok(judge(
        &spec.job,
        summary.label,
        &topo,
        &history,
        simulated_ns,
        false,
    ))
}

/// Runs one scenario offline: the ranks' Flight Recorder dumps are imported as a trace and
/// analysed once, as `yard diagnose --fr-dumps` would. Times are not scored (there is no clock).
pub fn run_offline(spec: &SimSpec, cfg: &Config) -> Result<Outcome, SimError> {
    let topo = Topology::new(spec)?;
    let sim = simulate(spec)?;
    let dumps = fr_dumps(&sim, spec)?;
    let mut trace = to_trace(&dumps);
    trace.job = spec.job.clone();
    let verdicts = analyze_trace(&trace, cfg);
    let mut history = History::default();
    history.observe(sim.end_ns, &verdicts);
    let simulated_ns = sim.end_ns.saturating_sub(spec.epoch_ns);
    let mut outcome = judge(&spec.job, sim.label, &topo, &history, simulated_ns, true);
    outcome.detect_ns = None;
    outcome.locate_ns = None;
    outcome.name = format!("{}-offline", spec.job);
    Ok(outcome)
}

/// Runs every scenario of a catalogue live, and also offline for the faults Flight Recorder
/// can see (hangs and mismatches) when `offline` is set; outcomes in catalogue order.
pub fn run_catalogue(scale: Scale, cfg: &Config, offline: bool) -> Result<Vec<Outcome>, SimError> {
    let mut outcomes = Vec::new();
    for (_, spec) in catalogue(scale) {
        outcomes.push(run_scenario(&spec, cfg)?);
        let fr_visible = spec
            .fault
            .as_ref()
            .is_some_and(|f| f.pg().is_some() || matches!(f, Fault::ProcessCrash { .. }));
        if offline && fr_visible {
            outcomes.push(run_offline(&spec, cfg)?);
        }
    }
    Ok(outcomes)
}

/// The verdict lists the analyzer returned, kept only when they changed.
#[derive(Default)]
struct History {
    changes: Vec<(u64, Vec<Verdict>)>,
}

impl History {
    fn observe(&mut self, t: u64, verdicts: &[Verdict]) {
        let same = self.changes.last().is_some_and(|(_, last)| {
            last.len() == verdicts.len()
                && last.iter().zip(verdicts).all(|(a, b)| a.key() == b.key())
        });
        let nothing_yet = self.changes.is_empty() && verdicts.is_empty();
        if !same && !nothing_yet {
            self.changes.push((t, verdicts.to_vec()));
        }
    }
}

/// Compares what the analyzer said with the ground truth.
fn judge(
    name: &str,
    label: Label,
    topo: &Topology,
    history: &History,
    simulated_ns: u64,
    offline: bool,
) -> Outcome {
    let onset = label.onset_ns;
    let fault = label.is_fault();
    let mut seen = HashSet::new();
    let mut false_alarms = 0;
    let mut detect_ns = None;
    let mut locate_ns = None;
    for (t, verdicts) in &history.changes {
        for v in verdicts {
            if seen.insert(v.key()) {
                if !fault || (*t < onset && !offline) {
                    false_alarms += 1;
                } else if detect_ns.is_none() {
                    detect_ns = Some(t.saturating_sub(onset));
                }
            }
        }
        let located = verdicts
            .first()
            .is_some_and(|v| matches_label(v, &label, topo));
        if fault && located && locate_ns.is_none() && (*t >= onset || offline) {
            locate_ns = Some(t.saturating_sub(onset));
        }
    }
    let final_verdicts = history
        .changes
        .last()
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let top = final_verdicts.first();
    let top1_correct = match top {
        None => !fault,
        Some(v) => fault && matches_label(v, &label, topo),
    };
    let predicted = top.map_or("none".to_string(), |v| format!("{}/{}", v.class, v.subtype));
    let culprits = culprit_counts(top.map_or(&[][..], |v| &v.culprits), &label.culprits);
    let links = link_counts(top.map_or(&[][..], |v| &v.links), &label.links, topo);
    Outcome {
        name: name.to_string(),
        category: label.category(),
        label,
        offline,
        simulated_ns,
        detect_ns,
        locate_ns,
        final_verdicts,
        predicted,
        top1_correct,
        culprits,
        links,
        false_alarms,
    }
}

/// A verdict names the fault: same class, and the same culprit set (for rank faults) or a
/// match for every blamed link (for link faults).
pub fn matches_label(v: &Verdict, label: &Label, topo: &Topology) -> bool {
    if Some(v.class) != label.class {
        return false;
    }
    let culprits_ok = label.culprits.is_empty() || {
        let want: BTreeSet<Rank> = label.culprits.iter().copied().collect();
        let got: BTreeSet<Rank> = v.culprits.iter().copied().collect();
        want == got
    };
    let links_ok = label.links.is_empty()
        || label
            .links
            .iter()
            .all(|want| v.links.iter().any(|got| link_matches(want, got, topo)));
    culprits_ok && links_ok
}

fn culprit_counts(predicted: &[Rank], truth: &[Rank]) -> Counts {
    let p: BTreeSet<Rank> = predicted.iter().copied().collect();
    let t: BTreeSet<Rank> = truth.iter().copied().collect();
    Counts {
        tp: p.intersection(&t).count() as u32,
        fp: p.difference(&t).count() as u32,
        fn_: t.difference(&p).count() as u32,
    }
}

fn link_counts(predicted: &[Link], truth: &[LabelLink], topo: &Topology) -> Counts {
    let found = truth
        .iter()
        .filter(|t| predicted.iter().any(|p| link_matches(t, p, topo)))
        .count() as u32;
    let right = predicted
        .iter()
        .filter(|p| truth.iter().any(|t| link_matches(t, p, topo)))
        .count() as u32;
    Counts {
        tp: found,
        fp: predicted.len() as u32 - right,
        fn_: truth.len() as u32 - found,
    }
}

/// Whether a verdict's link is the labelled one. Pairs match undirected by the nodes of their
/// ranks; a NIC by the node of its rank or a `node<i>` token in its name; a switch by a
/// `tor<k>` token in its name (the `switch` field of the members).
pub fn link_matches(truth: &LabelLink, got: &Link, topo: &Topology) -> bool {
    if truth.kind != got.kind {
        return false;
    }
    let node = |r: Option<Rank>| r.filter(|&r| r < topo.world).map(|r| topo.node_of(r));
    let has_token = |token: &str| {
        got.name
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|t| t == token)
    };
    match truth.kind {
        LinkKind::Pair => match (node(got.from), node(got.to), truth.nodes.as_slice()) {
            (Some(a), Some(b), &[x, y]) => (a, b) == (x, y) || (a, b) == (y, x),
            _ => false,
        },
        LinkKind::Nic => truth
            .nodes
            .first()
            .is_some_and(|&n| node(got.from) == Some(n) || has_token(&Topology::host(n))),
        LinkKind::Switch => truth
            .tor
            .is_some_and(|tor| has_token(&Topology::tor_name(tor))),
    }
}

// ---- the catalogue -----------------------------------------------------------------------------

/// How big the catalogue's jobs are and how many seeds each scenario gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// 16 ranks (4 nodes × 4 GPUs), two seeds: for tests.
    Smoke,
    /// 64 ranks (8 × 8), three seeds.
    Small,
    /// 1,024 ranks (128 × 8), one seed.
    Medium,
    /// 16,384 ranks (2,048 × 8), one seed, no noise variants.
    Large,
}

impl Scale {
    /// (nodes, gpus per node, tp, pp, seeds)
    fn shape(self) -> (u32, u32, u32, u32, u64) {
        match self {
            Scale::Smoke => (4, 4, 2, 2, 2),
            Scale::Small => (8, 8, 4, 2, 3),
            Scale::Medium => (128, 8, 8, 4, 1),
            Scale::Large => (2048, 8, 8, 4, 1),
        }
    }

    fn variants(self) -> &'static [Variant] {
        match self {
            Scale::Large => &[Variant::Clean],
            _ => &Variant::ALL,
        }
    }
}

/// Measurement-noise variants every scenario is run under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Clean,
    /// Hosts' clocks off by up to ±20 ms.
    Skew,
    /// 1 % of probe reports lost.
    Dropped,
    /// One rank's dump missing and a short Flight Recorder ring buffer.
    MissingDumps,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Clean,
        Variant::Skew,
        Variant::Dropped,
        Variant::MissingDumps,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Clean => "clean",
            Variant::Skew => "skew",
            Variant::Dropped => "dropped",
            Variant::MissingDumps => "missing-dumps",
        }
    }

    fn apply(self, spec: &mut SimSpec) {
        match self {
            Variant::Clean => {}
            Variant::Skew => spec.clock_skew_ns = 20_000_000,
            Variant::Dropped => spec.noise.dropped_events = 0.01,
            Variant::MissingDumps => {
                spec.noise.missing_dumps = 1;
                spec.noise.fr_buffer = 64;
            }
        }
    }
}

/// Hangs and mismatches strike at this step: a short history is enough to call a hang.
const HANG_STEP: u32 = 6;
/// Slowdowns strike at this step, after every group has completed the 20-odd ops a baseline
/// needs.
const SLOW_STEP: u32 = 24;
/// Steps each catalogue job runs: 20 after a slowdown's onset, the detection budget of §4.3.
const STEPS: u32 = SLOW_STEP + 20;
/// The world group's loss all-reduce runs every this many steps.
const LOG_EVERY: u32 = 4;

/// Every fault class, the healthy job and both imbalance controls, for several seeds and under
/// each noise variant. Names read `<fault>-s<seed>-<variant>`; each spec's `job` is its name.
pub fn catalogue(scale: Scale) -> Vec<(String, SimSpec)> {
    let (nodes, gpus, tp, pp, seeds) = scale.shape();
    let mut out = Vec::new();
    for seed in 1..=seeds {
        let mut base = SimSpec::new(nodes, gpus, tp, pp);
        base.steps = STEPS;
        base.step_compute_ns = 100_000_000;
        base.log_every = LOG_EVERY;
        base.links.nodes_per_tor = (nodes / 2).clamp(1, 4);
        base.seed = seed;
        let Ok(topo) = Topology::new(&base) else {
            continue;
        };
        let mut scenarios: Vec<(String, Option<Fault>)> = vec![("healthy".into(), None)];
        scenarios.extend(
            faults_for(&base, &topo, seed)
                .into_iter()
                .map(|f| (fault_name(&f), Some(f))),
        );
        for (fault_name, fault) in scenarios {
            for &variant in scale.variants() {
                let mut spec = base.clone();
                spec.fault = fault.clone();
                variant.apply(&mut spec);
                let name = format!("{fault_name}-s{seed}-{}", variant.name());
                spec.job = name.clone();
                out.push((name, spec));
            }
        }
    }
    out
}

fn fault_name(f: &Fault) -> String {
    match f {
        Fault::Mismatch { kind, .. } => {
            let kind = match kind {
                MismatchKind::Type => "type",
                MismatchKind::Size => "size",
                MismatchKind::Dtype => "dtype",
            };
            format!("mismatch_{kind}")
        }
        other => other.name().to_string(),
    }
}

/// One instance of every fault and control, with the culprit and parameters drawn from `seed`.
fn faults_for(spec: &SimSpec, topo: &Topology, seed: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let world = topo.world;
    let nodes = world / topo.gpus_per_node;
    let step_ns = u64::from(spec.pp) * spec.step_compute_ns;
    let at_step = |step: u32| u64::from(step) * step_ns + step_ns / 2;
    let (hang_at, slow_at) = (at_step(HANG_STEP), at_step(SLOW_STEP));
    let rank = rng.gen_range(0..world);
    let group_of = |r: Rank, prefix: &str| -> Option<String> {
        topo.groups
            .iter()
            .find(|g| g.name.starts_with(prefix) && g.ranks.contains(&r))
            .map(|g| g.name.to_string())
    };
    // Per step: two TP all-reduces per pass of each stage, one DP all-reduce.
    let tp_seq = 2 * u64::from(HANG_STEP) + 1;
    let dp_seq = u64::from(HANG_STEP) + 1;
    let (coll_pg, coll_seq) = match (group_of(rank, "dp"), group_of(rank, "tp")) {
        (Some(dp), Some(tp)) => {
            if seed.is_multiple_of(2) {
                (tp, tp_seq)
            } else {
                (dp, dp_seq)
            }
        }
        (Some(dp), None) => (dp, dp_seq),
        (None, Some(tp)) => (tp, tp_seq),
        (None, None) => ("world".into(), 1),
    };
    let mut faults = vec![
        Fault::SkipCollective {
            rank,
            pg: coll_pg.clone(),
            seq: coll_seq,
        },
        Fault::ExtraCollective {
            rank,
            pg: "world".into(),
            // The start-up barrier is world op 1; the loss all-reduce after step 4 is op 2.
            after_seq: 2,
        },
    ];
    for kind in [MismatchKind::Type, MismatchKind::Size, MismatchKind::Dtype] {
        faults.push(Fault::Mismatch {
            rank,
            pg: coll_pg.clone(),
            seq: coll_seq,
            kind,
        });
    }
    faults.extend([
        Fault::ProcessFreeze {
            rank,
            onset_ns: hang_at,
        },
        Fault::ProcessCrash {
            rank,
            onset_ns: hang_at,
        },
        Fault::GpuKernelHang {
            rank,
            pg: coll_pg,
            seq: coll_seq,
        },
        Fault::SlowCompute {
            rank,
            factor: rng.gen_range(1.6..3.0),
            onset_ns: slow_at,
        },
    ]);
    if let Some((from_node, to_node)) = crossing_pair(topo, rank) {
        faults.push(Fault::SlowLink {
            from_node,
            to_node,
            factor: rng.gen_range(3.0..6.0),
            onset_ns: slow_at,
        });
    }
    if nodes > 1 {
        faults.push(Fault::SlowNic {
            node: rng.gen_range(0..nodes),
            factor: rng.gen_range(2.0..4.0),
            onset_ns: slow_at,
        });
        let tors = nodes.div_ceil(topo.nodes_per_tor);
        faults.push(Fault::Congestion {
            tor: rng.gen_range(0..tors),
            factor: rng.gen_range(2.0..4.0),
            onset_ns: slow_at,
        });
    }
    faults.push(Fault::ImbalanceStage {
        stage: topo.pp - 1,
        factor: 1.3,
    });
    faults.push(Fault::ImbalanceRandom { factor: 1.3 });
    faults
}

/// Two neighbouring nodes of the data-parallel ring through `rank`'s DP group (or any ring), so
/// a slowed link between them actually carries traffic.
fn crossing_pair(topo: &Topology, rank: Rank) -> Option<(u32, u32)> {
    let mut rings: Vec<&[Rank]> = topo
        .groups
        .iter()
        .filter(|g| g.name.starts_with("dp") && g.ranks.contains(&rank))
        .map(|g| &g.ranks[..])
        .collect();
    rings.extend(topo.groups.iter().map(|g| &g.ranks[..]));
    rings.into_iter().find_map(|ring| {
        (0..ring.len()).find_map(|i| {
            let (a, b) = (ring[i], ring[(i + 1) % ring.len()]);
            let (na, nb) = (topo.node_of(a), topo.node_of(b));
            (na != nb).then_some((na, nb))
        })
    })
}

// ---- the scorecard -----------------------------------------------------------------------------

/// Scores of one ground-truth category.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassScore {
    pub scenarios: u32,
    /// Scenarios whose top final verdict was right (for healthy and controls: no verdict).
    pub top1_correct: u32,
    pub top1_accuracy: f64,
    /// Faulty scenarios with any verdict at or after onset.
    pub detected: u32,
    pub detect_p50_ns: Option<u64>,
    pub detect_p90_ns: Option<u64>,
    pub locate_p50_ns: Option<u64>,
    pub locate_p90_ns: Option<u64>,
    pub false_alarms: u32,
    pub culprits: Counts,
    pub links: Counts,
}

/// The summary of a catalogue run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scorecard {
    pub scenarios: u32,
    /// Per `Label::category` ("hang/missing_participant", "healthy", "control/…").
    pub by_class: BTreeMap<String, ClassScore>,
    /// Over every scenario.
    pub top1_accuracy: Option<f64>,
    /// Faulty scenarios detected / faulty scenarios.
    pub detection_recall: Option<f64>,
    pub culprits: Counts,
    pub culprit_precision: Option<f64>,
    pub culprit_recall: Option<f64>,
    pub culprit_f1: Option<f64>,
    pub links: Counts,
    pub link_precision: Option<f64>,
    pub link_recall: Option<f64>,
    /// Verdicts on healthy and control jobs per simulated hour of them.
    pub false_alarms_per_hour: Option<f64>,
    /// Verdicts raised before a fault's onset, over all faulty scenarios.
    pub early_alarms: u32,
    /// Ground-truth category → predicted "class/subtype" (or "none") → scenarios.
    pub confusion: BTreeMap<String, BTreeMap<String, u32>>,
}

/// Summarises outcomes; pure arithmetic over them.
pub fn score(outcomes: &[Outcome]) -> Scorecard {
    let mut card = Scorecard {
        scenarios: outcomes.len() as u32,
        ..Scorecard::default()
    };
    let mut detects: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut locates: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let (mut quiet_alarms, mut quiet_ns) = (0u32, 0u64);
    let (mut faulty, mut detected, mut correct) = (0u32, 0u32, 0u32);
    for o in outcomes {
        let class = card.by_class.entry(o.category.clone()).or_default();
        class.scenarios += 1;
        class.top1_correct += u32::from(o.top1_correct);
        class.false_alarms += o.false_alarms;
        class.culprits.add(o.culprits);
        class.links.add(o.links);
        card.culprits.add(o.culprits);
        card.links.add(o.links);
        correct += u32::from(o.top1_correct);
        *card
            .confusion
            .entry(o.category.clone())
            .or_default()
            .entry(o.predicted.clone())
            .or_default() += 1;
        if o.label.is_fault() {
            faulty += 1;
            card.early_alarms += o.false_alarms;
            if o.detect_ns.is_some() || (o.offline && !o.final_verdicts.is_empty()) {
                detected += 1;
                class.detected += 1;
            }
            if let Some(t) = o.detect_ns {
                detects.entry(&o.category).or_default().push(t);
            }
            if let Some(t) = o.locate_ns {
                locates.entry(&o.category).or_default().push(t);
            }
        } else {
            quiet_alarms += o.false_alarms;
            quiet_ns += o.simulated_ns;
        }
    }
    for (category, class) in card.by_class.iter_mut() {
        class.top1_accuracy = f64::from(class.top1_correct) / f64::from(class.scenarios.max(1));
        if let Some(v) = detects.get_mut(category.as_str()) {
            class.detect_p50_ns = percentile(v, 0.5);
            class.detect_p90_ns = percentile(v, 0.9);
        }
        if let Some(v) = locates.get_mut(category.as_str()) {
            class.locate_p50_ns = percentile(v, 0.5);
            class.locate_p90_ns = percentile(v, 0.9);
        }
    }
    card.top1_accuracy = ratio(correct, card.scenarios);
    card.detection_recall = ratio(detected, faulty);
    card.culprit_precision = card.culprits.precision();
    card.culprit_recall = card.culprits.recall();
    card.culprit_f1 = card.culprits.f1();
    card.link_precision = card.links.precision();
    card.link_recall = card.links.recall();
    card.false_alarms_per_hour =
        (quiet_ns > 0).then(|| f64::from(quiet_alarms) / (quiet_ns as f64 / HOUR_NS));
    card
}

/// Nearest-rank percentile (`p` in 0..=1) of unsorted values.
pub fn percentile(values: &mut [u64], p: f64) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = (p * values.len() as f64).ceil() as usize;
    Some(values[rank.clamp(1, values.len()) - 1])
}

impl Scorecard {
    /// A Markdown table per class and the headline figures, for humans.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.1}%", v * 100.0));
        let secs =
            |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{:.2}s", v as f64 / 1e9));
        let _ = writeln!(
            s,
            "| class | n | top-1 | detected | detect p50 | detect p90 | locate p50 | locate p90 | culprit P/R | false alarms |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for (name, c) in &self.by_class {
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} |",
                c.scenarios,
                pct(Some(c.top1_accuracy)),
                c.detected,
                secs(c.detect_p50_ns),
                secs(c.detect_p90_ns),
                secs(c.locate_p50_ns),
                secs(c.locate_p90_ns),
                pct(c.culprits.precision()),
                pct(c.culprits.recall()),
                c.false_alarms,
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "scenarios: {}", self.scenarios);
        let _ = writeln!(s, "top-1 accuracy: {}", pct(self.top1_accuracy));
        let _ = writeln!(s, "detection recall: {}", pct(self.detection_recall));
        let _ = writeln!(
            s,
            "culprits: precision {}, recall {}, F1 {}",
            pct(self.culprit_precision),
            pct(self.culprit_recall),
            pct(self.culprit_f1)
        );
        let _ = writeln!(
            s,
            "links: precision {}, recall {}",
            pct(self.link_precision),
            pct(self.link_recall)
        );
        let _ = writeln!(
            s,
            "false alarms per simulated hour on healthy jobs and controls: {}",
            self.false_alarms_per_hour
                .map_or("n/a".to_string(), |v| format!("{v:.1}"))
        );
        let _ = writeln!(s, "alarms before a fault's onset: {}", self.early_alarms);
        s
    }
}

// ---- the job kinds people run ------------------------------------------------------------------

/// One scenario of [`kinds_catalogue`]: the spec and whether its Flight Recorder dumps are
/// scored too (hangs the dumps can show, healthy jobs and controls; not slowdowns, which a dump
/// taken at a timeout does not see).
#[derive(Clone, Debug)]
pub struct KindScenario {
    pub name: String,
    pub spec: SimSpec,
    pub offline: bool,
}

/// Pipeline (coalesced p2p), HSDP, Megatron TP with sequence parallelism and DiLoCo jobs on 16
/// ranks (4 nodes × 4 GPUs), each healthy and with the faults that job kind typically meets:
/// a stage rank that never posts its p2p op, a slow link on a pipeline boundary, a compute
/// straggler in one shard, a rank missing from a shard or TP collective; and as negative
/// controls a healthy job dumped on demand while ops are legitimately in flight (a DiLoCo
/// outer all-reduce of seconds over a slow link, a pipeline's pending recvs). Names read
/// `<kind>-<fault>-s<seed>`.
pub fn kinds_catalogue(seeds: u64) -> Result<Vec<KindScenario>, SimError> {
    use crate::sim::{kind_spec, DumpTrigger, JobKind};
    let (nodes, gpus) = (4, 4);
    let mut out = Vec::new();
    for seed in 1..=seeds {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9));
        for kind in [
            JobKind::Pipeline,
            JobKind::Hsdp,
            JobKind::TpSp,
            JobKind::Diloco,
        ] {
            let mut base = kind_spec(kind, nodes, gpus);
            base.steps = if kind == JobKind::Diloco { 12 } else { STEPS };
            base.step_compute_ns = 100_000_000;
            base.links.nodes_per_tor = 2;
            base.seed = seed;
            let topo = Topology::new(&base)?;
            let step_ns = u64::from(base.pp) * base.step_compute_ns;
            let at_step = |step: u32| u64::from(step) * step_ns + step_ns / 2;
            let kind_name = match kind {
                JobKind::Pipeline => "pipeline",
                JobKind::Hsdp => "hsdp",
                JobKind::TpSp => "tp_sp",
                JobKind::Diloco => "diloco",
                JobKind::Megatron => "megatron",
            };
            let group_of = |r: Rank, kind: crate::sim::GroupKind| -> String {
                topo.groups
                    .iter()
                    .find(|g| g.kind == kind && g.ranks.contains(&r))
                    .map(|g| g.name.to_string())
                    .unwrap_or_default()
            };
            let mut scenarios: Vec<(&str, Option<Fault>, DumpTrigger, bool)> =
                vec![("healthy", None, DumpTrigger::Timeout, true)];
            match kind {
                JobKind::Pipeline => {
                    // A middle stage posts four p2p ops a step (recv and send, both passes).
                    let stage = rng.gen_range(1..topo.pp - 1);
                    let rank = topo.stage_ranks(stage).start + rng.gen_range(0..topo.dp);
                    let pg = group_of(rank, crate::sim::GroupKind::Pp);
                    scenarios.push((
                        "skip_p2p",
                        Some(Fault::SkipCollective {
                            rank,
                            pg,
                            seq: 4 * u64::from(HANG_STEP) + 1 + rng.gen_range(0..4),
                        }),
                        DumpTrigger::Timeout,
                        true,
                    ));
                    scenarios.push((
                        "crash_stage",
                        Some(Fault::ProcessCrash {
                            rank,
                            onset_ns: at_step(HANG_STEP),
                        }),
                        DumpTrigger::Timeout,
                        true,
                    ));
                    let boundary = rng.gen_range(0..topo.pp - 1);
                    scenarios.push((
                        "slow_pp_link",
                        Some(Fault::SlowLink {
                            from_node: boundary,
                            to_node: boundary + 1,
                            factor: rng.gen_range(20.0..40.0),
                            onset_ns: at_step(SLOW_STEP),
                        }),
                        DumpTrigger::Timeout,
                        false,
                    ));
                    let at = at_step(STEPS / 2) + rng.gen_range(0..step_ns / 2);
                    scenarios.push(("on_demand", None, DumpTrigger::OnDemand { at_ns: at }, true));
                }
                JobKind::Hsdp | JobKind::TpSp => {
                    let rank = rng.gen_range(0..topo.world);
                    let (pg, per_step) = if kind == JobKind::Hsdp {
                        // All-gather per layer forward, all-gather and reduce-scatter backward.
                        (
                            group_of(rank, crate::sim::GroupKind::Tp),
                            3 * u64::from(base.layers),
                        )
                    } else {
                        // All-gather and reduce-scatter per layer, forward and backward.
                        (
                            group_of(rank, crate::sim::GroupKind::Tp),
                            4 * u64::from(base.layers),
                        )
                    };
                    scenarios.push((
                        "skip_collective",
                        Some(Fault::SkipCollective {
                            rank,
                            pg,
                            seq: per_step * u64::from(HANG_STEP) + 1 + rng.gen_range(0..per_step),
                        }),
                        DumpTrigger::Timeout,
                        true,
                    ));
                    scenarios.push((
                        "slow_compute",
                        Some(Fault::SlowCompute {
                            rank,
                            factor: rng.gen_range(1.6..3.0),
                            onset_ns: at_step(SLOW_STEP),
                        }),
                        DumpTrigger::Timeout,
                        false,
                    ));
                }
                JobKind::Diloco | JobKind::Megatron => {
                    // Dumped on demand halfway through an outer all-reduce: the first (no
                    // earlier one to compare with) or the last.
                    for (name, nth) in [("on_demand_first_outer", 0), ("on_demand_outer", 2)] {
                        let (start, end) = op_span(&base, "dp", nth)?;
                        let at = (start + end) / 2 - base.epoch_ns;
                        scenarios.push((name, None, DumpTrigger::OnDemand { at_ns: at }, true));
                    }
                }
            }
            for (fault_name, fault, dump, offline) in scenarios {
                let mut spec = base.clone();
                spec.fault = fault;
                spec.dump = dump;
                let name = format!("{kind_name}-{fault_name}-s{seed}");
                spec.job = name.clone();
                out.push(KindScenario {
                    name,
                    spec,
                    offline,
                });
            }
        }
    }
    Ok(out)
}

/// When rank 0's `nth` op (from 0) in a group whose name starts with `prefix` started and
/// ended, in a healthy run of `spec` (true clock: the run has no skew).
fn op_span(spec: &SimSpec, prefix: &str, nth: usize) -> Result<(u64, u64), SimError> {
    use crate::event::{Event, Phase};
    let mut healthy = spec.clone();
    healthy.fault = None;
    healthy.clock_skew_ns = 0;
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    simulate_into(&healthy, &mut |_, ev| {
        if let Event::Coll(c) = ev {
            if c.rank == 0 && c.pg.starts_with(prefix) {
                match c.phase {
                    Phase::Start => starts.push(c.t_ns),
                    Phase::End => ends.push(c.t_ns),
                    Phase::Enqueue => {}
                }
            }
        }
    })?;
    starts.sort_unstable();
    ends.sort_unstable();
    match (starts.get(nth), ends.get(nth)) {
        (Some(&s), Some(&e)) => Ok((s, e)),
        _ => Err(SimError::Param(format!(
            "no op {nth} in a group named {prefix}…"
        ))),
    }
}

/// Runs [`kinds_catalogue`] live, and offline where its dumps are scored.
pub fn run_kinds(seeds: u64, cfg: &Config) -> Result<Vec<Outcome>, SimError> {
    let mut outcomes = Vec::new();
    for s in kinds_catalogue(seeds)? {
        outcomes.push(run_scenario(&s.spec, cfg)?);
        if s.offline {
            outcomes.push(run_offline(&s.spec, cfg)?);
        }
    }
    Ok(outcomes)
}
