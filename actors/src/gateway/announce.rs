//! Gratuitous ARP: how a node that takes a VIP tells the segment's neighbour caches that the
//! VIP now lives at its MAC. The frame is built by a pure function; sending needs a raw packet
//! socket, the one place the gateway shell calls into libc directly.

use std::net::Ipv4Addr;

/// A gratuitous ARP for `vip` at `mac`: a broadcast request (`reply = false`) or reply, both
/// naming the VIP as sender and target. Kernels update an existing entry from either; some
/// switches and hosts only listen to one, so the shell sends both (as MetalLB and kube-vip do).
pub fn garp_frame(mac: [u8; 6], vip: Ipv4Addr, reply: bool) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    f[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    f[18] = 6;
    f[19] = 4;
    f[20..22].copy_from_slice(&(if reply { 2u16 } else { 1u16 }).to_be_bytes());
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&vip.octets());
    if reply {
        f[32..38].copy_from_slice(&[0xff; 6]);
    }
    f[38..42].copy_from_slice(&vip.octets());
    f
}

/// A raw packet socket bound to one interface, for sending announcement frames.
#[derive(Debug)]
pub struct PacketSender {
    fd: std::os::fd::OwnedFd,
    ifindex: i32,
}

impl PacketSender {
    pub fn open(ifindex: u32) -> std::io::Result<Self> {
        sys::open(ifindex)
    }

    /// Sends one Ethernet frame (destination MAC in its first 6 bytes).
    pub fn send(&self, frame: &[u8]) -> std::io::Result<()> {
        sys::send(self, frame)
    }
}

#[allow(unsafe_code)]
mod sys {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use super::PacketSender;

    const ETH_P_ARP: u16 = 0x0806;

    pub fn open(ifindex: u32) -> std::io::Result<PacketSender> {
        let ifindex = i32::try_from(ifindex)
            .map_err(|_| std::io::Error::other("interface index out of range"))?;
        // SAFETY: plain socket(2) call with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_ARP.to_be()),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(PacketSender { fd, ifindex })
    }

    pub fn send(s: &PacketSender, frame: &[u8]) -> std::io::Result<()> {
        if frame.len() < 14 {
            return Err(std::io::Error::other(
                "frame shorter than an ethernet header",
            ));
        }
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_ARP.to_be();
        addr.sll_ifindex = s.ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: the buffer and address pointers are valid for the lengths passed, and the fd
        // is open for the lifetime of `s`.
        let n = unsafe {
            libc::sendto(
                s.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::addr_of!(addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garp_names_the_vip_as_sender_and_target() {
        let mac = [2, 0, 0, 0, 0, 7];
        let vip = Ipv4Addr::new(198, 19, 255, 1);
        let f = garp_frame(mac, vip, false);
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(&f[6..12], &mac);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1]);
        assert_eq!(&f[22..28], &mac);
        assert_eq!(&f[28..32], &vip.octets());
        assert_eq!(&f[38..42], &vip.octets());
        assert_eq!(&garp_frame(mac, vip, true)[20..22], &[0, 2]);
    }
}
