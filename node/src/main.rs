//! The `yard` binary: the node daemon and the operator CLI in one executable.

mod cmd;

fn main() -> std::process::ExitCode {
    cmd::main()
}
