//! `yard offload check` and `yard offload plan` end to end: the real binary on the gateway's object, compiled here
//! with clang exactly as ebpf/build.rs compiles it, and on files that are not BPF objects.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_yard");

fn gateway_object(dir: &Path) -> PathBuf {
    let bpf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf");
    let out = dir.join("gateway.bpf.o");
    let multiarch = if cfg!(target_arch = "aarch64") {
        "/usr/include/aarch64-linux-gnu"
    } else {
        "/usr/include/x86_64-linux-gnu"
    };
    let status = Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86"])
        .arg(format!("-I{multiarch}"))
        .arg("-c")
        .arg(bpf.join("gateway.bpf.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("clang is installed");
    assert!(status.success());
    out
}

fn yard(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run yard")
}

#[test]
fn check_gateway_json_and_text() {
    let dir = tempfile::tempdir().unwrap();
    let obj = gateway_object(dir.path());
    let obj = obj.to_str().unwrap();

    let out = yard(&["offload", "check", obj, "--profile", "nfp", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["profile"], "nfp");
    let p = &v["programs"][0];
    assert_eq!(p["name"], "yard_gateway");
    assert_eq!(p["verdict"], "ineligible");
    assert_eq!(p["return_codes"], serde_json::json!([1, 2, 3]));
    let details: Vec<String> = p["functions"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["detail"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        details.iter().any(|d| d.contains("bpf_fib_lookup (69)")),
        "{details:?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.contains("gw_counters is percpu_array")),
        "{details:?}"
    );

    let text = yard(&["offload", "check", obj, "--profile", "nfp"]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("program yard_gateway (section xdp): ineligible for profile nfp"),
        "{text}"
    );
    assert!(
        text.contains("ineligible because calls helper bpf_fib_lookup (69) at insn"),
        "{text}"
    );
    assert!(text.contains("model estimate"), "{text}");

    let none = yard(&["offload", "check", obj, "--profile", "none", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&none.stdout).unwrap();
    assert_eq!(v["programs"][0]["findings"][0]["rule"], "no_offload_target");
}

#[test]
fn bad_files_get_one_sentence_and_fail() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.o");
    std::fs::write(&junk, b"not an object at all").unwrap();
    let out = yard(&["offload", "check", junk.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("junk.o: not an ELF object"),
        "{err}"
    );

    // an ELF object that is not BPF: the yard binary itself
    let out = yard(&["offload", "check", BIN]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("an ELF object, but not a BPF one"), "{err}");

    let missing = yard(&["offload", "check", "/nonexistent/x.o"]);
    assert!(!missing.status.success());
    let err = String::from_utf8(missing.stderr).unwrap();
    assert!(
        err.contains("/nonexistent/x.o: could not read the file"),
        "{err}"
    );

    let bad_profile = yard(&["offload", "check", BIN, "--profile", "bluefield"]);
    assert!(!bad_profile.status.success());
}

#[test]
fn plan_is_labelled_a_model() {
    let out = yard(&["offload", "plan", "--profile", "nfp", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["profile"], "nfp");
    assert!(v["label"].as_str().unwrap().starts_with("MODEL"));
    let nic: Vec<&str> = v["nic_ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert!(
        nic.contains(&"endpoint_lookup") && !nic.contains(&"fib_fallback"),
        "{nic:?}"
    );
    assert!(
        v["figures"]["throughput_pps"].as_f64().unwrap()
            > v["host_only"]["throughput_pps"].as_f64().unwrap()
    );

    let text = yard(&["offload", "plan"]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("(MODEL: figures computed from assumed parameters, not measured"),
        "{text}"
    );
    assert!(
        text.contains("fib_fallback stays on the host: helper bpf_fib_lookup (69)"),
        "{text}"
    );
    assert!(text.contains("OXDP 18.7 Mpps"), "{text}");

    let none = yard(&["offload", "plan", "--profile", "none", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&none.stdout).unwrap();
    assert_eq!(v["nic_ops"], serde_json::json!([]));
}

#[test]
fn plan_emits_programs_that_compile() {
    let dir = tempfile::tempdir().unwrap();
    let out = yard(&[
        "offload",
        "plan",
        "--emit",
        dir.path().to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // the NIC part (pass handoff and the emulated NIC's redirect handoff), the host part, yard.h
    assert_eq!(v["emitted"].as_array().unwrap().len(), 4);
    let multiarch = if cfg!(target_arch = "aarch64") {
        "/usr/include/aarch64-linux-gnu"
    } else {
        "/usr/include/x86_64-linux-gnu"
    };
    for part in ["oxdp_nic", "oxdp_nic_emu", "oxdp_host"] {
        let src = dir.path().join(format!("{part}.bpf.c"));
        let obj = dir.path().join(format!("{part}.bpf.o"));
        let status = Command::new("clang")
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg(format!("-I{multiarch}"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status()
            .expect("clang");
        assert!(status.success(), "{part} does not compile");
    }
    // the NIC part of the nfp plan passes the nfp check with no definite finding
    let check = yard(&[
        "offload",
        "check",
        dir.path().join("oxdp_nic.bpf.o").to_str().unwrap(),
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_ne!(r["programs"][0]["verdict"], "ineligible", "{r}");
}
