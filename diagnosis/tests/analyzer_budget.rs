//! Issue 25, finding 7: the analyzer's memory is bounded per job whatever its clients send.
//! Measured on the heap itself (a counting allocator), not only on the analyzer's own
//! estimate, so these tests also say the estimate is not fooling itself.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use counting::LIVE;

use yard_diagnosis::analyzer::{Config, JobAnalyzer, Rejected};
use yard_diagnosis::event::{Event, Group, Member};

/// Counts live heap bytes. A global allocator is unsafe to implement; this one only adds a
/// counter in front of the system's.
#[allow(unsafe_code)]
mod counting {
    use super::*;
    pub struct Counting;

    pub static LIVE: AtomicUsize = AtomicUsize::new(0);

    // SAFETY: forwards every call to the system allocator unchanged and only counts sizes.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            // SAFETY: the caller's contract is passed on as is.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            // SAFETY: the caller's contract is passed on as is.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOC: Counting = Counting;
}

/// Tests measure the whole process's heap: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn member(rank: u32, world_size: u32) -> Event {
    Event::Member(Member {
        rank,
        world_size,
        host: "h1".into(),
        addr: "198.18.0.1".into(),
        nic: String::new(),
        switch: String::new(),
        pid: 7,
    })
}

fn group(ranks: Vec<u32>) -> Event {
    Event::Group(Group {
        name: "0".into(),
        desc: String::new(),
        ranks,
    })
}

/// Before, rank state was a Vec indexed by rank: one introduction of rank 2^20 − 1 (in a
/// world it declares as 2^20) allocated a million rank entries, about 130 MB.
#[test]
fn a_rank_id_near_2_pow_20_costs_one_entry() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut a = JobAnalyzer::new("j", Config::default());
    let before = LIVE.load(Ordering::Relaxed);
    a.try_ingest(&member((1 << 20) - 1, 1 << 20), 1)
        .expect("the largest rank is taken");
    a.try_ingest(
        &Event::Heartbeat {
            rank: (1 << 20) - 1,
            t_ns: 2,
        },
        2,
    )
    .expect("heartbeat");
    let grown = LIVE.load(Ordering::Relaxed) - before;
    assert!(grown < 64 << 10, "one rank took {grown} bytes");
    assert!(a.footprint() < 64 << 10, "{}", a.footprint());
    // 2^20 itself is past any world.
    assert!(matches!(
        a.try_ingest(
            &Event::Heartbeat {
                rank: 1 << 20,
                t_ns: 3
            },
            3
        ),
        Err(Rejected::TooLarge { .. })
    ));
}

/// A job that tries to grow past its budget is refused, event by event, and both the
/// estimate and the heap stay under it.
#[test]
fn a_job_stays_under_its_budget() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let budget = 4 << 20;
    let cfg = Config {
        job_budget_bytes: budget,
        ..Config::default()
    };
    let before = LIVE.load(Ordering::Relaxed);
    let mut a = JobAnalyzer::new("j", cfg);
    a.try_ingest(&member(0, 1 << 20), 1).expect("introduction");
    let mut refused = 0;
    // Every group a new name with 800 ranks: each a new stream of 800 members (~2 MB).
    for g in 0..64u32 {
        let ev = Event::Group(Group {
            name: format!("g{g}").into(),
            desc: String::new(),
            ranks: (g * 800..(g + 1) * 800).collect(),
        });
        match a.try_ingest(&ev, 2) {
            Ok(()) => {}
            Err(e @ Rejected::OverBudget { .. }) => {
                refused += 1;
                assert!(
                    e.to_string().starts_with(
                        "the event would take the job's analyzer state past its budget of"
                    ),
                    "{e}"
                );
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused > 50, "only {refused} refused");
    assert!(a.footprint() <= budget, "{} over {budget}", a.footprint());
    let heap = LIVE.load(Ordering::Relaxed) - before;
    // Vec spare capacity is not counted in the estimate: at most as much again.
    assert!(
        heap <= 2 * budget,
        "the heap grew {heap} bytes for a {budget}-byte budget"
    );
}

/// A repeated declaration changes nothing, and a large group announced in slices (as the
/// node re-announces it after each GROUP frame) costs what it costs declared at once, not
/// one stream per partial list.
#[test]
fn repeated_and_growing_group_declarations_do_not_grow_the_state() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let world = 4000u32;
    let all: Vec<u32> = (0..world).collect();

    let mut once = JobAnalyzer::new("j", Config::default());
    once.try_ingest(&member(0, world), 1).expect("member");
    once.try_ingest(&group(all.clone()), 1).expect("group");
    let whole = once.footprint();

    let mut sliced = JobAnalyzer::new("j", Config::default());
    sliced.try_ingest(&member(0, world), 1).expect("member");
    for end in (800..=world).step_by(800) {
        sliced
            .try_ingest(&group(all[..end as usize].to_vec()), 1)
            .expect("slice");
    }
    assert_eq!(sliced.footprint(), whole, "slices made extra streams");

    for _ in 0..100 {
        sliced.try_ingest(&group(all.clone()), 1).expect("repeat");
    }
    let mut doubled = all.clone();
    doubled.extend(&all);
    sliced.try_ingest(&group(doubled), 1).expect("ranks twice");
    assert_eq!(sliced.footprint(), whole, "a repeat grew the state");
}
