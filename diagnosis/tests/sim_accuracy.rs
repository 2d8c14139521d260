//! How well the analyzer names injected faults, scored on the simulator's Smoke catalogue
//! (every fault class, the healthy job and both controls, two seeds, four noise variants). These
//! assert the budgets of notes §4.3: every labelled fault named top-1, none raised on healthy
//! and control jobs. `-- --nocapture` prints the scorecards.

use yard_diagnosis::analyzer::Config;
use yard_diagnosis::score::{
    catalogue, run_offline, run_scenario, score, Outcome, Scale, Scorecard,
};

/// Categories a hang-or-mismatch verdict is expected for.
const HANGS: [&str; 7] = [
    "hang/missing_participant",
    "hang/extra_participant",
    "hang/dead_process",
    "hang/dataplane_stall",
    "mismatch/type_mismatch",
    "mismatch/size_mismatch",
    "mismatch/dtype_mismatch",
];

const SLOWS: [&str; 3] = [
    "slow/compute_straggler",
    "slow/slow_link",
    "slow/congestion",
];

fn live(scale: Scale, cfg: &Config) -> (Vec<Outcome>, Scorecard) {
    let outcomes: Vec<Outcome> = catalogue(scale)
        .iter()
        .map(|(name, spec)| run_scenario(spec, cfg).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();
    let card = score(&outcomes);
    println!("{}", card.to_table());
    for o in outcomes
        .iter()
        .filter(|o| !o.top1_correct || o.false_alarms > 0)
    {
        println!(
            "miss: {} predicted {} ({} false alarms)",
            o.name, o.predicted, o.false_alarms
        );
    }
    (outcomes, card)
}

#[test]
fn live_analyzer_names_hangs_quickly_and_rightly() {
    let cfg = Config::default();
    let (_, card) = live(Scale::Smoke, &cfg);
    // Detection within the hang floor plus two evaluation periods and the probe's batching.
    let budget = cfg.hang_floor_ns.max(cfg.heartbeat_timeout_ns) + 500_000_000;
    for class in HANGS {
        let c = &card.by_class[class];
        assert_eq!(
            c.top1_correct, c.scenarios,
            "{class}: top-1 {}",
            c.top1_accuracy
        );
        assert_eq!(c.detected, c.scenarios, "{class}: undetected runs");
        let p90 = c.detect_p90_ns.unwrap_or(u64::MAX);
        assert!(p90 <= budget, "{class}: detect p90 {p90} ns over {budget}");
    }
}

#[test]
fn live_analyzer_names_slowdowns_within_twenty_steps() {
    let (_, card) = live(Scale::Smoke, &Config::default());
    // A catalogue step of the smoke shape is about 0.22 s (two stages × 0.1 s of compute).
    let twenty_steps = 20 * 220_000_000;
    for class in SLOWS {
        let c = &card.by_class[class];
        assert_eq!(
            c.top1_correct, c.scenarios,
            "{class}: top-1 {}",
            c.top1_accuracy
        );
        let p50 = c.locate_p50_ns.unwrap_or(u64::MAX);
        assert!(p50 <= twenty_steps, "{class}: locate p50 {p50} ns");
    }
    assert_eq!(card.culprit_precision, Some(1.0));
}

#[test]
fn live_analyzer_stays_quiet_on_healthy_and_imbalanced_jobs() {
    let (outcomes, card) = live(Scale::Smoke, &Config::default());
    for o in outcomes.iter().filter(|o| !o.label.is_fault()) {
        assert_eq!(
            o.false_alarms, 0,
            "{} raised {:?}",
            o.name, o.final_verdicts
        );
    }
    assert_eq!(card.false_alarms_per_hour, Some(0.0));
    assert_eq!(card.early_alarms, 0, "verdicts before a fault's onset");
}

#[test]
fn flight_recorder_dumps_alone_name_hangs_and_mismatches() {
    let cfg = Config::default();
    let outcomes: Vec<Outcome> = catalogue(Scale::Smoke)
        .iter()
        .filter(|(_, spec)| {
            spec.fault.as_ref().is_some_and(|f| {
                matches!(
                    f.name(),
                    "skip_collective"
                        | "extra_collective"
                        | "mismatch"
                        | "process_crash"
                        | "gpu_kernel_hang"
                )
            })
        })
        .map(|(name, spec)| run_offline(spec, &cfg).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();
    let card = score(&outcomes);
    println!("{}", card.to_table());
    for o in outcomes.iter().filter(|o| !o.top1_correct) {
        println!("offline miss: {} predicted {}", o.name, o.predicted);
    }
    // Everything the dumps can decide is named, a lost dump of another rank notwithstanding.
    for class in [
        "hang/missing_participant",
        "hang/extra_participant",
        "mismatch/type_mismatch",
        "mismatch/size_mismatch",
        "mismatch/dtype_mismatch",
    ] {
        let c = &card.by_class[class];
        assert_eq!(
            c.top1_correct, c.scenarios,
            "{class} offline: top-1 {}",
            c.top1_accuracy
        );
    }
    // A hung kernel cannot be told from Flight Recorder dumps alone (every member's entry says
    // "started" and there is no per-peer progress): the honest answer names nobody.
    for o in outcomes
        .iter()
        .filter(|o| o.category == "hang/dataplane_stall")
    {
        let top = &o.final_verdicts[0];
        assert_eq!(o.predicted, "hang/undecided", "{}", o.name);
        assert!(
            top.culprits.is_empty(),
            "{} blamed {:?}",
            o.name,
            top.culprits
        );
    }
    // A crashed rank leaves no dump: the analyzer must blame it, not a live rank (unless the
    // noise variant lost another dump too, which leaves two equally silent candidates).
    for o in outcomes
        .iter()
        .filter(|o| o.category == "hang/dead_process" && !o.name.contains("missing-dumps"))
    {
        assert!(o.top1_correct, "{} predicted {}", o.name, o.predicted);
        assert_eq!(o.culprits.fp, 0, "{} blamed a live rank", o.name);
    }
}

/// A rank slow from the job's first step (a restart onto a bad node) has no healthy history of
/// its own to compare with: its baseline learns the slowness as normal. Compared with its
/// data-parallel peers at the same seqs, as CCL-D compares ranks, it stands out, both from the
/// first step and a few seconds in (a custom 128-rank TP 4 × PP 2 job, as `yard sim ccl
/// --nodes 16 --tp 4 --pp 2` runs it).
#[test]
fn a_rank_slow_from_the_first_steps_is_named_against_its_peers() {
    use yard_diagnosis::score::run_scenario;
    use yard_diagnosis::sim::{Fault, SimSpec};
    for onset_ns in [0, 3_000_000_000] {
        let mut spec = SimSpec::new(16, 8, 4, 2);
        spec.steps = 20;
        spec.seed = 1;
        spec.job = "sim-16x8".into();
        spec.fault = Some(Fault::SlowCompute {
            rank: 5,
            factor: 6.0,
            onset_ns,
        });
        let o = run_scenario(&spec, &Config::default()).unwrap();
        assert!(o.top1_correct, "onset {onset_ns}: {:#?}", o.final_verdicts);
        assert_eq!(o.final_verdicts[0].culprits, vec![5]);
        assert_eq!(o.false_alarms, 0);
    }
}
