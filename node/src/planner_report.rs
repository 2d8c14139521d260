//! Every gateway node's part in the service planner: the per-VIP rates it measures, sent to the
//! leader's planner (`crate::planner_control`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use yard_actors::gateway::replan::{Rate, RateSmoother, VipCount};

use crate::rpc::{Reply, Request};
use crate::service::Node;

/// Samples this node's per-VIP counters every `every` and reports the smoothed rates to the
/// leader; returns when the task is aborted. Counters that cannot be read (the gateway program
/// not loaded yet) are retried at the next interval.
pub async fn report_rates(node: Node, pin_dir: PathBuf, every: Duration, smoothing: f64) {
    let epoch = Instant::now();
    let mut smoother = RateSmoother::new(smoothing);
    let mut stats: Option<std::sync::Arc<yard_ebpf::VipStats>> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tick.tick().await;
        let (dir, have) = (pin_dir.clone(), stats.clone());
        let read = tokio::task::spawn_blocking(move || {
            let s = match have {
                Some(s) => s,
                None => std::sync::Arc::new(yard_ebpf::VipStats::open_pinned(&dir)?),
            };
            let counts = s.read()?;
            Ok::<_, yard_ebpf::EbpfError>((s, counts))
        })
        .await;
        let counts = match read {
            Ok(Ok((s, counts))) => {
                stats = Some(s);
                warned = false;
                counts
            }
            Ok(Err(e)) => {
                stats = None;
                if !warned {
                    tracing::warn!(error = %e, "planner: the per-vip counters are unreadable");
                    warned = true;
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "planner: the counter read failed");
                continue;
            }
        };
        let counts: BTreeMap<Ipv4Addr, VipCount> = counts
            .into_iter()
            .map(|(v, c)| {
                (
                    v,
                    VipCount {
                        packets: c.packets,
                        bytes: c.bytes,
                    },
                )
            })
            .collect();
        smoother.sample(epoch.elapsed().as_millis() as u64, &counts);
        let Some((leader, _)) = node.known_leader() else {
            continue;
        };
        let rates: Vec<(Ipv4Addr, Rate)> = smoother.rates().iter().map(|(v, r)| (*v, *r)).collect();
        let reply = node
            .call_node(leader, Request::GatewayRates { rates }, every)
            .await;
        match reply {
            Ok(Reply::RatesAccepted) => {}
            other => tracing::debug!(leader, ?other, "planner: rates not taken"),
        }
    }
}
