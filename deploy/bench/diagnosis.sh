#!/usr/bin/env bash
# The probe and analyzer's figures (no root, no network: everything runs on simulated jobs):
#   1. diagnosis: time from fault onset to a correct verdict at 64, 1,024, 4,096 and 16,384
#      ranks with the analyzer's cost per 100 ms summary window; analyzer events/s on one core;
#      the labelled catalogue's accuracy live and from Flight Recorder dumps, beside PyTorch's
#      fr_trace matching rules on the same dumps;
#   2. probe-cost: what reporting one event costs the rank (client) and the node, end to end,
#      beside a bare write(2) of the same bytes.
#
#   deploy/bench/diagnosis.sh                       # both, defaults (about 4 minutes)
#   deploy/bench/diagnosis.sh --out DIR             # also keep the JSON in DIR
#   DIAGNOSIS_ARGS="--only scale --ranks 64,4096" deploy/bench/diagnosis.sh
#
# Each program prints one JSON object on stdout and tables on stderr, and never fails on a number.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=""
if [[ ${1:-} == --out ]]; then
    out=${2:?--out needs a directory}
    mkdir -p "$out"
fi
cargo build --release -p yard-bench --bin diagnosis --bin probe-cost
target=${CARGO_TARGET_DIR:-target}/release
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
"$target/diagnosis" ${DIAGNOSIS_ARGS:-} | tee ${out:+"$out/diagnosis.json"}
# shellcheck disable=SC2086
"$target/probe-cost" ${PROBE_COST_ARGS:-} | tee ${out:+"$out/probe-cost.json"}
