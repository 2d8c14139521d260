#!/usr/bin/env bash
# Issue 28's rolling upgrade, in CI: builds the release pinned in
# cluster-tests/tests/yard_cluster.rs (PINNED_OLD) from this repository's history, then runs
# `a_rolling_upgrade_from_the_previous_release_loses_no_acknowledged_write` (3 voters on the
# pinned release under a writer, replaced one at a time by this build, one of them back to
# the pinned release and up again while the cluster level is still 0, then the level's rise
# once all three run this build; no write may fail or be lost). The pinned tree is exported with
# `git archive` into YARD_OLD_DIR (default /var/tmp/yard-old-<commit>) and built there once;
# its target directory is removed after the build, only the binary is kept. Needs root (the
# test runs namespaces) and the repository's history: a checkout without the pinned commit
# (a shallow clone) cannot build it, and the script says so on stderr and in its last line
# ("rolling upgrade test NOT RUN") instead of passing quietly.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $EUID -eq 0 ]] || { echo "upgrade-test: the namespace test needs root; run as root" >&2; exit 1; }
pin=$(sed -n 's/^const PINNED_OLD: &str = "\([0-9a-f]*\)";$/\1/p' cluster-tests/tests/yard_cluster.rs)
[[ -n $pin ]] || { echo "upgrade-test: no PINNED_OLD in cluster-tests/tests/yard_cluster.rs" >&2; exit 1; }
if ! git cat-file -e "$pin^{commit}" 2>/dev/null; then
    echo "upgrade-test: rolling upgrade test NOT RUN: this checkout does not hold release $pin; clone the repository with its history (no --depth) to run it" >&2
    exit 0
fi
old_dir=${YARD_OLD_DIR:-/var/tmp/yard-old-$pin}
old_bin=$old_dir/yard
if [[ ! -x $old_bin ]]; then
    rm -rf "$old_dir/src"
    mkdir -p "$old_dir/src"
    git archive "$pin" | tar -x -C "$old_dir/src"
    echo "upgrade-test: building release $pin in $old_dir/src"
    CARGO_TARGET_DIR=$old_dir/target cargo build --release --manifest-path "$old_dir/src/Cargo.toml" -p yard
    cp "$old_dir/target/release/yard" "$old_bin.tmp"
    mv "$old_bin.tmp" "$old_bin"
    rm -rf "$old_dir/target" "$old_dir/src"
fi
export YARD_BIN=${YARD_BIN:-$PWD/target/release/yard}
YARD_OLD_BIN=$old_bin cargo test -p yard-cluster-tests --test yard_cluster rolling_upgrade -- --ignored --nocapture
