//! What one host serves: the running jobs placed on it, as `yard_agg` table entries, and the
//! effects that bring the program's tables from what they hold to that.

use std::collections::BTreeMap;

use yard_agg::wire::{Dtype, Geometry};
use yard_ebpf::AggJobEntry;
use yard_raft_store::aggregation::{AggJob, AggTables};
use yard_raft_store::NodeId;

/// A change to make to the program's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Serve this job (new, or a new epoch, membership or slot range).
    Set(AggJobEntry),
    /// Stop serving the job with this id.
    Remove(u32),
}

/// The entry the program needs for `job`, summed on this host at `self_ip`.
pub fn entry(job: &AggJob, base: u32, self_ip: std::net::Ipv4Addr) -> AggJobEntry {
    AggJobEntry {
        id: job.id,
        epoch: job.epoch,
        base,
        geometry: Geometry {
            values: job.values,
            chunk_values: job.chunk_values,
        },
        dtype: Dtype::from_raw(job.dtype).unwrap_or(Dtype::I32),
        members: job.worker_order().into_iter().map(|(_, a)| a).collect(),
        self_ip,
    }
}

/// The jobs `me` must serve, by id: running jobs placed on it. A host not registered as an
/// aggregator serves nothing.
pub fn desired(tables: &AggTables, me: NodeId) -> BTreeMap<u32, AggJobEntry> {
    let Some(host) = tables.hosts.get(&me) else {
        return BTreeMap::new();
    };
    tables
        .jobs
        .values()
        .filter(|j| j.running())
        .filter_map(|j| {
            let p = j.placement?;
            (p.node == me).then(|| (j.id, entry(j, p.base, host.ip)))
        })
        .collect()
}

/// Effects from `current` to `wanted`: removals first (they free slot ranges a new job may
/// have been given), then the jobs that are new or changed.
pub fn diff(
    current: &BTreeMap<u32, AggJobEntry>,
    wanted: &BTreeMap<u32, AggJobEntry>,
) -> Vec<Effect> {
    let mut out: Vec<Effect> = current
        .keys()
        .filter(|id| !wanted.contains_key(id))
        .map(|id| Effect::Remove(*id))
        .collect();
    out.extend(
        wanted
            .iter()
            .filter(|(id, e)| current.get(id) != Some(e))
            .map(|(_, e)| Effect::Set(e.clone())),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use yard_raft_store::aggregation::{AggCommand, Placement, Quota};

    fn tables() -> AggTables {
        let mut t = AggTables::default();
        let quota = Quota {
            job_bytes: 1 << 30,
            cluster_bytes: 1 << 30,
        };
        for name in ["a", "b"] {
            t.apply(
                &AggCommand::Create {
                    name: name.into(),
                    workers: 2,
                    values: 1000,
                    dtype: 1,
                    elastic: false,
                    chunk_values: 360,
                    colocate: false,
                    quota,
                },
                1,
            )
            .unwrap();
            for rank in 0..2u16 {
                let addr = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000 + rank);
                let name = name.to_string();
                t.apply(&AggCommand::Join { name, rank, addr }, 1).unwrap();
            }
        }
        t.apply(
            &AggCommand::Host {
                node: 1,
                ip: Ipv4Addr::new(198, 18, 0, 1),
                slots: 100,
            },
            1,
        )
        .unwrap();
        t
    }

    fn place(t: &mut AggTables, name: &str, node: NodeId, base: u32) {
        let expect_epoch = t.jobs[name].epoch;
        let name = name.into();
        let placement = Placement { node, base };
        t.apply(
            &AggCommand::Place {
                name,
                expect_epoch,
                placement,
            },
            2,
        )
        .unwrap();
    }

    #[test]
    fn a_host_serves_exactly_the_running_jobs_placed_on_it() {
        let mut t = tables();
        assert!(desired(&t, 1).is_empty(), "nothing placed yet");
        place(&mut t, "a", 1, 0);
        place(&mut t, "b", 2, 0);
        let d = desired(&t, 1);
        assert_eq!(d.keys().copied().collect::<Vec<_>>(), [t.jobs["a"].id]);
        let e = &d[&t.jobs["a"].id];
        assert_eq!(e.epoch, t.jobs["a"].epoch);
        assert_eq!(e.members.len(), 2);
        assert_eq!(e.self_ip, Ipv4Addr::new(198, 18, 0, 1));
        assert!(
            desired(&t, 3).is_empty(),
            "an unregistered host serves nothing"
        );
    }

    #[test]
    fn a_move_removes_here_and_a_new_epoch_re_sets() {
        let mut t = tables();
        place(&mut t, "a", 1, 0);
        let before = desired(&t, 1);
        assert_eq!(diff(&BTreeMap::new(), &before).len(), 1);
        assert!(diff(&before, &before).is_empty());
        place(&mut t, "a", 2, 0);
        let after = desired(&t, 1);
        assert_eq!(diff(&before, &after), [Effect::Remove(t.jobs["a"].id)]);
    }
}
