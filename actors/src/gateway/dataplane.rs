//! [`DataPlane`] over the pinned XDP gateway program of `yard-ebpf`: the whole program on the
//! gateway's interface, or the split of issue 15 (the NIC part on an emulated NIC in front of
//! the interface, the host part on it; `yard_ebpf::EmulatedNic` documents the topology).

use std::net::Ipv4Addr;
use std::path::Path;

use yard_ebpf::{EmulatedNic, Gateway, GatewayConfig, GatewayImage, VipMode, XdpMode};
use yard_raft_store::gateway::{Endpoint, EndpointKey, EndpointRecord};

use super::actor::{Adopted, CounterRow, DataPlane, DataPlaneError};
use super::core::Serve;

fn err(e: impl std::fmt::Display) -> DataPlaneError {
    DataPlaneError(e.to_string())
}

const NS_PER_MS: u64 = 1_000_000;

/// Where the forwarding function runs (`[gateway] offload`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offload {
    /// The whole program on the interface.
    None,
    /// Hardware mode tried for the NIC part; refused, the whole program on the interface.
    Auto,
    /// The NIC part on the emulated NIC's `wire` veth, the host part on the interface. The
    /// NIC's two ports run native XDP whatever `xdp_mode` says: they are veths, which have it,
    /// and a NIC runs its program before any sk_buff exists.
    Emulated { wire: String, port: String },
}

/// The XDP gateway, pinned under a bpffs directory and attached to the gateway interface.
pub struct XdpDataPlane {
    gw: Gateway,
    /// The NIC part, when the split runs on the emulated NIC.
    nic: Option<EmulatedNic>,
    placement: String,
}

impl XdpDataPlane {
    /// Opens (re-adopting pinned state when a previous daemon left it) and attaches the
    /// program, then writes the interface's MAC and the MTU. Returns whether state was adopted.
    ///
    /// With [`Offload::Emulated`] the host part goes on `iface` before the NIC part goes on the
    /// wire port, so that no frame is handed over to an interface without the program that
    /// strips the shim.
    pub fn open(
        pin_dir: &Path,
        iface: &str,
        mode: XdpMode,
        mac: [u8; 6],
        mtu: u16,
        offload: &Offload,
    ) -> Result<(Self, bool), DataPlaneError> {
        let image = match offload {
            Offload::Emulated { .. } => GatewayImage::SplitHost,
            Offload::None | Offload::Auto => GatewayImage::Whole,
        };
        let placement = match offload {
            Offload::None => format!("offload none: the whole program on {iface}"),
            Offload::Auto => format!("offload auto: {}", yard_ebpf::try_hardware(iface)),
            Offload::Emulated { wire, port } => format!(
                "offload emulated: the NIC part on {wire} (emulated NIC, host port {port}), \
                 the host part on {iface}"
            ),
        };
        let (mut gw, adopted) = Gateway::open_pinned_image(pin_dir, image).map_err(err)?;
        gw.attach(iface, mode).map_err(err)?;
        gw.set_config(&GatewayConfig { mac, mtu }).map_err(err)?;
        let nic = match offload {
            Offload::Emulated { wire, port } => Some(
                EmulatedNic::open(pin_dir, wire, port, XdpMode::Native).map_err(|e| {
                    err(format!(
                        "the emulated NIC on {wire}: {}",
                        yard_ebpf::error_chain(&e)
                    ))
                })?,
            ),
            Offload::None | Offload::Auto => None,
        };
        Ok((Self { gw, nic, placement }, adopted))
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

    fn put_source(&mut self, vni: u32, source: Ipv4Addr) -> Result<(), DataPlaneError> {
        self.gw.put_source(vni, source).map_err(err)
    }

    fn remove_source(&mut self, vni: u32, source: Ipv4Addr) -> Result<(), DataPlaneError> {
        self.gw.remove_source(vni, source).map_err(err)
    }

    fn put_host(&mut self, host: Ipv4Addr, mac: [u8; 6]) -> Result<(), DataPlaneError> {
        self.gw.put_host(host, mac).map_err(err)
    }

    fn remove_host(&mut self, host: Ipv4Addr) -> Result<(), DataPlaneError> {
        self.gw.remove_host(host).map_err(err)
    }

    fn counters(&self) -> Result<Vec<CounterRow>, DataPlaneError> {
        let mut rows: Vec<CounterRow> = self
            .gw
            .counters()
            .map_err(err)?
            .into_iter()
            .map(|(c, v)| (c.name(), v.packets, v.bytes))
            .collect();
        // The split's counts are the two parts' sum (each frame is counted by the part that
        // decided it), in the same order.
        if let Some(nic) = &self.nic {
            for (row, (_, v)) in rows.iter_mut().zip(nic.counters().map_err(err)?) {
                row.1 = row.1.wrapping_add(v.packets);
                row.2 = row.2.wrapping_add(v.bytes);
            }
        }
        Ok(rows)
    }

    fn placement(&self) -> String {
        self.placement.clone()
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
        let sources = self.gw.sources().map_err(err)?;
        Ok(Adopted {
            vips,
            deadline_ms,
            endpoints,
            sources,
        })
    }
}
