#!/usr/bin/env bash
# MFU of the default run's architecture against nanoGPT's at the same shape (4 x 4 x 128,
# context 64, batch 24), both with AdamW so that the optimizer costs the same: ROUNDS rounds,
# alternating, one JSON line each (ms_per_iter, model_gflop_per_iter, mfu). Needs:
# cargo build --release. BENCHMARKS.md section 17 compares the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
for _ in $(seq "$rounds"); do
  ./target/release/bench --config configs/nanogpt_cpu.toml --batch-size 24 train --steps 30 | sed 's/^/old /'
  ./target/release/bench --config configs/tiny_cpu.toml --optimizer adamw train --steps 30 | sed 's/^/new /'
done
