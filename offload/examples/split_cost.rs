//! `split_cost`: the host CPU a split saves, MEASURED on this machine with BPF_PROG_TEST_RUN,
//! beside the planner's MODEL figures for the same cut.
//!
//! For a tunnel frame of the main class (forward to a known host) it measures, interleaved in
//! rounds: the bounce floor (`yard_bounce`), the whole gateway (`yard_gateway`), the generated
//! host part of the nfp plan's cut on what the NIC part hands it, and the generated NIC part
//! run on this CPU (the emulated NIC: its time here says nothing about a SmartNIC's speed).
//! One program run per call (the kernel's timer read is in every figure, the floor's too), the
//! median over calls per round, the median over rounds. Execution time only: no driver RX.
//!
//! A benchmark, not a test: it prints figures and never fails on a number; it fails only when
//! it cannot compile (clang) or load (root) the programs.
//!
//! ```text
//! cargo run -p yard-offload --example split_cost [--release] -- [--calls N] [--rounds R] [--json]
//! ```

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use aya::maps::{Array, HashMap as BpfHashMap};
use aya::programs::Xdp;
use aya::Ebpf;
use serde_json::json;
use yard_ebpf::frames::{Inner, VxlanFrame};
use yard_ebpf::layout::{ip_to_map, GwConfig, GwEp, GwEpKey, GwHost, GwVip, VIP_OWNED};
use yard_ebpf::{bench_xdp, run_xdp, Bounce, Endpoint, Gateway, GatewayConfig, VipMode, XdpAction};
use yard_offload::gen::{self, Role};
use yard_offload::plan::{self, HostModel};
use yard_offload::{gateway, Profile};

const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xff, 0x01];
const SENDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x00, 0x09];
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x00, 0x02];
const TENANT_MAC: [u8; 6] = [0x02, 0, 0, 1, 0, 0x10];
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const SENDER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 9);
const HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const TENANT: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 10);
const VNI: u32 = 100;

fn compile(name: &str, src: &str, dir: &Path) -> Vec<u8> {
    let c = dir.join(format!("{name}.c"));
    let o = dir.join(format!("{name}.o"));
    std::fs::write(&c, src).expect("write C");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf");
    let multiarch = if cfg!(target_arch = "aarch64") {
        "/usr/include/aarch64-linux-gnu"
    } else {
        "/usr/include/x86_64-linux-gnu"
    };
    let ok = Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf"])
        .arg(format!("-I{multiarch}"))
        .arg(format!("-I{}", include.display()))
        .arg("-c")
        .arg(&c)
        .arg("-o")
        .arg(&o)
        .status()
        .expect("clang is installed")
        .success();
    assert!(ok, "clang failed on {name}");
    std::fs::read(o).expect("read object")
}

fn load_part(obj: &[u8], role: Role) -> Ebpf {
    let mut e = Ebpf::load(obj).expect("parse");
    {
        let p: &mut Xdp = e
            .program_mut(role.program_name())
            .expect("program")
            .try_into()
            .expect("xdp");
        p.load().expect("load (root needed)");
    }
    let mut cfg: Array<_, GwConfig> =
        Array::try_from(e.map_mut("gw_config").expect("map")).expect("array");
    cfg.set(
        0,
        GwConfig {
            mac: GW_MAC,
            mtu: 1500,
            lease_deadline_ns: u64::MAX,
        },
        0,
    )
    .expect("set");
    let mut vips: BpfHashMap<_, u32, GwVip> =
        BpfHashMap::try_from(e.map_mut("gw_vips").expect("map")).expect("hash");
    vips.insert(ip_to_map(VIP), GwVip { mode: VIP_OWNED }, 0)
        .expect("vip");
    let mut eps: BpfHashMap<_, GwEpKey, GwEp> =
        BpfHashMap::try_from(e.map_mut("gw_endpoints").expect("map")).expect("hash");
    eps.insert(
        GwEpKey {
            vni: VNI,
            ip: ip_to_map(TENANT),
        },
        GwEp {
            mac: TENANT_MAC,
            pad: 0,
            host: ip_to_map(HOST),
        },
        0,
    )
    .expect("endpoint");
    let mut hosts: BpfHashMap<_, u32, GwHost> =
        BpfHashMap::try_from(e.map_mut("gw_hosts").expect("map")).expect("hash");
    hosts
        .insert(
            ip_to_map(HOST),
            GwHost {
                mac: HOST_MAC,
                pad: 0,
            },
            0,
        )
        .expect("host");
    let mut sources: BpfHashMap<_, GwEpKey, u32> =
        BpfHashMap::try_from(e.map_mut("gw_sources").expect("map")).expect("hash");
    sources
        .insert(
            GwEpKey {
                vni: VNI,
                ip: ip_to_map(SENDER),
            },
            1,
            0,
        )
        .expect("source");
    e
}

fn part(e: &Ebpf, role: Role) -> &Xdp {
    e.program(role.program_name())
        .expect("program")
        .try_into()
        .expect("xdp")
}

/// One run: the verdict and the frame as the part left it.
fn run_part(e: &Ebpf, role: Role, frame: &[u8]) -> (XdpAction, Vec<u8>) {
    let o = run_xdp(part(e, role), role.program_name(), frame).expect("test run");
    (o.action, o.frame)
}

/// One kernel-measured run, in ns.
fn time_part(e: &Ebpf, role: Role, frame: &[u8]) -> u64 {
    bench_xdp(part(e, role), role.program_name(), frame, 1).expect("test run")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let calls = opt("--calls", 2000).max(1);
    let rounds = opt("--rounds", 7).max(1);
    let as_json = args.iter().any(|a| a == "--json");

    let pipeline = gateway::pipeline();
    let nfp = Profile::by_name("nfp").expect("nfp");
    let the_plan = plan::plan(&pipeline, &nfp, &HostModel::default()).expect("plan");
    let dir = tempfile::tempdir().expect("tempdir");
    let nic = load_part(
        &compile(
            "oxdp_nic",
            &gen::generate(&pipeline, the_plan.mask, Role::Nic).expect("gen"),
            dir.path(),
        ),
        Role::Nic,
    );
    let host = load_part(
        &compile(
            "oxdp_host",
            &gen::generate(&pipeline, 0, Role::Host).expect("gen"),
            dir.path(),
        ),
        Role::Host,
    );

    let mut whole = Gateway::load().expect("load yard_gateway (root needed)");
    whole
        .set_config(&GatewayConfig {
            mac: GW_MAC,
            mtu: 1500,
        })
        .expect("config");
    whole.set_lease_deadline(u64::MAX).expect("lease");
    whole.put_vip(VIP, VipMode::Owned).expect("vip");
    whole
        .put_endpoint(&Endpoint {
            vni: VNI,
            ip: TENANT,
            mac: TENANT_MAC,
            host: HOST,
        })
        .expect("endpoint");
    whole.put_host(HOST, HOST_MAC).expect("host");
    whole.put_source(VNI, SENDER).expect("source");
    let bounce = Bounce::load().expect("load yard_bounce");

    let frame = VxlanFrame::new(
        SENDER_MAC,
        GW_MAC,
        SENDER,
        VIP,
        VNI,
        Inner::udp(
            [0x02, 0, 0, 1, 0, 0x20],
            [0x02, 0, 0, 0, 0, 0x77],
            Ipv4Addr::new(198, 19, 1, 20),
            TENANT,
            b"payload!",
        ),
    )
    .build();
    // what the host part receives under this cut, and a check that the split forwards it
    let (nic_verdict, handed) = run_part(&nic, Role::Nic, &frame);
    let host_input = if nic_verdict == XdpAction::Pass {
        handed
    } else {
        Vec::new()
    };
    if !host_input.is_empty() {
        let (v, out) = run_part(&host, Role::Host, &host_input);
        let w = whole.test_run(&frame).expect("whole");
        assert_eq!(
            (v, out),
            (XdpAction::Tx, w.frame),
            "split and whole disagree on the benchmark frame"
        );
    }

    let mut floor = Vec::new();
    let mut whole_ns = Vec::new();
    let mut host_ns = Vec::new();
    let mut nic_ns = Vec::new();
    for _ in 0..rounds {
        let mut f = Vec::new();
        let mut w = Vec::new();
        let mut h = Vec::new();
        let mut n = Vec::new();
        for _ in 0..calls {
            f.push(bounce.bench_run(&frame, 1).expect("bounce") as f64);
            w.push(whole.bench_run(&frame, 1).expect("whole") as f64);
            n.push(time_part(&nic, Role::Nic, &frame) as f64);
            if !host_input.is_empty() {
                h.push(time_part(&host, Role::Host, &host_input) as f64);
            }
        }
        floor.push(median(f));
        whole_ns.push(median(w));
        nic_ns.push(median(n));
        if !h.is_empty() {
            host_ns.push(median(h));
        }
    }
    let floor = median(floor);
    let whole_ns = median(whole_ns);
    let nic_ns = median(nic_ns);
    let host_ns = if host_ns.is_empty() {
        0.0
    } else {
        median(host_ns)
    };
    let f = &the_plan.figures;
    let value = json!({
        "frame": "forward class: VXLAN to a VIP, known endpoint and host",
        "cut_nic_ops": the_plan.nic_ops,
        "measured": {
            "label": "MEASURED on this machine: BPF_PROG_TEST_RUN, one run per call, median of call medians; execution only (no driver RX)",
            "calls_per_round": calls,
            "rounds": rounds,
            "bounce_floor_ns": floor,
            "whole_gateway_ns": whole_ns,
            "split_host_part_ns": host_ns,
            "split_nic_part_on_this_cpu_ns": nic_ns,
            "whole_over_floor": whole_ns / floor,
            "host_part_over_floor": host_ns / floor,
            "host_ns_saved_per_packet": whole_ns - host_ns,
        },
        "model": {
            "label": the_plan.label,
            "split_throughput_pps": f.throughput_pps,
            "nic_pps": f.nic_pps,
            "host_pps": f.host_pps,
            "host_only_throughput_pps": the_plan.host_only.throughput_pps,
            "speedup_vs_host_only": the_plan.speedup_vs_host_only,
            "host_model_ns_per_packet_host_only": the_plan.host_only.host_ns_per_pkt,
            "host_model_rx_ns": HostModel::default().rx_ns,
        },
        "reference": "OXDP (published, other hardware): 18.7 Mpps, 30x one software XDP core",
    });
    if as_json {
        println!("{value}");
    } else {
        println!(
            "split_cost: the nfp plan's cut ({} ops on the NIC), forward-class frame",
            the_plan.nic_ops.len()
        );
        println!("MEASURED (BPF_PROG_TEST_RUN, execution only, one run per call, {rounds} rounds x {calls} calls):");
        println!("  bounce floor           {floor:>8.1} ns");
        println!(
            "  whole yard_gateway     {whole_ns:>8.1} ns  ({:.2}x floor)",
            whole_ns / floor
        );
        println!(
            "  split host part        {host_ns:>8.1} ns  ({:.2}x floor)",
            host_ns / floor
        );
        println!("  split NIC part (here)  {nic_ns:>8.1} ns  (emulated NIC on this CPU: not a SmartNIC figure)");
        println!("  host ns saved/packet   {:>8.1} ns", whole_ns - host_ns);
        println!("MODEL (assumed parameters, not measured):");
        println!(
            "  split {:.2} Mpps (NIC {:.2}, host {:.2}); host only {:.2} Mpps; {:.1}x",
            f.throughput_pps / 1e6,
            f.nic_pps / 1e6,
            f.host_pps / 1e6,
            the_plan.host_only.throughput_pps / 1e6,
            the_plan.speedup_vs_host_only
        );
        println!(
            "reference (published, other hardware): OXDP 18.7 Mpps, 30x one software XDP core"
        );
    }
}
