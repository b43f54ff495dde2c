#!/usr/bin/env bash
# The safety classifier's time per image on a full-size synthetic ViT-B/16 (the published
# classifier's shapes and names, random weights: bench/safety_synth_vit.py): `klein safety`
# on one 1024x1024 image and on five, REPEAT times each; the time per image is the difference
# over four (the process start, the model's opening and the first page-in cancel out), with
# the peak RSS.
#
#   bench/safety.sh [MODEL_DIR]    (default: a synthetic model made in a temporary directory)
#
# Options from the environment: THREADS (2), REPEAT (3), KLEIN (build/klein), PYTHON (python3,
# with numpy and PIL).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
klein="${KLEIN:-$here/build/klein}"
threads="${THREADS:-2}"
repeat="${REPEAT:-3}"
python="${PYTHON:-python3}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model="${1:-}"
if [[ -z "$model" ]]; then
  model="$work/vit-b16"
  "$python" "$here/bench/safety_synth_vit.py" "$model"
fi
"$python" -c '
import sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(1)
Image.fromarray((rng.random((1024, 1024, 3)) * 255).astype("uint8")).save(sys.argv[1])
' "$work/image.png"
echo "command: bench/safety.sh ${1:-} (THREADS=$threads REPEAT=$repeat)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
run() {  # images... -> "seconds peak_kib"
  /usr/bin/time -f "%e %M" "$klein" safety -m "$model" -t "$threads" "$@" 2>&1 >/dev/null | tail -n 1
}
best1=999 best5=999 rss=0
for ((i = 0; i < repeat; ++i)); do
  read -r s1 m1 < <(run "$work/image.png")
  read -r s5 m5 < <(run "$work/image.png" "$work/image.png" "$work/image.png" "$work/image.png" "$work/image.png")
  best1=$(awk -v a="$best1" -v b="$s1" 'BEGIN { print (b < a ? b : a) }')
  best5=$(awk -v a="$best5" -v b="$s5" 'BEGIN { print (b < a ? b : a) }')
  rss=$(( m5 > rss ? m5 : rss ))
done
awk -v a="$best1" -v b="$best5" -v r="$rss" 'BEGIN {
  printf "one image: %.2f s (process, model and image)   five: %.2f s   per image: %.3f s   peak RSS %.0f MiB\n", a, b, (b - a) / 4, r / 1024 }'
