//! The figures: one JSON object and a human table, with the ratios yard/etcd.

use serde_json::{json, Value};

use crate::stats::{max, median, ratio};
use crate::workload::{CliTrial, KillSettings, KillTrial, RoundFigures};
use crate::Args;

/// The targets (figures to read, never assertions).
const TARGET_THROUGHPUT_RATIO: f64 = 1.5;
const TARGET_CLI_P50_MS: f64 = 300.0;
const TARGET_CLI_P99_MS: f64 = 520.0;
const TARGET_P99_RATIO: f64 = 1.0;
const TARGET_RECOVERY_RATIO: f64 = 0.25;
const TARGET_IDLE_RSS_MIB: f64 = 64.0;

pub struct RssFigures {
    pub fresh_kib: Vec<u64>,
    pub after_load_kib: Vec<u64>,
}

impl RssFigures {
    fn max_mib(&self) -> Option<f64> {
        let all: Vec<f64> = self
            .fresh_kib
            .iter()
            .chain(&self.after_load_kib)
            .map(|&k| k as f64 / 1024.0)
            .collect();
        max(&all)
    }

    fn max_of(v: &[u64]) -> Option<f64> {
        max(&v.iter().map(|&k| k as f64 / 1024.0).collect::<Vec<_>>())
    }

    fn json(&self) -> Value {
        json!({
            "fresh_kib": self.fresh_kib,
            "after_load_kib": self.after_load_kib,
            "max_fresh_mib": Self::max_of(&self.fresh_kib),
            "max_after_load_mib": Self::max_of(&self.after_load_kib),
        })
    }
}

pub struct Report {
    pub args: Args,
    pub run_id: String,
    pub servers: Vec<String>,
    pub client: String,
    pub data_dir: String,
    pub etcd_version: String,
    /// Member 1's flags per etcd profile.
    pub etcd_flags: Vec<(&'static str, Vec<String>)>,
    pub yard_timings: Value,
    pub rounds: Vec<RoundFigures>,
    pub kill: KillSettings,
    pub trials: Vec<KillTrial>,
    pub cli_trials: Vec<CliTrial>,
    pub rss_yard: RssFigures,
    pub rss_etcd: RssFigures,
    pub elapsed_s: f64,
}

/// Per-system medians over the rounds.
#[derive(Default, Clone, Copy)]
struct PutSummary {
    throughput: Option<f64>,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    p999_ms: Option<f64>,
    errors: usize,
}

/// Per-system leader-kill summary.
#[derive(Default, Clone, Copy)]
struct KillSummary {
    p50_ms: Option<f64>,
    max_ms: Option<f64>,
    trials: usize,
    without_recovery: usize,
}

/// The CLI leader-kill trials of one system.
#[derive(Default, Clone, Copy)]
struct CliSummary {
    trials: usize,
    /// Trials in which no put was acknowledged within the give-up time.
    failed: usize,
    /// Recovery quantiles over every trial, a failed one counted at the give-up time (a lower
    /// bound of its real value): nearest rank.
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    best_ms: Option<f64>,
    worst_ms: Option<f64>,
    /// CLI invocations that ended in an error, all trials.
    errors: usize,
    /// Trials in which the user saw at least one error.
    trials_with_errors: usize,
}

/// The nearest-rank `q` quantile (0 < q <= 1).
fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

impl Report {
    fn cli(&self, system: &str) -> CliSummary {
        let ts: Vec<&CliTrial> = self
            .cli_trials
            .iter()
            .filter(|t| t.system == system)
            .collect();
        let give_up_ms = self.kill.give_up_s as f64 * 1e3;
        let all: Vec<f64> = ts
            .iter()
            .map(|t| t.recovery_ms.unwrap_or(give_up_ms))
            .collect();
        CliSummary {
            trials: ts.len(),
            failed: ts.iter().filter(|t| t.recovery_ms.is_none()).count(),
            p50_ms: quantile(&all, 0.5),
            p99_ms: quantile(&all, 0.99),
            best_ms: all.iter().copied().min_by(f64::total_cmp),
            worst_ms: max(&all),
            errors: ts.iter().map(|t| t.errors).sum(),
            trials_with_errors: ts.iter().filter(|t| t.errors > 0).count(),
        }
    }

    fn puts(&self, system: &str) -> PutSummary {
        let rs: Vec<&RoundFigures> = self.rounds.iter().filter(|r| r.system == system).collect();
        let med =
            |f: &dyn Fn(&RoundFigures) -> f64| median(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
        PutSummary {
            throughput: med(&|r| r.put.throughput_ops_s),
            p50_ms: med(&|r| r.put.p50_us as f64 / 1e3),
            p99_ms: med(&|r| r.put.p99_us as f64 / 1e3),
            p999_ms: med(&|r| r.put.p999_us as f64 / 1e3),
            errors: rs.iter().map(|r| r.put.errors).sum(),
        }
    }

    fn kills(&self, system: &str) -> KillSummary {
        let ts: Vec<&KillTrial> = self.trials.iter().filter(|t| t.system == system).collect();
        let rec: Vec<f64> = ts.iter().filter_map(|t| t.recovery_ms).collect();
        KillSummary {
            p50_ms: median(&rec),
            max_ms: max(&rec),
            trials: ts.len(),
            without_recovery: ts.len() - rec.len(),
        }
    }

    pub fn to_json(&self) -> Value {
        let (py, pe) = (self.puts("yard"), self.puts("etcd"));
        let (ky, ke) = (self.kills("yard"), self.kills("etcd"));
        let put_json = |p: PutSummary| {
            json!({
                "median_throughput_ops_s": p.throughput,
                "median_p50_ms": p.p50_ms,
                "median_p99_ms": p.p99_ms,
                "median_p999_ms": p.p999_ms,
                "errors": p.errors,
            })
        };
        let kill_json = |k: KillSummary| {
            json!({
                "recovery_p50_ms": k.p50_ms,
                "recovery_max_ms": k.max_ms,
                "trials": k.trials,
                "trials_without_recovery": k.without_recovery,
            })
        };
        let cli_json = |c: CliSummary| {
            json!({
                "trials": c.trials,
                "failed_trials": c.failed,
                "recovery_p50_ms": c.p50_ms,
                "recovery_p99_ms": c.p99_ms,
                "recovery_best_of_n_ms": c.best_ms,
                "recovery_worst_ms": c.worst_ms,
                "errors_shown": c.errors,
                "trials_with_errors": c.trials_with_errors,
            })
        };
        let (cy, ce, cm) = (self.cli("yard"), self.cli("etcd"), self.cli("etcd-matched"));
        let pm = self.puts("etcd-matched");
        let targets = self.targets();
        let a = &self.args;
        json!({
            "benchmark": "kv-vs-etcd",
            "settings": {
                "rounds": a.rounds,
                "clients": a.clients,
                "ops_per_round": a.ops,
                "value_size": a.value_size,
                "put_timeout_ms": a.put_timeout_ms,
                "kill_trials": a.kill_trials,
                "idle_secs": a.idle_secs,
                "order": "per round: yard then etcd; leader-kill trials likewise",
                "client_placement": "client c talks only to server c % 3 (followers forward writes to the leader)",
                "leader_kill": self.kill,
                "leader_kill_method": "one writer per member, each sending a new put every probe_interval_ms (not waiting for those in flight) with a write_timeout_ms timeout; recovery = kill -9 of the leader to the first acknowledged put sent after the kill; the killed member is then restarted from its data and the next trial waits until it has caught up",
            },
            "topology": {
                "run_id": self.run_id,
                "servers": self.servers,
                "client": self.client,
                "both_clusters_running": "all the time, on the same hosts; the one not measured idles",
                "data_dir": self.data_dir,
            },
            "yard": {
                "binary": a.yard_bin.as_ref().map(|p| p.display().to_string()),
                "transport": "QUIC with mutual TLS (always on)",
                "client": "yard::client::AdminClient, one per concurrent client",
                "timings": self.yard_timings,
            },
            "etcd": {
                "version": self.etcd_version,
                "binary": a.etcd_bin.display().to_string(),
                "transport": "gRPC over plaintext HTTP/2 (no TLS)",
                "client": "etcd-client 0.14.1, one per concurrent client",
                "timings": "etcd's defaults: --heartbeat-interval 100 ms, --election-timeout 1000 ms",
                "matched_timings": crate::etcd_cluster::EtcdProfile::MATCHED.timing_text(),
                "flags_of_member_1": self.etcd_flags.iter().map(|(n, f)| json!({"profile": n, "flags": f})).collect::<Vec<_>>(),
            },
            "put": {
                "rounds": self.rounds,
                "yard": put_json(py),
                "etcd": put_json(pe),
                "etcd_matched": put_json(pm),
                "ratio_yard_over_etcd": {
                    "throughput": ratio(py.throughput, pe.throughput),
                    "p50": ratio(py.p50_ms, pe.p50_ms),
                    "p99": ratio(py.p99_ms, pe.p99_ms),
                    "p999": ratio(py.p999_ms, pe.p999_ms),
                },
                "ratio_yard_over_etcd_matched": {
                    "throughput": ratio(py.throughput, pm.throughput),
                    "p99": ratio(py.p99_ms, pm.p99_ms),
                },
            },
            "cli_leader_kill": {
                "method": "kill -9 of the leader, then at once the CLI at its defaults (yard kv put: 5 s timeout; etcdctl put: 5 s command and 2 s dial timeouts), a fresh process per attempt, against one survivor, again after each error, until a put succeeds; recovery = kill to that put's exit; failed trials (no success within give_up_s) stay in, counted at give_up_s",
                "trials": self.cli_trials,
                "yard": cli_json(cy),
                "etcd": cli_json(ce),
                "etcd_matched": cli_json(cm),
                "ratio_yard_over_etcd": {"p50": ratio(cy.p50_ms, ce.p50_ms), "p99": ratio(cy.p99_ms, ce.p99_ms)},
                "ratio_yard_over_etcd_matched": {"p50": ratio(cy.p50_ms, cm.p50_ms), "p99": ratio(cy.p99_ms, cm.p99_ms)},
            },
            "leader_kill": {
                "trials": self.trials,
                "yard": kill_json(ky),
                "etcd": kill_json(ke),
                "etcd_matched": kill_json(self.kills("etcd-matched")),
                "ratio_yard_over_etcd": {
                    "p50": ratio(ky.p50_ms, ke.p50_ms),
                    "max": ratio(ky.max_ms, ke.max_ms),
                },
                "ratio_yard_over_etcd_matched": {
                    "p50": ratio(ky.p50_ms, self.kills("etcd-matched").p50_ms),
                    "max": ratio(ky.max_ms, self.kills("etcd-matched").max_ms),
                },
            },
            "idle_rss": {
                "yard": self.rss_yard.json(),
                "etcd": self.rss_etcd.json(),
                "ratio_yard_over_etcd_max": ratio(self.rss_yard.max_mib(), self.rss_etcd.max_mib()),
            },
            "targets": targets,
            "elapsed_s": self.elapsed_s,
        })
    }

    /// Each target with its figure and whether it was met (`null` when not measured).
    fn targets(&self) -> Value {
        let (py, pe) = (self.puts("yard"), self.puts("etcd"));
        let (ky, ke) = (self.kills("yard"), self.kills("etcd"));
        let t = ratio(py.throughput, pe.throughput);
        let p99 = ratio(py.p99_ms, pe.p99_ms);
        let rec = ratio(ky.p50_ms, ke.p50_ms);
        let rss = self.rss_yard.max_mib();
        let cy = self.cli("yard");
        json!({
            "cli_leader_kill_p50_ms_at_most_300": {"value": cy.p50_ms, "met": cy.p50_ms.map(|v| v <= TARGET_CLI_P50_MS)},
            "cli_leader_kill_p99_ms_at_most_520": {"value": cy.p99_ms, "met": cy.p99_ms.map(|v| v <= TARGET_CLI_P99_MS)},
            "cli_leader_kill_no_error_shown": {"value": cy.errors, "met": (cy.trials > 0).then_some(cy.errors == 0)},
            "put_throughput_ratio_at_least_1_5": {"value": t, "met": t.map(|v| v >= TARGET_THROUGHPUT_RATIO)},
            "put_p99_ratio_at_most_1": {"value": p99, "met": p99.map(|v| v <= TARGET_P99_RATIO)},
            "leader_kill_p50_ratio_at_most_0_25": {"value": rec, "met": rec.map(|v| v <= TARGET_RECOVERY_RATIO)},
            "yard_idle_rss_max_mib_at_most_64": {"value": rss, "met": rss.map(|v| v <= TARGET_IDLE_RSS_MIB)},
        })
    }

    pub fn table(&self) -> String {
        let (py, pe) = (self.puts("yard"), self.puts("etcd"));
        let (ky, ke) = (self.kills("yard"), self.kills("etcd"));
        let a = &self.args;
        let mut out = format!(
            "kv-vs-etcd: servers {} (yard + etcd {}), driver {}; {} rounds interleaved (yard, etcd), \
             {} clients x {} puts x {} B; {} leader-kill trials each\n",
            self.servers.join(", "),
            self.etcd_version,
            self.client,
            a.rounds,
            a.clients,
            a.ops,
            a.value_size,
            a.kill_trials
        );
        out += &format!(
            "{:<28}{:>12}{:>12}{:>11}  {}\n",
            "figure", "yard", "etcd", "yard/etcd", "target"
        );
        let mut row =
            |name: &str, y: Option<f64>, e: Option<f64>, target: &str, met: Option<bool>| {
                let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
                let r = ratio(y, e).map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
                let verdict = match met {
                    Some(true) => " (met)",
                    Some(false) => " (not met)",
                    None => "",
                };
                out += &format!(
                    "{name:<28}{:>12}{:>12}{:>11}  {target}{verdict}\n",
                    f(y),
                    f(e),
                    r
                );
            };
        let le = |r: Option<f64>, t: f64| r.map(|r| r <= t);
        row(
            "put throughput (ops/s)",
            py.throughput,
            pe.throughput,
            ">= 1.5",
            ratio(py.throughput, pe.throughput).map(|r| r >= TARGET_THROUGHPUT_RATIO),
        );
        row("put p50 (ms)", py.p50_ms, pe.p50_ms, "", None);
        row(
            "put p99 (ms)",
            py.p99_ms,
            pe.p99_ms,
            "<= 1",
            le(ratio(py.p99_ms, pe.p99_ms), TARGET_P99_RATIO),
        );
        row("put p999 (ms)", py.p999_ms, pe.p999_ms, "", None);
        row(
            "leader-kill recovery p50 (ms)",
            ky.p50_ms,
            ke.p50_ms,
            "<= 0.25",
            le(ratio(ky.p50_ms, ke.p50_ms), TARGET_RECOVERY_RATIO),
        );
        row(
            "leader-kill recovery max (ms)",
            ky.max_ms,
            ke.max_ms,
            "",
            None,
        );
        let yr = self.rss_yard.max_mib();
        row(
            "idle RSS, max member (MiB)",
            yr,
            self.rss_etcd.max_mib(),
            "yard <= 64 MiB",
            yr.map(|v| v <= TARGET_IDLE_RSS_MIB),
        );
        out += &format!(
            "put errors: yard {}, etcd {}; leader-kill trials without recovery: yard {}, etcd {}\n",
            py.errors, pe.errors, ky.without_recovery, ke.without_recovery
        );
        out += &format!(
            "idle RSS per member (MiB), fresh / after load: yard {} / {}; etcd {} / {}\n",
            mibs(&self.rss_yard.fresh_kib),
            mibs(&self.rss_yard.after_load_kib),
            mibs(&self.rss_etcd.fresh_kib),
            mibs(&self.rss_etcd.after_load_kib)
        );
        out += "rounds:\n";
        for r in &self.rounds {
            out += &format!(
                "  {} {}: {:>9.0} ops/s  p50 {:>7.2} ms  p99 {:>7.2} ms  p999 {:>7.2} ms  max {:>7.2} ms  {} errors\n",
                r.round,
                r.system,
                r.put.throughput_ops_s,
                r.put.p50_us as f64 / 1e3,
                r.put.p99_us as f64 / 1e3,
                r.put.p999_us as f64 / 1e3,
                r.put.max_us as f64 / 1e3,
                r.put.errors
            );
        }
        if !self.trials.is_empty() {
            out += "leader-kill trials:\n";
            for t in &self.trials {
                out += &format!(
                    "  {} {}: killed host {}, recovery {}, {} failed attempts, rejoin {:.0} ms\n",
                    t.trial,
                    t.system,
                    t.killed_host,
                    t.recovery_ms
                        .map_or_else(|| "none".to_owned(), |v| format!("{v:.1} ms")),
                    t.failed_attempts,
                    t.rejoin_ms
                );
            }
        }
        let pm = self.puts("etcd-matched");
        let km = self.kills("etcd-matched");
        out += &format!(
            "etcd-matched leader-kill recovery (writers): p50 {} ms, max {} ms; yard/etcd-matched p50 {}\n",
            km.p50_ms.map_or("-".into(), |v| format!("{v:.1}")),
            km.max_ms.map_or("-".into(), |v| format!("{v:.1}")),
            ratio(ky.p50_ms, km.p50_ms).map_or("-".into(), |v| format!("{v:.3}")),
        );
        out += &format!(
            "etcd-matched puts: {} ops/s, p99 {} ms; yard/etcd-matched throughput {}, p99 {}\n",
            pm.throughput.map_or("-".into(), |v| format!("{v:.0}")),
            pm.p99_ms.map_or("-".into(), |v| format!("{v:.2}")),
            ratio(py.throughput, pm.throughput).map_or("-".into(), |v| format!("{v:.3}")),
            ratio(py.p99_ms, pm.p99_ms).map_or("-".into(), |v| format!("{v:.3}")),
        );
        if !self.cli_trials.is_empty() {
            out += "leader kill, CLI at its defaults against a survivor (failed trials counted at the give-up time):\n";
            out += &format!(
                "  {:<14}{:>7}{:>8}{:>10}{:>10}{:>12}{:>10}{:>8}{:>13}\n",
                "system",
                "trials",
                "failed",
                "p50 ms",
                "p99 ms",
                "best-of-N",
                "worst",
                "errors",
                "p50 vs yard"
            );
            let y = self.cli("yard");
            for system in ["yard", "etcd", "etcd-matched"] {
                let c = self.cli(system);
                let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
                out += &format!(
                    "  {:<14}{:>7}{:>8}{:>10}{:>10}{:>12}{:>10}{:>8}{:>13}\n",
                    system,
                    c.trials,
                    c.failed,
                    f(c.p50_ms),
                    f(c.p99_ms),
                    f(c.best_ms),
                    f(c.worst_ms),
                    c.errors,
                    ratio(y.p50_ms, c.p50_ms).map_or("-".into(), |v| format!("{v:.3}"))
                );
            }
        }
        out += &format!(
            "yard timings: defaults (heartbeat {} ms, election {}-{} ms); etcd timings: defaults \
             (heartbeat 100 ms, election 1000 ms), etcd-matched: {}; etcd over plaintext gRPC, yard over QUIC+mTLS\n",
            self.yard_timings["heartbeat_ms"],
            self.yard_timings["election_timeout_min_ms"],
            self.yard_timings["election_timeout_max_ms"],
            crate::etcd_cluster::EtcdProfile::MATCHED.timing_text()
        );
        out
    }
}

fn mibs(kib: &[u64]) -> String {
    kib.iter()
        .map(|&k| format!("{:.1}", k as f64 / 1024.0))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(10.0));
        // With 20 trials the 99th percentile is the worst one: nothing is hidden.
        assert_eq!(quantile(&v, 0.99), Some(20.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
