#!/usr/bin/env bash
# What `train --time` chose against what it could have chosen (BENCHMARKS.md, section 24): on
# one text and one budget, one after the other on this machine, each timed from start to exit:
#   - `--time BUDGET` with each shape of the given ladder rungs fixed by flags (the steps,
#     schedule and dropout still planned for the budget): the grid;
#   - `--time BUDGET` alone: the rule's choice;
#   - the default config (configs/tiny_cpu.toml, 880 steps) as it is;
#   - the default config with max_iters and lr_decay_iters scaled by the budget over the
#     default's own wall time: what a user would try.
# Appends one row per run to OUT (tab-separated: text, MB, budget, seed, run, shape, steps,
# dropout, epochs, wall s, best val, stopped early) and prints it.
#
#   scripts/time_grid.sh TEXT BUDGET [--seed N] [--rungs "1 2 3 4 5 6"] [--out FILE]
#                                    [--only "grid time default scaled"] [--default-wall S]
#                                    [--keep DIR]
#
# --default-wall: the default config's wall seconds on this machine (measured on another text),
# for "scaled" without running "default" here.
#
# Needs: cargo build --release (or CINDER_TRAIN: the train binary to run, e.g. a copy that a
# build meanwhile does not replace). Rungs count from 1, smallest first (run/plan.rs, LADDER);
# a shape off the ladder is written LxWxHxCxB (layers, width, heads, context, batch).
set -euo pipefail
cd "$(dirname "$0")/.."
text=$1 budget=$2
shift 2
seed=1337 rungs="1 2 3 4 5 6" out=bench_out/time_grid.tsv only="grid time default scaled"
default_wall="" keep=""
while [ $# -gt 0 ]; do
  case $1 in
    --seed) seed=$2; shift 2 ;;
    --rungs) rungs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --default-wall) default_wall=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
# The ladder, read from its one declaration (run/plan.rs): "layers width heads context batch".
mapfile -t ladder < <(sed -n 's/^    shape(\(.*\)),$/\1/p' crates/cinder/src/run/plan.rs | tr -d ,)
train=${CINDER_TRAIN:-target/release/train}
name=$(basename "$text" .txt)
mb=$(awk -v b="$(stat -c %s "$text")" 'BEGIN { printf "%.2f", b / 1e6 }')
work=$(mktemp -d /tmp/time_grid.XXXXXX)
mkdir -p "$(dirname "$out")"
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%F %H:%M') UTC; $name ($mb MB), $budget, seed $seed"

# field FILE KEY: a field of a run's config.toml.
field() { sed -n "s/^$2 = //p" "$1" | head -1 | tr -d '"'; }

# run LABEL ARGS...: trains into a fresh folder, appends its row.
run() {
  local label=$1 dir="$work/$1" start end wall
  shift
  start=$(date +%s.%N)
  "$train" --data "$text" --out "$dir" --seed "$seed" "$@" > "$dir.log" 2>&1 \
    || { echo "$label failed:"; tail -5 "$dir.log"; return 0; }
  end=$(date +%s.%N)
  wall=$(echo "$end - $start" | bc)
  local c=$dir/config.toml
  local shape steps best epochs early
  shape="$(field "$c" n_layer)x$(field "$c" n_embd)/$(field "$c" n_head)h c$(field "$c" block_size) b$(field "$c" batch_size)"
  steps=$(tail -1 "$dir/metrics.csv" | cut -d, -f1)
  best=$(awk -F, 'NR > 1 && $3 != "" && (b == "" || $3 < b) { b = $3 } END { printf "%.4f", b }' "$dir/metrics.csv")
  epochs=$(sed -n 's/.*tokens seen, \([0-9.]*\) epochs.*/\1/p' "$dir.log")
  early=no
  [ "$steps" -lt "$(field "$c" max_iters)" ] && early=yes
  local row
  row=$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s' "$name" "$mb" "$budget" "$seed" \
    "$label" "$shape" "$steps" "$(field "$c" dropout)" "$epochs" "$wall" "$best" "$early")
  echo "$row" | tee -a "$out"
  echo "$wall" > "$dir.wall"
}

for part in $only; do
  case $part in
    grid)
      for r in $rungs; do
        if [[ $r == *x* ]]; then
          read -r l e h b n <<< "${r//x/ }"
        else
          read -r l e h b n <<< "${ladder[$((r - 1))]}"
        fi
        run "grid$r" --time "$budget" --n-layer "$l" --n-embd "$e" --n-head "$h" \
          --block-size "$b" --batch-size "$n"
      done ;;
    time) run time --time "$budget" ;;
    default) run default ;;
    scaled)
      # The default's wall time on this text, measured here unless this run measured it.
      [ -n "$default_wall" ] && echo "$default_wall" > "$work/default.wall"
      [ -f "$work/default.wall" ] || run default
      case $budget in
        *h) seconds=$(( ${budget%h} * 3600 )) ;;
        *m) seconds=$(( ${budget%m} * 60 )) ;;
        *s) seconds=${budget%s} ;;
        *) echo "write the budget as 90s, 10m or 1h" >&2; exit 2 ;;
      esac
      iters=$(echo "$(field configs/tiny_cpu.toml max_iters | cut -d' ' -f1) * $seconds / $(cat "$work/default.wall")" | bc)
      run scaled --max-iters "$iters" --lr-decay-iters "$iters" ;;
  esac
done
# --keep DIR: each run's folder and log are kept under DIR/<text>-<budget>-<seed>/.
if [ -n "$keep" ]; then
  mkdir -p "$keep" && rm -rf "${keep:?}/$name-$budget-$seed" && mv "$work" "$keep/$name-$budget-$seed"
else
  rm -rf "$work"
fi
