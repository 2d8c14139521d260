//! The aggregator's result fan-out on real veths (issue 26): `yard_agg` and its TC fan-out on
//! host 1's eth0, workers on hosts 2..=5 as plain UDP sockets that count every frame they get.
//! Every worker must get every chunk's result exactly once, with the exact int32 sum and the
//! aggregator's result token, through clones for all but the last worker and the original
//! frame redirected to the last. Run at MTU 1500 and at MTU 9000 (jumbo frames, which need the
//! multi-buffer build of the XDP program on a veth). Needs root.

use std::collections::BTreeMap;
use std::net::{SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use yard_agg::wire::{self, Dtype, Geometry, Header, Kind};
use yard_cluster_tests::{require_root, Topology};
use yard_ebpf::{AggCounter, AggJobEntry, Aggregator, XdpMode};

const JOB: u32 = 9;
const WORKERS: usize = 4;
const ROUNDS: u32 = 3;
const RESULT_TOKEN: u32 = 0x5eed_0001;

fn token(w: usize) -> u32 {
    0x7000_0000 | w as u32
}

fn gradient(w: usize, round: u32, values: u32) -> Vec<i32> {
    (0..values)
        .map(|i| {
            (i as i32)
                .wrapping_mul(31)
                .wrapping_add((w as i32 + 1) * 1000 + round as i32)
        })
        .collect()
}

/// What worker `w` received: (round, chunk) -> every result frame's values.
type Received = BTreeMap<(u32, u32), Vec<Vec<i32>>>;

/// Worker `w` of the job: sends each round's chunks, then collects results until it has every
/// chunk of the round and the line has been quiet for a while (so a second copy would be seen).
fn worker(
    w: usize,
    addr: SocketAddrV4,
    agg: SocketAddrV4,
    geometry: Geometry,
) -> Result<Received, String> {
    let sock = UdpSocket::bind(addr).map_err(|e| format!("worker {w} cannot bind {addr}: {e}"))?;
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .map_err(|e| e.to_string())?;
    let mut got = Received::new();
    let mut buf = vec![0u8; 16 << 10];
    for round in 0..ROUNDS {
        let g = gradient(w, round, geometry.values);
        let mut start = 0usize;
        for chunk in 0..geometry.chunks() {
            let n = geometry.chunk_len(chunk);
            let frame = wire::encode(
                &Header {
                    kind: Kind::Data,
                    flags: 0,
                    exp: 0,
                    job: JOB,
                    epoch: 1,
                    round,
                    chunk,
                    worker: w as u16,
                    count: 0,
                    contributors: 0,
                    token: token(w),
                },
                &g[start..start + n],
            );
            start += n;
            sock.send_to(&frame, agg)
                .map_err(|e| format!("worker {w} cannot send: {e}"))?;
        }
        // Every chunk of this round, then quiet: a duplicate would arrive within the timeout.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let complete = (0..geometry.chunks()).all(|c| got.contains_key(&(round, c)));
            match sock.recv(&mut buf) {
                Ok(len) => {
                    let (h, body) = Header::parse(&buf[..len])
                        .map_err(|e| format!("worker {w}: a frame that is not a result: {e}"))?;
                    if h.kind != Kind::Result || h.job != JOB || h.token != RESULT_TOKEN {
                        return Err(format!("worker {w}: unexpected frame {h:?}"));
                    }
                    got.entry((h.round, h.chunk))
                        .or_default()
                        .push(wire::values(body));
                }
                Err(_) if complete => break,
                Err(_) if Instant::now() > deadline => {
                    return Err(format!("worker {w}: round {round} incomplete after 10 s"))
                }
                Err(_) => {}
            }
        }
    }
    Ok(got)
}

fn fan_out_at(mtu: u32) {
    require_root();
    let topo = Topology::new(WORKERS + 1).expect("namespace hosts");
    if mtu != 1500 {
        let mtu = mtu.to_string();
        let set = |ns: &str, dev: &str| {
            let out = std::process::Command::new("ip")
                .args(["-n", ns, "link", "set", dev, "mtu", &mtu])
                .output()
                .expect("ip runs");
            assert!(out.status.success(), "cannot set the MTU of {dev} in {ns}");
        };
        for i in 1..=WORKERS + 1 {
            set(&topo.fabric_ns(), &format!("h{i}"));
            set(&topo.ns_name(i), "eth0");
        }
        set(&topo.fabric_ns(), "br0");
    }
    let geometry = Geometry {
        values: 5000,
        chunk_values: Geometry::chunk_values_for_mtu(mtu).expect("a chunk fits"),
    };
    let agg = SocketAddrV4::new(topo.addr(1), wire::PORT);
    let members: Vec<SocketAddrV4> = (0..WORKERS)
        .map(|w| SocketAddrV4::new(topo.addr(w + 2), 40000))
        .collect();
    let entry = AggJobEntry {
        id: JOB,
        epoch: 1,
        base: 0,
        geometry,
        dtype: Dtype::I32,
        members: members.clone(),
        tokens: (0..WORKERS).map(token).collect(),
        result_token: RESULT_TOKEN,
        self_ip: topo.addr(1),
        parent: None,
    };
    // The aggregator lives in a thread of host 1 (its programs stay attached while it holds
    // them); it answers with its counters when told the workers are done.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let slots = geometry.chunks() * 2;
    let aggregator = topo
        .thread_in_host(1, move || -> Vec<(AggCounter, u64)> {
            let setup = (|| {
                let mut a = Aggregator::load(slots)?;
                a.attach("eth0", XdpMode::Native)?;
                a.set_job(&entry)?;
                Ok::<_, yard_ebpf::EbpfError>(a)
            })();
            let a = match setup {
                Ok(a) => a,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e}")));
                    return Vec::new();
                }
            };
            let _ = ready_tx.send(Ok(()));
            let _ = done_rx.recv();
            a.job_counters(JOB)
                .expect("the job's counters")
                .into_iter()
                .map(|(c, v)| (c, v.packets))
                .collect()
        })
        .expect("aggregator thread");
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the aggregator started")
        .expect("the aggregator attaches");

    let workers: Vec<_> = members
        .iter()
        .enumerate()
        .map(|(w, &addr)| {
            topo.thread_in_host(w + 2, move || worker(w, addr, agg, geometry))
                .expect("worker thread")
        })
        .collect();
    let received: Vec<Received> = workers
        .into_iter()
        .map(|h| h.join().expect("worker thread").expect("worker"))
        .collect();
    let _ = done_tx.send(());
    let counters: BTreeMap<&str, u64> = aggregator
        .join()
        .expect("aggregator thread")
        .into_iter()
        .map(|(c, v)| (c.name(), v))
        .collect();

    let chunks = u64::from(geometry.chunks()) * u64::from(ROUNDS);
    for (w, got) in received.iter().enumerate() {
        for round in 0..ROUNDS {
            let exact: Vec<i32> = (0..WORKERS).fold(vec![0; 5000], |mut s, v| {
                for (a, b) in s.iter_mut().zip(gradient(v, round, 5000)) {
                    *a = a.wrapping_add(b);
                }
                s
            });
            let mut start = 0;
            for chunk in 0..geometry.chunks() {
                let n = geometry.chunk_len(chunk);
                let copies = got.get(&(round, chunk)).map_or(&[][..], |v| &v[..]);
                assert_eq!(
                    copies.len(),
                    1,
                    "worker {w}, round {round}, chunk {chunk}: results received (MTU {mtu})"
                );
                assert_eq!(copies[0], exact[start..start + n], "worker {w}: exact sum");
                start += n;
            }
        }
    }
    assert_eq!(counters["completed"], chunks, "{counters:?}");
    assert_eq!(
        counters["fanout_sent"],
        chunks * WORKERS as u64,
        "one copy per worker and chunk: {counters:?}"
    );
    assert_eq!(counters["fanout_failed"], 0, "{counters:?}");
    assert_eq!(counters["bad_header"], 0, "{counters:?}");
}

#[test]
fn every_worker_gets_each_result_once_at_mtu_1500() {
    fan_out_at(1500);
}

#[test]
fn every_worker_gets_each_result_once_with_jumbo_frames() {
    fan_out_at(9000);
}
