//! `yard gateway …`: the VIP pool, endpoints, drains and a node's data-plane stats.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::json;
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, GatewayRequest};
use yard_actors::neigh::parse_mac;
use yard_raft_store::gateway::{Endpoint, EndpointKey, EndpointRecord};

use super::output::Out;

/// Endpoints per command when importing: one Raft entry each (about 0.5 MB), well under the
/// frame limit.
const IMPORT_CHUNK: usize = 20_000;

#[derive(Debug, Subcommand)]
pub enum GatewayCmd {
    /// The VIP pool.
    Vip {
        #[command(subcommand)]
        cmd: VipCmd,
    },
    /// Tenant endpoints: (vni, inner ip) → mac and compute host.
    Endpoint {
        #[command(subcommand)]
        cmd: EndpointCmd,
    },
    /// Move a node's VIPs away (planned maintenance); it gets no new ones until undrained.
    Drain { node: u64 },
    /// Let a drained node take VIPs again.
    Undrain { node: u64 },
    /// The contacted node's data plane: lease, VIPs served, XDP counters.
    Stats,
}

#[derive(Debug, Subcommand)]
pub enum VipCmd {
    /// Add VIPs to the pool (the leader places them).
    Add {
        #[arg(required = true)]
        vips: Vec<Ipv4Addr>,
    },
    /// Remove VIPs from the pool.
    Remove {
        #[arg(required = true)]
        vips: Vec<Ipv4Addr>,
    },
    /// Every VIP and its owner.
    List,
}

#[derive(Debug, Subcommand)]
pub enum EndpointCmd {
    /// Add or replace one endpoint.
    Add {
        #[arg(long)]
        vni: u32,
        #[arg(long)]
        ip: Ipv4Addr,
        #[arg(long, value_parser = mac_arg)]
        mac: [u8; 6],
        #[arg(long)]
        host: Ipv4Addr,
    },
    /// Remove one endpoint.
    Remove {
        #[arg(long)]
        vni: u32,
        #[arg(long)]
        ip: Ipv4Addr,
    },
    /// Every endpoint.
    List,
    /// Add endpoints from FILE, one per line: `VNI IP MAC HOST` (`#` starts a comment).
    Import { file: PathBuf },
}

fn mac_arg(s: &str) -> Result<[u8; 6], String> {
    parse_mac(s).ok_or_else(|| format!("{s:?} is not a mac address like 02:00:00:00:00:01"))
}

fn mac_str(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses an import file; the first bad line is named.
pub fn parse_endpoints(text: &str) -> anyhow::Result<Vec<Endpoint>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = (|| {
            let [vni, ip, mac, host] = f[..] else {
                return None;
            };
            Some(Endpoint {
                key: EndpointKey {
                    vni: vni.parse().ok()?,
                    ip: ip.parse().ok()?,
                },
                record: EndpointRecord {
                    mac: parse_mac(mac)?,
                    host: host.parse().ok()?,
                },
            })
        })();
        match parsed {
            Some(ep) => out.push(ep),
            None => bail!("line {} is not `VNI IP MAC HOST`: {line:?}", n + 1),
        }
    }
    Ok(out)
}

pub async fn run(client: &AdminClient, cmd: &GatewayCmd, out: Out) -> anyhow::Result<ExitCode> {
    let req = match cmd {
        GatewayCmd::Vip { cmd } => match cmd {
            VipCmd::Add { vips } => GatewayRequest::AddVips(vips.clone()),
            VipCmd::Remove { vips } => GatewayRequest::RemoveVips(vips.clone()),
            VipCmd::List => GatewayRequest::ListVips,
        },
        GatewayCmd::Endpoint { cmd } => match cmd {
            EndpointCmd::Add { vni, ip, mac, host } => {
                GatewayRequest::PutEndpoints(vec![Endpoint {
                    key: EndpointKey { vni: *vni, ip: *ip },
                    record: EndpointRecord {
                        mac: *mac,
                        host: *host,
                    },
                }])
            }
            EndpointCmd::Remove { vni, ip } => {
                GatewayRequest::RemoveEndpoints(vec![EndpointKey { vni: *vni, ip: *ip }])
            }
            EndpointCmd::List => GatewayRequest::ListEndpoints,
            EndpointCmd::Import { file } => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                let eps = parse_endpoints(&text)
                    .with_context(|| format!("{} is not an endpoint list", file.display()))?;
                let mut revision = 0;
                for chunk in eps.chunks(IMPORT_CHUNK) {
                    let reply = client
                        .admin(AdminRequest::Gateway(GatewayRequest::PutEndpoints(
                            chunk.to_vec(),
                        )))
                        .await?;
                    if let AdminReply::Written { revision: r } = reply {
                        revision = r;
                    }
                }
                out.line(json!({"imported": eps.len(), "revision": revision}), || {
                    format!("imported {} endpoints (revision {revision})", eps.len())
                });
                return Ok(ExitCode::SUCCESS);
            }
        },
        GatewayCmd::Drain { node } => GatewayRequest::SetDrain {
            node: *node,
            draining: true,
        },
        GatewayCmd::Undrain { node } => GatewayRequest::SetDrain {
            node: *node,
            draining: false,
        },
        GatewayCmd::Stats => GatewayRequest::Stats,
    };
    let reply = client.admin(AdminRequest::Gateway(req)).await?;
    render(reply, out);
    Ok(ExitCode::SUCCESS)
}

fn render(reply: AdminReply, out: Out) {
    match reply {
        AdminReply::Vips(rows) => {
            let v: Vec<_> = rows
                .iter()
                .map(|r| json!({"vip": r.vip, "owner": r.owner, "handoff_to": r.handoff_to}))
                .collect();
            out.line(serde_json::Value::Array(v), || {
                let mut t = String::from("VIP              OWNER  HANDOFF");
                for r in &rows {
                    t.push_str(&format!(
                        "\n{:<16} {:<6} {}",
                        r.vip,
                        r.owner.map_or("-".into(), |o| o.to_string()),
                        r.handoff_to.map_or("-".into(), |o| format!("→ {o}"))
                    ));
                }
                t
            });
        }
        AdminReply::Endpoints(eps) => {
            let v: Vec<_> = eps
                .iter()
                .map(|e| {
                    json!({"vni": e.key.vni, "ip": e.key.ip, "mac": mac_str(&e.record.mac), "host": e.record.host})
                })
                .collect();
            out.line(serde_json::Value::Array(v), || {
                let mut t = String::from("VNI       IP               MAC                HOST");
                for e in &eps {
                    t.push_str(&format!(
                        "\n{:<9} {:<16} {:<18} {}",
                        e.key.vni,
                        e.key.ip,
                        mac_str(&e.record.mac),
                        e.record.host
                    ));
                }
                t
            });
        }
        AdminReply::GatewayStats(s) => {
            let counters: serde_json::Map<String, serde_json::Value> = s
                .counters
                .iter()
                .map(|(n, p, b)| (n.clone(), json!({"packets": p, "bytes": b})))
                .collect();
            let vips: Vec<_> = s
                .vips
                .iter()
                .map(|(v, m)| {
                    let since = s.owned_since.iter().find(|o| o.0 == *v).map(|o| o.1);
                    json!({"vip": v, "mode": m, "answering_since_ms": since})
                })
                .collect();
            out.line(
                json!({"node": s.node, "enabled": s.enabled, "lease_remaining_ms": s.lease_remaining_ms,
                       "fenced": s.fenced, "now_ms": s.now_ms, "vips": vips, "endpoints": s.endpoints,
                       "revision": s.revision, "counters": counters, "errors": s.errors}),
                || {
                    if !s.enabled {
                        return format!("node {}: the gateway is not enabled here", s.node);
                    }
                    let mut t = format!(
                        "node {}  lease {}  endpoints {}  revision {}\n",
                        s.node,
                        if s.fenced {
                            "lapsed".to_owned()
                        } else {
                            format!("{} ms left", s.lease_remaining_ms)
                        },
                        s.endpoints,
                        s.revision
                    );
                    for (v, m) in &s.vips {
                        t.push_str(&format!("vip {v} {m}\n"));
                    }
                    for (n, p, b) in &s.counters {
                        t.push_str(&format!("{n:<22} {p:>12} packets {b:>14} bytes\n"));
                    }
                    t.trim_end().to_owned()
                },
            );
        }
        AdminReply::Written { revision } => out.line(json!({"revision": revision}), || {
            format!("revision {revision}")
        }),
        other => out.line(json!({"reply": format!("{other:?}")}), || {
            format!("{other:?}")
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_names_the_bad_line() {
        let eps =
            parse_endpoints("# vni ip mac host\n100 198.19.1.1 02:00:00:00:00:01 198.18.0.4\n\n")
                .unwrap();
        assert_eq!(eps.len(), 1);
        let err = parse_endpoints("100 198.19.1.1 02:00:00:00:00:01 198.18.0.4\n7 nope\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
