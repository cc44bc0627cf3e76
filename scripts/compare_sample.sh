#!/usr/bin/env bash
# Sampling speed (characters per second) of cinder with its fused and its composite layers, each
# with and without its key/value cache, next to
# the PyTorch reference's sampling mode (which has no cache), on randomly initialised models.
#   scripts/compare_sample.sh tiny|gpt6 TOKENS [path/to/torch_reference.py]
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-tiny}
tokens=${2:-500}
ref=${3:-../shared/bench/torch_reference.py}
threads=$(nproc)
case $which in
  tiny) flags=() ;;
  gpt6) flags=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256) ;;
  *) echo "usage: $0 tiny|gpt6 TOKENS" >&2; exit 2 ;;
esac
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $threads cores, config $which, $tokens characters"
for ops in fused composite; do
  ./target/release/bench --ops $ops "${flags[@]}" sample --tokens "$tokens"
  ./target/release/bench --ops $ops "${flags[@]}" sample --tokens "$tokens" --no-cache
done
python3 "$ref" --text data/tinyshakespeare.txt --threads "$threads" "${flags[@]}" sample --tokens "$tokens"
