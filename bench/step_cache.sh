#!/usr/bin/env bash
# Step caching (issue 64, part 5): the time of a step that runs every transformer layer and of
# one that `--cache first-block:T` skips, from `klein generate --json`'s step_seconds, on a
# Z-Image model (the full-size synthetic one: klein synth --variant zimage-turbo -t q4). The
# cached run uses a threshold that skips every step after the first (random weights decide
# nothing of where a real model would skip). Prints the machine, the commands and a Markdown
# table (docs/SPEED.md, "Step caching").
#
#   bench/step_cache.sh MODEL [SIZE [STEPS [GUIDANCE]]]     (defaults 256, 4, 5)
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
klein="$here/build/klein"
model=${1:?usage: bench/step_cache.sh MODEL [SIZE [STEPS [GUIDANCE]]]}
size=${2:-256}
steps=${3:-4}
guidance=${4:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) CPUs"
echo "| run | step 1 | later steps | denoise | peak RSS |"
echo "| --- | --- | --- | --- | --- |"
for cache in "" "--cache first-block:1e9"; do
  cmd=("$klein" generate -m "$model" -p "a lighthouse at dusk" -g "$guidance" -s "$steps"
       -W "$size" -H "$size" --seed 1 --no-cache --json --threads 2 -o "$out/image.png")
  [[ -n "$cache" ]] && cmd+=($cache)
  echo "command: ${cmd[*]}" >&2
  "${cmd[@]}" 2>&1 | grep '"event":"result"' | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
s = r["step_seconds"]
c = r.get("step_cache")
name = "no cache" if not c else "--cache first-block:%g (%d computed, %d skipped)" % (
    c["threshold"], c["computed"], c["skipped"])
later = "%.2f-%.2f s" % (min(s[1:]), max(s[1:])) if len(s) > 1 else "-"
print("| %s | %.1f s | %s | %.1f s | %.0f MiB |" % (
    name, s[0], later, r["timings"]["denoise"], r["peak_rss_bytes"] / 2**20))'
done
