//! The `yard` binary: the node daemon and the operator CLI in one executable.

mod cmd;

/// mimalloc instead of glibc's allocator: the write path allocates per request (frames,
/// commands, replies) on threads that hand buffers to each other, where glibc's arenas spent
/// a tenth of the runtime threads' time (`malloc`, `free`, `malloc_consolidate` in a profile
/// of `kv-vs-etcd`); with mimalloc the benchmark's puts/s rose by about 8%.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cmd::main()
}
