mod analyzer_support;
use analyzer_support::{Sim, Fault};
use yard_diagnosis::analyzer::{Config, JobAnalyzer};
#[test]
fn tmp_speed() {
    for (n, steps, peers) in [(8u32, 20000u64, true), (16384, 30, true)] {
        let mut sim = Sim::ring(n, steps).fault(Fault::Missing{rank: 77, seq: steps - 2});
        sim.peers = peers;
        sim.tail_ns = 3_000_000_000;
        let events: Vec<_> = sim.events().into_iter().filter(|e| !matches!(e.1, yard_diagnosis::event::Event::Heartbeat{..})).collect();
        let mut a = JobAnalyzer::new("j", Config::default());
        let t = std::time::Instant::now();
        for (now, ev) in &events { a.ingest(ev, *now); }
        let el = t.elapsed();
        let end = events.last().unwrap().0 + 2_500_000_000;
        let t2 = std::time::Instant::now();
        let mut k = 0;
        for i in 0..10 { k = a.evaluate(end + i).len(); }
        println!("n={n} events={} ingest {:.2} Mev/s evaluate {:?} each, {k} verdicts, retained {}", events.len(), events.len() as f64 / el.as_secs_f64() / 1e6, t2.elapsed() / 10, a.retained_records());
    }
}
