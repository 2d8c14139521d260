//! A sequence-numbered UDP probe stream between two tenants, and its loss-window analysis.
//!
//! The sender sends datagram `seq` at `epoch + seq × interval` (absolute deadlines: a late send
//! never shifts the later ones), each carrying `seq` and its send offset; the receiver records
//! `(seq, receive Instant)` for every datagram. All namespaces share CLOCK_MONOTONIC, so the
//! receiver's Instants compare with the sender's and with a fault injected by the caller.
//!
//! The loss window is measured from the data path (not from logs): the largest interval between
//! consecutive received datagrams in send order, `(first seq after a gap − last seq before it)
//! × interval`; a gap at the start (nothing before it received) counts from seq −1, one at the
//! end (nothing after it received) up to seq `sent`. Duplicates (two gateways answering) and
//! reordering are counted too. [`analyze`] is a pure function over the record.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{io_err, Error, Result};
use crate::overlay::Tenant;

/// Datagram payload: seq (u64 BE) then the send offset from the epoch in ns (u64 BE).
const PAYLOAD_LEN: usize = 16;

/// How long the receiver keeps listening after the sender stops, for datagrams in flight.
const DRAIN: Duration = Duration::from_millis(200);

/// Settings of a probe stream.
#[derive(Debug, Clone, Copy)]
pub struct ProbeOptions {
    /// UDP port of the receiver.
    pub port: u16,
    /// Datagrams per second (the loss window's resolution is one interval).
    pub rate_pps: u32,
    /// The sender stops on its own after this long, stopped or not.
    pub max_duration: Duration,
}

impl ProbeOptions {
    /// `rate_pps` to `port`, at most two minutes.
    pub fn new(port: u16, rate_pps: u32) -> Self {
        Self {
            port,
            rate_pps,
            max_duration: Duration::from_secs(120),
        }
    }
}

/// A running probe stream; [`ProbeStream::stop`] ends it and analyses what arrived.
#[derive(Debug)]
pub struct ProbeStream {
    epoch: Instant,
    interval: Duration,
    rate_pps: u32,
    stop: Arc<AtomicBool>,
    rx_stop: Arc<AtomicBool>,
    live: Arc<Live>,
    sender: Option<JoinHandle<SenderFigures>>,
    receiver: Option<JoinHandle<Vec<(u64, Instant)>>>,
}

/// What the threads publish while running.
#[derive(Debug, Default)]
struct Live {
    received: AtomicU64,
    /// ns since the epoch of the latest arrival, plus one (0: none yet).
    last_rx_ns: AtomicU64,
    sent: AtomicU64,
}

#[derive(Debug, Default, Clone, Copy)]
struct SenderFigures {
    sent: u64,
    send_errors: u64,
    max_lateness: Duration,
}

/// A run of lost datagrams.
#[derive(Debug, Clone, PartialEq)]
pub struct Gap {
    /// The last seq received before the gap (`None`: the gap starts the stream).
    pub after_seq: Option<u64>,
    /// Datagrams lost in it.
    pub lost: u64,
    /// When the first lost datagram was due to be sent, ms after the epoch.
    pub start_ms: f64,
    /// The loss window: (first seq received after − last seq received before) × interval.
    pub len_ms: f64,
    /// When the first datagram after the gap arrived, ms after the epoch (`None`: nothing
    /// arrived after it).
    pub resumed_rx_ms: Option<f64>,
    /// Receive time of the first datagram after the gap minus that of the last before it (the
    /// window as the receiver saw it); `None` for a gap at either end.
    pub rx_len_ms: Option<f64>,
}

/// What a probe stream delivered.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// The stream's time origin: datagram `seq` was due at `epoch + seq × interval`.
    pub epoch: Instant,
    /// The sending interval in ms.
    pub interval_ms: f64,
    /// Datagrams sent.
    pub sent: u64,
    /// Distinct datagrams received.
    pub received: u64,
    /// `sent − received`.
    pub lost: u64,
    /// Datagrams received more than once (extra copies).
    pub duplicates: u64,
    /// Datagrams that arrived after one with a higher seq.
    pub reordered: u64,
    /// The largest gap's `len_ms`, 0 if nothing was lost.
    pub max_gap_ms: f64,
    /// Every gap, in seq order.
    pub gaps: Vec<Gap>,
    /// Sends the kernel refused (they count as sent and, not arriving, as lost).
    pub send_errors: u64,
    /// How far behind its schedule the sender fell at worst, ms.
    pub max_send_lateness_ms: f64,
}

impl ProbeStream {
    /// Starts `rate_pps` datagrams a second from `from` to `to`'s address, port `port`; the
    /// sender stops on its own after two minutes.
    pub fn start(from: &Tenant, to: &Tenant, port: u16, rate_pps: u32) -> Result<Self> {
        Self::start_with(from, to, ProbeOptions::new(port, rate_pps))
    }

    /// [`ProbeStream::start`] with every setting.
    pub fn start_with(from: &Tenant, to: &Tenant, opts: ProbeOptions) -> Result<Self> {
        if opts.rate_pps == 0 || opts.rate_pps > 1_000_000 {
            return Err(Error::Setup(format!(
                "probe rate {} pps is not in 1..=1000000",
                opts.rate_pps
            )));
        }
        let interval = Duration::from_nanos(1_000_000_000 / u64::from(opts.rate_pps));
        let stop = Arc::new(AtomicBool::new(false));
        let rx_stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Live::default());
        let dst = SocketAddrV4::new(to.ip(), opts.port);
        // Bounded memory: a stream can never record more than it can send, twice over.
        let cap = (u128::from(opts.rate_pps) * opts.max_duration.as_millis() / 1000 * 2)
            .clamp(1024, 50_000_000) as usize;
        let rx_deadline = opts.max_duration + DRAIN + Duration::from_secs(1);

        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::io::Result<()>>();
        // The epoch is fixed after the receiver is bound, before the sender starts.
        let (epoch_tx, epoch_rx) = std::sync::mpsc::channel::<Instant>();
        let receiver = {
            let (rx_stop, live) = (Arc::clone(&rx_stop), Arc::clone(&live));
            to.thread(move || {
                let sock = match UdpSocket::bind(dst).and_then(|s| {
                    s.set_read_timeout(Some(Duration::from_millis(10)))
                        .map(|()| s)
                }) {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Vec::new();
                    }
                };
                let Ok(epoch) = epoch_rx.recv() else {
                    return Vec::new();
                };
                receive(&sock, epoch, &rx_stop, &live, cap, rx_deadline)
            })?
        };
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                rx_stop.store(true, Ordering::SeqCst);
                let _ = receiver.join();
                return Err(io_err(format!(
                    "bind the probe receiver to {dst} in {}",
                    to.ns()
                ))(e));
            }
            Err(_) => {
                rx_stop.store(true, Ordering::SeqCst);
                return Err(Error::Setup("the probe receiver did not start".into()));
            }
        }
        let src = from.ip();
        let epoch = Instant::now() + Duration::from_millis(5);
        let _ = epoch_tx.send(epoch);
        let sender = {
            let (stop, live) = (Arc::clone(&stop), Arc::clone(&live));
            let max = opts.max_duration;
            from.thread(move || send(src, dst, epoch, interval, max, &stop, &live))
        };
        let sender = match sender {
            Ok(s) => s,
            Err(e) => {
                rx_stop.store(true, Ordering::SeqCst);
                let _ = receiver.join();
                return Err(e);
            }
        };
        Ok(Self {
            epoch,
            interval,
            rate_pps: opts.rate_pps,
            stop,
            rx_stop,
            live,
            sender: Some(sender),
            receiver: Some(receiver),
        })
    }

    /// The time origin: datagram `seq` is due at `epoch + seq × interval`.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Datagrams per second.
    pub fn rate_pps(&self) -> u32 {
        self.rate_pps
    }

    /// Datagrams received so far (copies included).
    pub fn received(&self) -> u64 {
        self.live.received.load(Ordering::Relaxed)
    }

    /// Datagrams sent so far.
    pub fn sent(&self) -> u64 {
        self.live.sent.load(Ordering::Relaxed)
    }

    /// When the latest datagram arrived, if any has.
    pub fn last_received_at(&self) -> Option<Instant> {
        match self.live.last_rx_ns.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.epoch + Duration::from_nanos(n - 1)),
        }
    }

    /// Waits until datagrams have arrived without a pause longer than `quiet` for `steady`, for
    /// up to `timeout`; `true` if they did (the path is up and stable).
    pub fn wait_flowing(&self, steady: Duration, quiet: Duration, timeout: Duration) -> bool {
        let start = Instant::now();
        let mut flowing_since: Option<Instant> = None;
        while start.elapsed() < timeout {
            let now = Instant::now();
            let fresh = self
                .last_received_at()
                .is_some_and(|t| now.saturating_duration_since(t) <= quiet);
            if fresh {
                let since = *flowing_since.get_or_insert(now);
                if now.duration_since(since) >= steady {
                    return true;
                }
            } else {
                flowing_since = None;
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Stops the sender, lets datagrams in flight arrive, stops the receiver and analyses.
    pub fn stop(mut self) -> ProbeReport {
        self.finish()
    }

    fn finish(&mut self) -> ProbeReport {
        self.stop.store(true, Ordering::SeqCst);
        let figures = self
            .sender
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        thread::sleep(DRAIN);
        self.rx_stop.store(true, Ordering::SeqCst);
        let records = self
            .receiver
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let mut report = analyze(&records, figures.sent, self.interval, self.epoch);
        report.send_errors = figures.send_errors;
        report.max_send_lateness_ms = ms(figures.max_lateness);
        report
    }
}

impl Drop for ProbeStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.rx_stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.sender.take() {
            let _ = h.join();
        }
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}

fn send(
    src: Ipv4Addr,
    dst: SocketAddrV4,
    epoch: Instant,
    interval: Duration,
    max: Duration,
    stop: &AtomicBool,
    live: &Live,
) -> SenderFigures {
    let mut fig = SenderFigures::default();
    let Ok(sock) = UdpSocket::bind(SocketAddrV4::new(src, 0)) else {
        return fig;
    };
    let mut buf = [0u8; PAYLOAD_LEN];
    let mut seq: u64 = 0;
    let interval_ns = interval.as_nanos();
    while !stop.load(Ordering::Relaxed) {
        let offset =
            Duration::from_nanos(u64::try_from(interval_ns * u128::from(seq)).unwrap_or(u64::MAX));
        if offset >= max {
            break;
        }
        let due = epoch + offset;
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        } else {
            fig.max_lateness = fig.max_lateness.max(now - due);
        }
        buf[..8].copy_from_slice(&seq.to_be_bytes());
        let sent_at = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        buf[8..].copy_from_slice(&sent_at.to_be_bytes());
        if sock.send_to(&buf, dst).is_err() {
            fig.send_errors += 1;
        }
        seq += 1;
        fig.sent = seq;
        live.sent.store(seq, Ordering::Relaxed);
    }
    fig
}

fn receive(
    sock: &UdpSocket,
    epoch: Instant,
    stop: &AtomicBool,
    live: &Live,
    cap: usize,
    deadline: Duration,
) -> Vec<(u64, Instant)> {
    let mut records = Vec::with_capacity(cap.min(1 << 20));
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) && epoch.elapsed() < deadline {
        match sock.recv(&mut buf) {
            Ok(n) if n >= PAYLOAD_LEN => {
                let at = Instant::now();
                let mut seq = [0u8; 8];
                seq.copy_from_slice(&buf[..8]);
                if records.len() < cap {
                    records.push((u64::from_be_bytes(seq), at));
                }
                live.received.fetch_add(1, Ordering::Relaxed);
                let ns = u64::try_from(at.saturating_duration_since(epoch).as_nanos())
                    .unwrap_or(u64::MAX - 1);
                live.last_rx_ns.store(ns + 1, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => thread::sleep(Duration::from_millis(1)),
        }
    }
    records
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Analyses a receiver's record: `(seq, receive time)` in arrival order, `sent` datagrams sent
/// (seqs `0..sent`) every `interval` from `epoch`. Seqs at or beyond `sent` are ignored.
pub fn analyze(
    records: &[(u64, Instant)],
    sent: u64,
    interval: Duration,
    epoch: Instant,
) -> ProbeReport {
    let iv = ms(interval);
    let rel = |t: Instant| ms(t.saturating_duration_since(epoch));
    // First arrival of each seq; copies and late arrivals counted in arrival order.
    let mut first: BTreeMap<u64, Instant> = BTreeMap::new();
    let (mut duplicates, mut reordered) = (0, 0);
    let mut highest: Option<u64> = None;
    for &(seq, at) in records.iter().filter(|(s, _)| *s < sent) {
        if first.contains_key(&seq) {
            duplicates += 1;
            continue;
        }
        first.insert(seq, at);
        if highest.is_some_and(|h| seq < h) {
            reordered += 1;
        }
        highest = Some(highest.map_or(seq, |h| h.max(seq)));
    }
    let mut gaps = Vec::new();
    let mut prev: Option<(u64, Instant)> = None;
    for (&seq, &at) in &first {
        let expected = prev.map_or(0, |(p, _)| p + 1);
        if seq > expected {
            let span = seq - prev.map_or(0, |(p, _)| p + 1) + 1;
            gaps.push(Gap {
                after_seq: prev.map(|(p, _)| p),
                lost: seq - expected,
                start_ms: expected as f64 * iv,
                len_ms: span as f64 * iv,
                resumed_rx_ms: Some(rel(at)),
                rx_len_ms: prev.map(|(_, p_at)| ms(at.saturating_duration_since(p_at))),
            });
        }
        prev = Some((seq, at));
    }
    let next = prev.map_or(0, |(p, _)| p + 1);
    if sent > next {
        gaps.push(Gap {
            after_seq: prev.map(|(p, _)| p),
            lost: sent - next,
            start_ms: next as f64 * iv,
            len_ms: (sent - next + 1) as f64 * iv,
            resumed_rx_ms: None,
            rx_len_ms: None,
        });
    }
    let received = first.len() as u64;
    ProbeReport {
        epoch,
        interval_ms: iv,
        sent,
        received,
        lost: sent.saturating_sub(received),
        duplicates,
        reordered,
        max_gap_ms: gaps.iter().map(|g| g.len_ms).fold(0.0, f64::max),
        gaps,
        send_errors: 0,
        max_send_lateness_ms: 0.0,
    }
}

impl ProbeReport {
    /// The largest gap, if anything was lost.
    pub fn largest_gap(&self) -> Option<&Gap> {
        self.gaps
            .iter()
            .max_by(|a, b| a.len_ms.total_cmp(&b.len_ms))
    }

    /// ms after the epoch of `t` (negative if before).
    pub fn offset_ms(&self, t: Instant) -> f64 {
        if t >= self.epoch {
            ms(t - self.epoch)
        } else {
            -ms(self.epoch - t)
        }
    }

    /// The figures as JSON (at most `max_gaps` gaps listed, the largest first).
    pub fn to_json(&self, max_gaps: usize) -> Value {
        let mut gaps: Vec<&Gap> = self.gaps.iter().collect();
        gaps.sort_by(|a, b| b.len_ms.total_cmp(&a.len_ms));
        let gaps: Vec<Value> = gaps
            .into_iter()
            .take(max_gaps)
            .map(|g| {
                json!({
                    "after_seq": g.after_seq,
                    "lost": g.lost,
                    "start_ms": g.start_ms,
                    "len_ms": g.len_ms,
                    "resumed_rx_ms": g.resumed_rx_ms,
                    "rx_len_ms": g.rx_len_ms,
                })
            })
            .collect();
        json!({
            "interval_ms": self.interval_ms,
            "sent": self.sent,
            "received": self.received,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "reordered": self.reordered,
            "max_gap_ms": self.max_gap_ms,
            "gap_count": self.gaps.len(),
            "gaps": gaps,
            "send_errors": self.send_errors,
            "max_send_lateness_ms": self.max_send_lateness_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IV: Duration = Duration::from_millis(1);

    /// Arrivals at their send time plus 100 µs, in the order given.
    fn record(epoch: Instant, seqs: &[u64]) -> Vec<(u64, Instant)> {
        seqs.iter()
            .map(|&s| (s, epoch + IV * s as u32 + Duration::from_micros(100)))
            .collect()
    }

    #[test]
    fn a_clean_stream_has_no_gap() {
        let e = Instant::now();
        let seqs: Vec<u64> = (0..100).collect();
        let r = analyze(&record(e, &seqs), 100, IV, e);
        assert_eq!((r.sent, r.received, r.lost), (100, 100, 0));
        assert_eq!((r.duplicates, r.reordered), (0, 0));
        assert!(r.gaps.is_empty());
        assert_eq!(r.max_gap_ms, 0.0);
    }

    #[test]
    fn an_interior_gap_is_measured_between_the_datagrams_around_it() {
        let e = Instant::now();
        let seqs: Vec<u64> = (0..10).chain(25..40).collect();
        let r = analyze(&record(e, &seqs), 40, IV, e);
        assert_eq!(r.lost, 15);
        assert_eq!(r.gaps.len(), 1);
        let g = &r.gaps[0];
        assert_eq!(g.after_seq, Some(9));
        assert_eq!(g.lost, 15);
        assert!((g.start_ms - 10.0).abs() < 1e-9);
        // 25 − 9 = 16 intervals.
        assert!((g.len_ms - 16.0).abs() < 1e-9);
        assert!((r.max_gap_ms - 16.0).abs() < 1e-9);
        assert!((g.rx_len_ms.unwrap() - 16.0).abs() < 1e-6);
        assert!((g.resumed_rx_ms.unwrap() - 25.1).abs() < 1e-6);
    }

    #[test]
    fn gaps_at_the_ends_count_from_the_start_and_to_the_end() {
        let e = Instant::now();
        let seqs: Vec<u64> = (3..7).collect();
        let r = analyze(&record(e, &seqs), 10, IV, e);
        assert_eq!(r.gaps.len(), 2);
        assert_eq!(r.gaps[0].after_seq, None);
        assert_eq!(r.gaps[0].lost, 3);
        // From the virtual seq −1 to 3.
        assert!((r.gaps[0].len_ms - 4.0).abs() < 1e-9);
        assert_eq!(r.gaps[0].rx_len_ms, None);
        assert_eq!(r.gaps[1].after_seq, Some(6));
        assert_eq!(r.gaps[1].lost, 3);
        // From 6 to the virtual seq 10.
        assert!((r.gaps[1].len_ms - 4.0).abs() < 1e-9);
        assert_eq!(r.gaps[1].resumed_rx_ms, None);
        assert_eq!(r.lost, 6);
    }

    #[test]
    fn nothing_received_is_one_gap_over_the_whole_stream() {
        let e = Instant::now();
        let r = analyze(&[], 50, IV, e);
        assert_eq!(r.gaps.len(), 1);
        assert_eq!(r.lost, 50);
        assert!((r.max_gap_ms - 51.0).abs() < 1e-9);
        let none = analyze(&[], 0, IV, e);
        assert!(none.gaps.is_empty());
    }

    #[test]
    fn duplicates_and_reordering_are_counted_not_lost() {
        let e = Instant::now();
        let r = analyze(&record(e, &[0, 1, 3, 2, 2, 4, 4, 4, 5]), 6, IV, e);
        assert_eq!(r.received, 6);
        assert_eq!(r.lost, 0);
        assert_eq!(r.duplicates, 3);
        assert_eq!(r.reordered, 1);
        assert!(r.gaps.is_empty());
    }

    #[test]
    fn the_largest_of_several_gaps_is_the_loss_window_and_stray_seqs_are_ignored() {
        let e = Instant::now();
        let seqs: Vec<u64> = [0, 1, 2, 5, 6, 20, 21, 22, 999].to_vec();
        let r = analyze(&record(e, &seqs), 23, Duration::from_micros(100), e);
        assert_eq!(r.gaps.len(), 2);
        assert!((r.max_gap_ms - 1.4).abs() < 1e-9);
        assert_eq!(r.largest_gap().unwrap().after_seq, Some(6));
        assert_eq!(r.received, 8);
        let j = r.to_json(1);
        assert_eq!(j["gap_count"], 2);
        assert_eq!(j["gaps"].as_array().unwrap().len(), 1);
    }
}
