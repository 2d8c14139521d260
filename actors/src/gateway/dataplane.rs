//! [`DataPlane`] over the pinned XDP gateway program of `yard-ebpf`.

use std::net::Ipv4Addr;
use std::path::Path;

use yard_ebpf::{Gateway, GatewayConfig, VipMode, XdpMode};
use yard_raft_store::gateway::{Endpoint, EndpointKey, EndpointRecord};

use super::actor::{Adopted, CounterRow, DataPlane, DataPlaneError};
use super::core::Serve;

fn err(e: impl std::fmt::Display) -> DataPlaneError {
    DataPlaneError(e.to_string())
}

const NS_PER_MS: u64 = 1_000_000;

/// The XDP gateway, pinned under a bpffs directory and attached to the gateway interface.
pub struct XdpDataPlane {
    gw: Gateway,
}

impl XdpDataPlane {
    /// Opens (re-adopting pinned state when a previous daemon left it) and attaches the
    /// program, then writes the interface's MAC and the MTU. Returns whether state was adopted.
    pub fn open(
        pin_dir: &Path,
        iface: &str,
        mode: XdpMode,
        mac: [u8; 6],
        mtu: u16,
    ) -> Result<(Self, bool), DataPlaneError> {
        let (mut gw, adopted) = Gateway::open_pinned(pin_dir).map_err(err)?;
        gw.attach(iface, mode).map_err(err)?;
        gw.set_config(&GatewayConfig { mac, mtu }).map_err(err)?;
        Ok((Self { gw }, adopted))
    }
}

impl DataPlane for XdpDataPlane {
    fn now_ms(&self) -> u64 {
        yard_ebpf::ktime_now_ns() / NS_PER_MS
    }

    fn set_lease(&mut self, deadline_ms: u64) -> Result<(), DataPlaneError> {
        self.gw
            .set_lease_deadline(deadline_ms.saturating_mul(NS_PER_MS))
            .map_err(err)
    }

    fn put_vip(&mut self, vip: Ipv4Addr, serve: Serve) -> Result<(), DataPlaneError> {
        let mode = match serve {
            Serve::Owned => VipMode::Owned,
            Serve::ForwardOnly => VipMode::ForwardOnly,
        };
        self.gw.put_vip(vip, mode).map_err(err)
    }

    fn remove_vip(&mut self, vip: Ipv4Addr) -> Result<(), DataPlaneError> {
        self.gw.remove_vip(vip).map_err(err)
    }

    fn put_endpoint(&mut self, ep: &Endpoint) -> Result<(), DataPlaneError> {
        self.gw
            .put_endpoint(&yard_ebpf::Endpoint {
                vni: ep.key.vni,
                ip: ep.key.ip,
                mac: ep.record.mac,
                host: ep.record.host,
            })
            .map_err(err)
    }

    fn remove_endpoint(&mut self, key: &EndpointKey) -> Result<(), DataPlaneError> {
        self.gw.remove_endpoint(key.vni, key.ip).map_err(err)
    }

    fn put_host(&mut self, host: Ipv4Addr, mac: [u8; 6]) -> Result<(), DataPlaneError> {
        self.gw.put_host(host, mac).map_err(err)
    }

    fn remove_host(&mut self, host: Ipv4Addr) -> Result<(), DataPlaneError> {
        self.gw.remove_host(host).map_err(err)
    }

    fn counters(&self) -> Result<Vec<CounterRow>, DataPlaneError> {
        Ok(self
            .gw
            .counters()
            .map_err(err)?
            .into_iter()
            .map(|(c, v)| (c.name(), v.packets, v.bytes))
            .collect())
    }

    fn adopted(&self) -> Result<Adopted, DataPlaneError> {
        let vips = self
            .gw
            .vips()
            .map_err(err)?
            .into_iter()
            .map(|(v, m)| {
                let serve = match m {
                    VipMode::Owned => Serve::Owned,
                    VipMode::ForwardOnly => Serve::ForwardOnly,
                };
                (v, serve)
            })
            .collect();
        let deadline_ms = self.gw.lease_deadline().map_err(err)? / NS_PER_MS;
        let endpoints = self
            .gw
            .endpoints()
            .map_err(err)?
            .into_iter()
            .map(|e| Endpoint {
                key: EndpointKey {
                    vni: e.vni,
                    ip: e.ip,
                },
                record: EndpointRecord {
                    mac: e.mac,
                    host: e.host,
                },
            })
            .collect();
        Ok(Adopted {
            vips,
            deadline_ms,
            endpoints,
        })
    }
}
