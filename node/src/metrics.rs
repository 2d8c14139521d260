//! Prometheus metrics through the `prometheus` client library: the process's counters and
//! latency histograms live in a registry, and gauges read from live state (openraft, the
//! actors' views, the replicated tables) are turned into metric families at scrape time, so a
//! scrape always shows the state as it is and nothing has to push gauges on every change.
//!
//! The exposition itself is the library's text encoder; [`crate::http`] serves it.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    exponential_buckets, CounterVec, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    Opts, Registry, TextEncoder,
};

/// A monotonically increasing counter (`inc`, `get`).
pub type Counter = IntCounter;

/// Why a scrape could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metric family {name} has a malformed label set {labels:?}")]
    Labels { name: String, labels: String },
    #[error("metric family {name} has the unknown kind {kind:?}")]
    Kind { name: String, kind: String },
    #[error("metric family {name} is not valid: {source}")]
    Family {
        name: String,
        source: prometheus::Error,
    },
    #[error("the exposition cannot be encoded: {0}")]
    Encode(prometheus::Error),
}

/// The phases of a gateway failover that the leader times (see `gateway_control`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverPhase {
    /// From the leader seeing a node's lease lapse to the moment a majority of voters is
    /// certain to refuse that node (its VIPs may move from then on).
    Fence,
    /// From proposing a placement (VIPs to new owners) to its commit.
    Placement,
}

impl FailoverPhase {
    pub const ALL: [Self; 2] = [Self::Fence, Self::Placement];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fence => "fence",
            Self::Placement => "placement",
        }
    }
}

/// Every counter and histogram the node keeps, registered in a registry of their own.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub rpc_sent: Counter,
    pub rpc_failed: Counter,
    pub rpc_served: Counter,
    pub frame_errors: Counter,
    pub handshake_failed: Counter,
    pub requests_refused: Counter,
    pub kv_writes: Counter,
    pub kv_reads: Counter,
    pub forwarded: Counter,
    pub forward_retries: Counter,
    pub liveness_probes: Counter,
    pub liveness_probe_failures: Counter,
    pub gateway_renewals: Counter,
    pub gateway_placements: Counter,
    /// A put served by this node, from its arrival to the reply (forwards included).
    pub put_latency: Histogram,
    /// One forward of a request to the leader, from sending it to its outcome.
    pub forward_latency: Histogram,
    /// Gateway failover phases timed by the leader, by `phase` ([`FailoverPhase`]).
    pub failover_phase: HistogramVec,
    /// One analyzer pass over every job on the leader.
    pub analyzer_pass: Histogram,
    /// On an agent: from a session-tagged write's proposal (the proposer's wall clock, in the
    /// entry) to its apply in this agent's tables. Hosts share no clock in general; on one
    /// machine (the benchmarks) they do, and NTP-synced hosts are within milliseconds.
    pub watch_visible: Histogram,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics in a registry of its own (the process uses [`METRICS`]).
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("a counter's name and help are valid");
            registry
                .register(Box::new(c.clone()))
                .expect("each counter is registered once");
            c
        };
        // Latencies from 100 µs (a put on an idle leader) to about 6.5 s (a forward that
        // waits out an election).
        let latency_buckets =
            exponential_buckets(0.0001, 2.0, 17).expect("the latency buckets are valid");
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("a histogram's name, help and buckets are valid");
            registry
                .register(Box::new(h.clone()))
                .expect("each histogram is registered once");
            h
        };
        let failover_phase = HistogramVec::new(
            HistogramOpts::new(
                "yard_gateway_failover_phase_duration_seconds",
                "gateway failover phases timed by the leader: fence (lease lapsed to fenced at a majority), placement (placement proposed to committed)",
            )
            // 1 ms to about 65 s: a fence waits out a lease, which is configurable up to minutes.
            .buckets(exponential_buckets(0.001, 2.0, 17).expect("the phase buckets are valid")),
            &["phase"],
        )
        .expect("the failover histogram is valid");
        registry
            .register(Box::new(failover_phase.clone()))
            .expect("the failover histogram is registered once");
        // Every phase is exported from the start, so a dashboard shows zeros rather than
        // nothing on a node that has not seen a failover.
        for phase in FailoverPhase::ALL {
            failover_phase.with_label_values(&[phase.as_str()]);
        }
        Self {
            rpc_sent: counter("yard_transport_rpc_sent_total", "requests sent to peers"),
            rpc_failed: counter(
                "yard_transport_rpc_failed_total",
                "requests to peers that failed or timed out",
            ),
            rpc_served: counter("yard_transport_rpc_served_total", "request streams served"),
            frame_errors: counter(
                "yard_transport_frame_errors_total",
                "malformed, truncated or oversize frames refused",
            ),
            handshake_failed: counter(
                "yard_transport_handshake_failed_total",
                "connections refused during the TLS handshake",
            ),
            requests_refused: counter(
                "yard_requests_refused_total",
                "requests and connections refused for the peer's role or a transport limit",
            ),
            kv_writes: counter("yard_kv_writes_total", "kv writes accepted by this node"),
            kv_reads: counter("yard_kv_reads_total", "kv reads served by this node"),
            forwarded: counter("yard_forwarded_total", "requests forwarded to the leader"),
            forward_retries: counter(
                "yard_forward_retries_total",
                "forwarded reads and session-tagged writes sent again after a leader change or an unknown outcome",
            ),
            liveness_probes: counter("yard_liveness_probes_total", "liveness probes sent"),
            liveness_probe_failures: counter(
                "yard_liveness_probe_failures_total",
                "liveness probes that failed",
            ),
            gateway_renewals: counter(
                "yard_gateway_lease_renewals_total",
                "gateway lease renewals granted by this node as leader",
            ),
            gateway_placements: counter(
                "yard_gateway_placements_total",
                "gateway placement commands committed by this node as leader",
            ),
            put_latency: histogram(
                "yard_kv_put_duration_seconds",
                "kv puts served by this node, arrival to reply, forwarded ones included",
                latency_buckets.clone(),
            ),
            forward_latency: histogram(
                "yard_forward_duration_seconds",
                "requests this node forwarded to the leader, send to outcome",
                latency_buckets,
            ),
            analyzer_pass: histogram(
                "yard_analyzer_pass_duration_seconds",
                "one analyzer pass over every watched job on the leader",
                // 10 µs to about 1.3 s: a pass is in-memory work over the jobs' windows.
                exponential_buckets(0.00001, 2.0, 18).expect("the analyzer buckets are valid"),
            ),
            watch_visible: histogram(
                "yard_watch_visible_seconds",
                "on an agent: a session-tagged write's proposal on the leader to its apply here (wall clocks)",
                vec![
                    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
                    0.15, 0.25, 0.5, 1.0, 2.5,
                ],
            ),
            failover_phase,
            registry,
        }
    }

    /// Records one failover phase's duration.
    pub fn observe_failover(&self, phase: FailoverPhase, took: Duration) {
        self.failover_phase
            .with_label_values(&[phase.as_str()])
            .observe(took.as_secs_f64());
    }

    /// The registry's families plus `gauges`' families, sorted by name.
    ///
    /// A live family that cannot be turned into a metric family (a bug in its source) is
    /// logged and left out, so one bad family never costs the whole scrape.
    pub fn gather(&self, gauges: &dyn GaugeSource) -> Vec<MetricFamily> {
        let mut families = self.registry.gather();
        for (name, help, value) in gauges.gauges() {
            match gauge_family(name, help, value) {
                Ok(f) => families.extend(f),
                Err(e) => tracing::warn!(error = %e, "metric left out of the scrape"),
            }
        }
        for family in gauges.families() {
            match family.to_metric_families() {
                Ok(f) => families.extend(f),
                Err(e) => tracing::warn!(error = %e, "metric left out of the scrape"),
            }
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        families
    }

    /// The text exposition of [`gather`](Self::gather).
    pub fn render(&self, gauges: &dyn GaugeSource) -> Result<String, MetricsError> {
        TextEncoder::new()
            .encode_to_string(&self.gather(gauges))
            .map_err(MetricsError::Encode)
    }
}

/// The process's exposition: [`METRICS`] plus `gauges`.
pub fn render(gauges: &dyn GaugeSource) -> Result<String, MetricsError> {
    METRICS.render(gauges)
}

/// The content type of the text exposition.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Gauges that a scrape reads from live state.
pub trait GaugeSource: Send + Sync + 'static {
    /// `(name, help, value)` triples.
    fn gauges(&self) -> Vec<(&'static str, &'static str, f64)>;

    /// Labelled families (e.g. one XDP counter per reason); none by default.
    fn families(&self) -> Vec<Family> {
        Vec::new()
    }
}

/// No live gauges: the registry alone.
#[derive(Debug, Default)]
pub struct NoGauges;

impl GaugeSource for NoGauges {
    fn gauges(&self) -> Vec<(&'static str, &'static str, f64)> {
        Vec::new()
    }
}

/// A metric family with labelled samples, read at scrape time.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// (label set as written in the exposition, without braces, e.g. `reason="forwarded"` or
    /// `job="j",class="hang"`, with values escaped as the exposition escapes them; value)
    pub samples: Vec<(String, f64)>,
}

impl Family {
    /// The family as the client library's metric families (none when it has no samples).
    pub fn to_metric_families(&self) -> Result<Vec<MetricFamily>, MetricsError> {
        let parsed = self
            .samples
            .iter()
            .map(|(labels, v)| {
                parse_labels(labels)
                    .map(|l| (l, *v))
                    .ok_or_else(|| MetricsError::Labels {
                        name: self.name.to_owned(),
                        labels: labels.clone(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let Some((first, _)) = parsed.first() else {
            return Ok(Vec::new());
        };
        let names: Vec<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
        let invalid = |source| MetricsError::Family {
            name: self.name.to_owned(),
            source,
        };
        // Every sample must carry the first sample's label names, in that order.
        let values = |labels: &[(String, String)]| -> Result<Vec<String>, MetricsError> {
            if labels.len() != names.len() || labels.iter().zip(&names).any(|((k, _), n)| k != n) {
                return Err(MetricsError::Labels {
                    name: self.name.to_owned(),
                    labels: labels
                        .iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                });
            }
            Ok(labels.iter().map(|(_, v)| v.clone()).collect())
        };
        let opts = Opts::new(self.name, self.help);
        match self.kind {
            "gauge" => {
                let vec = GaugeVec::new(opts, &names).map_err(invalid)?;
                for (labels, v) in &parsed {
                    let values = values(labels)?;
                    vec.get_metric_with_label_values(&values)
                        .map_err(invalid)?
                        .add(*v);
                }
                Ok(vec.collect())
            }
            "counter" => {
                let vec = CounterVec::new(opts, &names).map_err(invalid)?;
                for (labels, v) in &parsed {
                    let values = values(labels)?;
                    // Counts read from live state are never negative; a counter refuses them.
                    vec.get_metric_with_label_values(&values)
                        .map_err(invalid)?
                        .inc_by(v.max(0.0));
                }
                Ok(vec.collect())
            }
            other => Err(MetricsError::Kind {
                name: self.name.to_owned(),
                kind: other.to_owned(),
            }),
        }
    }
}

fn gauge_family(
    name: &'static str,
    help: &'static str,
    value: f64,
) -> Result<Vec<MetricFamily>, MetricsError> {
    let g = prometheus::Gauge::new(name, help).map_err(|source| MetricsError::Family {
        name: name.to_owned(),
        source,
    })?;
    g.set(value);
    Ok(g.collect())
}

/// Parses `k="v",k2="v2"` (values escaped as in the exposition: `\\`, `\"`, `\n`) into pairs;
/// `None` when malformed. An empty string is no labels.
pub fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let key = key.trim();
        let valid_key = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_key {
            return None;
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    _ => return None,
                },
                (_, c) => value.push(c),
            }
        };
        out.push((key.to_owned(), value));
        rest = after[end + 1..].trim_start();
        if let Some(r) = rest.strip_prefix(',') {
            rest = r.trim_start();
            if rest.is_empty() {
                return None;
            }
        } else if !rest.is_empty() {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl GaugeSource for Fixed {
        fn gauges(&self) -> Vec<(&'static str, &'static str, f64)> {
            vec![("yard_test_gauge", "a test gauge", 2.5)]
        }

        fn families(&self) -> Vec<Family> {
            vec![
                Family {
                    name: "yard_test_reasons_total",
                    help: "by reason",
                    kind: "counter",
                    samples: vec![
                        ("reason=\"pass\"".into(), 3.0),
                        ("reason=\"drop\"".into(), 4.0),
                    ],
                },
                Family {
                    name: "yard_test_jobs",
                    help: "jobs",
                    kind: "gauge",
                    samples: vec![("job=\"a \\\"b\\\"\",class=\"hang\"".into(), 1.0)],
                },
                // A bug in one source costs only its own family.
                Family {
                    name: "yard_test_broken",
                    help: "broken",
                    kind: "gauge",
                    samples: vec![("reason=pass".into(), 1.0)],
                },
                Family {
                    name: "yard_test_empty",
                    help: "no samples",
                    kind: "gauge",
                    samples: vec![],
                },
            ]
        }
    }

    #[test]
    fn labels_parse_with_escapes_or_are_refused() {
        assert_eq!(parse_labels(""), Some(vec![]));
        assert_eq!(
            parse_labels("job=\"a\\\\b\\\"c\\nd\", class=\"hang\""),
            Some(vec![
                ("job".into(), "a\\b\"c\nd".into()),
                ("class".into(), "hang".into())
            ])
        );
        for bad in [
            "reason=pass",
            "reason=\"open",
            "=\"v\"",
            "1x=\"v\"",
            "a=\"v\" b=\"w\"",
            "a=\"v\",",
            "a=\"\\t\"",
        ] {
            assert_eq!(parse_labels(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_exposition_has_counters_histograms_and_live_families() {
        let m = Metrics::new();
        m.kv_writes.inc();
        m.kv_writes.inc();
        m.put_latency.observe(0.003);
        m.observe_failover(FailoverPhase::Fence, Duration::from_millis(1500));
        let text = m.render(&Fixed).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for want in [
            "# TYPE yard_kv_writes_total counter",
            "yard_kv_writes_total 2",
            "yard_transport_frame_errors_total 0",
            "# TYPE yard_kv_put_duration_seconds histogram",
            "yard_kv_put_duration_seconds_bucket{le=\"0.0032\"} 1",
            "yard_kv_put_duration_seconds_bucket{le=\"0.0016\"} 0",
            "yard_kv_put_duration_seconds_bucket{le=\"+Inf\"} 1",
            "yard_kv_put_duration_seconds_count 1",
            "yard_kv_put_duration_seconds_sum 0.003",
            "yard_forward_duration_seconds_count 0",
            "yard_analyzer_pass_duration_seconds_count 0",
            "yard_gateway_failover_phase_duration_seconds_count{phase=\"fence\"} 1",
            "yard_gateway_failover_phase_duration_seconds_count{phase=\"placement\"} 0",
            "# TYPE yard_test_gauge gauge",
            "yard_test_gauge 2.5",
            "# TYPE yard_test_reasons_total counter",
            "yard_test_reasons_total{reason=\"pass\"} 3",
            "yard_test_reasons_total{reason=\"drop\"} 4",
            "yard_test_jobs{class=\"hang\",job=\"a \\\"b\\\"\"} 1",
        ] {
            assert!(lines.contains(&want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("yard_test_broken"), "{text}");
        assert!(!text.contains("yard_test_empty"), "{text}");
    }

    #[test]
    fn an_unknown_kind_is_refused() {
        let f = Family {
            name: "yard_x",
            help: "x",
            kind: "summary",
            samples: vec![("a=\"b\"".into(), 1.0)],
        };
        assert!(matches!(
            f.to_metric_families(),
            Err(MetricsError::Kind { .. })
        ));
    }
}
