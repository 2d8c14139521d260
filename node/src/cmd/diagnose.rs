//! `yard diagnose`: the verdicts the cluster's analyzer committed for a live job, or an offline
//! analysis of PyTorch Flight Recorder dumps or an NCCL RAS report; `--svg` draws the ranks
//! around the culprit op.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest};
use yard_diagnosis::analyzer::{self, Config as AnalyzerConfig};
use yard_diagnosis::event::{Coll, Event, Member, Trace};
use yard_diagnosis::verdict::Verdict;

use super::output::Out;

/// Ranks drawn in an offline timeline.
const TIMELINE_RANKS: usize = 16;
/// Sequence numbers drawn before and after the culprit op.
const TIMELINE_SEQS: u64 = 3;

#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// A live job: its verdicts as the cluster's analyzer committed them.
    #[arg(long, conflicts_with_all = ["fr_dumps", "ras"])]
    job: Option<String>,
    /// Analyze the PyTorch Flight Recorder dumps (pickle or JSON) of every rank in DIR.
    #[arg(long, value_name = "DIR", conflicts_with = "ras")]
    fr_dumps: Option<PathBuf>,
    /// The dumps were taken on demand (`_dump_nccl_trace`, the debug server), not written by
    /// the watchdog at a timeout. Without TORCH_NCCL_ENABLE_TIMING a dump never marks an op
    /// started, so it cannot show when it was taken; such dumps are read as timeout dumps
    /// (what PyTorch writes by itself) unless this says otherwise.
    #[arg(long, requires = "fr_dumps")]
    fr_on_demand: bool,
    /// Analyze an NCCL RAS report (`ncclras` text or `-f json` output).
    #[arg(long, value_name = "FILE")]
    ras: Option<PathBuf>,
    /// Write a timeline picture of the ranks around the top verdict's op.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

impl DiagnoseArgs {
    /// Offline analyses need no cluster.
    pub fn is_offline(&self) -> bool {
        self.fr_dumps.is_some() || self.ras.is_some()
    }
}

/// Offline: import, analyze, print.
pub fn offline(args: &DiagnoseArgs, out: Out) -> anyhow::Result<ExitCode> {
    let trace = if let Some(dir) = &args.fr_dumps {
        let mut trace = yard_diagnosis::import::fr::read_dir(dir)?;
        if args.fr_on_demand {
            trace.stuck = false;
        }
        trace
    } else if let Some(file) = &args.ras {
        yard_diagnosis::import::ras::read_ras(file)?
    } else {
        bail!("give --fr-dumps DIR or --ras FILE for an offline analysis");
    };
    let verdicts = analyzer::analyze_trace(&trace, &AnalyzerConfig::default());
    if let Some(path) = &args.svg {
        let top = verdicts.first();
        let (colls, members) = trace_window(&trace, top);
        write_svg(path, top, &colls, &members)?;
    }
    print_verdicts(&verdicts, out, || {
        format!(
            "{} ranks, {} with no record",
            trace.world.len(),
            trace.missing.len()
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// Live: the replicated verdicts of one job or of every job.
pub async fn live(client: &AdminClient, args: &DiagnoseArgs, out: Out) -> anyhow::Result<ExitCode> {
    let req = AdminRequest::Diagnose {
        job: args.job.clone(),
        timeline: args.svg.is_some(),
    };
    let AdminReply::Diagnosis(view) = client.admin(req).await? else {
        bail!("unexpected reply to a diagnose request");
    };
    if let Some(job) = &args.job {
        let Some(j) = view.jobs.iter().find(|j| &j.job == job) else {
            eprintln!("job not found: {job} (no probe has reported it, or it was forgotten)");
            return Ok(ExitCode::FAILURE);
        };
        if let Some(path) = &args.svg {
            let top = j.verdicts.first();
            let (colls, members) = view.timeline.clone().unwrap_or_default();
            if top.is_some() && colls.is_empty() {
                eprintln!("note: the analyzer no longer holds this job's records; the picture shows no ops");
            }
            write_svg(path, top, &colls, &members)?;
        }
        print_verdicts(&j.verdicts, out, || format!("job {job}"));
        return Ok(ExitCode::SUCCESS);
    }
    if out.json {
        let jobs: Vec<Value> = view
            .jobs
            .iter()
            .map(|j| json!({"job": j.job, "verdicts": j.verdicts, "updated_unix_ms": j.updated_unix_ms}))
            .collect();
        let verdicts: Vec<Value> = view
            .jobs
            .iter()
            .flat_map(|j| {
                j.verdicts.iter().map(move |v| {
                    let mut value = serde_json::to_value(v).unwrap_or(Value::Null);
                    value["job"] = json!(j.job);
                    value
                })
            })
            .collect();
        println!("{}", json!({"verdicts": verdicts, "jobs": jobs}));
    } else if view.jobs.is_empty() {
        println!("no jobs have reported to the probe");
    } else {
        for j in &view.jobs {
            println!("job {}:", j.job);
            print_verdicts(&j.verdicts, out, String::new);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_verdicts(verdicts: &[Verdict], out: Out, context: impl FnOnce() -> String) {
    if out.json {
        println!("{}", json!({ "verdicts": verdicts }));
        return;
    }
    if verdicts.is_empty() {
        let ctx = context();
        if ctx.is_empty() {
            println!("  no verdicts: healthy");
        } else {
            println!("no verdicts: healthy ({ctx})");
        }
        return;
    }
    for (i, v) in verdicts.iter().enumerate() {
        println!("{}", headline(v, i == 0));
        for e in &v.evidence {
            println!("    - {e}");
        }
    }
}

/// One line: class/subtype, who, where, how sure.
fn headline(v: &Verdict, root: bool) -> String {
    let mut parts = vec![format!("{}/{}", v.class, v.subtype)];
    if !v.culprits.is_empty() {
        parts.push(format!("culprits {}", ranks(&v.culprits)));
    }
    if !v.links.is_empty() {
        let names: Vec<&str> = v.links.iter().map(|l| l.name.as_str()).collect();
        parts.push(format!("links {}", names.join(", ")));
    }
    if let Some(pg) = &v.pg {
        parts.push(format!("pg {} {}", pg.name, ranks(&pg.ranks)));
    }
    if let (Some(seq), Some(op)) = (v.seq, v.op) {
        parts.push(format!("{op} #{seq}"));
    }
    parts.push(format!("confidence {:.2}", v.confidence));
    format!(
        "{}{}",
        if root { "root cause: " } else { "  also: " },
        parts.join("  ")
    )
}

/// `[0-3, 5]`-style rank lists, so 4,096 ranks stay one line.
fn ranks(r: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < r.len() {
        let start = r[i];
        let mut end = start;
        while i + 1 < r.len() && r[i + 1] == end + 1 {
            i += 1;
            end = r[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    format!("[{}]", out.join(", "))
}

/// The records of an offline trace around a verdict: its group, a few seqs either side, the
/// culprits and link ends first, then the group's other ranks up to [`TIMELINE_RANKS`].
fn trace_window(trace: &Trace, verdict: Option<&Verdict>) -> (Vec<Coll>, Vec<Member>) {
    let Some(v) = verdict else {
        return (Vec::new(), Vec::new());
    };
    let mut chosen: Vec<u32> = v.culprits.clone();
    // An undecided verdict names nobody: its ranked candidates are where to look.
    chosen.extend(yard_diagnosis::timeline::candidates(v));
    for l in &v.links {
        chosen.extend(l.from.iter().chain(l.to.iter()));
    }
    if let Some(pg) = &v.pg {
        chosen.extend(pg.ranks.iter().copied());
    }
    let mut seen = BTreeSet::new();
    chosen.retain(|r| seen.insert(*r));
    chosen.truncate(TIMELINE_RANKS);
    let keep: BTreeSet<u32> = chosen.iter().copied().collect();
    let seq = v.seq.unwrap_or(0);
    let colls = trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Coll(c)
                if keep.contains(&c.rank)
                    && v.pg.as_ref().is_none_or(|pg| *c.pg == *pg.name)
                    && (v.seq.is_none()
                        || (c.seq + TIMELINE_SEQS >= seq && c.seq <= seq + TIMELINE_SEQS)) =>
            {
                Some(c.clone())
            }
            _ => None,
        })
        .collect();
    let members = trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Member(m) if keep.contains(&m.rank) => Some(m.clone()),
            _ => None,
        })
        .collect();
    (colls, members)
}

fn write_svg(
    path: &Path,
    verdict: Option<&Verdict>,
    colls: &[Coll],
    members: &[Member],
) -> anyhow::Result<()> {
    let svg = yard_diagnosis::timeline::render_svg(verdict, colls, members);
    std::fs::write(path, svg)
        .with_context(|| format!("cannot write the timeline to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_collapse_runs() {
        assert_eq!(ranks(&[]), "[]");
        assert_eq!(ranks(&[3]), "[3]");
        assert_eq!(ranks(&[0, 1, 2, 3, 5, 7, 8]), "[0-3, 5, 7-8]");
    }
}
