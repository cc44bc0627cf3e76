#!/usr/bin/env bash
# Rebuilds the texts that `train --time` was measured on but not tuned on (BENCHMARKS.md,
# section 24), from Debian's package registry: prose in two languages and code, from about 200 KB
# to over 20 MB. Writes data/texts/*.txt (ignored by git). Needs apt-get and dpkg-deb.
#
#   scripts/make_texts.sh [OUT_DIR]
#
#   de_witze.txt   German jokes (fortunes-de: witze), 0.2 MB
#   de.txt         all of fortunes-de (German sayings, quotes, jokes, poems), 3.0 MB
#   ru.txt         all of fortunes-ru (Russian jokes and quotes), 3.5 MB
#   python.txt     the Python 3.11 standard library's .py files (libpython3.11-stdlib), 6.3 MB
#   python_all.txt the standard library, its tests (libpython3.11-testsuite) and the
#                  documentation's reST sources (python3.11-doc), 34 MB
#
# Files are taken in sorted path order and joined as they are (fortune's % separators kept).
set -euo pipefail
out=$(realpath -m "${1:-data/texts}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download fortunes-de fortunes-ru libpython3.11-stdlib libpython3.11-testsuite \
    python3.11-doc >/dev/null 2>&1
for deb in *.deb; do dpkg-deb -x "$deb" x; done
mkdir -p "$out"

# fortune files: plain text; the .dat indexes and the .u8 links are left out.
fortunes() { find "$1" -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort | xargs cat; }
cat x/usr/share/games/fortunes/de/witze >"$out/de_witze.txt"
fortunes x/usr/share/games/fortunes/de >"$out/de.txt"
fortunes x/usr/share/games/fortunes/ru >"$out/ru.txt"

stdlib=x/usr/lib/python3.11
find "$stdlib" -type f -name '*.py' ! -path '*/test/*' | LC_ALL=C sort | xargs cat >"$out/python.txt"
{
    cat "$out/python.txt"
    find "$stdlib/test" -type f -name '*.py' | LC_ALL=C sort | xargs cat
    find x/usr/share/doc/python3.11/html/_sources -name '*.txt' | LC_ALL=C sort | xargs cat
} >"$out/python_all.txt"

# Some test files hold bytes that are not UTF-8 on purpose: keep only valid UTF-8 lines.
for f in "$out"/*.txt; do
    iconv -f UTF-8 -t UTF-8 -c "$f" >"$f.tmp" && mv "$f.tmp" "$f"
done
ls -l "$out"
