#!/usr/bin/env bash
# Runs every benchmark behind BENCHMARKS.md and keeps their output in $OUT
# (default: $CARGO_TARGET_DIR/bench-results). Takes about ten minutes on a 2-core machine:
# ~4 min for `cargo bench`, ~1.5 min for the soak, ~2 min for the HTTP runs, plus the build.
# Run it on an otherwise idle machine: other builds or fuzzers distort every figure.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
out="${OUT:-$CARGO_TARGET_DIR/bench-results}"
bin="$CARGO_TARGET_DIR/release"
mkdir -p "$out"

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- engine server || echo ' (engine/ or server/ with uncommitted changes)')"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "kernel: $(uname -r)"
  echo "rustc: $(rustc --version)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

cargo build --release --locked -p idemlog-server -p idemlog-benches --bins

# The load average every 10 s while the benchmarks run, to judge the figures by.
(while sleep 10; do echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; done) >"$out/load.log" &
monitor=$!
trap 'kill "$monitor" 2>/dev/null || true' EXIT

# Stale criterion results would leak into the report: start from none.
rm -rf "$CARGO_TARGET_DIR/criterion"
cargo bench --locked -p idemlog-benches --bench store 2>&1 | tee "$out/store.txt"
"$bin/report" --criterion "$CARGO_TARGET_DIR/criterion" | tee "$out/report.md"

"$bin/keymem" --keys 1000000 | tee "$out/keymem.txt"
"$bin/soak" --duration 90s | tee "$out/soak.md"
"$bin/loadgen" --server "$bin/idemlog-server" --connections 64 --duration 10s --rounds 3 \
  | tee "$out/loadgen.md"

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
echo "results in $out"
