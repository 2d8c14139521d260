//! The NIC part of the gateway's split, loaded where a SmartNIC would run it: in hardware mode
//! on the gateway's interface ([`try_hardware`]), or on an emulated NIC ([`EmulatedNic`]).
//!
//! # The emulated NIC
//!
//! A SmartNIC has a wire port and a host port. On a machine without one, two veth pairs in
//! front of the host's interface stand in for them:
//!
//! ```text
//!  fabric ── peer ═══ <wire> │ emulated NIC │ <port> ═══ <interface> (the host's, with its IP)
//!                    NIC part ──redirect──►          host part (the gateway's pinned maps)
//!                     ◄──────redirect───── port program ◄── everything the host sends
//! ```
//!
//! `wire` and `port` are ordinary veths of the host's namespace without addresses. The NIC part
//! runs in XDP on `wire` (frames from the fabric); every frame it does not finish itself
//! (XDP_TX back to the fabric, XDP_DROP) it hands over with the shim pushed in front and
//! redirects into `port` (the `oxdp_handoff` devmap), which delivers it to the host's
//! interface, where the host part strips the shim and resumes. Everything the host sends
//! (the host part's XDP_TX, the stack's own packets) leaves the interface, arrives on `port`,
//! and `emunic_port` redirects it into `wire`, i.e. out to the fabric. The host's interface keeps
//! its name, address and MAC, so nothing else on the node changes.
//!
//! The NIC part shares the gateway's pinned maps (`gw_config`, `gw_vips`, `gw_endpoints`,
//! `gw_sources`, `gw_hosts`): the control plane fills one copy and both parts read it, as they would a
//! NIC whose maps the driver mirrors. The NIC part counts into `oxdp_nic_counters`, pinned
//! beside them; the gateway's counters are the sum of both. Both links are pinned in the same
//! directory, so forwarding survives a daemon restart as the whole program's does.
//!
//! Veth limits: a redirect into a veth is delivered only when the receiving end runs XDP or has
//! GRO on (the setup turns GRO on), and the shim adds 40 bytes, so a frame within 40 bytes of
//! the host interface's MTU is dropped on the way to the host part.

use std::path::Path;

use aya::maps::{Array, DevMap, MapData, MapType};
use aya::programs::links::PinnedLink;
use aya::{Ebpf, EbpfLoader};

use crate::gateway::{
    attach_xdp, prog_err, vet_pinned, MapShape, MAPS, MAP_CONFIG, MAP_ENDPOINTS, MAP_HOSTS,
    MAP_SOURCES, MAP_VIPS,
};
use crate::layout::{GwCounter, COUNTER_MAX};
use crate::maps::{map_err, take};
use crate::{Counter, CounterValue, EbpfError, XdpMode};

static NIC: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/oxdp_nic.bpf.o"));
static NIC_EMU: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/oxdp_nic_emu.bpf.o"));
static PORT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/emunic_port.bpf.o"));

const NIC_PROGRAM: &str = "oxdp_nic";
const PORT_PROGRAM: &str = "emunic_port";
const MAP_NIC_COUNTERS: &str = "oxdp_nic_counters";
const MAP_HANDOFF: &str = "oxdp_handoff";
const MAP_WIRE: &str = "emunic_wire";
const NIC_COUNTERS: MapShape = (MAP_NIC_COUNTERS, MapType::Array, 4, 16, COUNTER_MAX);

/// The NIC part running on an emulated NIC, and the port program beside it.
pub struct EmulatedNic {
    /// The NIC part's counters; `None` on a pass-through NIC.
    counters: Option<Array<MapData, GwCounter>>,
    /// Links this value attached and pinned, kept so that their fds close with it.
    _links: Vec<PinnedLink>,
    /// The port program's object and the wire program's, in that order.
    objects: Vec<Ebpf>,
}

impl std::fmt::Debug for EmulatedNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedNic")
            .field("nic_part", &self.counters.is_some())
            .finish_non_exhaustive()
    }
}

fn point(map: &mut DevMap<MapData>, name: &'static str, iface: &str) -> Result<(), EbpfError> {
    let index =
        crate::sys::ifindex(iface).ok_or_else(|| EbpfError::InvalidInterface(iface.to_owned()))?;
    map.set(0, index, None, 0)
        .map_err(|source| EbpfError::Redirect {
            map: name,
            iface: iface.to_owned(),
            source: Box::new(source),
        })
}

/// Loads a port program whose every frame goes out of `to`.
fn port_program(to: &str) -> Result<Ebpf, EbpfError> {
    let mut obj = crate::program::load_object(&mut EbpfLoader::new(), PORT, "emunic_port.bpf.o")?;
    let mut map: DevMap<MapData> = take(&mut obj, MAP_WIRE)?;
    point(&mut map, MAP_WIRE, to)?;
    crate::program::xdp_mut(&mut obj, PORT_PROGRAM)?
        .load()
        .map_err(prog_err(PORT_PROGRAM, "load"))?;
    Ok(obj)
}

impl EmulatedNic {
    /// Loads the NIC part against the gateway maps pinned under `pin_dir` (open the gateway
    /// there first, so they exist and were vetted), attaches it to `wire` and the port program
    /// to `port`, both in `mode`, through links pinned in `pin_dir` (re-adopted, their programs
    /// swapped, when a previous daemon pinned them).
    pub fn open(pin_dir: &Path, wire: &str, port: &str, mode: XdpMode) -> Result<Self, EbpfError> {
        let mut loader = EbpfLoader::new();
        // The gateway's tables; its per-CPU counters are the host part's alone.
        let shared = MAPS.iter().filter(|m| {
            [MAP_CONFIG, MAP_VIPS, MAP_ENDPOINTS, MAP_SOURCES, MAP_HOSTS].contains(&m.0)
        });
        let paths: Vec<(&MapShape, std::path::PathBuf)> = shared
            .chain(std::iter::once(&NIC_COUNTERS))
            .map(|m| (m, pin_dir.join(m.0)))
            .collect();
        for (shape, path) in &paths {
            if path.exists() {
                vet_pinned(path, shape)?;
            }
            loader.map_pin_path(shape.0, path.as_path());
        }
        let mut nic = crate::program::load_object(&mut loader, NIC_EMU, "oxdp_nic_emu.bpf.o")?;
        let mut handoff: DevMap<MapData> = take(&mut nic, MAP_HANDOFF)?;
        point(&mut handoff, MAP_HANDOFF, port)?;
        let counters = take(&mut nic, MAP_NIC_COUNTERS)?;
        crate::program::xdp_mut(&mut nic, NIC_PROGRAM)?
            .load()
            .map_err(prog_err(NIC_PROGRAM, "load"))?;
        Self::attach(
            pin_dir,
            wire,
            port,
            mode,
            (nic, NIC_PROGRAM),
            Some(counters),
        )
    }

    /// An emulated NIC that offloads nothing: every frame from `wire` goes to `port` as it
    /// came, for a baseline with the same hops as [`EmulatedNic::open`] (the whole program
    /// then runs on the host's interface).
    pub fn open_passthrough(
        pin_dir: &Path,
        wire: &str,
        port: &str,
        mode: XdpMode,
    ) -> Result<Self, EbpfError> {
        let through = port_program(port)?;
        Self::attach(pin_dir, wire, port, mode, (through, PORT_PROGRAM), None)
    }

    /// Attaches the port program to `port`, then `wire_prog` to `wire`: the return path first,
    /// so that nothing handed to the host finds no way back.
    fn attach(
        pin_dir: &Path,
        wire: &str,
        port: &str,
        mode: XdpMode,
        wire_prog: (Ebpf, &'static str),
        counters: Option<Array<MapData, GwCounter>>,
    ) -> Result<Self, EbpfError> {
        std::fs::create_dir_all(pin_dir)
            .map_err(crate::gateway::io_err("create the pin directory", pin_dir))?;
        let port_obj = port_program(wire)?;
        let mut links = Vec::new();
        let mut objects = Vec::new();
        for (mut obj, program, iface) in [
            (port_obj, PORT_PROGRAM, port),
            (wire_prog.0, wire_prog.1, wire),
        ] {
            let xdp = crate::program::xdp_mut(&mut obj, program)?;
            links.extend(attach_xdp(xdp, program, Some(pin_dir), iface, mode)?);
            objects.push(obj);
        }
        Ok(Self {
            counters,
            _links: links,
            objects,
        })
    }

    /// What the NIC part counted, in [`Counter::ALL`] order (all zero on a pass-through NIC):
    /// added to the host part's counters, the whole program's.
    pub fn counters(&self) -> Result<Vec<(Counter, CounterValue)>, EbpfError> {
        let mut out = Vec::with_capacity(Counter::ALL.len());
        for counter in Counter::ALL {
            let value = match &self.counters {
                Some(map) => {
                    let v = map
                        .get(&counter.index(), 0)
                        .map_err(map_err("read", MAP_NIC_COUNTERS))?;
                    CounterValue {
                        packets: v.packets,
                        bytes: v.bytes,
                    }
                }
                None => CounterValue::default(),
            };
            out.push((counter, value));
        }
        Ok(out)
    }

    /// Kernel run statistics of the program on the wire port (the NIC part, or the
    /// pass-through): total run time and runs, counted while `kernel.bpf_stats_enabled` is 1.
    pub fn wire_run_stats(&self) -> Result<(std::time::Duration, u64), EbpfError> {
        let (obj, program) = (
            &self.objects[1],
            if self.counters.is_some() {
                NIC_PROGRAM
            } else {
                PORT_PROGRAM
            },
        );
        crate::program::run_stats(obj, program)
    }
}

/// Tries to attach the NIC part to `iface` in hardware mode. The answer is one sentence
/// saying why not; hardware mode is always refused by this loader's own construction (aya
/// loads programs without `prog_ifindex`, so they are not bound to a device, which the kernel
/// requires for offload), and an accepted attach would leave the NIC's own maps unfilled, so
/// it is detached again and said so. Either way the caller runs the whole program.
pub fn try_hardware(iface: &str) -> String {
    let attempt = || -> Result<(), EbpfError> {
        let mut nic = crate::program::load_object(&mut EbpfLoader::new(), NIC, "oxdp_nic.bpf.o")?;
        let xdp = crate::program::xdp_mut(&mut nic, NIC_PROGRAM)?;
        xdp.load().map_err(prog_err(NIC_PROGRAM, "load"))?;
        xdp.attach(iface, aya::programs::XdpMode::Hardware)
            .map_err(prog_err(NIC_PROGRAM, "attach in hardware mode"))?;
        Ok(())
    };
    match attempt() {
        Ok(()) => format!(
            "{iface} accepted the NIC part in hardware mode, but this loader cannot fill a \
             device's own maps, so it was detached and the whole program runs on the host"
        ),
        Err(e) => hardware_refused(iface, &e),
    }
}

/// The one sentence for a refused hardware-mode attach of a NIC part on `iface`: the kernel's
/// reason, and that the whole program runs on the host.
pub fn hardware_refused(iface: &str, e: &dyn std::error::Error) -> String {
    format!(
        "hardware-mode XDP on {iface} was refused ({}), so the whole program runs on the host \
         (this loader does not bind programs to a device, which hardware mode needs)",
        // aya prints the netlink extended ack as "[]" when the kernel gave none
        error_chain(e).replace(": []", "")
    )
}

/// An error and its causes on one line (a cause its parent's message already quotes is left
/// out): for messages that must carry the kernel's reason, such as the refusal above.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}
