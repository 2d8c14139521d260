//! How well the analyzer names injected faults, scored on the simulator's catalogue. These
//! assert the budgets of notes §4.3; they are ignored until the analyzer lands, then run with
//! `cargo test -p yard-diagnosis --test sim_accuracy -- --ignored --nocapture` (the scorecard
//! is printed).

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
#[ignore = "enabled once the analyzer lands"]
fn live_analyzer_names_hangs_quickly_and_rightly() {
    let cfg = Config::default();
    let (_, card) = live(Scale::Smoke, &cfg);
    // Detection within the hang floor plus two evaluation periods and the probe's batching.
    let budget = cfg.hang_floor_ns.max(cfg.heartbeat_timeout_ns) + 500_000_000;
    for class in HANGS {
        let c = &card.by_class[class];
        assert!(
            c.top1_accuracy >= 0.75,
            "{class}: top-1 {}",
            c.top1_accuracy
        );
        assert_eq!(c.detected, c.scenarios, "{class}: undetected runs");
        let p90 = c.detect_p90_ns.unwrap_or(u64::MAX);
        assert!(p90 <= budget, "{class}: detect p90 {p90} ns over {budget}");
    }
}

#[test]
#[ignore = "enabled once the analyzer lands"]
fn live_analyzer_names_slowdowns_within_twenty_steps() {
    let (_, card) = live(Scale::Smoke, &Config::default());
    // A catalogue step of the smoke shape is about 0.22 s (two stages × 0.1 s of compute).
    let twenty_steps = 20 * 220_000_000;
    for class in SLOWS {
        let c = &card.by_class[class];
        assert!(c.top1_accuracy >= 0.5, "{class}: top-1 {}", c.top1_accuracy);
        let p50 = c.locate_p50_ns.unwrap_or(u64::MAX);
        assert!(p50 <= twenty_steps, "{class}: locate p50 {p50} ns");
    }
    assert!(card.culprit_precision.unwrap_or(0.0) >= 0.8);
}

#[test]
#[ignore = "enabled once the analyzer lands"]
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
#[ignore = "enabled once the analyzer lands"]
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
    for class in [
        "hang/missing_participant",
        "mismatch/type_mismatch",
        "mismatch/size_mismatch",
        "mismatch/dtype_mismatch",
    ] {
        let c = &card.by_class[class];
        assert!(
            c.top1_accuracy >= 0.75,
            "{class} offline: top-1 {}",
            c.top1_accuracy
        );
    }
    for o in outcomes.iter().filter(|o| !o.top1_correct) {
        println!("offline miss: {} predicted {}", o.name, o.predicted);
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
