#!/usr/bin/env bash
# cinder's default run beside nanoGPT's recipe, one after the other on the same machine, each
# timed from start to exit (evaluations included). Prints a table of wall time and final
# validation loss:
#   - cinder, configs/tiny_cpu.toml (the default run: RoPE, RMSNorm, QK-norm, ReLU², Muon, ...)
#   - cinder, configs/nanogpt_cpu.toml (nanoGPT's recipe, the default run before)
#   - the PyTorch reference of nanoGPT's model and recipe (../shared/bench/torch_reference.py)
#   - nanoGPT's own train.py with its README's CPU command (4x4x128, context 64, batch 12, 2,000
#     iterations, nine evaluations of 2 x 20 batches: --eval_iters=20, --log_interval=1), when a
#     nanoGPT checkout is given
#   - with --cinder "LABEL|FLAGS" (repeatable): the default run with those flags as well
#
#   scripts/compare_train.sh [--seed N] [--nanogpt path/to/nanoGPT] [--python PYTHON]
#       [--reference path/to/torch_reference.py] [--only-default] [--cinder "LABEL|FLAGS"]...
#
# Needs: cargo build --release; pip install torch numpy (and requests, which nanoGPT's prepare.py
# imports). For nanoGPT: a checkout of
# karpathy/nanoGPT; the script copies data/tinyshakespeare.txt to its
# data/shakespeare_char/input.txt (in place of its download) and runs its prepare.py.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=1337
nanogpt=""
ref=../shared/bench/torch_reference.py
python=python3
recipes="tiny_cpu nanogpt_cpu"
variants=()
while [ $# -gt 0 ]; do
  case $1 in
    --seed) seed=$2; shift 2 ;;
    --nanogpt) nanogpt=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --reference) ref=$2; shift 2 ;;
    --only-default) recipes=tiny_cpu; ref=""; shift ;;
    --cinder) variants+=("$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
threads=$(nproc)
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $threads cores; $(date -u '+%F %H:%M') UTC; seed $seed"
rows=()

# Wall seconds of a command (its output goes to $log).
timed() {
  local start end
  start=$(date +%s.%N)
  "$@" > "$log" 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
# The last validation loss of a cinder run folder's metrics.csv.
last_val() { awk -F, 'NR > 1 && $3 != "" { v = $3 } END { print v }' "$1/metrics.csv"; }

for recipe in $recipes; do
  out=checkpoints/compare_$recipe
  log=$(mktemp)
  wall=$(timed ./target/release/train --config configs/$recipe.toml --out "$out" --overwrite \
    --seed "$seed" --quiet)
  rows+=("cinder configs/$recipe.toml|$wall|$(last_val "$out")")
done

for variant in "${variants[@]}"; do
  IFS='|' read -r label flags <<< "$variant"
  out=checkpoints/compare_variant
  log=$(mktemp)
  # shellcheck disable=SC2086 # the flags are words
  wall=$(timed ./target/release/train --config configs/tiny_cpu.toml --out "$out" --overwrite \
    --seed "$seed" --quiet $flags)
  rows+=("cinder $label|$wall|$(last_val "$out")")
done

if [ -n "$ref" ] && [ -f "$ref" ]; then
  log=$(mktemp)
  wall=$(timed "$python" "$ref" --text data/tinyshakespeare.txt --threads "$threads" \
    --seed "$seed" train --iters 2000)
  val=$(grep -o '"val[_a-z]*": *[0-9.]*' "$log" | tail -1 | grep -o '[0-9.]*$' || true)
  rows+=("PyTorch reference (nanoGPT's recipe)|$wall|${val:-see $log}")
fi

if [ -n "$nanogpt" ]; then
  data="$nanogpt/data/shakespeare_char"
  cp data/tinyshakespeare.txt "$data/input.txt"
  (cd "$data" && "$python" prepare.py > /dev/null)
  log=$(mktemp)
  # Its README's command, with the run written outside the checkout.
  wall=$(cd "$nanogpt" && timed "$python" train.py config/train_shakespeare_char.py --device=cpu \
    --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 \
    --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0 \
    --out_dir=/tmp/compare-nanogpt) # (train.py's seed is its own: 1337)
  val=$(grep -o 'step 2000: .*val loss [0-9.]*' "$log" | grep -o '[0-9.]*$' || true)
  rows+=("nanoGPT train.py (its README's CPU command)|$wall|${val:-see $log}")
fi

echo
printf '| %-40s | %10s | %8s |\n' "run" "wall (s)" "val"
printf '| %-40s | %10s | %8s |\n' "---" "---" "---"
for row in "${rows[@]}"; do
  IFS='|' read -r name wall val <<< "$row"
  printf '| %-40s | %10.1f | %8s |\n' "$name" "$wall" "$val"
done
