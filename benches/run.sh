#!/usr/bin/env bash
# Runs every benchmark behind benches/NOTEBOOK.md and keeps their output in $OUT
# (default: $CARGO_TARGET_DIR/bench-results). Takes about ten minutes on a 2-core machine:
# ~4 min for `cargo bench`, ~2 min for the soaks, ~3 min for the HTTP runs, plus the build.
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

# Every 10 s while the benchmarks run: the load average (our own caller threads count in it) and
# the processes using more than 5% of a core, to see what else competed for the two cores.
(while sleep 9; do
  busy=$(top -bn2 -d1 -w 200 | awk '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $9+0 > 5 {printf "%s:%s%% ", $12, $9}')
  echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) $busy"
done) >"$out/load.log" &
monitor=$!
trap 'kill "$monitor" 2>/dev/null || true' EXIT

# Stale criterion results would leak into the report: start from none.
rm -rf "$CARGO_TARGET_DIR/criterion"
cargo bench --locked -p idemlog-benches --bench store 2>&1 | tee "$out/store.txt"
"$bin/report" --criterion "$CARGO_TARGET_DIR/criterion" | tee "$out/report.md"

"$bin/keymem" --keys 1000000 | tee "$out/keymem.txt"
"$bin/soak" --duration 90s | tee "$out/soak.md"
# Control: the same stream without sweeping or compaction (disk grows; shows which slow claims
# compaction causes).
"$bin/soak" --duration 30s --settle 5s --compaction off | tee "$out/soak-control.md"
"$bin/loadgen" --server "$bin/idemlog-server" --connections 64 --duration 10s --rounds 5 \
  | tee "$out/loadgen.md"

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
echo "results in $out"
