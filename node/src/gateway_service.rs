//! Operators' gateway requests: VIP pool, endpoints, drains (replicated writes), listings
//! (linearizable reads) and this node's data-plane stats (local).

use std::net::Ipv4Addr;

use yard_actors::gateway::core::Serve;
use yard_raft_store::gateway::{Endpoint, GatewayCommand, MAX_VNI};
use yard_raft_store::Command;

use crate::rpc::{AdminReply, AdminRequest, GatewayRequest, GatewayStats, Reply, VipRow};
use crate::service::Node;

/// Why `vip` cannot be a VIP, if it cannot.
pub fn check_vip(vip: Ipv4Addr) -> Result<(), String> {
    if vip.is_unspecified()
        || vip.is_broadcast()
        || vip.is_multicast()
        || vip.is_loopback()
        || vip.is_link_local()
    {
        return Err(format!(
            "{vip} is not a unicast address and cannot be a vip"
        ));
    }
    Ok(())
}

/// Why `ep` cannot be stored, if it cannot.
pub fn check_endpoint(ep: &Endpoint) -> Result<(), String> {
    let k = &ep.key;
    if k.vni == 0 || k.vni > MAX_VNI {
        return Err(format!("vni {} is outside 1..={MAX_VNI}", k.vni));
    }
    if ep.record.mac[0] & 1 == 1 || ep.record.mac == [0; 6] {
        return Err(format!(
            "endpoint {} in vni {} needs a unicast mac",
            k.ip, k.vni
        ));
    }
    check_vip(k.ip).map_err(|_| format!("endpoint address {} is not unicast", k.ip))?;
    check_vip(ep.record.host).map_err(|_| format!("host {} is not unicast", ep.record.host))
}

fn serve_name(s: Serve) -> String {
    match s {
        Serve::Owned => "owned",
        Serve::ForwardOnly => "forward_only",
    }
    .to_owned()
}

impl Node {
    pub(crate) async fn handle_gateway(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        g: &GatewayRequest,
    ) -> Reply {
        let cmd = match g {
            GatewayRequest::AddVips(vips) => {
                if let Some(e) = vips.iter().find_map(|v| check_vip(*v).err()) {
                    return Reply::Error(e);
                }
                GatewayCommand::AddVips(vips.clone())
            }
            GatewayRequest::RemoveVips(vips) => GatewayCommand::RemoveVips(vips.clone()),
            GatewayRequest::PutEndpoints(eps) => {
                if let Some(e) = eps.iter().find_map(|ep| check_endpoint(ep).err()) {
                    return Reply::Error(e);
                }
                GatewayCommand::PutEndpoints(eps.clone())
            }
            GatewayRequest::RemoveEndpoints(keys) => GatewayCommand::RemoveEndpoints(keys.clone()),
            GatewayRequest::SetDrain { node, draining } => {
                if !self.is_host(*node) {
                    return Reply::Error(format!("node {node} is not a member"));
                }
                GatewayCommand::SetDrain {
                    node: *node,
                    draining: *draining,
                }
            }
            GatewayRequest::ListVips => {
                return self
                    .read(forwarded, req, |d| {
                        AdminReply::Vips(
                            d.gateway
                                .vips
                                .iter()
                                .map(|(vip, r)| VipRow {
                                    vip: *vip,
                                    owner: r.owner,
                                    handoff_to: r.handoff_to,
                                })
                                .collect(),
                        )
                    })
                    .await
            }
            GatewayRequest::ListEndpoints => {
                return self
                    .read(forwarded, req, |d| {
                        AdminReply::Endpoints(
                            d.gateway
                                .endpoints
                                .iter()
                                .map(|(key, record)| Endpoint {
                                    key: *key,
                                    record: *record,
                                })
                                .collect(),
                        )
                    })
                    .await
            }
            GatewayRequest::Stats => return Reply::Admin(AdminReply::GatewayStats(self.stats())),
        };
        self.write(forwarded, req, Command::Gateway(cmd)).await
    }

    /// This node's data plane as its gateway actor last published it.
    pub fn stats(&self) -> GatewayStats {
        let Some(view) = self.gateway_view() else {
            return GatewayStats {
                node: self.id(),
                enabled: false,
                lease_remaining_ms: 0,
                fenced: true,
                vips: Vec::new(),
                owned_since: Vec::new(),
                now_ms: 0,
                endpoints: 0,
                revision: 0,
                counters: Vec::new(),
                errors: 0,
            };
        };
        let s = view.snapshot();
        GatewayStats {
            node: self.id(),
            enabled: true,
            lease_remaining_ms: s.lease_remaining_ms,
            fenced: s.fenced,
            vips: s.vips.iter().map(|(v, m)| (*v, serve_name(*m))).collect(),
            owned_since: s.owned_since.clone(),
            now_ms: s.now_ms,
            endpoints: s.endpoints,
            revision: s.revision,
            counters: s
                .counters
                .iter()
                .map(|(n, p, b)| ((*n).to_owned(), *p, *b))
                .collect(),
            errors: s.errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yard_raft_store::gateway::{EndpointKey, EndpointRecord};

    #[test]
    fn bad_vips_and_endpoints_are_named() {
        assert!(check_vip(Ipv4Addr::new(198, 19, 255, 1)).is_ok());
        assert!(check_vip(Ipv4Addr::new(224, 0, 0, 1))
            .unwrap_err()
            .contains("224.0.0.1"));
        let mut ep = Endpoint {
            key: EndpointKey {
                vni: 100,
                ip: Ipv4Addr::new(198, 19, 1, 1),
            },
            record: EndpointRecord {
                mac: [2, 0, 0, 0, 0, 1],
                host: Ipv4Addr::new(198, 18, 0, 4),
            },
        };
        assert!(check_endpoint(&ep).is_ok());
        ep.key.vni = MAX_VNI + 1;
        assert!(check_endpoint(&ep).unwrap_err().contains("vni"));
        ep.key.vni = 5;
        ep.record.mac = [1, 0, 0, 0, 0, 1];
        assert!(check_endpoint(&ep).unwrap_err().contains("unicast mac"));
    }
}
