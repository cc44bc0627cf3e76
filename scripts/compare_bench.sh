#!/usr/bin/env bash
# Training-step speed of cinder and of the PyTorch reference, side by side: the two run
# alternately, ROUNDS times each, with the same config and thread count; prints every JSON line,
# then the medians and the ratio of tokens per second (cinder / PyTorch).
#   scripts/compare_bench.sh tiny|gpt6 [ROUNDS] [path/to/torch_reference.py]
# tiny: configs/tiny_cpu.toml. gpt6: 6 layers, 6 heads, 384 wide, context 256, batch 12.
# Needs: cargo build --release; pip install torch numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-tiny}
rounds=${2:-3}
ref=${3:-../shared/bench/torch_reference.py}
threads=$(nproc)
case $which in
  tiny) ours=(); theirs=(); steps=50 ;;
  gpt6) ours=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 12)
        theirs=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 12); steps=10 ;;
  *) echo "usage: $0 tiny|gpt6 [ROUNDS]" >&2; exit 2 ;;
esac
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $threads cores, config $which"
log=$(mktemp)
# Peak resident memory of each process, measured the same way for both (GNU time's %M).
rss() { /usr/bin/time -f '{"maxrss_kb": %M}' -a -o "$log" "$@"; }
for i in $(seq "$rounds"); do
  rss ./target/release/bench "${ours[@]}" train --steps "$steps" | tee -a "$log"
  sed -i '$s/}$/, "impl": "cinder"}/' "$log"
  rss python3 "$ref" --text data/tinyshakespeare.txt --threads "$threads" "${theirs[@]}" bench --steps "$steps" | tee -a "$log"
  sed -i '$s/}$/, "impl": "pytorch"}/' "$log"
done
python3 - "$log" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def med(impl_prefix, key):
    xs = [r[key] for r in rows if r["impl"].startswith(impl_prefix) and r.get(key) is not None]
    return statistics.median(xs) if xs else None
c, t = med("cinder", "tokens_per_s"), med("pytorch", "tokens_per_s")
print(f"median ms/iter: cinder {med('cinder', 'ms_per_iter')}, pytorch {med('pytorch', 'ms_per_iter')}")
print(f"median tokens/s: cinder {c}, pytorch {t}; ratio cinder/pytorch = {c / t:.2f}")
mem = lambda p: med(p, "maxrss_kb") / 1024
print(f"median peak RSS MB (GNU time): cinder {mem('cinder'):.0f}, pytorch {mem('pytorch'):.0f}")
print(f"cinder MFU {med('cinder', 'mfu')}")
PY
