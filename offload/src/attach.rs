//! The loader (the shell around the planner and the generator): the NIC part attached in
//! hardware mode where the NIC accepts it, the host part in driver mode, and, where hardware
//! mode is refused, one sentence saying why and the host part alone, which with no shim in
//! front of its frames is the whole program.
//!
//! Known limit, said in every refusal: aya 0.14 loads programs without `prog_ifindex`, so they
//! are not bound to a device, and the kernel refuses a hardware-mode attach of such a program
//! even on an nfp port; offloading for real needs a device-bound load (libbpf's
//! `bpf_program__set_ifindex`), which this loader does not do.

use aya::programs::{Xdp, XdpMode};
use aya::Ebpf;

use crate::gen::Role;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("could not load the {part} part: {source}")]
    Load {
        part: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("could not attach the host part to {iface} in driver or generic mode: {source}")]
    Host {
        iface: String,
        #[source]
        source: aya::programs::ProgramError,
    },
}

/// Where the NIC part ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicPlacement {
    /// Offloaded: running on the NIC.
    Hardware,
    /// Refused, with the reason in one sentence; the host part runs everything.
    Refused(String),
}

/// The attached parts; dropping it detaches them.
#[derive(Debug)]
pub struct Attached {
    pub nic: NicPlacement,
    /// `Driver` or, where the device has no native XDP, `Skb`.
    pub host_mode: XdpMode,
    nic_obj: Option<Ebpf>,
    host_obj: Ebpf,
}

impl Attached {
    /// The host part's object, for its maps.
    pub fn host(&mut self) -> &mut Ebpf {
        &mut self.host_obj
    }

    /// The NIC part's object, when it is offloaded.
    pub fn nic(&mut self) -> Option<&mut Ebpf> {
        self.nic_obj.as_mut()
    }
}

fn load(obj: &[u8], role: Role) -> Result<Ebpf, AttachError> {
    let part = match role {
        Role::Nic => "NIC",
        Role::Host => "host",
    };
    let mut e = Ebpf::load(obj).map_err(|e| AttachError::Load {
        part,
        source: Box::new(e),
    })?;
    let prog: &mut Xdp = e
        .program_mut(role.program_name())
        .ok_or_else(|| AttachError::Load {
            part,
            source: format!("no program {}", role.program_name()).into(),
        })?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| AttachError::Load {
            part,
            source: Box::new(e),
        })?;
    prog.load().map_err(|e| AttachError::Load {
        part,
        source: Box::new(e),
    })?;
    Ok(e)
}

fn xdp(e: &mut Ebpf, role: Role) -> &mut Xdp {
    e.program_mut(role.program_name())
        .expect("loaded above")
        .try_into()
        .expect("an XDP program, checked at load")
}

/// Attaches a split on `iface`. The caller fills the maps of both parts (through
/// [`Attached::host`] and [`Attached::nic`]) after this returns.
pub fn attach(iface: &str, nic_obj: &[u8], host_obj: &[u8]) -> Result<Attached, AttachError> {
    let mut host = load(host_obj, Role::Host)?;
    let mut nic = load(nic_obj, Role::Nic)?;
    let placement = match xdp(&mut nic, Role::Nic).attach(iface, XdpMode::Hardware) {
        Ok(_) => NicPlacement::Hardware,
        Err(e) => NicPlacement::Refused(yard_ebpf::hardware_refused(iface, &e)),
    };
    let nic_obj = match placement {
        NicPlacement::Hardware => Some(nic),
        NicPlacement::Refused(_) => None,
    };
    let host_mode = match xdp(&mut host, Role::Host).attach(iface, XdpMode::Driver) {
        Ok(_) => XdpMode::Driver,
        Err(_) => {
            xdp(&mut host, Role::Host)
                .attach(iface, XdpMode::Skb)
                .map_err(|source| AttachError::Host {
                    iface: iface.to_owned(),
                    source,
                })?;
            XdpMode::Skb
        }
    };
    Ok(Attached {
        nic: placement,
        host_mode,
        nic_obj,
        host_obj: host,
    })
}
