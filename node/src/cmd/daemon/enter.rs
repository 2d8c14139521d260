//! How this host enters its cluster when the daemon starts. [`start_mode`] decides from the
//! flags and what the data directory holds; [`enter_cluster`] carries it out and starts the
//! watch that follows the tables (which idles while this host is a Raft member).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use yard::config::Config;
use yard::service::Node;
use yard_control::roles::Role;
use yard_raft_store::StateMachineStore;

use super::StartArgs;

/// What a starting host does, in the order the cases are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMode {
    /// `--join SEED`: join through a member (again, if the store already belongs to a cluster:
    /// the join then returns at once).
    Join(String),
    /// An agent restarted without `--join`: it follows the seeds it remembered, since an agent's
    /// store holds no Raft state that would say it belongs anywhere.
    ResumeAgent,
    /// `--bootstrap`, or no config file at all (a one-node trial): a one-node cluster unless
    /// the store already has one.
    Bootstrap,
    /// A member restarted: Raft resumes from the store.
    ResumeMember,
    /// An empty store and no flag: wait for a leader to add this host.
    Wait,
}

/// Decides how a host starts: `join` and `bootstrap` are the flags, `has_config` whether a
/// config file was given, `remembered_agent` whether the data directory remembers that this
/// host was an agent, `initialized` whether its Raft store belongs to a cluster.
pub fn start_mode(
    join: Option<&str>,
    bootstrap: bool,
    has_config: bool,
    remembered_agent: bool,
    initialized: bool,
) -> StartMode {
    if let Some(seed) = join {
        StartMode::Join(seed.to_owned())
    } else if remembered_agent && !initialized {
        StartMode::ResumeAgent
    } else if bootstrap || !has_config {
        StartMode::Bootstrap
    } else if initialized {
        StartMode::ResumeMember
    } else {
        StartMode::Wait
    }
}

/// Carries out this host's [`start_mode`].
pub async fn enter_cluster(
    cfg: &Config,
    args: &StartArgs,
    node: &Node,
    store: &StateMachineStore,
    rpc_timeout: Duration,
) -> anyhow::Result<()> {
    let agent_file = cfg.node.data_dir.join("agent-seeds");
    let follow = |seeds: Vec<String>| {
        let settings = yard::roles::agent::Settings {
            hold: Duration::from_millis(cfg.liveness.hold_ms),
            rpc_timeout,
            pace: Duration::from_millis(cfg.raft.watch_pace_ms),
            seeds,
            remember: agent_file.clone(),
        };
        tokio::spawn(yard::roles::agent::follow(
            node.clone(),
            store.clone(),
            settings,
        ));
    };
    let mode = start_mode(
        args.join.as_deref(),
        args.bootstrap,
        args.config.is_some(),
        agent_file.exists(),
        node.raft().is_initialized().await?,
    );
    match mode {
        StartMode::Join(seed) => {
            // Logged once the signal handlers are installed (this runs inside the daemon's
            // select): from here a SIGTERM stops the node.
            tracing::info!(seed = %seed, "joining the cluster");
            let role = node
                .join(&seed, Duration::from_secs(120))
                .await
                .map_err(anyhow::Error::msg)?;
            if role == Role::Agent {
                // Remembered, so a restart without --join follows again.
                std::fs::write(&agent_file, format!("{seed}\n"))
                    .with_context(|| format!("cannot write {}", agent_file.display()))?;
            }
            follow(vec![seed]);
        }
        StartMode::ResumeAgent => {
            let seeds = remembered_seeds(&agent_file)?;
            tracing::info!(?seeds, "resuming as an agent");
            follow(seeds);
        }
        StartMode::Bootstrap => {
            follow(Vec::new());
            node.bootstrap().await.map_err(anyhow::Error::msg)?;
        }
        StartMode::ResumeMember => {
            tracing::info!("resuming from the store");
            follow(Vec::new());
        }
        StartMode::Wait => {
            tracing::warn!("the store is empty and neither --bootstrap nor --join was given: waiting to be added by a leader");
        }
    }
    Ok(())
}

/// The seeds an agent wrote when it joined, one per line.
fn remembered_seeds(path: &Path) -> anyhow::Result<Vec<String>> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_wins_over_everything_else() {
        for (remembered, initialized) in [(false, false), (true, false), (true, true)] {
            assert_eq!(
                start_mode(Some("198.18.0.1:7480"), true, true, remembered, initialized),
                StartMode::Join("198.18.0.1:7480".into())
            );
        }
    }

    #[test]
    fn a_remembered_agent_resumes_following_unless_its_store_is_a_members() {
        assert_eq!(
            start_mode(None, false, true, true, false),
            StartMode::ResumeAgent
        );
        // Promoted since it joined as an agent: Raft's store says it is a member now.
        assert_eq!(
            start_mode(None, false, true, true, true),
            StartMode::ResumeMember
        );
    }

    #[test]
    fn bootstrap_without_config_or_with_the_flag() {
        assert_eq!(
            start_mode(None, false, false, false, false),
            StartMode::Bootstrap
        );
        assert_eq!(
            start_mode(None, true, true, false, true),
            StartMode::Bootstrap
        );
    }

    #[test]
    fn an_empty_configured_host_waits_to_be_added() {
        assert_eq!(start_mode(None, false, true, false, false), StartMode::Wait);
        assert_eq!(
            start_mode(None, false, true, false, true),
            StartMode::ResumeMember
        );
    }
}
