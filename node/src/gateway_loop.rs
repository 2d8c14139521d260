//! The gateway leader's loop on this node ([`GatewayControl::run`]): feeds the leader core
//! with renewals, revocation answers, grace requests and the replicated tables, and executes its
//! effects (revocation RPCs to the voters, placement and grace writes through Raft, re-plans on
//! a blocking thread) without waiting on any of them. The state it drives, and the voter half,
//! are `crate::gateway_control`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use openraft::ServerState;
use yard_actors::gateway::leader::{Effect, LeaderCore, TickInput};
use yard_actors::gateway::replan::{replan, stay, Replan, ReplanInput};
use yard_raft_store::gateway::GatewayCommand;
use yard_raft_store::{Command, Raft};

use crate::gateway_control::{GatewayControl, Input};
use crate::metrics::{FailoverPhase, METRICS};
use crate::planner_control::{PlannerLoop, HEALTH_KEY};
use crate::raft_wait::{wait_leading, IDLE_RECHECK};
use crate::rpc::{NodeHealthView, Reply, Request};
use crate::service::Node;

/// Runs `plan` on a blocking thread and answers with its `Input::Replanned`, also when it
/// panicked (as an error). The planner loop's `busy` flag is cleared only by that input: a
/// re-plan that never answered stopped re-planning on this node for good.
pub(crate) async fn replan_off_runtime(
    term: u64,
    measured_vips: usize,
    plan: impl FnOnce() -> Result<Replan, String> + Send + 'static,
) -> Input {
    let result = match tokio::task::spawn_blocking(plan).await {
        Ok(result) => result,
        Err(e) => {
            tracing::error!(term, error = %e, "planner: the re-plan failed");
            Err(format!("the re-plan failed: {e}"))
        }
    };
    Input::Replanned {
        term,
        result,
        measured_vips,
    }
}

impl GatewayControl {
    /// The loop; returns when the task is aborted.
    pub async fn run(&self, node: Node) {
        let taken = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut rx) = taken else {
            tracing::error!("the gateway control loop runs once");
            return;
        };
        let raft = node.raft().clone();
        let feed = node.feed().clone();
        let mut core = LeaderCore::new(self.cfg, node.id());
        let mut pl = self.planner.clone().map(PlannerLoop::new);
        let mut next_tick = self.now_ms();
        // Whether this node led at the last pass: a follower's loop sleeps until it leads (or
        // an input arrives), not at the leader's interval.
        let mut leading = false;
        loop {
            let wait = Duration::from_millis(next_tick.saturating_sub(self.now_ms()));
            let until_next = async {
                if leading {
                    tokio::time::sleep(wait).await;
                } else {
                    wait_leading(&raft, wait).await;
                }
            };
            let mut urgent = false;
            tokio::select! {
                _ = until_next => {}
                input = rx.recv() => match input {
                    Some(input) => urgent |= self.input(&mut core, &mut pl, input),
                    None => return,
                },
            }
            while let Ok(input) = rx.try_recv() {
                urgent |= self.input(&mut core, &mut pl, input);
            }
            let m = raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                if core.term().is_some() {
                    core.lose();
                    // A former leader's re-plans are not the cluster's any more: its metrics
                    // would go on showing a placement nobody follows.
                    self.plans().forget();
                    self.health().clear();
                }
                leading = false;
                next_tick = self.now_ms() + IDLE_RECHECK.as_millis() as u64;
                continue;
            }
            leading = true;
            if core.term() != Some(m.current_term) {
                // Committed restart graces must be read from tables that include everything the
                // predecessors committed: wait until this term's first entry is applied.
                if !matches!(
                    tokio::time::timeout(self.interval * 10, raft.ensure_linearizable()).await,
                    Ok(Ok(_))
                ) {
                    next_tick = self.now_ms() + self.interval.as_millis() as u64;
                    continue;
                }
                let (graces, history, placed) = feed.read(|d| {
                    (
                        d.gateway.graces.clone(),
                        d.kv.get(HEALTH_KEY).map(|v| v.value.clone()),
                        pl.as_ref()
                            .map(|pl| stay(&d.gateway.vips, pl.settings.replan.target.max_moves)),
                    )
                });
                core.gain(m.current_term, self.now_ms(), &graces);
                if let Some(pl) = pl.as_mut() {
                    pl.gain(self.now_ms(), history.as_deref());
                    // Until the first re-plan the VIPs stay where the last leader left them.
                    core.set_planned(placed);
                }
                tracing::info!(
                    term = m.current_term,
                    graces = graces.len(),
                    "gateway: leading; leases held by the voters carry over"
                );
                urgent = true;
            }
            let now = self.now_ms();
            if now < next_tick && !urgent {
                continue;
            }
            let (vips, draining, graces, revision) = feed.read(|d| {
                (
                    d.gateway.vips.clone(),
                    d.gateway.draining.clone(),
                    d.gateway.graces.clone(),
                    d.gateway.revision,
                )
            });
            let voters = node.voter_ids();
            let effects = core.tick(
                now,
                &TickInput {
                    vips: &vips,
                    draining: &draining,
                    graces: &graces,
                    revision,
                    voters: &voters,
                },
            );
            for effect in effects {
                self.execute(&node, &raft, m.current_term, effect);
            }
            if let Some(pl) = pl.as_mut() {
                self.replan(pl, &core, &raft, m.current_term, now, &vips);
            }
            let interval = self.interval.as_millis() as u64;
            next_tick = core
                .next_wake(now)
                .map_or(now + interval, |t| t.min(now + interval))
                .max(now + 1);
        }
    }

    /// Starts a re-plan when one is due: advances and commits the nodes' history, and plans
    /// on a blocking thread, whose result comes back as `Input::Replanned`.
    fn replan(
        &self,
        pl: &mut PlannerLoop,
        core: &LeaderCore,
        raft: &Raft,
        term: u64,
        now: u64,
        vips: &BTreeMap<std::net::Ipv4Addr, yard_raft_store::gateway::VipRecord>,
    ) {
        let seen = core.seen().clone();
        if !pl.due(now, &seen.placeable) {
            return;
        }
        let (rates, nodes) = pl.start(now, &seen.known, &seen.live, &seen.placeable);
        *self.health() = pl
            .health
            .iter()
            .map(|(n, h)| NodeHealthView {
                node: *n,
                history: *h,
                fail_prob: h.fail_prob(pl.settings.prior),
            })
            .collect();
        let value = pl.health_json();
        let raft = raft.clone();
        tokio::spawn(async move {
            let cmd = Command::Put {
                key: HEALTH_KEY.to_owned(),
                value,
            };
            if let Err(e) = raft.client_write(cmd).await {
                tracing::debug!(error = %e, "planner: the node history was not committed");
            }
        });
        let (vips, tenants, cfg, tx) = (
            vips.clone(),
            pl.settings.tenants.clone(),
            pl.settings.replan,
            self.tx.clone(),
        );
        let measured_vips = rates.len();
        tokio::spawn(async move {
            let answer = replan_off_runtime(term, measured_vips, move || {
                replan(
                    &ReplanInput {
                        vips: &vips,
                        rates: &rates,
                        tenants: &tenants,
                        nodes: &nodes,
                    },
                    &cfg,
                )
                .map_err(|e| e.to_string())
            })
            .await;
            let _ = tx.send(answer).await;
        });
    }

    fn execute(&self, node: &Node, raft: &Raft, term: u64, effect: Effect) {
        // Calls run in tasks of their own and are not waited for; a long timeout lets a slow
        // handshake finish instead of being aborted and started over at every retry.
        let timeout = Duration::from_secs(1);
        match effect {
            Effect::Revoke {
                node: target,
                stamp,
                voters,
            } => {
                for voter in voters {
                    let (node, tx, epoch) = (node.clone(), self.tx.clone(), self.epoch);
                    tokio::spawn(async move {
                        let req = Request::GatewayRevoke {
                            node: target,
                            stamp,
                        };
                        match node.call_node(voter, req, timeout).await {
                            Ok(Reply::LeaseRevoked {
                                remaining_ms,
                                held_ms,
                            }) => {
                                // The voter applied it at least `held_ms` before this.
                                let at =
                                    (epoch.elapsed().as_millis() as u64).saturating_sub(held_ms);
                                let _ = tx
                                    .send(Input::RevokeAnswer {
                                        node: target,
                                        stamp,
                                        voter,
                                        remaining_ms,
                                        at,
                                    })
                                    .await;
                            }
                            other => {
                                tracing::debug!(
                                    voter,
                                    node = target,
                                    ?other,
                                    "gateway revocation not answered"
                                )
                            }
                        }
                    });
                }
            }
            Effect::Unrevoke {
                node: target,
                stamp,
                voters,
            } => {
                for voter in voters {
                    let (node, tx) = (node.clone(), self.tx.clone());
                    tokio::spawn(async move {
                        let req = Request::GatewayUnrevoke {
                            node: target,
                            stamp,
                        };
                        if let Ok(Reply::LeaseUnrevoked) = node.call_node(voter, req, timeout).await
                        {
                            let _ = tx
                                .send(Input::UnrevokeAck {
                                    node: target,
                                    stamp,
                                    voter,
                                })
                                .await;
                        }
                    });
                }
            }
            Effect::Propose(changes) => {
                let (raft, tx) = (raft.clone(), self.tx.clone());
                let moves = changes.len();
                tokio::spawn(async move {
                    let proposed = Instant::now();
                    let written = raft
                        .client_write(Command::Gateway(GatewayCommand::Assign(changes)))
                        .await;
                    match written {
                        Ok(resp) => {
                            METRICS.gateway_placements.inc();
                            METRICS.observe_failover(FailoverPhase::Placement, proposed.elapsed());
                            let revision = match resp.data {
                                yard_raft_store::Response::Written { revision } => revision,
                                _ => 0,
                            };
                            tracing::info!(revision, moves, "gateway placement committed");
                        }
                        Err(e) => tracing::debug!(error = %e, "gateway placement not committed"),
                    }
                    let _ = tx.send(Input::PlacementDone { term }).await;
                });
            }
            Effect::EndGrace(target) => {
                let raft = raft.clone();
                tokio::spawn(async move {
                    let cleared = raft
                        .client_write(Command::Gateway(GatewayCommand::Grace {
                            node: target,
                            ms: 0,
                        }))
                        .await;
                    tracing::info!(
                        node = target,
                        ok = cleared.is_ok(),
                        "gateway restart grace ended"
                    );
                });
            }
            Effect::Lapsed {
                node,
                owned,
                holddown_ms,
            } => {
                self.lapsed_at().insert(node, self.now_ms());
                // The message is what the failover benchmark looks for (detection).
                tracing::info!(node, owned, holddown_ms, "gateway lease lapsed");
            }
            Effect::Fenced { node, at_ms } => {
                self.fenced(node, at_ms);
                tracing::info!(
                    node,
                    fenced_at_ms = at_ms,
                    "gateway lease revoked at a majority"
                );
            }
            Effect::Restored { node } => {
                self.lapsed_at().remove(&node);
                tracing::info!(
                    node,
                    "gateway lease restored; held down before it receives vips"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A re-plan that panics still answers, as an error, so the loop's `busy` flag is cleared
    /// and the next re-plan runs; one that finishes answers with its result.
    #[tokio::test]
    async fn a_replan_that_panics_still_answers() {
        let Input::Replanned {
            term,
            result,
            measured_vips,
        } = replan_off_runtime(7, 3, || panic!("the planner hit a bug")).await
        else {
            panic!("not a re-plan's answer");
        };
        assert_eq!((term, measured_vips), (7, 3));
        let Err(why) = result else {
            panic!("a panicked re-plan answered Ok");
        };
        assert!(why.starts_with("the re-plan failed: "), "{why}");
        let Input::Replanned { result, .. } =
            replan_off_runtime(8, 0, || Err("no nodes".to_string())).await
        else {
            panic!("not a re-plan's answer");
        };
        assert_eq!(result.err().as_deref(), Some("no nodes"));
    }

    /// The panicking re-plan's answer, fed to the loop, frees the planner for the next one.
    #[tokio::test]
    async fn a_panicked_replan_leaves_the_planner_free_to_plan_again() {
        use crate::planner_control::PlannerSettings;
        use yard_actors::gateway::lease::LeaseConfig;
        let lease = LeaseConfig {
            lease_ms: 90,
            margin_ms: 10,
        };
        let ctl = GatewayControl::new(lease, Duration::from_millis(20), false);
        let mut core = LeaderCore::new(ctl.cfg, 1);
        let settings = PlannerSettings::from_config(&crate::config::PlannerSection::default());
        let mut pl = Some(PlannerLoop::new(settings));
        let nodes = [1u64].into_iter().collect();
        pl.as_mut().unwrap().start(0, &nodes, &nodes, &nodes);
        assert!(pl.as_ref().unwrap().busy);
        let answer = replan_off_runtime(1, 0, || panic!("the planner hit a bug")).await;
        ctl.input(&mut core, &mut pl, answer);
        assert!(!pl.as_ref().unwrap().busy, "the planner is free again");
        assert!(pl.as_ref().unwrap().due(1_000_000, &nodes));
    }
}
