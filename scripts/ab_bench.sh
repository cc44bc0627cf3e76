#!/usr/bin/env bash
# Speed of this checkout against another build of cinder, side by side: the two run alternately,
# ROUNDS times each, and the medians are printed. For A/B measurements of a change:
#   git worktree add ../base <commit> && (cd ../base && CARGO_TARGET_DIR=../target-base cargo build --release)
#   scripts/ab_bench.sh ../target-base/release WHAT [ROUNDS]
# WHAT: tiny | gpt6 | dropout | sample | sample6 | evaluate. Needs: cargo build --release.
# Both builds take the same flags. For a base build that cannot read this checkout's configs/,
# AB_CONFIG=FILE gives both `--config FILE`, and AB_CHAR_CONFIG=FILE replaces dropout's
# configs/shakespeare_char.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1; what=$2; rounds=${3:-3}
gpt6=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 12)
case $what in
  tiny) args=(train --steps 50) ;;
  gpt6) args=("${gpt6[@]}" train --steps 5 --warmup-steps 1) ;;
  dropout) args=(--config "${AB_CHAR_CONFIG:-configs/shakespeare_char.toml}" --batch-size 12 train --steps 3 --warmup-steps 1) ;;
  sample) args=(sample --tokens 500) ;;
  sample6) args=("${gpt6[@]:0:8}" sample --tokens 500) ;;
  evaluate) args=() ;;
  *) echo "usage: $0 BASE_BIN_DIR tiny|gpt6|dropout|sample|sample6|evaluate [ROUNDS]" >&2; exit 2 ;;
esac
if [ -n "${AB_CONFIG:-}" ] && [ "$what" != dropout ]; then args=(--config "$AB_CONFIG" "${args[@]}"); fi
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $what"
log=$(mktemp)
if [ "$what" = evaluate ]; then
  # The whole validation split of a tiny model trained once by the other build (whose checkpoint
  # format this checkout also reads).
  ckpt=${CKPT:-/tmp/cinder-ab-ckpt-$(basename "$(dirname "$base")")}
  [ -d "$ckpt/latest" ] || "$base/train" --out "$ckpt" --max-iters 200 -q
fi
for i in $(seq "$rounds"); do
  for impl in new base; do
    bin=./target/release; [ $impl = base ] && bin=$base
    if [ "$what" = evaluate ]; then
      s=$(date +%s.%N)
      /usr/bin/time -f '%M' -o /tmp/ab-rss "$bin/evaluate" --checkpoint "$ckpt" --split val -q >/dev/null
      e=$(date +%s.%N)
      echo "{\"impl\": \"$impl\", \"seconds\": $(awk "BEGIN { print $e - $s }"), \"maxrss_kb\": $(cat /tmp/ab-rss)}" | tee -a "$log"
    else
      /usr/bin/time -f '%M' -o /tmp/ab-rss "$bin/bench" "${args[@]}" > /tmp/ab-out
      sed "s/}\$/, \"impl\": \"$impl\", \"maxrss_kb\": $(cat /tmp/ab-rss)}/" /tmp/ab-out | tee -a "$log"
    fi
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for key in ["ms_per_iter", "tokens_per_s", "seconds", "maxrss_kb"]:
    m = {i: statistics.median([r[key] for r in rows if r["impl"] == i]) for i in ["new", "base"] if any(key in r for r in rows)}
    if len(m) == 2:
        print(f"median {key}: new {m['new']}, base {m['base']}, new/base {m['new'] / m['base']:.3f}")
PY
