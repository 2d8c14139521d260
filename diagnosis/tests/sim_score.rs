//! The scorer's arithmetic on synthetic outcomes, its matching rules, and the catalogue.

use std::collections::BTreeSet;
use yard_diagnosis::analyzer::Config;
use yard_diagnosis::event::Rank;
use yard_diagnosis::score::{
    catalogue, link_matches, matches_label, percentile, run_offline, run_scenario, score, Counts,
    Outcome, Scale,
};
use yard_diagnosis::sim::{simulate_into, Label, LabelLink, SimSpec, Topology};
use yard_diagnosis::verdict::{Class, Link, LinkKind, Subtype, Verdict};

fn verdict(class: Class, subtype: Subtype, culprits: Vec<Rank>, links: Vec<Link>) -> Verdict {
    Verdict {
        class,
        subtype,
        culprits,
        links,
        pg: None,
        seq: None,
        op: None,
        evidence: vec![],
        confidence: 0.9,
        detected_ns: 0,
    }
}

fn label(class: Option<Class>, subtype: Option<Subtype>, culprits: Vec<Rank>) -> Label {
    Label {
        fault: class.map(|_| "x".to_string()),
        class,
        subtype,
        culprits,
        links: vec![],
        onset_ns: 1_000,
    }
}

/// An outcome with the given ground truth and scores; everything else neutral.
#[allow(clippy::too_many_arguments)]
fn outcome(
    label: Label,
    correct: bool,
    detect_s: Option<f64>,
    locate_s: Option<f64>,
    culprits: Counts,
    false_alarms: u32,
    hours: f64,
) -> Outcome {
    Outcome {
        name: "t".into(),
        category: label.category(),
        label,
        offline: false,
        simulated_ns: (hours * 3_600e9) as u64,
        detect_ns: detect_s.map(|s| (s * 1e9) as u64),
        locate_ns: locate_s.map(|s| (s * 1e9) as u64),
        final_verdicts: vec![],
        predicted: if correct { "ok".into() } else { "none".into() },
        top1_correct: correct,
        culprits,
        links: Counts::default(),
        false_alarms,
    }
}

fn counts(tp: u32, fp: u32, fn_: u32) -> Counts {
    Counts { tp, fp, fn_ }
}

#[test]
fn percentiles_use_nearest_rank() {
    let mut v: Vec<u64> = (1..=10).rev().collect();
    assert_eq!(percentile(&mut v, 0.5), Some(5));
    assert_eq!(percentile(&mut v, 0.9), Some(9));
    assert_eq!(percentile(&mut v, 1.0), Some(10));
    assert_eq!(percentile(&mut v, 0.0), Some(1));
    assert_eq!(percentile(&mut [7], 0.9), Some(7));
    assert_eq!(percentile(&mut [], 0.5), None);
}

#[test]
fn scorecard_arithmetic_on_synthetic_outcomes() {
    let hang = || {
        label(
            Some(Class::Hang),
            Some(Subtype::MissingParticipant),
            vec![3],
        )
    };
    let slow = || label(Some(Class::Slow), Some(Subtype::ComputeStraggler), vec![5]);
    let outcomes = vec![
        // Four hangs: three right (detect 1,2,3 s; locate 2,3,4 s), one blamed the wrong rank.
        outcome(hang(), true, Some(1.0), Some(2.0), counts(1, 0, 0), 0, 0.01),
        outcome(hang(), true, Some(2.0), Some(3.0), counts(1, 0, 0), 0, 0.01),
        outcome(hang(), true, Some(3.0), Some(4.0), counts(1, 0, 0), 0, 0.01),
        outcome(hang(), false, Some(4.0), None, counts(0, 1, 1), 1, 0.01),
        // One slow fault, never detected.
        outcome(slow(), false, None, None, counts(0, 0, 1), 0, 0.01),
        // Controls: two hours of healthy and control jobs with 3 alarms between them.
        outcome(
            label(None, None, vec![]),
            true,
            None,
            None,
            counts(0, 0, 0),
            0,
            1.0,
        ),
        outcome(
            Label {
                fault: Some("imbalance_stage".into()),
                ..Label::default()
            },
            false,
            None,
            None,
            counts(0, 2, 0),
            3,
            1.0,
        ),
    ];
    let card = score(&outcomes);
    assert_eq!(card.scenarios, 7);
    let h = &card.by_class["hang/missing_participant"];
    assert_eq!((h.scenarios, h.top1_correct, h.detected), (4, 3, 4));
    assert!((h.top1_accuracy - 0.75).abs() < 1e-9);
    assert_eq!(h.detect_p50_ns, Some(2_000_000_000));
    assert_eq!(h.detect_p90_ns, Some(4_000_000_000));
    assert_eq!(h.locate_p50_ns, Some(3_000_000_000));
    assert_eq!(h.locate_p90_ns, Some(4_000_000_000));
    let s = &card.by_class["slow/compute_straggler"];
    assert_eq!((s.detected, s.detect_p50_ns), (0, None));
    assert_eq!(card.by_class["control/imbalance_stage"].false_alarms, 3);
    assert_eq!(card.by_class["healthy"].top1_correct, 1);
    // 4 of 7 right; 4 of 5 faults detected.
    assert!((card.top1_accuracy.unwrap() - 4.0 / 7.0).abs() < 1e-9);
    assert!((card.detection_recall.unwrap() - 0.8).abs() < 1e-9);
    // Culprits: tp 3, fp 1 + 2, fn 1 + 1.
    assert_eq!(card.culprits, counts(3, 3, 2));
    assert!((card.culprit_precision.unwrap() - 0.5).abs() < 1e-9);
    assert!((card.culprit_recall.unwrap() - 0.6).abs() < 1e-9);
    let f1 = 2.0 * 0.5 * 0.6 / 1.1;
    assert!((card.culprit_f1.unwrap() - f1).abs() < 1e-9);
    // No links anywhere: nothing claimed, nothing to find.
    assert_eq!((card.link_precision, card.link_recall), (None, None));
    // 3 alarms over 2 control hours; the one on a fault counts as early, not per hour.
    assert!((card.false_alarms_per_hour.unwrap() - 1.5).abs() < 1e-9);
    assert_eq!(card.early_alarms, 1);
    assert_eq!(card.confusion["hang/missing_participant"]["ok"], 3);
    assert_eq!(card.confusion["hang/missing_participant"]["none"], 1);
    let table = card.to_table();
    assert!(table.contains("| hang/missing_participant | 4 | 75.0% | 4 | 2.00s | 4.00s |"));
    assert!(table.contains("false alarms per simulated hour on healthy jobs and controls: 1.5"));
    let json = serde_json::to_value(&card).unwrap();
    assert_eq!(json["by_class"]["healthy"]["scenarios"], 1);
}

#[test]
fn an_empty_run_scores_without_dividing_by_zero() {
    let card = score(&[]);
    assert_eq!(card.scenarios, 0);
    assert_eq!(card.top1_accuracy, None);
    assert_eq!(card.false_alarms_per_hour, None);
    assert!(card.to_table().contains("n/a"));
}

#[test]
fn verdicts_match_labels_by_class_and_culprit_set_or_link() {
    let spec = SimSpec::new(4, 4, 2, 2);
    let topo = Topology::new(&spec).unwrap();
    let hang = label(Some(Class::Hang), Some(Subtype::DeadProcess), vec![3]);
    let v = |class, culprits| verdict(class, Subtype::DeadProcess, culprits, vec![]);
    assert!(matches_label(&v(Class::Hang, vec![3]), &hang, &topo));
    assert!(!matches_label(&v(Class::Hang, vec![3, 4]), &hang, &topo));
    assert!(!matches_label(&v(Class::Slow, vec![3]), &hang, &topo));

    // Pairs match undirected by node; rank 5 is on node 1, rank 9 on node 2.
    let pair = LabelLink {
        kind: LinkKind::Pair,
        name: "node2 <-> node1".into(),
        nodes: vec![2, 1],
        tor: None,
    };
    let link = |kind, name: &str, from, to| Link {
        kind,
        name: name.into(),
        from,
        to,
    };
    assert!(link_matches(
        &pair,
        &link(LinkKind::Pair, "", Some(5), Some(9)),
        &topo
    ));
    assert!(link_matches(
        &pair,
        &link(LinkKind::Pair, "", Some(10), Some(6)),
        &topo
    ));
    assert!(!link_matches(
        &pair,
        &link(LinkKind::Pair, "", Some(1), Some(9)),
        &topo
    ));
    assert!(!link_matches(
        &pair,
        &link(LinkKind::Nic, "", Some(5), Some(9)),
        &topo
    ));
    let nic = LabelLink {
        kind: LinkKind::Nic,
        name: "node2/nic0".into(),
        nodes: vec![2],
        tor: None,
    };
    assert!(link_matches(
        &nic,
        &link(LinkKind::Nic, "node2/nic0", None, None),
        &topo
    ));
    assert!(link_matches(
        &nic,
        &link(LinkKind::Nic, "?", Some(8), None),
        &topo
    ));
    assert!(!link_matches(
        &nic,
        &link(LinkKind::Nic, "node21/nic0", None, None),
        &topo
    ));
    let tor = LabelLink {
        kind: LinkKind::Switch,
        name: "tor1".into(),
        nodes: vec![],
        tor: Some(1),
    };
    assert!(link_matches(
        &tor,
        &link(LinkKind::Switch, "tor1", None, None),
        &topo
    ));
    assert!(!link_matches(
        &tor,
        &link(LinkKind::Switch, "tor11", None, None),
        &topo
    ));

    let slow_link = Label {
        fault: Some("slow_link".into()),
        class: Some(Class::Slow),
        subtype: Some(Subtype::SlowLink),
        culprits: vec![],
        links: vec![pair],
        onset_ns: 0,
    };
    let good = verdict(
        Class::Slow,
        Subtype::SlowLink,
        vec![],
        vec![link(LinkKind::Pair, "", Some(9), Some(5))],
    );
    assert!(matches_label(&good, &slow_link, &topo));
    let bad = verdict(Class::Slow, Subtype::SlowLink, vec![], vec![]);
    assert!(!matches_label(&bad, &slow_link, &topo));
}

#[test]
fn the_catalogue_covers_every_fault_and_control_and_simulates() {
    let cat = catalogue(Scale::Smoke);
    let names: BTreeSet<&str> = cat.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), cat.len(), "names are unique");
    let mut categories = BTreeSet::new();
    for (name, spec) in &cat {
        assert_eq!(&spec.job, name);
        let summary = simulate_into(spec, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{name} does not simulate: {e}"));
        categories.insert(summary.label.category());
        if let Some(fault) = &spec.fault {
            assert!(name.starts_with(fault.name()) || name.starts_with("mismatch"));
        }
    }
    for want in [
        "healthy",
        "control/imbalance_stage",
        "control/imbalance_random",
        "hang/missing_participant",
        "hang/extra_participant",
        "hang/dead_process",
        "hang/dataplane_stall",
        "mismatch/type_mismatch",
        "mismatch/size_mismatch",
        "mismatch/dtype_mismatch",
        "slow/compute_straggler",
        "slow/slow_link",
        "slow/congestion",
    ] {
        assert!(categories.contains(want), "no {want} scenario");
    }
    for variant in ["clean", "skew", "dropped", "missing-dumps"] {
        assert!(
            cat.iter().any(|(n, _)| n.ends_with(variant)),
            "no {variant}"
        );
    }
    assert!(catalogue(Scale::Small).len() > cat.len());
}

#[test]
fn scenarios_run_live_and_offline() {
    let cat = catalogue(Scale::Smoke);
    let (_, healthy) = cat.iter().find(|(n, _)| n == "healthy-s1-clean").unwrap();
    let live = run_scenario(healthy, &Config::default()).unwrap();
    assert_eq!(live.category, "healthy");
    assert!(!live.offline);
    assert!(live.simulated_ns > 1_000_000_000);
    assert_eq!(live.detect_ns, None);
    let (_, skip) = cat
        .iter()
        .find(|(n, _)| n == "skip_collective-s1-clean")
        .unwrap();
    let offline = run_offline(skip, &Config::default()).unwrap();
    assert!(offline.offline);
    assert_eq!(offline.category, "hang/missing_participant");
    assert_eq!(offline.name, "skip_collective-s1-clean-offline");
    assert_eq!(offline.label.culprits.len(), 1);
}
