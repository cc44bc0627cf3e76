#!/usr/bin/env bash
# Runs a command and reports its peak anonymous memory (RssAnon, sampled from /proc every 0.1 s:
# heap and stacks, not the pages of memory-mapped files) beside GNU time's maximum resident set
# size (which counts mapped file pages too). Used for BENCHMARKS.md.
#
#   scripts/peak_rss.sh ./target/release/prepare --data big.txt --out big.prepared
set -euo pipefail
log=$(mktemp)
/usr/bin/time -v -o "$log" "$@" &
time_pid=$!
peak=0
while kill -0 "$time_pid" 2>/dev/null; do
  child=$(pgrep -P "$time_pid" | head -1 || true)
  if [[ -n "$child" && -r /proc/$child/status ]]; then
    kb=$(awk '/^RssAnon:/ {print $2}' "/proc/$child/status" 2>/dev/null || echo 0)
    (( ${kb:-0} > peak )) && peak=$kb
  fi
  sleep 0.1
done
wait "$time_pid"
max=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
echo "peak RssAnon $((peak / 1024)) MiB; GNU time max RSS $((max / 1024)) MiB (mapped file pages included); wall $wall"
rm -f "$log"
