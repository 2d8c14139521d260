//! `yard plan services` end to end: the real binary on files, its JSON and table, and a bad
//! line refused with the file and line named.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_yard");

const NODES: &str = "\
# id  bytes/s  packets/s  P(down)
gw1   1.25G    2M         0.01
gw2   1.25G    2M         0.01
gw3   1.25G    2M         0.05
gw4   1.25G    2M         0.002
";

/// Skewed: one tenant carries most of the traffic.
const TENANTS: &str = "\
# tenant  availability  VIPs
big     0.9999  198.19.0.1=400M,300k 198.19.0.2=300M,250k 198.19.0.3=200M,150k
small1  0.999   198.19.1.1=50M,40k
small2  0.99    replicas=3 198.19.2.1=30M,20k 198.19.2.2=30M,20k
small3  0.999   198.19.3.1=80M,60k
";

fn files(tenants: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("tenants.txt");
    let n = dir.path().join("nodes.txt");
    std::fs::write(&t, tenants).unwrap();
    std::fs::write(&n, NODES).unwrap();
    let (t, n) = (t.display().to_string(), n.display().to_string());
    (dir, t, n)
}

#[test]
fn plans_services_from_files() {
    let (_dir, t, n) = files(TENANTS);
    let out = Command::new(BIN)
        .args([
            "plan",
            "services",
            "--tenants",
            &t,
            "--nodes",
            &n,
            "--failures",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 4);
    let tenants = v["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 4);
    for t in tenants {
        assert_eq!(t["met"], true, "{t}");
        assert!(t["nodes"].as_array().unwrap().len() >= 2);
        for vip in t["vips"].as_array().unwrap() {
            assert!(t["nodes"].as_array().unwrap().contains(&vip["node"]));
        }
    }
    assert_eq!(
        tenants[2]["nodes"].as_array().unwrap().len(),
        3,
        "replicas=3"
    );
    // 1.12 GB/s over 5 GB/s: no survivor of one failure is overloaded.
    assert!(v["load_factor"].as_f64().unwrap() < 1.0);
    assert!(v["worst_single_failure"]["load_factor"].as_f64().unwrap() <= 1.0);
    assert_eq!(v["worst_single_failure"]["served"], 1.0);
    let worst = v["worst"].as_array().unwrap();
    assert_eq!(worst.len(), 2);
    assert_eq!(worst[1]["scenarios"], 6);
    let loads: f64 = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["bps"].as_f64().unwrap())
        .sum();
    assert!(
        (loads - 1.09e9).abs() < 1.0,
        "every byte placed once: {loads}"
    );

    // The same seed, the same plan; the table names every node and tenant.
    let again = Command::new(BIN)
        .args([
            "plan",
            "services",
            "--tenants",
            &t,
            "--nodes",
            &n,
            "--failures",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.stdout, again.stdout);
    let table = Command::new(BIN)
        .args(["plan", "services", "--tenants", &t, "--nodes", &n])
        .output()
        .unwrap();
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    for name in ["gw1", "gw4", "big", "small3", "worst single failure"] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
}

#[test]
fn a_bad_line_is_refused_naming_file_and_line() {
    let (_dir, t, n) = files("ok 0.99 198.19.0.1=1M,1k\nbad 1.5 198.19.0.2=1M,1k\n");
    let out = Command::new(BIN)
        .args(["plan", "services", "--tenants", &t, "--nodes", &n])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err.trim_end(),
        format!("error: {t} line 2: availability must be a number in [0, 1), got \"1.5\"")
    );
    assert!(out.stdout.is_empty());
}
