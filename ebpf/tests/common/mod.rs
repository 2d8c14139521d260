//! Shared by the integration tests: root check, the standard gateway fixture, counter deltas,
//! a reference model of `yard_gateway` for the fuzz test, and clean-up guards for bpffs pin
//! directories and network namespaces (one with a veth pair inside, or two joined by one).
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use yard_ebpf::frames::{self, offsets, Arp, Inner, VxlanFrame};
use yard_ebpf::{
    ktime_now_ns, Counter, CounterValue, Endpoint, Gateway, GatewayConfig, TestOutcome, VipMode,
    XdpAction,
};

/// Loading programs needs CAP_BPF/CAP_NET_ADMIN: fail loudly instead of skipping.
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test loads eBPF programs and needs root; run `cargo test -p yard-ebpf` as root"
    );
}

pub const GW_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0xff, 0x01];
pub const SENDER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x14];
pub const HOST_A_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0a];
pub const HOST_B_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0b];
pub const TENANT_A_MAC: [u8; 6] = [0x02, 0xaa, 0x00, 0x00, 0x01, 0x0a];
pub const TENANT_B_MAC: [u8; 6] = [0x02, 0xbb, 0x00, 0x00, 0x01, 0x0a];
pub const TENANT_SRC_MAC: [u8; 6] = [0x02, 0xaa, 0x00, 0x00, 0x01, 0x14];

pub const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
pub const VIP_FWD: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
pub const NOT_VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const SENDER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 20);
pub const HOST_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
pub const HOST_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
pub const HOST_UNKNOWN: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 99);
pub const VNI_A: u32 = 100;
pub const VNI_B: u32 = 0x00ab_cdef;
/// In both VNIs: VNI_A -> HOST_A, VNI_B -> HOST_B.
pub const TENANT: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 10);
pub const TENANT_SRC: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 20);
/// In VNI_A, on a host without a gw_hosts entry.
pub const TENANT_ON_UNKNOWN_HOST: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 30);
pub const TENANT_UNKNOWN: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 99);
pub const MTU: u16 = 1500;
pub const PAYLOAD: &[u8] = b"switchyard inner payload: must arrive unchanged";

pub const HOUR_NS: u64 = 3_600_000_000_000;

/// A gateway with the standard fixture programmed: config, valid lease, both VIPs, three
/// endpoints, two hosts, and SENDER allowed to tunnel for both VNIs.
pub fn fixture() -> Gateway {
    require_root();
    let mut gw = Gateway::load().expect("load the gateway program");
    program_fixture(&mut gw);
    gw
}

pub fn program_fixture(gw: &mut Gateway) {
    gw.set_config(&GatewayConfig {
        mac: GW_MAC,
        mtu: MTU,
    })
    .unwrap();
    gw.set_lease_deadline(ktime_now_ns() + HOUR_NS).unwrap();
    gw.put_vip(VIP, VipMode::Owned).unwrap();
    gw.put_vip(VIP_FWD, VipMode::ForwardOnly).unwrap();
    for ep in fixture_endpoints() {
        gw.put_endpoint(&ep).unwrap();
    }
    gw.put_host(HOST_A, HOST_A_MAC).unwrap();
    gw.put_host(HOST_B, HOST_B_MAC).unwrap();
    for (vni, source) in fixture_sources() {
        gw.put_source(vni, source).unwrap();
    }
}

/// The (VNI, outer source) pairs the fixture allows: the standard sender, in both VNIs.
pub fn fixture_sources() -> Vec<(u32, Ipv4Addr)> {
    vec![(VNI_A, SENDER), (VNI_B, SENDER)]
}

pub fn fixture_endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint {
            vni: VNI_A,
            ip: TENANT,
            mac: TENANT_A_MAC,
            host: HOST_A,
        },
        Endpoint {
            vni: VNI_B,
            ip: TENANT,
            mac: TENANT_B_MAC,
            host: HOST_B,
        },
        Endpoint {
            vni: VNI_A,
            ip: TENANT_ON_UNKNOWN_HOST,
            mac: TENANT_A_MAC,
            host: HOST_UNKNOWN,
        },
    ]
}

/// The standard tunnel frame: SENDER -> `vip`, VNI `vni`, inner UDP TENANT_SRC -> `dst`.
pub fn tunnel(vip: Ipv4Addr, vni: u32, dst: Ipv4Addr) -> VxlanFrame {
    VxlanFrame::new(
        SENDER_MAC,
        GW_MAC,
        SENDER,
        vip,
        vni,
        Inner::udp(TENANT_SRC_MAC, GW_MAC, TENANT_SRC, dst, PAYLOAD),
    )
}

pub fn inner_ipv4(f: &mut VxlanFrame) -> &mut frames::Ipv4Header {
    match &mut f.inner {
        Inner::Ipv4 { ip, .. } => ip,
        _ => panic!("not an inner IPv4 frame"),
    }
}

/// A tunnel frame carrying an inner ARP request for `target`.
pub fn tunnel_arp(vip: Ipv4Addr, vni: u32, target: Ipv4Addr) -> VxlanFrame {
    VxlanFrame::new(
        SENDER_MAC,
        GW_MAC,
        SENDER,
        vip,
        vni,
        Inner::arp_request(TENANT_SRC_MAC, TENANT_SRC, target),
    )
}

/// An underlay ARP request from SENDER for `target`.
pub fn outer_arp(target: Ipv4Addr) -> Vec<u8> {
    frames::arp_frame(
        [0xff; 6],
        SENDER_MAC,
        &Arp::request(SENDER_MAC, SENDER, target),
    )
}

pub fn counter_map(gw: &Gateway) -> HashMap<Counter, CounterValue> {
    gw.counters().unwrap().into_iter().collect()
}

/// The one counter of `all` that moved between `before` and `after`, asserting that exactly
/// one moved, by one packet and `frame`'s length in bytes (every program here counts each
/// frame under exactly one reason).
pub fn the_one_moved<C>(
    all: &[C],
    before: &HashMap<C, CounterValue>,
    after: &HashMap<C, CounterValue>,
    frame: &[u8],
) -> C
where
    C: Copy + Eq + std::hash::Hash + std::fmt::Debug + std::fmt::Display,
{
    let moved: Vec<(C, u64, u64)> = all
        .iter()
        .filter_map(|c| {
            let (b, a) = (before[c], after[c]);
            (a != b).then(|| (*c, a.packets - b.packets, a.bytes - b.bytes))
        })
        .collect();
    assert_eq!(
        moved.len(),
        1,
        "exactly one counter must move, got {moved:?}"
    );
    let (counter, packets, bytes) = moved[0];
    assert_eq!(packets, 1, "{counter} packets");
    assert_eq!(bytes, frame.len() as u64, "{counter} bytes");
    counter
}

/// Runs `frame` once and returns the outcome and the one counter that moved, asserting that
/// exactly one moved, by one packet and the frame's length in bytes, and that the verdict
/// agrees with the counter's kind.
pub fn run(gw: &Gateway, frame: &[u8]) -> (TestOutcome, Counter) {
    let before = counter_map(gw);
    let out = gw.test_run(frame).expect("test run");
    let after = counter_map(gw);
    let counter = the_one_moved(&Counter::ALL, &before, &after, frame);
    assert_ne!(out.action, XdpAction::Aborted, "never XDP_ABORTED");
    let expected_action = if counter.is_tx() {
        XdpAction::Tx
    } else if counter.is_pass() {
        XdpAction::Pass
    } else {
        XdpAction::Drop
    };
    assert_eq!(out.action, expected_action, "verdict for {counter}");
    assert_eq!(
        out.frame.len(),
        frame.len(),
        "no program changes the frame size"
    );
    // An unresolved host's frame is re-addressed before the stack gets it; every other frame
    // not sent must be untouched.
    if out.action != XdpAction::Tx && counter != Counter::PassUnresolvedHost {
        assert_eq!(
            out.frame, frame,
            "{counter}: a frame not sent must be untouched"
        );
    }
    (out, counter)
}

/// Asserts the TX frame is a forward of `input` to (`host`, `host_mac`) with inner dst MAC
/// `tenant_mac`.
pub fn assert_forwarded(
    input: &[u8],
    out: &[u8],
    host: Ipv4Addr,
    host_mac: [u8; 6],
    tenant_mac: [u8; 6],
) {
    use frames::{ip_at, ipv4_header_valid, mac_at, u16_at};
    let (ip, udp, vx, ieth, iip) = (
        offsets::OUTER_IP,
        offsets::OUTER_UDP,
        offsets::VXLAN,
        offsets::INNER_ETH,
        offsets::INNER_L3,
    );
    assert_eq!(mac_at(out, 0), Some(host_mac), "outer eth dst = host mac");
    assert_eq!(mac_at(out, 6), Some(GW_MAC), "outer eth src = gateway mac");
    assert_eq!(&out[12..14], &input[12..14]);
    assert_eq!(
        ip_at(out, ip + 12),
        ip_at(input, ip + 16),
        "outer src = the VIP"
    );
    assert_eq!(
        ip_at(out, ip + 16),
        Some(host),
        "outer dst = the compute host"
    );
    assert_eq!(out[ip + 8], 64, "outer TTL 64");
    assert!(ipv4_header_valid(&out[ip..ip + 20]), "outer IPv4 checksum");
    // Rest of the outer IPv4 header unchanged (version, tos, length, id, frag, protocol).
    assert_eq!(&out[ip..ip + 8], &input[ip..ip + 8]);
    assert_eq!(out[ip + 9], input[ip + 9]);
    assert_eq!(
        u16_at(out, udp),
        u16_at(input, udp),
        "outer UDP src port kept"
    );
    assert_eq!(u16_at(out, udp + 2), Some(4789));
    assert_eq!(
        u16_at(out, udp + 4),
        u16_at(input, udp + 4),
        "UDP length kept"
    );
    assert_eq!(u16_at(out, udp + 6), Some(0), "UDP checksum 0");
    assert_eq!(
        &out[vx..vx + 8],
        &input[vx..vx + 8],
        "VXLAN header kept (same VNI)"
    );
    assert_eq!(
        mac_at(out, ieth),
        Some(tenant_mac),
        "inner eth dst = tenant mac"
    );
    assert_eq!(
        &out[ieth + 6..ieth + 14],
        &input[ieth + 6..ieth + 14],
        "inner src, type"
    );
    assert_eq!(out[iip + 8], input[iip + 8] - 1, "inner TTL decremented");
    assert!(
        ipv4_header_valid(&out[iip..iip + 20]),
        "inner IPv4 checksum"
    );
    assert_eq!(&out[iip..iip + 8], &input[iip..iip + 8]);
    assert_eq!(&out[iip + 9..iip + 10], &input[iip + 9..iip + 10]);
    assert_eq!(
        &out[iip + 12..],
        &input[iip + 12..],
        "inner addresses and payload unchanged"
    );
}

// ---------------------------------------------------------------------------------------------
// Reference model of yard_gateway, for the fuzz test.

/// The maps as the model sees them.
#[derive(Clone, Debug)]
pub struct ModelState {
    pub mac: [u8; 6],
    pub mtu: u16,
    pub lease_valid: bool,
    pub vips: HashMap<Ipv4Addr, u32>,
    pub endpoints: HashMap<(u32, Ipv4Addr), ([u8; 6], Ipv4Addr)>,
    pub hosts: HashMap<Ipv4Addr, [u8; 6]>,
    pub sources: std::collections::HashSet<(u32, Ipv4Addr)>,
}

impl ModelState {
    pub fn fixture() -> Self {
        Self {
            mac: GW_MAC,
            mtu: MTU,
            lease_valid: true,
            vips: [(VIP, 1), (VIP_FWD, 2)].into_iter().collect(),
            endpoints: fixture_endpoints()
                .into_iter()
                .map(|e| ((e.vni, e.ip), (e.mac, e.host)))
                .collect(),
            hosts: [(HOST_A, HOST_A_MAC), (HOST_B, HOST_B_MAC)]
                .into_iter()
                .collect(),
            sources: fixture_sources().into_iter().collect(),
        }
    }
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn ip4(f: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3])
}

fn arp_is_request(a: &[u8]) -> bool {
    be16(a, 0) == 1 && be16(a, 2) == 0x0800 && a[4] == 6 && a[5] == 4 && be16(a, 6) == 1
}

/// ARP request at `at` -> reply from (mac, ip), in place.
fn arp_reply(f: &mut [u8], at: usize, mac: [u8; 6], ip: Ipv4Addr) {
    let req_mac: [u8; 6] = f[at + 8..at + 14].try_into().unwrap();
    let req_ip: [u8; 4] = f[at + 14..at + 18].try_into().unwrap();
    f[at + 6..at + 8].copy_from_slice(&2u16.to_be_bytes());
    f[at + 8..at + 14].copy_from_slice(&mac);
    f[at + 14..at + 18].copy_from_slice(&ip.octets());
    f[at + 18..at + 24].copy_from_slice(&req_mac);
    f[at + 24..at + 28].copy_from_slice(&req_ip);
}

fn outer_readdress(f: &mut [u8], mac: [u8; 6], dst_mac: [u8; 6], dst_ip: Ipv4Addr) {
    let vip: [u8; 4] = f[30..34].try_into().unwrap();
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&mac);
    f[26..30].copy_from_slice(&vip);
    f[30..34].copy_from_slice(&dst_ip.octets());
    f[22] = 64;
    let c = frames::ipv4_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[36..38].copy_from_slice(&4789u16.to_be_bytes());
    f[40..42].copy_from_slice(&[0, 0]);
}

/// What yard_gateway must do with `f`: the counter, and for XDP_TX the output frame.
pub fn model(s: &ModelState, f: &[u8]) -> (Counter, Option<Vec<u8>>) {
    use Counter::*;
    let len = f.len();
    if s.mtu == 0 {
        return (PassNotConfigured, None);
    }
    if len < 14 {
        return (DropTruncated, None);
    }
    let vip_mode = |ip: Ipv4Addr| s.vips.get(&ip).copied().filter(|m| *m == 1 || *m == 2);
    match be16(f, 12) {
        0x0806 => {
            if len < 14 + 28 || !arp_is_request(&f[14..]) {
                return (PassNotVip, None);
            }
            let tip = ip4(f, 14 + 24);
            let Some(mode) = vip_mode(tip) else {
                return (PassNotVip, None);
            };
            if !s.lease_valid {
                return (DropLeaseExpired, None);
            }
            if mode != 1 {
                return (PassNotVip, None);
            }
            let mut o = f.to_vec();
            let sha: [u8; 6] = f[22..28].try_into().unwrap();
            o[0..6].copy_from_slice(&sha);
            o[6..12].copy_from_slice(&s.mac);
            arp_reply(&mut o, 14, s.mac, tip);
            return (ArpRepliedOuter, Some(o));
        }
        0x0800 => {}
        _ => return (PassNonIpv4, None),
    }
    if len < 34 || f[14] >> 4 != 4 || f[14] & 0xf < 5 {
        return (DropTruncated, None);
    }
    if vip_mode(ip4(f, 30)).is_none() {
        return (PassNotVip, None);
    }
    // A flooded copy addressed to another host is left to the stack.
    if f[0..6] != s.mac {
        return (PassNotVip, None);
    }
    if f[14] & 0xf > 5 {
        return (DropIpOptions, None);
    }
    if be16(f, 20) & 0x3fff != 0 {
        return (DropFragment, None);
    }
    if len > usize::from(s.mtu) + 14 {
        return (DropOversize, None);
    }
    let tot = usize::from(be16(f, 16));
    if tot < 20 || tot > len - 14 {
        return (DropTruncated, None);
    }
    if f[23] != 17 {
        return (PassNotVxlan, None);
    }
    if len < 42 {
        return (DropTruncated, None);
    }
    if be16(f, 36) != 4789 {
        return (PassNotVxlan, None);
    }
    if len < 50 {
        return (DropTruncated, None);
    }
    if f[42] & 0x08 == 0 {
        return (DropBadVxlan, None);
    }
    let vni = u32::from_be_bytes([0, f[46], f[47], f[48]]);
    if !s.sources.contains(&(vni, ip4(f, 26))) {
        return (DropUnknownSource, None);
    }
    if len < 64 {
        return (DropTruncated, None);
    }
    match be16(f, 62) {
        0x0806 => {
            if len < 64 + 28 {
                return (DropTruncated, None);
            }
            if !arp_is_request(&f[64..]) {
                return (DropInnerOther, None);
            }
            let tip = ip4(f, 64 + 24);
            let Some((ep_mac, _)) = s.endpoints.get(&(vni, tip)) else {
                return (DropUnknownEndpoint, None);
            };
            let mut o = f.to_vec();
            let sha: [u8; 6] = f[72..78].try_into().unwrap();
            o[50..56].copy_from_slice(&sha);
            o[56..62].copy_from_slice(ep_mac);
            arp_reply(&mut o, 64, *ep_mac, tip);
            let prev: [u8; 6] = f[6..12].try_into().unwrap();
            outer_readdress(&mut o, s.mac, prev, ip4(f, 26));
            return (ArpRepliedInner, Some(o));
        }
        0x86dd => return (DropInnerIpv6, None),
        0x0800 => {}
        _ => return (DropInnerOther, None),
    }
    if len < 84 || f[64] >> 4 != 4 || f[64] & 0xf < 5 {
        return (DropTruncated, None);
    }
    let inner_tot = usize::from(be16(f, 66));
    if inner_tot < 20 || inner_tot > len - 64 {
        return (DropTruncated, None);
    }
    if f[64] & 0xf > 5 {
        return (DropIpOptions, None);
    }
    if be16(f, 70) & 0x3fff != 0 {
        return (DropFragment, None);
    }
    if f[72] <= 1 {
        return (DropTtl, None);
    }
    let Some((ep_mac, host)) = s.endpoints.get(&(vni, ip4(f, 80))) else {
        return (DropUnknownEndpoint, None);
    };
    let mut o = f.to_vec();
    o[50..56].copy_from_slice(ep_mac);
    // RFC 1624 as the program (and Linux's ip_decrease_ttl) does it, on the raw field.
    let mut check = u32::from(u16::from_ne_bytes([o[74], o[75]]));
    check += u32::from(0x0100u16.to_be());
    let check = (check + u32::from(check >= 0xffff)) as u16;
    o[74..76].copy_from_slice(&check.to_ne_bytes());
    o[72] -= 1;
    // Tests run where the kernel has no neighbour for the fixture's hosts: a host missing from
    // the map goes to the stack, addressed to the gateway's own MAC.
    let Some(host_mac) = s.hosts.get(host) else {
        outer_readdress(&mut o, s.mac, s.mac, *host);
        return (PassUnresolvedHost, Some(o));
    };
    outer_readdress(&mut o, s.mac, *host_mac, *host);
    (Forwarded, Some(o))
}

// ---------------------------------------------------------------------------------------------
// Clean-up guards.

/// A fresh directory on a bpffs for pins, removed (with everything pinned in it) on drop, also
/// when the test panics. Uses /sys/fs/bpf if it is a bpffs, else mounts a private one.
pub struct BpffsDir {
    pub path: PathBuf,
    mounted: Option<tempfile::TempDir>,
}

fn is_bpffs(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| {
            m.lines().any(|l| {
                let mut it = l.split_whitespace();
                let (_, target, fstype) = (it.next(), it.next(), it.next());
                target == path.to_str() && fstype == Some("bpf")
            })
        })
        .unwrap_or(false)
}

impl BpffsDir {
    pub fn new(tag: &str) -> Self {
        let root = Path::new("/sys/fs/bpf");
        let (base, mounted) = if is_bpffs(root) {
            (root.to_path_buf(), None)
        } else {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let status = Command::new("mount")
                .args(["-t", "bpf", "bpf"])
                .arg(dir.path())
                .status()
                .expect("run mount");
            assert!(
                status.success(),
                "could not mount a bpffs on {:?}",
                dir.path()
            );
            (dir.path().to_path_buf(), Some(dir))
        };
        let path = base.join(format!("ydebpf-{}-{tag}", std::process::id()));
        // A leftover of a killed earlier run with the same pid would make "adopted" lie.
        let _ = Gateway::remove_pinned(&path);
        Self { path, mounted }
    }
}

impl Drop for BpffsDir {
    fn drop(&mut self) {
        if let Err(e) = Gateway::remove_pinned(&self.path) {
            eprintln!("cleanup: {e}");
        }
        if let Some(dir) = &self.mounted {
            let _ = Command::new("umount").arg(dir.path()).status();
        }
    }
}

/// A network namespace `ydebpf-<pid>-<tag>` with a veth pair (`yd0`, `yd1`, both up) inside it;
/// deleted on drop, also on panic. Nothing is created in the root namespace.
pub struct NetnsVeth {
    pub name: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetnsVeth {
    pub fn new(tag: &str) -> Self {
        let name = format!("ydebpf-{}-{tag}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let guard = Self { name };
        let n = guard.name.as_str();
        ip(&[
            "-n", n, "link", "add", "yd0", "type", "veth", "peer", "name", "yd1",
        ]);
        ip(&["-n", n, "link", "set", "yd0", "up"]);
        ip(&["-n", n, "link", "set", "yd1", "up"]);
        guard
    }

    /// Runs `f` inside the namespace (see [`run_in_netns`]).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in_netns(&self.name, f)
    }

    /// `ip -n <ns> link show dev` output, to see the attached program.
    pub fn link_show(&self, dev: &str) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-d", "link", "show", "dev", dev])
            .output()
            .expect("run ip");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for NetnsVeth {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs `f` on a short-lived thread that has entered the named network namespace (setns
/// affects only the calling thread, so the test's own thread stays in the root namespace).
/// Sockets and attachments made in `f` stay in that namespace after it returns.
pub fn run_in_netns<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/var/run/netns/{name}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let ns = std::fs::File::open(&path).expect("open the netns");
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns into the test namespace");
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Two network namespaces `<prefix><pid>-<tag>-a` and `-b`, joined by a veth pair (`ydp0` in
/// a, `ydp1` in b, both up) with one address each; both deleted on drop, also on panic.
/// Nothing is created in the root namespace.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
}

impl NetnsPair {
    pub const IF_A: &'static str = "ydp0";
    pub const IF_B: &'static str = "ydp1";

    /// `addr_a`/`addr_b` must be in one /24 of 198.18.0.0/16 (the benchmarking range).
    pub fn new(prefix: &str, tag: &str, addr_a: Ipv4Addr, addr_b: Ipv4Addr) -> Self {
        let base = format!("{prefix}{}-{tag}", std::process::id());
        let (a, b) = (format!("{base}-a"), format!("{base}-b"));
        for name in [&a, &b] {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
        ip(&["netns", "add", &a]);
        // From here on the guard removes whatever was made, also if a later step panics.
        let mut guard = Self {
            a,
            b: String::new(),
        };
        ip(&["netns", "add", &b]);
        guard.b = b;
        let (a, b) = (guard.a.as_str(), guard.b.as_str());
        ip(&[
            "-n",
            a,
            "link",
            "add",
            Self::IF_A,
            "type",
            "veth",
            "peer",
            "name",
            Self::IF_B,
            "netns",
            b,
        ]);
        for (ns, dev, addr) in [(a, Self::IF_A, addr_a), (b, Self::IF_B, addr_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        guard
    }

    pub fn run_a<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in_netns(&self.a, f)
    }

    pub fn run_b<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in_netns(&self.b, f)
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for name in [&self.a, &self.b] {
            if !name.is_empty() {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
            }
        }
    }
}
