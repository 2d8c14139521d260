//! The offline file formats of `yard plan services`.
//!
//! Both are line-oriented text: fields separated by spaces or tabs, `#` starts a comment,
//! blank lines are skipped. Numbers are decimal (`2.5e9` is fine) with an optional SI suffix
//! `k`, `M`, `G` or `T` (powers of 1000): `10G` is 10,000,000,000.
//!
//! **Nodes**, one per line: `ID CAPACITY_BPS CAPACITY_PPS FAIL_PROB`
//! ```text
//! # id  bytes/s  packets/s  P(down)
//! gw1   1.25G    2M         0.01
//! gw2   1.25G    2M         0.002
//! ```
//!
//! **Tenants**, one per line: `ID AVAILABILITY [replicas=K] VIP=BPS,PPS...` — the availability
//! target in [0, 1) (probability that at least one of the tenant's nodes is up), optionally
//! the least number of nodes to spread over (default 2), then at least one VIP with its
//! bytes/s and packets/s.
//! ```text
//! # tenant  availability  VIPs
//! vni-100   0.9999        198.19.0.1=300M,400k 198.19.0.2=20M,30k
//! vni-200   0.99          replicas=3 198.19.1.1=600M,500k
//! ```
//!
//! A bad line is refused with one sentence naming the file and the line.

use std::collections::HashMap;

use thiserror::Error;

use crate::model::{Node, Tenant, Unit, DEFAULT_REPLICAS};

/// A line that cannot be read.
#[derive(Debug, Error, PartialEq)]
#[error("{file} line {line}: {what}")]
pub struct ParseError {
    pub file: String,
    pub line: usize,
    pub what: String,
}

/// A number with an optional SI suffix.
pub fn number(s: &str) -> Option<f64> {
    let (body, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        'G' => (&s[..s.len() - 1], 1e9),
        'T' => (&s[..s.len() - 1], 1e12),
        _ => (s, 1.0),
    };
    let v: f64 = body.parse().ok()?;
    (v.is_finite()).then_some(v * mult)
}

fn lines(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines().enumerate().filter_map(|(i, l)| {
        let l = l.split('#').next().unwrap_or("");
        let fields: Vec<&str> = l.split_whitespace().collect();
        (!fields.is_empty()).then_some((i + 1, fields))
    })
}

/// Parses a nodes file; `file` is how errors name it.
pub fn nodes(file: &str, text: &str) -> Result<Vec<Node>, ParseError> {
    let mut out = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (line, f) in lines(text) {
        let err = |what: String| ParseError {
            file: file.into(),
            line,
            what,
        };
        if f.len() != 4 {
            return Err(err(format!(
                "expected ID CAPACITY_BPS CAPACITY_PPS FAIL_PROB, got {} fields",
                f.len()
            )));
        }
        let positive = |s: &str, what: &str| match number(s) {
            Some(v) if v > 0.0 => Ok(v),
            _ => Err(err(format!("{what} must be a positive number, got {s:?}"))),
        };
        let capacity_bps = positive(f[1], "capacity in bytes/s")?;
        let capacity_pps = positive(f[2], "capacity in packets/s")?;
        let fail_prob = match number(f[3]) {
            Some(p) if (0.0..1.0).contains(&p) => p,
            _ => {
                return Err(err(format!(
                    "failure probability must be a number in [0, 1), got {:?}",
                    f[3]
                )))
            }
        };
        if let Some(first) = seen.insert(f[0].to_owned(), line) {
            return Err(err(format!(
                "node {} is already defined on line {first}",
                f[0]
            )));
        }
        out.push(Node {
            id: f[0].to_owned(),
            capacity_bps,
            capacity_pps,
            fail_prob,
        });
    }
    if out.is_empty() {
        return Err(ParseError {
            file: file.into(),
            line: 0,
            what: "no nodes are defined".into(),
        });
    }
    Ok(out)
}

/// Parses a tenants file; `file` is how errors name it.
pub fn tenants(file: &str, text: &str) -> Result<Vec<Tenant>, ParseError> {
    let mut out = Vec::new();
    let mut tenant_seen: HashMap<String, usize> = HashMap::new();
    let mut vip_seen: HashMap<String, usize> = HashMap::new();
    for (line, f) in lines(text) {
        let err = |what: String| ParseError {
            file: file.into(),
            line,
            what,
        };
        if f.len() < 3 {
            return Err(err(
                "expected ID AVAILABILITY [replicas=K] VIP=BPS,PPS...".into()
            ));
        }
        let availability = match number(f[1]) {
            Some(a) if (0.0..1.0).contains(&a) => a,
            _ => {
                return Err(err(format!(
                    "availability must be a number in [0, 1), got {:?}",
                    f[1]
                )))
            }
        };
        let mut replicas = DEFAULT_REPLICAS;
        let mut units = Vec::new();
        for tok in &f[2..] {
            if let Some(k) = tok.strip_prefix("replicas=") {
                replicas = match k.parse::<usize>() {
                    Ok(k) if k >= 1 => k,
                    _ => {
                        return Err(err(format!(
                            "replicas must be a whole number of at least 1, got {k:?}"
                        )))
                    }
                };
                continue;
            }
            let Some((id, rates)) = tok.split_once('=') else {
                return Err(err(format!("expected VIP=BPS,PPS, got {tok:?}")));
            };
            let Some((b, p)) = rates.split_once(',') else {
                return Err(err(format!("expected VIP=BPS,PPS, got {tok:?}")));
            };
            let (Some(bps), Some(pps)) = (number(b), number(p)) else {
                return Err(err(format!(
                    "VIP {id}'s rates must be numbers, got {rates:?}"
                )));
            };
            if id.is_empty() || bps < 0.0 || pps < 0.0 {
                return Err(err(format!(
                    "expected VIP=BPS,PPS with rates of at least 0, got {tok:?}"
                )));
            }
            if let Some(first) = vip_seen.insert(id.to_owned(), line) {
                return Err(err(format!("VIP {id} is already defined on line {first}")));
            }
            units.push(Unit {
                id: id.to_owned(),
                bps,
                pps,
            });
        }
        if units.is_empty() {
            return Err(err(format!("tenant {} has no VIP", f[0])));
        }
        if let Some(first) = tenant_seen.insert(f[0].to_owned(), line) {
            return Err(err(format!(
                "tenant {} is already defined on line {first}",
                f[0]
            )));
        }
        out.push(Tenant {
            id: f[0].to_owned(),
            availability,
            replicas,
            units,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_documented_examples() {
        let n = nodes(
            "nodes.txt",
            "# id bps pps p\ngw1 1.25G 2M 0.01\n\ngw2 1.25G 2M 0.002 # spare\n",
        )
        .unwrap();
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].capacity_bps, 1.25e9);
        assert_eq!(n[1].capacity_pps, 2e6);
        assert_eq!(n[1].fail_prob, 0.002);
        let t = tenants(
            "tenants.txt",
            "vni-100 0.9999 198.19.0.1=300M,400k 198.19.0.2=20M,30k\nvni-200 0.99 replicas=3 198.19.1.1=600M,500k\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].replicas, DEFAULT_REPLICAS);
        assert_eq!(t[0].units[1].bps, 20e6);
        assert_eq!(t[1].replicas, 3);
        assert_eq!(t[1].units[0].pps, 500e3);
    }

    fn node_err(text: &str) -> String {
        nodes("nodes.txt", text).unwrap_err().to_string()
    }

    fn tenant_err(text: &str) -> String {
        tenants("tenants.txt", text).unwrap_err().to_string()
    }

    #[test]
    fn a_bad_node_line_is_named() {
        assert_eq!(
            node_err("gw1 1G 1M 0.1\ngw2 1G 1M\n"),
            "nodes.txt line 2: expected ID CAPACITY_BPS CAPACITY_PPS FAIL_PROB, got 3 fields"
        );
        assert_eq!(
            node_err("# c\n\ngw1 -1G 1M 0.1\n"),
            "nodes.txt line 3: capacity in bytes/s must be a positive number, got \"-1G\""
        );
        assert_eq!(
            node_err("gw1 1G 1M 1.0\n"),
            "nodes.txt line 1: failure probability must be a number in [0, 1), got \"1.0\""
        );
        assert_eq!(
            node_err("gw1 1G 1M 0.1\ngw1 1G 1M 0.1\n"),
            "nodes.txt line 2: node gw1 is already defined on line 1"
        );
        assert_eq!(
            node_err("# nothing\n"),
            "nodes.txt line 0: no nodes are defined"
        );
    }

    #[test]
    fn a_bad_tenant_line_is_named() {
        assert_eq!(
            tenant_err("t1 0.99 a=1,1\nt2 1.5 b=1,1\n"),
            "tenants.txt line 2: availability must be a number in [0, 1), got \"1.5\""
        );
        assert_eq!(
            tenant_err("t1 0.99 a=1G\n"),
            "tenants.txt line 1: expected VIP=BPS,PPS, got \"a=1G\""
        );
        assert_eq!(
            tenant_err("t1 0.99 a=1x,2\n"),
            "tenants.txt line 1: VIP a's rates must be numbers, got \"1x,2\""
        );
        assert_eq!(
            tenant_err("t1 0.99 replicas=0 a=1,1\n"),
            "tenants.txt line 1: replicas must be a whole number of at least 1, got \"0\""
        );
        assert_eq!(
            tenant_err("t1 0.99 replicas=2 x\n"),
            "tenants.txt line 1: expected VIP=BPS,PPS, got \"x\""
        );
        assert_eq!(
            tenant_err("t1 0.99 replicas=2\n"),
            "tenants.txt line 1: tenant t1 has no VIP"
        );
        assert_eq!(
            tenant_err("t1 0.99\n"),
            "tenants.txt line 1: expected ID AVAILABILITY [replicas=K] VIP=BPS,PPS..."
        );
        assert_eq!(
            tenant_err("t1 0.99 a=1,1\nt2 0.9 a=2,2\n"),
            "tenants.txt line 2: VIP a is already defined on line 1"
        );
        assert_eq!(
            tenant_err("t1 0.99 a=1,1\nt1 0.9 b=2,2\n"),
            "tenants.txt line 2: tenant t1 is already defined on line 1"
        );
    }
}
