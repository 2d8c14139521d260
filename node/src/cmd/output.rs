//! Human or JSON output, one place for both.

use serde_json::{json, Value};
use std::process::ExitCode;

use yard::rpc::{Reply, Status};

#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub json: bool,
}

impl Out {
    /// Prints `value` as JSON, or the human text `human` builds.
    pub fn line(&self, value: Value, human: impl FnOnce() -> String) {
        if self.json {
            println!("{value}");
        } else {
            let text = human();
            if !text.is_empty() {
                println!("{text}");
            }
        }
    }
}

/// `yard version`: the answered node's release level and its tables' cluster level. A node of
/// a release from before levels cannot decode the question: it is level 0, and so is the
/// cluster it is in.
pub fn print_version(reply: Reply, out: Out) -> anyhow::Result<ExitCode> {
    let (release, cluster) = match reply {
        Reply::Level { release, cluster } => (release, cluster),
        Reply::Error(e) if yard::frame::is_undecodable(&e) => (0, 0),
        Reply::Error(e) => anyhow::bail!("{e}"),
        other => anyhow::bail!("unexpected reply to a level request: {other:?}"),
    };
    let this = yard_raft_store::version::LEVEL;
    out.line(
        json!({"release": release, "cluster": cluster, "cli": this}),
        || {
            format!(
                "node release level {release}, cluster level {cluster} (this yard: level {this})"
            )
        },
    );
    Ok(ExitCode::SUCCESS)
}

pub fn print_status(s: &Status, out: Out) {
    let members: Vec<Value> = s
        .members
        .iter()
        .map(|m| json!({"id": m.id, "name": m.name, "addr": m.addr, "role": m.role, "reachable": m.reachable}))
        .collect();
    let actors: Vec<Value> = s
        .actors
        .iter()
        .map(|a| json!({"name": a.name, "healthy": a.healthy, "detail": a.detail}))
        .collect();
    let value = json!({
        "id": s.id,
        "leader": s.leader,
        "term": s.term,
        "commit_index": s.commit_index,
        "members": members,
        "actors": actors,
    });
    out.line(value, || {
        let mut t = format!(
            "leader {}  term {}  commit index {}  (answered by node {})\n",
            s.leader.map_or("none".into(), |l| l.to_string()),
            s.term,
            s.commit_index,
            s.id
        );
        t.push_str("ID  NAME        ADDR                   ROLE     REACHABLE\n");
        for m in &s.members {
            t.push_str(&format!(
                "{:<3} {:<11} {:<22} {:<8} {}\n",
                m.id, m.name, m.addr, m.role, m.reachable
            ));
        }
        for a in &s.actors {
            t.push_str(&format!(
                "actor {}: {} ({})\n",
                a.name,
                if a.healthy { "healthy" } else { "unhealthy" },
                a.detail
            ));
        }
        t.trim_end().to_owned()
    });
}

/// `yard members`: one row per host, then the autopilot's reason.
pub fn print_members(m: &yard::rpc::MembersView, out: Out) {
    out.line(json!(m), || {
        let mut t = format!(
            "leader {}  commit index {}\nID    NAME        ADDR                   ROLE     ZONE      LAG     ALIVE  FOLLOWS\n",
            m.leader, m.commit_index
        );
        for h in &m.hosts {
            t.push_str(&format!(
                "{:<5} {:<11} {:<22} {:<8} {:<9} {:<7} {:<6} {}\n",
                h.id,
                h.name,
                h.addr,
                h.role,
                if h.zone.is_empty() { "-" } else { &h.zone },
                h.lag.map_or("?".into(), |l| l.to_string()),
                h.alive,
                h.follows.map_or("-".into(), |f| f.to_string()),
            ));
        }
        t.push_str(&format!("autopilot: {}", m.autopilot));
        t
    });
}
