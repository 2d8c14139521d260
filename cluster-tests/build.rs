//! Compiles the TC-BPF loss program once, so tests never need clang at run time.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/loss.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("loss.bpf.o");
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "arm64",
        _ => "x86",
    };
    let multiarch = match arch {
        "arm64" => "/usr/include/aarch64-linux-gnu",
        _ => "/usr/include/x86_64-linux-gnu",
    };
    let result = Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf"])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .status();
    match result {
        Ok(status) if status.success() => {}
        Ok(status) => panic!(
            "clang could not compile {src} ({status}); install Debian's clang and libbpf-dev"
        ),
        Err(e) => panic!(
            "could not run clang to compile {src} ({e}); install Debian's clang and libbpf-dev"
        ),
    }
}
