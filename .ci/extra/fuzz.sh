#!/usr/bin/env bash
# Fuzzing (issue 16): every target in fuzz/ (cargo fuzz, libFuzzer) runs for a bounded time,
# starting from the seeds in fuzz/seeds/<target>. Each run is cut at FUZZ_SECONDS (default 30 s;
# five targets). The build (nightly, sanitizers, every dependency) is most of the step: on a
# clean checkout of 2026-12-03 it took about 10 minutes and the five 45 s runs 4, so the runs
# were cut to 30 s to keep .ci/run under 45 minutes; a longer local run is FUZZ_SECONDS=600. A crash fails CI; its input is left in
# fuzz/artifacts/<target>/ and becomes a regression test in `cargo test` (the input as bytes).
# Needs the nightly toolchain these machines carry; installs cargo-fuzz from crates.io if absent.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${FUZZ_SECONDS:-30}"

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz.sh: no nightly toolchain (rustup toolchain list); cargo fuzz needs one" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

targets=(sqs_request sigv4 grpc_request replica_record storage_record)
cargo +nightly fuzz build -O
log="$(mktemp)"
for target in "${targets[@]}"; do
  corpus="fuzz/corpus/$target"
  mkdir -p "$corpus"
  echo "--- fuzz $target for ${seconds} s"
  status=0
  cargo +nightly fuzz run -O "$target" "$corpus" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -dict=fuzz/fuzz.dict -timeout=30 -rss_limit_mb=2048 \
    -print_final_stats=1 >"$log" 2>&1 || status=$?
  # The run's summary: executions, coverage, and any crash report.
  grep -E '^(#[0-9]+.*(INITED|DONE)|stat::number_of_executed_units|==[0-9]+==|SUMMARY|Done)' "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz.sh: $target failed (exit $status); inputs in fuzz/artifacts/$target/" >&2
    exit 1
  fi
done
echo "fuzz.sh: every target ran ${seconds} s without a failure"
