//! The loader on a veth in a network namespace the test makes (nothing in the root namespace):
//! hardware mode is refused here (no SmartNIC), the refusal is one sentence, and the host
//! part runs alone in driver mode; dropping the result detaches it. Needs root.

mod common;

use std::process::Command;

use aya::programs::XdpMode;
use yard_offload::attach::{attach, NicPlacement};
use yard_offload::gen::{self, Role};
use yard_offload::{gateway, plan, Profile};

struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("yd{}-ofl", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        ip(&[
            "-n", &ns.0, "link", "add", "yd0", "type", "veth", "peer", "name", "yd1",
        ]);
        ip(&["-n", &ns.0, "link", "set", "yd0", "up"]);
        ip(&["-n", &ns.0, "link", "set", "yd1", "up"]);
        ns
    }

    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path).expect("open the netns");
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&ns),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .expect("setns");
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    fn link(&self, dev: &str) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.0, "-d", "link", "show", "dev", dev])
            .output()
            .expect("ip");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hardware_mode_is_refused_cleanly_and_the_host_part_runs_alone() {
    let p = gateway::pipeline();
    let the_plan = plan::plan(
        &p,
        &Profile::by_name("nfp").unwrap(),
        &plan::HostModel::default(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let nic = std::fs::read(common::compile_str(
        "oxdp_nic",
        &gen::generate(&p, the_plan.mask, Role::Nic).unwrap(),
        dir.path(),
        &[],
    ))
    .unwrap();
    let host = std::fs::read(common::compile_str(
        "oxdp_host",
        &gen::generate(&p, 0, Role::Host).unwrap(),
        dir.path(),
        &[],
    ))
    .unwrap();
    let ns = Netns::new();
    let attached = ns.run(|| attach("yd0", &nic, &host).expect("attaches"));
    match &attached.nic {
        NicPlacement::Refused(reason) => {
            assert!(
                reason.starts_with("hardware-mode XDP on yd0 was refused ("),
                "{reason}"
            );
            assert!(
                reason.contains("the whole program runs on the host"),
                "{reason}"
            );
            assert!(!reason.contains('\n'));
            println!("{reason}");
        }
        NicPlacement::Hardware => panic!("hardware mode accepted on a veth"),
    }
    assert_eq!(attached.host_mode, XdpMode::Driver);
    let shown = ns.link("yd0");
    assert!(shown.contains("xdp"), "{shown}");
    drop(attached);
    let shown = ns.link("yd0");
    assert!(
        !shown.contains("prog/xdp"),
        "still attached after drop: {shown}"
    );
}
