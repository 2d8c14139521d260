//! The generated NIC and host programs compile with clang for every cut of the gateway
//! pipeline, and the checker's verdict on each NIC part agrees with the planner's profile
//! rules for the ops it holds.

mod common;

use yard_offload::gen::{self, Role};
use yard_offload::{check_file, gateway, Profile};

#[test]
fn generated_parts_compile_and_the_nfp_check_agrees() {
    let p = gateway::pipeline();
    let dir = tempfile::tempdir().expect("tempdir");
    let all = common::ideals(&p);
    assert_eq!(all.len(), 100);
    let host = gen::generate(&p, 0, Role::Host).expect("host part");
    let host_o = common::compile_str("oxdp_host", &host, dir.path(), &["-Wall", "-Werror"]);
    assert!(host_o.exists());
    let nfp = Profile::by_name("nfp").expect("nfp");
    // the whole fast path on the NIC (the planner's choice plus checksum and verdict)
    let fast = [0usize, 1, 5, 6, 7, 8, 10, 11, 13, 14, 15]
        .iter()
        .fold(0u64, |m, i| m | (1 << i));
    for mask in [0u64, 0b11, fast, (1 << 16) - 1] {
        let nic = gen::generate(&p, mask, Role::Nic).expect("NIC part");
        let o = common::compile_str(
            &format!("oxdp_nic_{mask:x}"),
            &nic,
            dir.path(),
            &["-Wall", "-Werror"],
        );
        let r = check_file(&o, &nfp).expect("parses");
        let prog = &r.programs[0];
        assert_eq!(prog.name, "oxdp_nic");
        let details: Vec<&str> = prog
            .functions
            .iter()
            .flat_map(|f| f.findings.iter())
            .chain(prog.findings.iter())
            .filter(|f| f.certainty == yard_offload::check::Certainty::Definite)
            .map(|f| f.detail.as_str())
            .collect();
        if mask == (1 << 16) - 1 {
            // everything, FIB lookup and lease clock included: refused for exactly those
            assert!(
                details.iter().any(|d| d.contains("bpf_fib_lookup")),
                "{details:?}"
            );
            assert!(
                details.iter().any(|d| d.contains("bpf_ktime_get_ns")),
                "{details:?}"
            );
        } else {
            // the fast path and smaller cuts use only nfp helpers and maps
            assert!(
                details.is_empty(),
                "cut {mask:#x}: {details:?}\n{}",
                r.human()
            );
        }
    }
}

#[test]
fn the_built_in_split_parts_are_the_generators_output_for_the_default_cut() {
    // ebpf/bpf/oxdp_*.bpf.c are what the daemon runs; they must not drift from the generator.
    let p = gateway::pipeline();
    let nfp = Profile::by_name("nfp").expect("nfp");
    let plan = yard_offload::plan::plan(&p, &nfp, &yard_offload::plan::HostModel::default())
        .expect("plans");
    assert_eq!(gateway::default_cut(), plan.mask);
    let bpf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf");
    for (name, role, handoff) in gen::FILES {
        let want = gen::generate_with(&p, plan.mask, role, handoff).expect("generates");
        let got = std::fs::read_to_string(bpf.join(name)).expect("the built-in part exists");
        assert!(
            got == want,
            "ebpf/bpf/{name} is stale: regenerate with `yard offload plan --profile nfp --emit ebpf/bpf`"
        );
    }
}
