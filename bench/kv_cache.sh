#!/usr/bin/env bash
# The reference K/V cache against ordinary references: the same weights declared once for
# Flux2KleinKVPipeline and once for Flux2KleinPipeline, edited with 1, 2 and 4 references at
# a fixed seed, through bench/e2e.sh (one table per reference count, and a summary of the
# denoising time of both).
#
#   klein synth -o /tmp/synth-kv --tokenizer TOKENIZER_DIR --variant 4b-kv
#   mkdir /tmp/synth-plain; ln -s /tmp/synth-kv/{transformer,text_encoder,vae,tokenizer,scheduler} /tmp/synth-plain/
#   sed s/Flux2KleinKVPipeline/Flux2KleinPipeline/ /tmp/synth-kv/model_index.json > /tmp/synth-plain/model_index.json
#   klein convert -m /tmp/synth-kv -t q4 -o /tmp/synth-kv-q4.klein
#   klein convert -m /tmp/synth-plain -t q4 -o /tmp/synth-plain-q4.klein
#   bench/kv_cache.sh /tmp/synth-kv-q4.klein /tmp/synth-plain-q4.klein REF1 REF2 REF3 REF4
#
# Options come from the environment: SIZE (target and, by the references' own size, default
# 256), STEPS (4), COUNTS ("1 2 4"), OUT (a new temp dir).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
(($# >= 3)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
cmdline="bench/kv_cache.sh$(printf ' %q' "$@")"
kv="$1"
plain="$2"
shift 2
refs=("$@")
size="${SIZE:-256}"
steps="${STEPS:-4}"
counts="${COUNTS:-1 2 4}"
out="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/klein-kv.XXXXXX")}"
echo "command: $cmdline (SIZE=$size STEPS=$steps COUNTS=\"$counts\")" >&2

for n in $counts; do
  ((n <= ${#refs[@]})) || { echo "kv_cache.sh: $n references asked, ${#refs[@]} given" >&2; exit 2; }
  extra=""
  for ((i = 0; i < n; ++i)); do extra+=" -r ${refs[i]}"; done
  "$here/bench/e2e.sh" -m "kv-$n=$kv" -m "plain-$n=$plain" -s "$size" -r auto \
    --steps "$steps" -x "$extra" -o "$out/refs-$n" >/dev/null
done

echo "| references | K/V cache: setup (reference pass) s | step s | denoise s | ordinary: step s | denoise s | denoise speed-up | peak RSS K/V / ordinary MiB |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for n in $counts; do
  jq -rs --arg n "$n" '
    def mean: add / length;
    def r2: . * 100 | round / 100;
    (map(select(.model | startswith("kv-"))) | first) as $k
    | (map(select(.model | startswith("plain-"))) | first) as $p
    | ($k.denoise_setup_seconds + ($k.step_seconds | add)) as $kd
    | ($p.denoise_setup_seconds + ($p.step_seconds | add)) as $pd
    | "| \($n) | \($k.denoise_setup_seconds | r2) | \($k.step_seconds | mean | r2) | \($kd | r2) | \($p.step_seconds | mean | r2) | \($pd | r2) | \($pd / $kd | r2)x | \($k.peak_rss_bytes / 1048576 | round) / \($p.peak_rss_bytes / 1048576 | round) |"
  ' "$out/refs-$n/results.jsonl"
done
echo "results: $out" >&2
