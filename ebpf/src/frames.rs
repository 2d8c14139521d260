//! Frame builders for tests and benchmarks: outer Ethernet/IPv4/UDP/VXLAN around an inner
//! Ethernet frame (IPv4/UDP, ARP or anything else), plain ARP, and a host's own TCP or UDP
//! traffic ([`HostFrame`]). Pure: no I/O, no kernel.
//!
//! Every field a test may want to break is a plain public field (IPv4 options, fragment bits,
//! version/IHL, VXLAN flags, ARP header fields, ...); [`VxlanFrame::build`] and
//! [`HostFrame::build`] compute lengths and the IPv4 header checksums from them.

use std::net::Ipv4Addr;

pub const ETH_LEN: usize = 14;
pub const IPV4_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
/// A TCP header without options.
pub const TCP_LEN: usize = 20;
/// An 802.1Q tag (TPID + TCI).
pub const VLAN_LEN: usize = 4;
pub const VXLAN_LEN: usize = 8;
pub const ARP_LEN: usize = 28;

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_TCP: u8 = 6;

/// IPv4 "more fragments" flag in the host-order flags/offset field.
pub const IP_MF: u16 = 0x2000;
/// IPv4 "don't fragment" flag.
pub const IP_DF: u16 = 0x4000;

/// Offsets in a tunnel frame without outer IPv4 options.
pub mod offsets {
    pub const OUTER_IP: usize = 14;
    pub const OUTER_UDP: usize = 34;
    pub const VXLAN: usize = 42;
    pub const INNER_ETH: usize = 50;
    /// Inner IPv4 header or ARP body.
    pub const INNER_L3: usize = 64;
    /// Inner UDP header (inner IPv4 without options).
    pub const INNER_UDP: usize = 84;
    /// Inner UDP payload.
    pub const INNER_PAYLOAD: usize = 92;
}

/// An IPv4 header to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Header {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ttl: u8,
    pub protocol: u8,
    pub tos: u8,
    pub id: u16,
    /// Flags and fragment offset, host order ([`IP_DF`], [`IP_MF`], offset in 8-byte units).
    pub frag: u16,
    /// Option bytes; padded with zeros (end of options) to a multiple of 4.
    pub options: Vec<u8>,
    /// Written into the version nibble (4 unless a test breaks it).
    pub version: u8,
    /// Overrides the IHL nibble (otherwise derived from the options).
    pub ihl: Option<u8>,
}

impl Ipv4Header {
    /// A well-formed header: TTL 64, DF set, no options.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8) -> Self {
        Self {
            src,
            dst,
            ttl: 64,
            protocol,
            tos: 0,
            id: 0x1234,
            frag: IP_DF,
            options: Vec::new(),
            version: 4,
            ihl: None,
        }
    }

    fn padded_options(&self) -> Vec<u8> {
        let mut opts = self.options.clone();
        while !opts.len().is_multiple_of(4) {
            opts.push(0);
        }
        opts
    }

    /// Appends the header (with a valid checksum) for `payload_len` bytes of payload.
    pub fn write(&self, payload_len: usize, out: &mut Vec<u8>) {
        let opts = self.padded_options();
        let hlen = IPV4_LEN + opts.len();
        let ihl = self.ihl.unwrap_or((hlen / 4) as u8);
        let start = out.len();
        out.push((self.version << 4) | (ihl & 0x0f));
        out.push(self.tos);
        out.extend_from_slice(&((hlen + payload_len) as u16).to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.frag.to_be_bytes());
        out.push(self.ttl);
        out.push(self.protocol);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.src.octets());
        out.extend_from_slice(&self.dst.octets());
        out.extend_from_slice(&opts);
        let csum = ipv4_checksum(&out[start..start + hlen]);
        out[start + 10..start + 12].copy_from_slice(&csum.to_be_bytes());
    }
}

/// The checksum field value that makes `header` valid (computed with the field taken as 0).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for (i, pair) in header.chunks(2).enumerate() {
        if i == 5 {
            continue; // the checksum field itself
        }
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether the IPv4 header in `header` (exactly IHL*4 bytes) carries a valid checksum: its
/// one's-complement sum, checksum included, is all ones.
pub fn ipv4_header_valid(header: &[u8]) -> bool {
    let mut sum: u32 = 0;
    for pair in header.chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

/// Appends an Ethernet header.
pub fn write_eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, out: &mut Vec<u8>) {
    out.extend_from_slice(&dst);
    out.extend_from_slice(&src);
    out.extend_from_slice(&ethertype.to_be_bytes());
}

/// Appends a UDP header (checksum 0, legal for IPv4) and `payload`.
pub fn write_udp(src_port: u16, dst_port: u16, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&src_port.to_be_bytes());
    out.extend_from_slice(&dst_port.to_be_bytes());
    out.extend_from_slice(&((UDP_LEN + payload.len()) as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
}

/// Appends an option-less TCP header (ACK|PSH, checksum 0: no program here checks it) and
/// `payload`.
pub fn write_tcp(src_port: u16, dst_port: u16, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&src_port.to_be_bytes());
    out.extend_from_slice(&dst_port.to_be_bytes());
    out.extend_from_slice(&1u32.to_be_bytes()); // sequence number
    out.extend_from_slice(&1u32.to_be_bytes()); // acknowledgement number
    out.push(((TCP_LEN / 4) as u8) << 4); // data offset
    out.push(0x18); // ACK | PSH
    out.extend_from_slice(&65535u16.to_be_bytes()); // window
    out.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    out.extend_from_slice(payload);
}

/// A host's own IPv4 traffic as a NIC carries it: Ethernet (optionally one 802.1Q tag), IPv4,
/// and a TCP or UDP header (chosen by `ip.protocol`; any other protocol gets no L4 header) with
/// a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFrame {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    /// Ethertype after the addresses (or after the tag): IPv4 unless a test breaks it.
    pub ethertype: u16,
    /// 802.1Q tag control information, if the frame carries a tag.
    pub vlan: Option<u16>,
    pub ip: Ipv4Header,
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: Vec<u8>,
}

impl HostFrame {
    /// A UDP datagram `src:src_port` -> `dst:dst_port` between two made-up MACs.
    pub fn udp(src: Ipv4Addr, src_port: u16, dst: Ipv4Addr, dst_port: u16, payload: &[u8]) -> Self {
        Self {
            eth_dst: [0x02, 0, 0, 0, 0, 0xd1],
            eth_src: [0x02, 0, 0, 0, 0, 0x51],
            ethertype: ETHERTYPE_IPV4,
            vlan: None,
            ip: Ipv4Header::new(src, dst, PROTO_UDP),
            src_port,
            dst_port,
            payload: payload.to_vec(),
        }
    }

    /// The same as [`HostFrame::udp`] for a TCP segment.
    pub fn tcp(src: Ipv4Addr, src_port: u16, dst: Ipv4Addr, dst_port: u16, payload: &[u8]) -> Self {
        let mut f = Self::udp(src, src_port, dst, dst_port, payload);
        f.ip.protocol = PROTO_TCP;
        f
    }

    /// Offset of the IPv4 header.
    pub fn l3_offset(&self) -> usize {
        ETH_LEN + if self.vlan.is_some() { VLAN_LEN } else { 0 }
    }

    /// The frame's bytes, IPv4 length and checksum filled in.
    pub fn build(&self) -> Vec<u8> {
        let mut l4 = Vec::with_capacity(TCP_LEN + self.payload.len());
        match self.ip.protocol {
            PROTO_UDP => write_udp(self.src_port, self.dst_port, &self.payload, &mut l4),
            PROTO_TCP => write_tcp(self.src_port, self.dst_port, &self.payload, &mut l4),
            _ => l4.extend_from_slice(&self.payload),
        }
        let mut out = Vec::with_capacity(self.l3_offset() + IPV4_LEN + l4.len());
        match self.vlan {
            Some(tci) => {
                write_eth(self.eth_dst, self.eth_src, ETHERTYPE_VLAN, &mut out);
                out.extend_from_slice(&tci.to_be_bytes());
                out.extend_from_slice(&self.ethertype.to_be_bytes());
            }
            None => write_eth(self.eth_dst, self.eth_src, self.ethertype, &mut out),
        }
        self.ip.write(l4.len(), &mut out);
        out.extend_from_slice(&l4);
        out
    }
}

/// An ARP body (IPv4 over Ethernet unless fields are changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    pub htype: u16,
    pub ptype: u16,
    pub hlen: u8,
    pub plen: u8,
    /// 1 request, 2 reply.
    pub op: u16,
    pub sha: [u8; 6],
    pub spa: Ipv4Addr,
    pub tha: [u8; 6],
    pub tpa: Ipv4Addr,
}

impl Arp {
    /// "Who has `tpa`? Tell `spa` (`sha`)".
    pub fn request(sha: [u8; 6], spa: Ipv4Addr, tpa: Ipv4Addr) -> Self {
        Self {
            htype: 1,
            ptype: ETHERTYPE_IPV4,
            hlen: 6,
            plen: 4,
            op: 1,
            sha,
            spa,
            tha: [0; 6],
            tpa,
        }
    }

    pub fn bytes(&self) -> [u8; ARP_LEN] {
        let mut b = [0u8; ARP_LEN];
        b[0..2].copy_from_slice(&self.htype.to_be_bytes());
        b[2..4].copy_from_slice(&self.ptype.to_be_bytes());
        b[4] = self.hlen;
        b[5] = self.plen;
        b[6..8].copy_from_slice(&self.op.to_be_bytes());
        b[8..14].copy_from_slice(&self.sha);
        b[14..18].copy_from_slice(&self.spa.octets());
        b[18..24].copy_from_slice(&self.tha);
        b[24..28].copy_from_slice(&self.tpa.octets());
        b
    }

    /// Parses an ARP body (no validity checks beyond the length).
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < ARP_LEN {
            return None;
        }
        let ip = |o: usize| Ipv4Addr::new(b[o], b[o + 1], b[o + 2], b[o + 3]);
        let mac = |o: usize| -> [u8; 6] { b[o..o + 6].try_into().unwrap_or([0; 6]) };
        Some(Self {
            htype: u16::from_be_bytes([b[0], b[1]]),
            ptype: u16::from_be_bytes([b[2], b[3]]),
            hlen: b[4],
            plen: b[5],
            op: u16::from_be_bytes([b[6], b[7]]),
            sha: mac(8),
            spa: ip(14),
            tha: mac(18),
            tpa: ip(24),
        })
    }
}

/// A whole ARP frame on the underlay: Ethernet + ARP, padded to the 60-byte minimum.
pub fn arp_frame(eth_dst: [u8; 6], eth_src: [u8; 6], arp: &Arp) -> Vec<u8> {
    let mut out = Vec::with_capacity(60);
    write_eth(eth_dst, eth_src, ETHERTYPE_ARP, &mut out);
    out.extend_from_slice(&arp.bytes());
    out.resize(60, 0);
    out
}

/// The Ethernet frame inside the tunnel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inner {
    /// IPv4/UDP with a payload.
    Ipv4 {
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
        ip: Ipv4Header,
        src_port: u16,
        dst_port: u16,
        payload: Vec<u8>,
    },
    Arp {
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
        arp: Arp,
    },
    /// Any ethertype with raw bytes after the Ethernet header (IPv6, ...).
    Raw {
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
        ethertype: u16,
        payload: Vec<u8>,
    },
}

impl Inner {
    /// An inner IPv4/UDP datagram (TTL 64, ports 40000 -> 5201) with `payload`.
    pub fn udp(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload: &[u8],
    ) -> Self {
        Inner::Ipv4 {
            dst_mac,
            src_mac,
            ip: Ipv4Header::new(src, dst, PROTO_UDP),
            src_port: 40000,
            dst_port: 5201,
            payload: payload.to_vec(),
        }
    }

    /// An inner ARP request, broadcast, from (`sha`, `spa`) for `tpa`.
    pub fn arp_request(sha: [u8; 6], spa: Ipv4Addr, tpa: Ipv4Addr) -> Self {
        Inner::Arp {
            dst_mac: [0xff; 6],
            src_mac: sha,
            arp: Arp::request(sha, spa, tpa),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Inner::Ipv4 {
                dst_mac,
                src_mac,
                ip,
                src_port,
                dst_port,
                payload,
            } => {
                write_eth(*dst_mac, *src_mac, ETHERTYPE_IPV4, out);
                ip.write(UDP_LEN + payload.len(), out);
                write_udp(*src_port, *dst_port, payload, out);
            }
            Inner::Arp {
                dst_mac,
                src_mac,
                arp,
            } => {
                write_eth(*dst_mac, *src_mac, ETHERTYPE_ARP, out);
                out.extend_from_slice(&arp.bytes());
            }
            Inner::Raw {
                dst_mac,
                src_mac,
                ethertype,
                payload,
            } => {
                write_eth(*dst_mac, *src_mac, *ethertype, out);
                out.extend_from_slice(payload);
            }
        }
    }
}

/// A VXLAN tunnel frame as a compute host sends it to a gateway VIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanFrame {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    /// Outer ethertype (IPv4 unless a test breaks it).
    pub ethertype: u16,
    pub ip: Ipv4Header,
    pub udp_src: u16,
    pub udp_dst: u16,
    /// VXLAN flags byte; 0x08 (I: VNI valid) in a well-formed header.
    pub vxlan_flags: u8,
    pub vni: u32,
    pub inner: Inner,
}

impl VxlanFrame {
    /// A well-formed frame from host (`src_mac`, `src`) to the gateway (`dst_mac`, VIP `dst`).
    pub fn new(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: Ipv4Addr,
        dst: Ipv4Addr,
        vni: u32,
        inner: Inner,
    ) -> Self {
        Self {
            eth_dst: dst_mac,
            eth_src: src_mac,
            ethertype: ETHERTYPE_IPV4,
            ip: Ipv4Header::new(src, dst, PROTO_UDP),
            udp_src: 49152,
            udp_dst: 4789,
            vxlan_flags: 0x08,
            vni,
            inner,
        }
    }

    /// The frame's bytes, lengths and outer/inner IPv4 checksums filled in; outer UDP checksum 0.
    pub fn build(&self) -> Vec<u8> {
        let mut inner = Vec::new();
        self.inner.write(&mut inner);
        let mut out = Vec::with_capacity(ETH_LEN + IPV4_LEN + UDP_LEN + VXLAN_LEN + inner.len());
        write_eth(self.eth_dst, self.eth_src, self.ethertype, &mut out);
        let udp_len = UDP_LEN + VXLAN_LEN + inner.len();
        self.ip.write(udp_len, &mut out);
        out.extend_from_slice(&self.udp_src.to_be_bytes());
        out.extend_from_slice(&self.udp_dst.to_be_bytes());
        out.extend_from_slice(&(udp_len as u16).to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        let vni = self.vni.to_be_bytes();
        out.extend_from_slice(&[self.vxlan_flags, 0, 0, 0, vni[1], vni[2], vni[3], 0]);
        out.extend_from_slice(&inner);
        out
    }
}

/// Reads the 24-bit VNI of a VXLAN header starting at `at`.
pub fn vni_at(frame: &[u8], at: usize) -> Option<u32> {
    let b = frame.get(at + 4..at + 7)?;
    Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

/// Reads an IPv4 address at `at`.
pub fn ip_at(frame: &[u8], at: usize) -> Option<Ipv4Addr> {
    let b = frame.get(at..at + 4)?;
    Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

/// Reads a MAC at `at`.
pub fn mac_at(frame: &[u8], at: usize) -> Option<[u8; 6]> {
    frame.get(at..at + 6)?.try_into().ok()
}

/// Reads a big-endian u16 at `at`.
pub fn u16_at(frame: &[u8], at: usize) -> Option<u16> {
    let b = frame.get(at..at + 2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    #[test]
    fn tunnel_frame_layout() {
        let f = VxlanFrame::new(
            A,
            B,
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 19, 255, 1),
            0x123456,
            Inner::udp(
                A,
                B,
                Ipv4Addr::new(198, 19, 1, 1),
                Ipv4Addr::new(198, 19, 1, 2),
                b"hello",
            ),
        )
        .build();
        assert_eq!(f.len(), offsets::INNER_PAYLOAD + 5);
        assert_eq!(u16_at(&f, 12), Some(ETHERTYPE_IPV4));
        assert!(ipv4_header_valid(&f[offsets::OUTER_IP..offsets::OUTER_UDP]));
        assert!(ipv4_header_valid(&f[offsets::INNER_L3..offsets::INNER_UDP]));
        assert_eq!(
            u16_at(&f, offsets::OUTER_IP + 2),
            Some((f.len() - ETH_LEN) as u16)
        );
        assert_eq!(u16_at(&f, offsets::OUTER_UDP + 2), Some(4789));
        assert_eq!(vni_at(&f, offsets::VXLAN), Some(0x123456));
        assert_eq!(&f[offsets::INNER_PAYLOAD..], b"hello");
    }

    #[test]
    fn checksum_matches_a_known_header() {
        // The classic example header (Wikipedia, "IPv4 header checksum").
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&h), 0xb861);
        assert!(ipv4_header_valid(&h));
    }

    #[test]
    fn host_frames_layout() {
        let (src, dst) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let udp = HostFrame::udp(src, 40000, dst, 29500, b"abc").build();
        assert_eq!(udp.len(), ETH_LEN + IPV4_LEN + UDP_LEN + 3);
        assert!(ipv4_header_valid(&udp[ETH_LEN..ETH_LEN + IPV4_LEN]));
        assert_eq!(u16_at(&udp, 16), Some((IPV4_LEN + UDP_LEN + 3) as u16));
        assert_eq!(udp[23], PROTO_UDP);
        assert_eq!(u16_at(&udp, 34), Some(40000));
        assert_eq!(u16_at(&udp, 36), Some(29500));
        assert_eq!(u16_at(&udp, 38), Some((UDP_LEN + 3) as u16));

        let mut tagged = HostFrame::tcp(src, 40000, dst, 29500, b"abc");
        tagged.vlan = Some(100);
        let tcp = tagged.build();
        assert_eq!(tcp.len(), ETH_LEN + VLAN_LEN + IPV4_LEN + TCP_LEN + 3);
        assert_eq!(u16_at(&tcp, 12), Some(ETHERTYPE_VLAN));
        assert_eq!(u16_at(&tcp, 16), Some(ETHERTYPE_IPV4));
        let l3 = tagged.l3_offset();
        assert!(ipv4_header_valid(&tcp[l3..l3 + IPV4_LEN]));
        assert_eq!(tcp[l3 + 9], PROTO_TCP);
        assert_eq!(u16_at(&tcp, l3 + IPV4_LEN + 2), Some(29500));
        assert_eq!(tcp[l3 + IPV4_LEN + 12] >> 4, 5, "TCP data offset");
        assert_eq!(&tcp[tcp.len() - 3..], b"abc");
    }

    #[test]
    fn arp_round_trips() {
        let a = Arp::request(
            A,
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 19, 0, 1),
        );
        assert_eq!(Arp::parse(&a.bytes()), Some(a));
        let f = arp_frame([0xff; 6], A, &a);
        assert_eq!(f.len(), 60);
        assert_eq!(u16_at(&f, 12), Some(ETHERTYPE_ARP));
    }
}
