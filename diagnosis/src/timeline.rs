//! The timeline picture (`yard diagnose --svg FILE`): one row per rank, a bar per op from its
//! enqueue to its end, so an operator sees at a glance which rank never arrived or never
//! finished.
//!
//! Hosts' clocks are skewed, so each rank's times are drawn from that rank's own first event in
//! the window; bars of different rows line up by order, not by absolute time. The caption says
//! so, to keep anyone from reading a cross-rank delay off the picture.

use crate::event::{Coll, Member, Op, Phase, Rank};
use crate::verdict::Verdict;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

/// At most this many rows; culprits are always among them.
pub const MAX_ROWS: usize = 16;

const WIDTH: f64 = 960.0;
const LABEL_W: f64 = 190.0;
const RIGHT_PAD: f64 = 20.0;
const TOP: f64 = 56.0;
const ROW_H: f64 = 26.0;
const BAR_H: f64 = 16.0;

/// The ranked candidates an undecided verdict lists in its evidence ("candidate 1 of 3: rank 5
/// …", as the analyzer writes them), best first, each once.
pub fn candidates(verdict: &Verdict) -> Vec<Rank> {
    let mut out: Vec<Rank> = Vec::new();
    for e in &verdict.evidence {
        let Some(rest) = e.strip_prefix("candidate ") else {
            continue;
        };
        let Some((_, after)) = rest.split_once(": rank ") else {
            continue;
        };
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(r) = digits.parse::<Rank>() {
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// Renders a self-contained SVG of `colls`, with rows labelled from `members`, the `verdict`'s
/// culprits highlighted and, for a verdict that names no culprit, its ranked candidates
/// marked (so an undecided verdict still shows where to look). Any input, including none,
/// gives a well-formed document.
pub fn render_svg(verdict: Option<&Verdict>, colls: &[Coll], members: &[Member]) -> String {
    let culprits: BTreeSet<Rank> = verdict
        .map(|v| v.culprits.iter().copied().collect())
        .unwrap_or_default();
    let ranked: Vec<Rank> = verdict
        .map(candidates)
        .unwrap_or_default()
        .into_iter()
        .filter(|r| !culprits.contains(r))
        .collect();
    let all_ranks: BTreeSet<Rank> = colls
        .iter()
        .map(|c| c.rank)
        .chain(members.iter().map(|m| m.rank))
        .chain(culprits.iter().copied())
        .chain(ranked.iter().copied())
        .collect();
    let rows = pick_rows(&all_ranks, &culprits, &ranked);
    let hosts: HashMap<Rank, &str> = members.iter().map(|m| (m.rank, m.host.as_str())).collect();
    let bars = bars(colls);

    // Each rank's clock starts at its own first event; the widest rank sets the scale.
    let mut first: HashMap<Rank, u64> = HashMap::new();
    let mut last: HashMap<Rank, u64> = HashMap::new();
    for c in colls {
        let f = first.entry(c.rank).or_insert(c.t_ns);
        *f = (*f).min(c.t_ns);
        let l = last.entry(c.rank).or_insert(c.t_ns);
        *l = (*l).max(c.t_ns);
    }
    let span = rows
        .iter()
        .filter_map(|r| Some(last.get(r)? - first.get(r)?))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let plot_w = WIDTH - LABEL_W - RIGHT_PAD;
    let x_of = |rank: Rank, t: u64| {
        let t0 = first.get(&rank).copied().unwrap_or(t);
        LABEL_W + plot_w * (t.saturating_sub(t0) as f64 / span) * 0.9
    };

    let height = TOP + ROW_H * rows.len().max(1) as f64 + 50.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="12">"##
    );
    let _ = writeln!(
        svg,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<text x="10" y="24" font-size="15" font-weight="bold">{}</text>"##,
        escape(&title(verdict))
    );

    for (i, &rank) in rows.iter().enumerate() {
        let y = TOP + ROW_H * i as f64;
        let culprit = culprits.contains(&rank);
        let candidate = ranked.iter().position(|&r| r == rank);
        let (class, fill) = if culprit {
            ("row culprit", "#fde0dc")
        } else if candidate.is_some() {
            ("row candidate", "#fff3cd")
        } else if i.is_multiple_of(2) {
            ("row", "#f6f6f6")
        } else {
            ("row", "#ffffff")
        };
        let _ = writeln!(
            svg,
            r##"<rect class="{class}" x="0" y="{y}" width="{WIDTH}" height="{ROW_H}" fill="{fill}"/>"##
        );
        let mut label = match hosts.get(&rank).filter(|h| !h.is_empty()) {
            Some(host) => format!("rank {rank} ({host})"),
            None => format!("rank {rank}"),
        };
        if let Some(k) = candidate {
            let _ = write!(label, " cand. {}", k + 1);
        }
        let weight = if culprit || candidate == Some(0) {
            "bold"
        } else {
            "normal"
        };
        let colour = if culprit {
            "#b71c1c"
        } else if candidate.is_some() {
            "#8a5a00"
        } else {
            "#222222"
        };
        let _ = writeln!(
            svg,
            r##"<text x="8" y="{}" font-weight="{weight}" fill="{colour}">{}</text>"##,
            y + ROW_H * 0.65,
            escape(&label)
        );
        for bar in bars.iter().filter(|b| b.rank == rank) {
            let x0 = x_of(rank, bar.start);
            let x1 = bar
                .end
                .map_or(WIDTH - RIGHT_PAD, |end| x_of(rank, end).max(x0 + 2.0));
            let open = bar.end.is_none();
            let _ = writeln!(
                svg,
                r##"<rect class="bar{}" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{BAR_H}" fill="{}" stroke="{}" stroke-dasharray="{}"><title>{}</title></rect>"##,
                if open { " open" } else { "" },
                y + (ROW_H - BAR_H) / 2.0,
                x1 - x0,
                op_colour(bar.op),
                if open { "#000000" } else { "none" },
                if open { "4 2" } else { "none" },
                escape(&format!(
                    "{} pg {} seq {}{}",
                    bar.op,
                    bar.pg,
                    bar.seq,
                    if open { " (not finished)" } else { "" }
                ))
            );
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#000000">{}</text>"##,
                x0 + 2.0,
                y + ROW_H * 0.62,
                bar.seq
            );
        }
    }

    let mut caption = String::from(
        "x: time since each rank's own first event in the window (host clocks are not synchronised); dashed bars have not finished",
    );
    if !ranked.is_empty() {
        caption.push_str("; amber rows: the verdict's ranked candidates (its evidence says why)");
    }
    if all_ranks.len() > rows.len() {
        let _ = write!(
            caption,
            "; {} of {} ranks shown",
            rows.len(),
            all_ranks.len()
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="10" y="{:.1}" font-size="11" fill="#555555">{}</text>"##,
        height - 18.0,
        escape(&caption)
    );
    svg.push_str("</svg>\n");
    svg
}

/// Culprits first, then candidates (best first), then the lowest other ranks, up to
/// [`MAX_ROWS`], in rank order.
fn pick_rows(all: &BTreeSet<Rank>, culprits: &BTreeSet<Rank>, ranked: &[Rank]) -> Vec<Rank> {
    let mut rows: BTreeSet<Rank> = culprits.iter().copied().take(MAX_ROWS).collect();
    for &r in ranked.iter().chain(all) {
        if rows.len() >= MAX_ROWS {
            break;
        }
        rows.insert(r);
    }
    rows.into_iter().collect()
}

struct Bar {
    rank: Rank,
    pg: String,
    seq: u64,
    op: Op,
    start: u64,
    end: Option<u64>,
}

/// One bar per (rank, group, seq, op): from the earliest phase seen to the `End`, if any.
fn bars(colls: &[Coll]) -> Vec<Bar> {
    /// (rank, group, seq, op) → (start, end).
    type Spans<'a> = BTreeMap<(Rank, &'a str, u64, Op), (u64, Option<u64>)>;
    let mut by_op: Spans = BTreeMap::new();
    for c in colls {
        let slot = by_op
            .entry((c.rank, &*c.pg, c.seq, c.op))
            .or_insert((c.t_ns, None));
        slot.0 = slot.0.min(c.t_ns);
        if c.phase == Phase::End {
            slot.1 = Some(slot.1.map_or(c.t_ns, |e: u64| e.max(c.t_ns)));
        }
    }
    by_op
        .into_iter()
        .map(|((rank, pg, seq, op), (start, end))| Bar {
            rank,
            pg: pg.to_string(),
            seq,
            op,
            start,
            end,
        })
        .collect()
}

fn title(verdict: Option<&Verdict>) -> String {
    let Some(v) = verdict else {
        return "collective timeline (no verdict)".to_string();
    };
    let mut t = format!("{} / {}", v.class, v.subtype);
    if let Some(pg) = &v.pg {
        let _ = write!(t, " - pg {}", pg.name);
    }
    if let Some(seq) = v.seq {
        let _ = write!(t, " seq {seq}");
    }
    if let Some(op) = v.op {
        let _ = write!(t, " {op}");
    }
    if !v.culprits.is_empty() {
        let ranks: Vec<String> = v.culprits.iter().map(|r| r.to_string()).collect();
        let _ = write!(t, " - culprits: {}", ranks.join(", "));
    } else {
        let ranked = candidates(v);
        if !ranked.is_empty() {
            let shown: Vec<String> = ranked.iter().take(8).map(|r| r.to_string()).collect();
            let _ = write!(
                t,
                " - candidates: {}{}",
                shown.join(", "),
                if ranked.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            );
        }
    }
    t
}

fn op_colour(op: Op) -> &'static str {
    match op {
        Op::AllReduce => "#4e79a7",
        Op::AllGather => "#59a14f",
        Op::ReduceScatter => "#f28e2b",
        Op::Broadcast => "#76b7b2",
        Op::Reduce => "#edc948",
        Op::AllToAll => "#b07aa1",
        Op::Barrier => "#9c755f",
        Op::Send => "#ff9da7",
        Op::Recv => "#e15759",
        Op::Gather | Op::Scatter => "#bab0ac",
        Op::Coalesced => "#86bcb6",
        Op::Other => "#cccccc",
    }
}

/// Escapes text for XML content and attribute values.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Dtype;
    use crate::verdict::{Class, PgRef, Subtype};
    use std::sync::Arc;

    /// Checks that every tag opened is closed in order, and returns the element names seen.
    fn balanced(svg: &str) -> Vec<String> {
        let mut stack: Vec<String> = Vec::new();
        let mut seen = Vec::new();
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let close = rest[open..].find('>').expect("unterminated tag") + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
            } else {
                let name = tag.split_whitespace().next().unwrap_or("").to_string();
                seen.push(name.clone());
                if !tag.ends_with('/') {
                    stack.push(name);
                }
            }
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        seen
    }

    fn coll(rank: Rank, seq: u64, phase: Phase, t_ns: u64) -> Coll {
        Coll {
            rank,
            pg: Arc::from("0"),
            seq,
            op: Op::AllReduce,
            dtype: Dtype::Float32,
            count: 1,
            bytes: 4,
            out_count: 0,
            peer: None,
            phase,
            t_ns,
        }
    }

    fn member(rank: Rank, host: &str) -> Member {
        Member {
            rank,
            world_size: 3,
            host: host.to_string(),
            addr: String::new(),
            nic: String::new(),
            switch: String::new(),
            pid: 1,
        }
    }

    #[test]
    fn draws_a_row_per_rank_and_highlights_the_culprit() {
        let colls = vec![
            coll(0, 7, Phase::Enqueue, 1_000),
            coll(0, 7, Phase::End, 5_000),
            coll(0, 8, Phase::Enqueue, 6_000),
            coll(1, 7, Phase::Enqueue, 900_000),
            coll(1, 7, Phase::End, 904_000),
            coll(1, 8, Phase::Enqueue, 905_000),
            coll(2, 7, Phase::Enqueue, 50),
            coll(2, 7, Phase::End, 4_050),
        ];
        let members = vec![member(0, "h0"), member(1, "h1"), member(2, "h<2>&co")];
        let verdict = Verdict {
            class: Class::Hang,
            subtype: Subtype::MissingParticipant,
            culprits: vec![2],
            links: vec![],
            pg: Some(PgRef {
                name: "0".into(),
                ranks: vec![0, 1, 2],
            }),
            seq: Some(8),
            op: Some(Op::AllReduce),
            evidence: vec![],
            confidence: 0.9,
            detected_ns: 0,
        };
        let svg = render_svg(Some(&verdict), &colls, &members);
        let tags = balanced(&svg);
        assert_eq!(tags.first().map(String::as_str), Some("svg"));
        assert!(svg.contains(">rank 0 (h0)<"));
        assert!(svg.contains(">rank 1 (h1)<"));
        assert!(svg.contains("rank 2 (h&lt;2&gt;&amp;co)"), "host escaped");
        assert_eq!(svg.matches("class=\"row culprit\"").count(), 1);
        assert_eq!(svg.matches("class=\"row").count(), 3);
        assert!(svg.contains("hang / missing_participant - pg 0 seq 8 all_reduce"));
        // Seq 8 never ended on ranks 0 and 1: two open bars; five bars in all.
        assert_eq!(svg.matches("class=\"bar open\"").count(), 2);
        assert_eq!(svg.matches("class=\"bar").count(), 5);
        assert!(svg.contains("not synchronised"));
    }

    /// An undecided verdict names nobody, but its ranked candidates are shown: their rows
    /// are marked (best first in the title) and always drawn, however many ranks there are.
    #[test]
    fn an_undecided_verdict_shows_its_candidates() {
        let colls: Vec<Coll> = (0..40).map(|r| coll(r, 1, Phase::Enqueue, 10)).collect();
        let verdict = Verdict {
            class: Class::Hang,
            subtype: Subtype::Undecided,
            culprits: vec![],
            links: vec![],
            pg: None,
            seq: Some(1),
            op: Some(Op::AllReduce),
            evidence: vec![
                "12 streams are stuck".into(),
                "candidate 1 of 2: rank 37 (weight 5): in pg 0: its all_reduce #1 was enqueued but never started".into(),
                "candidate 2 of 2: rank 21 (weight 1): in pg 0 (p2p): its pending send with rank 5 has no matching recv".into(),
            ],
            confidence: 0.2,
            detected_ns: 0,
        };
        assert_eq!(candidates(&verdict), vec![37, 21]);
        let svg = render_svg(Some(&verdict), &colls, &[]);
        balanced(&svg);
        assert_eq!(svg.matches("class=\"row candidate\"").count(), 2);
        assert!(svg.contains(">rank 37 cand. 1<"), "{svg}");
        assert!(svg.contains(">rank 21 cand. 2<"));
        assert!(svg.contains("hang / undecided seq 1 all_reduce - candidates: 37, 21"));
        assert!(svg.contains("amber rows"));
        assert_eq!(svg.matches("class=\"row culprit\"").count(), 0);
    }

    #[test]
    fn empty_input_is_a_valid_picture() {
        let svg = render_svg(None, &[], &[]);
        balanced(&svg);
        assert!(svg.contains("no verdict"));
        assert!(!svg.contains("class=\"row"));
    }

    #[test]
    fn rows_are_capped_but_keep_the_culprits() {
        let colls: Vec<Coll> = (0..40).map(|r| coll(r, 1, Phase::Enqueue, 10)).collect();
        let verdict = Verdict {
            class: Class::Slow,
            subtype: Subtype::ComputeStraggler,
            culprits: vec![33],
            links: vec![],
            pg: None,
            seq: None,
            op: None,
            evidence: vec![],
            confidence: 0.5,
            detected_ns: 0,
        };
        let svg = render_svg(Some(&verdict), &colls, &[]);
        balanced(&svg);
        assert_eq!(svg.matches("class=\"row").count(), MAX_ROWS);
        assert!(svg.contains(">rank 33<"));
        assert!(svg.contains("16 of 40 ranks shown"));
    }
}
