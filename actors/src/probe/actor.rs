//! The actix shell of the probe: every `report_every` it drains the shared core into one
//! summary, adds the eBPF per-peer counters, and hands the summary to the node's reporter
//! (which sends it to the leader over QUIC). When the leader changes it replays what a fresh
//! analyzer needs. All buffering decisions are in [`super::core`].

use std::future::Future;
use std::net::Ipv4Addr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use yard_diagnosis::event::{Event, LinkCounters};

use super::core::JobBatch;
use super::socket::SharedProbe;
use crate::health::HealthRegistry;

/// Most events in one summary; the rest waits for the next tick (keeps each QUIC frame small).
pub const MAX_EVENTS_PER_REPORT: usize = 20_000;

/// The leader that took a summary.
pub type LeaderId = u64;

/// Sends a summary to the analyzer; resolves to the leader that took it.
pub type ReportFuture = Pin<Box<dyn Future<Output = Result<LeaderId, String>> + Send>>;

/// What the node gives the shell to reach the analyzer. Runs on the node's tokio runtime.
pub trait Reporter: Send + Sync + 'static {
    fn report(&self, batches: Vec<JobBatch>) -> ReportFuture;
}

/// One peer host's traffic as the eBPF program counted it (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSample {
    pub peer: Ipv4Addr,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub rx_packets: u64,
    /// `CLOCK_MONOTONIC` ns of the last packet from the peer (0: never).
    pub last_rx_ns: u64,
}

/// The eBPF per-peer counters, when the node runs them.
pub trait PeerCounterSource: Send + 'static {
    /// Counts traffic on these ports from now on.
    fn set_ports(&mut self, ports: &[u16]) -> Result<(), String>;
    fn read(&mut self) -> Result<Vec<PeerSample>, String>;
}

pub struct ProbeActor {
    shared: SharedProbe,
    reporter: Arc<dyn Reporter>,
    counters: Option<Box<dyn PeerCounterSource>>,
    /// This node's underlay address (the `addr` of its counters).
    addr: String,
    every: Duration,
    health: HealthRegistry,
    in_flight: bool,
    leader: Option<LeaderId>,
    ports_applied: Vec<u16>,
    failures: u64,
}

impl ProbeActor {
    pub fn new(
        shared: SharedProbe,
        reporter: Arc<dyn Reporter>,
        counters: Option<Box<dyn PeerCounterSource>>,
        addr: String,
        every: Duration,
        health: HealthRegistry,
    ) -> Self {
        Self {
            shared,
            reporter,
            counters,
            addr,
            every,
            health,
            in_flight: false,
            leader: None,
            ports_applied: Vec::new(),
            failures: 0,
        }
    }

    /// The eBPF counters as events, one per peer, added to every job with local ranks.
    fn counter_events(&mut self) -> Vec<Event> {
        let Some(src) = self.counters.as_mut() else {
            return Vec::new();
        };
        let ports: Vec<u16> = self.shared.lock().ports.iter().copied().collect();
        if ports != self.ports_applied {
            match src.set_ports(&ports) {
                Ok(()) => self.ports_applied = ports,
                Err(e) => tracing::warn!(error = %e, "cannot set the probe's counted ports"),
            }
        }
        let t_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        match src.read() {
            Ok(samples) => samples
                .into_iter()
                .map(|s| {
                    Event::Counters(LinkCounters {
                        addr: self.addr.clone(),
                        peer_addr: s.peer.to_string(),
                        tx_bytes: s.tx_bytes,
                        rx_bytes: s.rx_bytes,
                        tx_packets: s.tx_packets,
                        rx_packets: s.rx_packets,
                        last_rx_ns: s.last_rx_ns,
                        t_ns,
                    })
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the probe's per-peer counters");
                Vec::new()
            }
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        let counters = self.counter_events();
        let batches = {
            let mut s = self.shared.lock();
            if !counters.is_empty() {
                let jobs: Vec<String> = s.jobs.keys().cloned().collect();
                for job in jobs {
                    for ev in &counters {
                        s.core.push(&job, ev.clone());
                    }
                }
            }
            s.core.drain(MAX_EVENTS_PER_REPORT)
        };
        if batches.is_empty() {
            self.publish_health();
            return;
        }
        self.in_flight = true;
        let fut = self.reporter.report(batches);
        ctx.spawn(fut.into_actor(self).map(|result, act, _| {
            act.in_flight = false;
            match result {
                Ok(leader) => {
                    if act.leader != Some(leader) {
                        if act.leader.is_some() || act.failures > 0 {
                            tracing::info!(leader, "probe: new analyzer; replaying job state");
                            act.shared.lock().core.replay();
                        }
                        act.leader = Some(leader);
                    }
                    act.failures = 0;
                }
                Err(e) => {
                    act.failures += 1;
                    if act.failures == 1 || act.failures % 50 == 0 {
                        tracing::warn!(error = %e, failures = act.failures, "probe summary not delivered; its events are lost");
                    }
                    // Whoever takes the next summary needs the job state again.
                    act.leader = None;
                }
            }
            act.publish_health();
        }));
    }

    fn publish_health(&self) {
        let s = self.shared.snapshot();
        let healthy = self.failures < 10;
        self.health.report(
            "probe",
            healthy,
            format!(
                "{} clients, {} jobs, {} events reported, {} dropped, {} refused connections{}",
                s.connections,
                s.jobs,
                s.stats.reported,
                s.stats.dropped,
                s.protocol_errors,
                if healthy {
                    String::new()
                } else {
                    format!(", {} summaries undelivered in a row", self.failures)
                }
            ),
        );
    }
}

impl Actor for ProbeActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.publish_health();
        ctx.run_interval(self.every, |act, ctx| act.tick(ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use yard_diagnosis::event::Event;

    struct Recorder {
        got: Mutex<Vec<JobBatch>>,
        leader: Mutex<Result<LeaderId, String>>,
    }

    impl Reporter for Arc<Recorder> {
        fn report(&self, batches: Vec<JobBatch>) -> ReportFuture {
            self.got.lock().unwrap().extend(batches);
            let r = self.leader.lock().unwrap().clone();
            Box::pin(async move { r })
        }
    }

    struct FakeCounters;

    impl PeerCounterSource for FakeCounters {
        fn set_ports(&mut self, _: &[u16]) -> Result<(), String> {
            Ok(())
        }
        fn read(&mut self) -> Result<Vec<PeerSample>, String> {
            Ok(vec![PeerSample {
                peer: Ipv4Addr::new(198, 18, 0, 2),
                tx_bytes: 10,
                rx_bytes: 20,
                tx_packets: 1,
                rx_packets: 2,
                last_rx_ns: 3,
            }])
        }
    }

    #[actix_rt::test]
    async fn summaries_go_out_and_a_new_leader_gets_the_job_state_again() {
        let shared = SharedProbe::new(100);
        let rec = Arc::new(Recorder {
            got: Mutex::default(),
            leader: Mutex::new(Ok(1)),
        });
        {
            let mut s = shared.lock();
            s.jobs.insert("j".into(), 1);
            s.core.push(
                "j",
                Event::Group(yard_diagnosis::event::Group {
                    name: "0".into(),
                    desc: String::new(),
                    ranks: vec![0],
                }),
            );
        }
        let actor = ProbeActor::new(
            shared.clone(),
            Arc::new(rec.clone()),
            Some(Box::new(FakeCounters)),
            "198.18.0.1".into(),
            Duration::from_millis(10),
            HealthRegistry::default(),
        )
        .start();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let first: Vec<JobBatch> = rec.got.lock().unwrap().drain(..).collect();
        assert!(first
            .iter()
            .any(|b| b.events.iter().any(|e| matches!(e, Event::Group(_)))));
        assert!(first.iter().any(|b| b.events.iter().any(
            |e| matches!(e, Event::Counters(c) if c.peer_addr == "198.18.0.2" && c.addr == "198.18.0.1")
        )));
        *rec.leader.lock().unwrap() = Ok(2);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let later: Vec<JobBatch> = rec.got.lock().unwrap().drain(..).collect();
        assert!(
            later
                .iter()
                .any(|b| b.events.iter().any(|e| matches!(e, Event::Group(_)))),
            "the group is replayed to the new leader"
        );
        drop(actor);
    }
}
