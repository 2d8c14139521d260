//! `yard plan services`: the planner offline, from files — size a gateway cluster before
//! building it, or check what the live planner would do with a traffic profile. The file
//! formats are documented in `yard_planner::parse`.
//!
//! `yard plan show`: the live cluster's planner on the leader — each node's measured and
//! predicted load, each tenant's availability, what the last re-plan moved and why.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::json;
use yard_planner::eval::{self, Outcome};
use yard_planner::{parse, plan, Instance, PlanOptions};

use yard::rpc::{AdminReply, AdminRequest, PlanView};

use super::output::Out;

#[derive(Debug, Subcommand)]
pub enum PlanCmd {
    /// Which gateway nodes serve each tenant and which node owns each VIP, from files.
    Services(ServicesArgs),
    /// The live cluster's planner: per-node load, tenants' availability, the last moves.
    Show,
}

impl PlanCmd {
    /// Whether the command runs without a cluster.
    pub fn is_offline(&self) -> bool {
        matches!(self, PlanCmd::Services(_))
    }
}

#[derive(Debug, Args)]
pub struct ServicesArgs {
    /// Tenants and their VIPs: `ID AVAILABILITY [replicas=K] VIP=BPS,PPS...` per line.
    #[arg(long, value_name = "FILE")]
    tenants: PathBuf,
    /// Gateway nodes: `ID CAPACITY_BPS CAPACITY_PPS FAIL_PROB` per line.
    #[arg(long, value_name = "FILE")]
    nodes: PathBuf,
    /// Report the worst case over every set of 1..=N failed nodes.
    #[arg(long, value_name = "N", default_value_t = 1)]
    failures: usize,
    /// Seed of the randomized rounding (the same seed gives the same plan).
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
}

/// Monte Carlo trials of independent failures.
const TRIALS: usize = 1_000;

/// Whether an availability meets its target, up to rounding (`1 − 0.01·0.01` is not exactly
/// `0.9999` in floating point).
fn met(availability: f64, target: f64) -> bool {
    availability >= target - 1e-12
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {what} file {}", path.display()))
}

/// `yard plan show` through the admin RPC (answered by the leader).
pub async fn show(client: &yard::client::AdminClient, out: Out) -> anyhow::Result<ExitCode> {
    let AdminReply::Plan(view) = client.admin(AdminRequest::PlanShow).await? else {
        bail!("unexpected reply to a plan request");
    };
    out.line(serde_json::to_value(&view)?, || show_human(&view));
    Ok(ExitCode::SUCCESS)
}

fn show_human(v: &PlanView) -> String {
    let mut s = String::new();
    if !v.enabled {
        let _ = writeln!(
            s,
            "the planner is not enabled on the leader (node {}): vips are spread by count",
            v.leader
        );
        return s.trim_end().to_owned();
    }
    let Some(latest) = &v.latest else {
        let _ = writeln!(s, "leader {}: no re-plan yet", v.leader);
        return s.trim_end().to_owned();
    };
    let r = &latest.report;
    let _ = writeln!(
        s,
        "leader {} (term {}), {} vips measured: load factor {:.2} (now {:.2})",
        v.leader, latest.term, latest.measured_vips, r.planned_worst, r.current_worst
    );
    let _ = writeln!(s, "{}", r.reason);
    let _ = writeln!(
        s,
        "{:>6} {:>9} {:>9} {:>14} {:>10}",
        "node", "measured", "predicted", "after failure", "fail prob"
    );
    for n in &r.nodes {
        let _ = writeln!(
            s,
            "{:>6} {:>9.3} {:>9.3} {:>14.3} {:>10.5}",
            n.node, n.measured, n.predicted, n.after_failure, n.fail_prob
        );
    }
    for t in &r.tenants {
        let nodes: Vec<String> = t.nodes.iter().map(|n| n.to_string()).collect();
        let _ = writeln!(
            s,
            "tenant {}: {} vips on nodes {}, availability {:.6} (target {}{})",
            t.tenant,
            t.vips,
            nodes.join(","),
            t.availability,
            t.target,
            if met(t.availability, t.target) {
                ""
            } else {
                ", NOT MET"
            }
        );
    }
    match &v.last_moved {
        Some(m) => {
            let _ = writeln!(
                s,
                "last moves (term {}, {} deferred): {}",
                m.term, m.report.deferred, m.report.reason
            );
            for mv in &m.report.moves {
                let _ = writeln!(
                    s,
                    "  {} {} -> {} ({:.0} B/s, {:.0} pkt/s)",
                    mv.vip, mv.from, mv.to, mv.rate.bps, mv.rate.pps
                );
            }
        }
        None => {
            let _ = writeln!(s, "no re-plan has moved a vip");
        }
    }
    s.trim_end().to_owned()
}

pub fn run(cmd: &PlanCmd, out: Out) -> anyhow::Result<ExitCode> {
    let a = match cmd {
        PlanCmd::Services(a) => a,
        PlanCmd::Show => bail!("yard plan show needs a cluster"),
    };
    let nodes = parse::nodes(&a.nodes.display().to_string(), &read(&a.nodes, "nodes")?)?;
    let tenants = parse::tenants(
        &a.tenants.display().to_string(),
        &read(&a.tenants, "tenants")?,
    )?;
    if tenants.is_empty() {
        bail!("{} defines no tenant", a.tenants.display());
    }
    let inst = Instance::new(tenants, nodes).context("the plan's input is invalid")?;
    let mut opts = PlanOptions::default();
    opts.assign.seed = a.seed;
    let p = plan(&inst, &opts)?;
    let nn = inst.nodes.len();
    let none = vec![false; nn];
    let (load, _) = eval::loads_after(&inst, &p.placement, &none);
    // The worst single failure, and which node it is.
    let mut worst1: Option<(usize, Outcome)> = None;
    let mut after_worst = vec![0.0; nn];
    for dead in 0..nn {
        let mut failed = none.clone();
        failed[dead] = true;
        let o = eval::outcome(&inst, &p.placement, &failed);
        if worst1.is_none_or(|(_, w)| o.max_load > w.max_load) {
            worst1 = Some((dead, o));
        }
        let (l, _) = eval::loads_after(&inst, &p.placement, &failed);
        after_worst
            .iter_mut()
            .zip(&l)
            .for_each(|(w, x)| *w = f64::max(*w, *x));
    }
    let report = eval::report(&inst, &p.placement, a.failures, TRIALS, a.seed);
    let mut bps = vec![0.0; nn];
    let mut pps = vec![0.0; nn];
    let mut vips = vec![0usize; nn];
    for (t, owners) in p.placement.owner.iter().enumerate() {
        for (u, &n) in owners.iter().enumerate() {
            bps[n] += inst.tenants[t].units[u].bps;
            pps[n] += inst.tenants[t].units[u].pps;
            vips[n] += 1;
        }
    }
    let node_json: Vec<_> = (0..nn)
        .map(|n| {
            json!({"id": inst.nodes[n].id, "load": load[n], "bps": bps[n], "pps": pps[n],
                   "vips": vips[n], "max_load_after_single_failure": after_worst[n]})
        })
        .collect();
    let tenant_json: Vec<_> = inst
        .tenants
        .iter()
        .enumerate()
        .map(|(t, ten)| {
            let set = &p.placement.sets[t];
            let vips: Vec<_> = ten
                .units
                .iter()
                .zip(&p.placement.owner[t])
                .map(|(u, &n)| json!({"vip": u.id, "node": inst.nodes[n].id}))
                .collect();
            json!({"id": ten.id,
                   "nodes": set.iter().map(|&n| &inst.nodes[n].id).collect::<Vec<_>>(),
                   "availability": inst.availability(set), "target": ten.availability,
                   "met": met(inst.availability(set), ten.availability), "vips": vips})
        })
        .collect();
    let (dead, w1) = worst1.expect("at least one node");
    let value = json!({
        "load_factor": report.nominal.max_load,
        "robust_load_factor": p.assignment.lambda,
        "relaxation": p.assignment.relaxed,
        "worst_single_failure": {"node": inst.nodes[dead].id, "load_factor": w1.max_load, "served": w1.served},
        "worst": report.worst,
        "monte_carlo": report.monte_carlo,
        "nodes": node_json,
        "tenants": tenant_json,
        "seed": a.seed,
    });
    out.line(value, || {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<12} {:>6} {:>12} {:>12} {:>5} {:>16}",
            "NODE", "LOAD", "BYTES/S", "PACKETS/S", "VIPS", "LOAD AFTER N-1"
        );
        for n in 0..nn {
            let _ = writeln!(
                s,
                "{:<12} {:>6.3} {:>12.4e} {:>12.4e} {:>5} {:>16.3}",
                inst.nodes[n].id, load[n], bps[n], pps[n], vips[n], after_worst[n]
            );
        }
        let _ = writeln!(
            s,
            "\n{:<12} {:>12} {:>10} {:>4}  NODES",
            "TENANT", "AVAILABILITY", "TARGET", "MET"
        );
        for (t, ten) in inst.tenants.iter().enumerate() {
            let set = &p.placement.sets[t];
            let av = inst.availability(set);
            let names: Vec<&str> = set.iter().map(|&n| inst.nodes[n].id.as_str()).collect();
            let _ = writeln!(
                s,
                "{:<12} {:>12.6} {:>10} {:>4}  {}",
                ten.id,
                av,
                ten.availability,
                if met(av, ten.availability) { "yes" } else { "no" },
                names.join(",")
            );
        }
        let _ = writeln!(
            s,
            "\nload factor {:.3} (robust reserve {:.3}); worst single failure: {} fails, load factor {:.3}, served {:.2}%",
            report.nominal.max_load,
            p.assignment.lambda,
            inst.nodes[dead].id,
            w1.max_load,
            100.0 * w1.served
        );
        for w in &report.worst {
            let _ = writeln!(
                s,
                "worst of {} {}-node failures: load factor {:.3}, served {:.2}%",
                if w.exhaustive { "all" } else { "sampled" },
                w.failures,
                w.max_load,
                100.0 * w.served
            );
        }
        let mc = &report.monte_carlo;
        let _ = write!(
            s,
            "independent failures ({} trials): mean served {:.3}%, 5th percentile {:.3}%",
            mc.trials,
            100.0 * mc.mean_served,
            100.0 * mc.p5_served
        );
        s
    });
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use yard::rpc::{NodeHealthView, PlanRecord};
    use yard_actors::gateway::replan::{
        NodeHealth, NodeView, PlannedMove, Rate, ReplanReport, TenantView,
    };

    fn view() -> PlanView {
        let report = ReplanReport {
            current_worst: 1.2,
            planned_worst: 0.61,
            moves: vec![PlannedMove {
                vip: "198.19.255.5".parse().unwrap(),
                from: 2,
                to: 1,
                rate: Rate {
                    bps: 98_000.0,
                    pps: 910.0,
                },
            }],
            deferred: 3,
            reason: "the worst load drops".into(),
            nodes: vec![NodeView {
                node: 2,
                fail_prob: 0.01,
                measured: 1.2,
                predicted: 0.593,
                after_failure: 0.6,
            }],
            tenants: vec![TenantView {
                tenant: "blue".into(),
                vips: 2,
                nodes: vec![1, 2],
                availability: 0.9,
                target: 0.999,
            }],
        };
        let record = PlanRecord {
            at_unix_ms: 1,
            term: 4,
            measured_vips: 2,
            report,
        };
        PlanView {
            leader: 1,
            enabled: true,
            latest: Some(record.clone()),
            last_moved: Some(record),
            health: vec![NodeHealthView {
                node: 2,
                history: NodeHealth::default(),
                fail_prob: 0.01,
            }],
        }
    }

    #[test]
    fn plan_show_names_loads_tenants_and_the_last_moves() {
        let text = show_human(&view());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "leader 1 (term 4), 2 vips measured: load factor 0.61 (now 1.20)"
        );
        assert!(
            lines.contains(&"     2     1.200     0.593          0.600    0.01000"),
            "{text}"
        );
        assert!(
            text.contains(
                "tenant blue: 2 vips on nodes 1,2, availability 0.900000 (target 0.999, NOT MET)"
            ),
            "{text}"
        );
        assert!(text.contains("last moves (term 4, 3 deferred): the worst load drops"));
        assert!(
            text.contains("  198.19.255.5 2 -> 1 (98000 B/s, 910 pkt/s)"),
            "{text}"
        );
        let off = PlanView {
            enabled: false,
            ..view()
        };
        assert!(show_human(&off).starts_with("the planner is not enabled on the leader (node 1)"));
    }
}
