//! The analyzer on Flight Recorder dumps from `tests/frgen/frgen.py`, a generator written from
//! PyTorch's recorder and the frameworks' call sequences (Megatron-LM 1F1B with
//! `batch_isend_irecv`, FSDP2 and coalesced FSDP1-style collectives, MoE all_to_all with uneven
//! splits, DiLoCo's async outer all_reduce), not from the analyzer's rules, and pickled by
//! Python itself.
//!
//! Three sets of seeds: [`TUNED`] are the ones the rules may be adjusted against; [`HELD_OUT`]
//! were kept apart until session 27d, which measured them once (48/55) and then changed rules
//! with their misses in view, so they are no longer untouched; [`FRESH`] were first generated
//! and scored after the last change and are the honest held-out score. Sets that were fresh
//! once and then looked at: 201-205 (27d: 49/55, then a change made with their misses in
//! view) and 301-310 (27e: 100/110, then the generator's slow-NIC placement and three rules
//! changed with their misses in view); `FRGEN_FRESH=<a>-<b>` scores any of them again, and
//! 27e scored 401-410 once after its changes, 27f 501-510 once after its own (a new NIC rule
//! for live paths and tied candidates in untimed hangs, neither made with any set's misses in
//! view). The test prints all three scorecards (`cargo
//! test -p yard-diagnosis --test fr_independent -- --nocapture`) and asserts what must hold on
//! every seed: no verdict naming a rank or a link on a healthy job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use yard_diagnosis::analyzer::{analyze_trace, Config};
use yard_diagnosis::import::read_dir;
use yard_verdict::{LinkKind, Subtype, Verdict};

/// Seeds the analyzer's rules may be tuned on.
const TUNED: [u64; 5] = [1, 2, 3, 4, 5];
/// `FRGEN_ONLY=<seed>` runs one tuned seed (with `FRGEN_SHOW=<seed>/<case>` printing that
/// case's verdicts and evidence).
fn tuned_seeds() -> Vec<u64> {
    match std::env::var("FRGEN_ONLY")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(s) if TUNED.contains(&s) => vec![s],
        _ => TUNED.to_vec(),
    }
}
/// Seeds kept apart until session 27d looked at their misses (see the module documentation).
const HELD_OUT: [u64; 5] = [101, 102, 103, 104, 105];
/// Seeds first scored after the 27e changes: measured, never tuned on (the first half of the
/// 401-410 set 27e scored). `FRGEN_FRESH=<a>-<b>` scores another range instead (a larger
/// sample, or a new set once these have been looked at).
const FRESH: [u64; 5] = [401, 402, 403, 404, 405];
fn fresh_seeds() -> Vec<u64> {
    let range = std::env::var("FRGEN_FRESH").ok().and_then(|v| {
        let (a, b) = v.split_once('-')?;
        Some(a.parse::<u64>().ok()?..=b.parse::<u64>().ok()?)
    });
    match range {
        Some(r) => r.collect(),
        None => FRESH.to_vec(),
    }
}

#[derive(serde::Deserialize, Debug)]
struct Truth {
    healthy: bool,
    /// "timeout" (the watchdog wrote it) or "on_demand".
    dump: String,
    culprits: Vec<u32>,
    link: Option<Vec<u32>>,
}

/// One case's outcome.
#[derive(Debug)]
struct Outcome {
    seed: u64,
    kind: String,
    healthy: bool,
    top1: bool,
    /// Top-1 when the analyzer is not told why the dump was taken (`yard diagnose` without
    /// `--fr-on-demand`).
    top1_unhinted: bool,
    /// False culprits likewise.
    false_unhinted: usize,
    /// Verdicts naming a rank or link that is not the truth (on a healthy job: any).
    false_culprits: usize,
    predicted: String,
    /// For the slow kinds, whether the top verdict also names the right cause (a compute
    /// straggler, a slow pair, a slow NIC), which top-1 does not ask: it takes the right ranks
    /// under any verdict.
    cause: Option<bool>,
}

fn generator() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/frgen/frgen.py")
}

fn generate(seed: u64, out: &Path) -> BTreeMap<String, Truth> {
    let status = Command::new("python3")
        .arg(generator())
        .arg(seed.to_string())
        .arg(out)
        .status()
        .expect("python3 must be installed to run the dump generator");
    assert!(status.success(), "frgen failed for seed {seed}");
    let truth = std::fs::read(out.join("truth.json")).expect("frgen writes truth.json");
    serde_json::from_slice(&truth).expect("truth.json parses")
}

fn describe(v: &Verdict) -> String {
    let who = if !v.culprits.is_empty() {
        format!("{:?}", v.culprits)
    } else if let Some(l) = v.links.first() {
        format!("{:?} {:?}->{:?}", l.kind, l.from, l.to)
    } else {
        "nobody".into()
    };
    format!("{}/{} {who}", v.class, v.subtype)
}

/// Whether `v` names exactly the truth: the culprit ranks, or for a slow link the pair (either
/// direction), or for a slow NIC the NIC of the culprit.
fn names_truth(v: &Verdict, t: &Truth) -> bool {
    if let Some(pair) = &t.link {
        return v.links.first().is_some_and(|l| {
            l.kind == LinkKind::Pair
                && matches!((l.from, l.to), (Some(a), Some(b))
                    if (a == pair[0] && b == pair[1]) || (a == pair[1] && b == pair[0]))
        });
    }
    if v.culprits == t.culprits {
        return true;
    }
    v.culprits.is_empty()
        && t.culprits.len() == 1
        && v.links
            .first()
            .is_some_and(|l| l.kind == LinkKind::Nic && l.from == Some(t.culprits[0]))
}

/// Whether `v` accuses anyone outside the truth.
fn accuses_others(v: &Verdict, t: &Truth) -> bool {
    let mut truth: Vec<u32> = t.culprits.clone();
    truth.extend(t.link.iter().flatten());
    let named = v
        .culprits
        .iter()
        .copied()
        .chain(v.links.iter().flat_map(|l| l.from.into_iter().chain(l.to)));
    let mut named = named;
    named.any(|r| !truth.contains(&r))
}

/// For a slow kind, whether the top verdict `v` names the cause `kind` injects; `None` for the
/// other kinds.
fn right_cause(kind: &str, v: Option<&Verdict>) -> Option<bool> {
    let subtype = v.map(|v| v.subtype);
    let link = v.and_then(|v| v.links.first()).map(|l| l.kind);
    match kind {
        "compute_straggler" => Some(subtype == Some(Subtype::ComputeStraggler)),
        "slow_link" => Some(subtype == Some(Subtype::SlowLink) && link == Some(LinkKind::Pair)),
        "slow_nic" => Some(subtype == Some(Subtype::SlowLink) && link == Some(LinkKind::Nic)),
        _ => None,
    }
}

/// (top-1, false culprits) of one case's verdicts.
fn judge(verdicts: &[Verdict], t: &Truth) -> (bool, usize) {
    let top1 = !t.healthy && verdicts.first().is_some_and(|v| names_truth(v, t));
    let false_culprits = if t.healthy {
        verdicts
            .iter()
            .filter(|v| !v.culprits.is_empty() || !v.links.is_empty())
            .count()
    } else {
        verdicts.iter().filter(|v| accuses_others(v, t)).count()
    };
    (top1, false_culprits)
}

fn run(seeds: &[u64]) -> Vec<Outcome> {
    let mut out = Vec::new();
    for &seed in seeds {
        let tmp = tempfile::tempdir().unwrap();
        // `FRGEN_DIR=<dir>` keeps each seed's dumps in `<dir>/<seed>` and reuses them, to
        // iterate on the rules without regenerating.
        let (dir, truths) = match std::env::var_os("FRGEN_DIR") {
            Some(d) => {
                let dir = Path::new(&d).join(seed.to_string());
                let truths = match std::fs::read(dir.join("truth.json")) {
                    Ok(t) => serde_json::from_slice(&t).expect("truth.json parses"),
                    Err(_) => generate(seed, &dir),
                };
                (dir, truths)
            }
            None => (tmp.path().to_path_buf(), generate(seed, tmp.path())),
        };
        let only_kind = std::env::var("FRGEN_KIND").ok();
        for (kind, t) in &truths {
            // `FRGEN_KIND=<case>` scores one kind of case only.
            if only_kind.as_ref().is_some_and(|k| k != kind) {
                continue;
            }
            let mut trace = read_dir(&dir.join(kind))
                .unwrap_or_else(|e| panic!("seed {seed} {kind}: the dumps do not import: {e}"));
            let unhinted = analyze_trace(&trace, &Config::default());
            // what `yard diagnose --fr-on-demand` does: the user says the watchdog did not
            // write these dumps, which a dump without timing cannot show by itself
            if t.dump == "on_demand" {
                trace.stuck = false;
            }
            let verdicts = analyze_trace(&trace, &Config::default());
            if std::env::var("FRGEN_SHOW").is_ok_and(|v| v == format!("{seed}/{kind}")) {
                println!("{seed}/{kind}: {t:?}");
                for v in &verdicts {
                    println!("  {}: {:#?}", describe(v), v.evidence);
                }
            }
            let (top1, false_culprits) = judge(&verdicts, t);
            let (top1_unhinted, false_unhinted) = judge(&unhinted, t);
            out.push(Outcome {
                seed,
                kind: kind.clone(),
                healthy: t.healthy,
                top1,
                top1_unhinted,
                false_culprits,
                false_unhinted,
                cause: right_cause(kind, verdicts.first()).map(|c| c && top1),
                predicted: if verdicts.is_empty() {
                    "no verdict".into()
                } else {
                    verdicts.iter().map(describe).collect::<Vec<_>>().join("; ")
                },
            });
        }
    }
    out
}

fn scorecard(title: &str, outcomes: &[Outcome]) -> String {
    let mut kinds: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    for o in outcomes {
        let e = kinds.entry(o.kind.as_str()).or_default();
        e.0 += 1;
        e.1 += usize::from(o.top1);
        e.2 += o.false_culprits;
    }
    let faulty: Vec<&Outcome> = outcomes.iter().filter(|o| !o.healthy).collect();
    let healthy: Vec<&Outcome> = outcomes.iter().filter(|o| o.healthy).collect();
    let mut s = format!(
        "{title}\n{:<24} {:>5} {:>6} {:>13}\n",
        "kind", "cases", "top-1", "false culprits"
    );
    for (k, (n, t, f)) in &kinds {
        let top = if k.starts_with("healthy") {
            "-".to_string()
        } else {
            t.to_string()
        };
        s += &format!("{k:<24} {n:>5} {top:>6} {f:>13}\n");
    }
    s += &format!(
        "faulty: top-1 {}/{} ({:.0}%), wrong ranks named beside {}; healthy: {} jobs, {} false culprits\n",
        faulty.iter().filter(|o| o.top1).count(),
        faulty.len(),
        100.0 * faulty.iter().filter(|o| o.top1).count() as f64 / faulty.len().max(1) as f64,
        faulty.iter().map(|o| o.false_culprits).sum::<usize>(),
        healthy.len(),
        healthy.iter().map(|o| o.false_culprits).sum::<usize>(),
    );
    let slow: Vec<bool> = outcomes.iter().filter_map(|o| o.cause).collect();
    s += &format!(
        "slow kinds: top-1 naming the right cause (straggler / pair / NIC) {}/{}\n",
        slow.iter().filter(|&&c| c).count(),
        slow.len()
    );
    s += &format!(
        "not told which dumps were taken on demand: top-1 {}/{}, healthy false culprits {}\n",
        faulty.iter().filter(|o| o.top1_unhinted).count(),
        faulty.len(),
        healthy.iter().map(|o| o.false_unhinted).sum::<usize>(),
    );
    for o in outcomes
        .iter()
        .filter(|o| (!o.healthy && !o.top1) || o.false_culprits > 0)
    {
        s += &format!("  miss seed {} {}: {}\n", o.seed, o.kind, o.predicted);
    }
    s
}

/// `FRGEN_SEEDS=tuned` runs only the tuned seeds (what one looks at while changing rules);
/// anything else runs both sets.
#[test]
fn independent_dumps_scorecard_tuned_and_held_out() {
    let only_tuned = std::env::var("FRGEN_SEEDS").is_ok_and(|v| v == "tuned");
    let tuned = run(&tuned_seeds());
    println!(
        "{}",
        scorecard("tuned seeds (the rules may be adjusted on these)", &tuned)
    );
    let held = if only_tuned {
        Vec::new()
    } else {
        run(&HELD_OUT)
    };
    let fresh = if only_tuned {
        Vec::new()
    } else {
        run(&fresh_seeds())
    };
    if !only_tuned {
        println!(
            "{}",
            scorecard(
                "held-out seeds 101-105 (kept apart until 27d, whose changes saw their misses)",
                &held
            )
        );
        let seeds = fresh_seeds();
        let status = if seeds == FRESH {
            "first scored after the 27e changes, never tuned on"
        } else {
            "chosen by FRGEN_FRESH"
        };
        println!(
            "{}",
            scorecard(
                &format!(
                    "fresh held-out seeds {}-{} ({status})",
                    seeds.first().unwrap_or(&0),
                    seeds.last().unwrap_or(&0)
                ),
                &fresh
            )
        );
    }
    for o in tuned
        .iter()
        .chain(&held)
        .chain(&fresh)
        .filter(|o| o.healthy)
    {
        assert_eq!(
            o.false_culprits, 0,
            "seed {} {}: a healthy job was given culprits: {}",
            o.seed, o.kind, o.predicted
        );
    }
}
