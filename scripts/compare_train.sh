#!/usr/bin/env bash
# The default training run (tiny_cpu, 2,000 iterations) by cinder and by the PyTorch reference,
# one after the other on the same machine, each timed. Prints both final validation losses.
#   scripts/compare_train.sh [path/to/torch_reference.py]
# Needs: cargo build --release; pip install torch numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:-../shared/bench/torch_reference.py}
threads=$(nproc)
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $threads cores; $(date -u +%F)"
echo "== cinder: train (configs/tiny_cpu.toml)"
rm -rf checkpoints/compare_tiny_cpu
start=$(date +%s.%N)
./target/release/train --out checkpoints/compare_tiny_cpu --quiet
end=$(date +%s.%N)
echo "cinder wall seconds: $(echo "$end - $start" | bc)"
echo "== PyTorch reference: train --iters 2000 ($threads threads)"
start=$(date +%s.%N)
python3 "$ref" --text data/tinyshakespeare.txt --threads "$threads" train --iters 2000
end=$(date +%s.%N)
echo "torch wall seconds: $(echo "$end - $start" | bc)"
