//! Compiles C with clang into BPF objects for the tests, exactly as ebpf/build.rs does for
//! the project's programs.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn multiarch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "/usr/include/aarch64-linux-gnu"
    } else {
        "/usr/include/x86_64-linux-gnu"
    }
}

/// `clang -O2 -g -target bpf -c src -o dir/out`, with the project's include directory.
pub fn compile(src: &Path, dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!(
        "{}.o",
        src.file_stem().expect("a file name").to_string_lossy()
    ));
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf");
    let status = Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86"])
        .arg(format!("-I{}", multiarch()))
        .arg(format!("-I{}", include.display()))
        .args(extra)
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("clang is installed (Debian's clang)");
    assert!(status.success(), "clang failed on {}", src.display());
    out
}

/// Compiles a C source given as text.
pub fn compile_str(name: &str, c: &str, dir: &Path, extra: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, c).expect("write the C source");
    compile(&src, dir, extra)
}

/// The project's gateway program, compiled fresh.
pub fn gateway(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf/gateway.bpf.c");
    compile(&src, dir, &[])
}

/// A host (x86-64 or arm64) object, to test that non-BPF ELF is refused.
pub fn compile_str_host(name: &str, c: &str, dir: &Path) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, c).expect("write the C source");
    let out = dir.join(format!("{name}.o"));
    let status = Command::new("clang")
        .args(["-O2", "-c"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("clang is installed");
    assert!(status.success());
    out
}

/// Every downward-closed set of a pipeline (bit i: op i on the NIC), derived here from the ops'
/// dependencies alone, independently of the planner's own enumeration it checks.
pub fn ideals(p: &yard_offload::plan::Pipeline) -> Vec<u64> {
    let n = p.ops.len();
    (0u64..1 << n)
        .filter(|m| {
            (0..n).all(|i| m & (1 << i) == 0 || p.ops[i].deps.iter().all(|&d| m & (1 << d) != 0))
        })
        .collect()
}
