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
