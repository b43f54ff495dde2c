#!/usr/bin/env bash
# What a LoRA costs at run time (--lora: the low-rank update beside every weight it names):
# `klein generate` on one model without a LoRA and with each given LoRA file, the runs
# alternating (REPS rounds) so that a noisy machine affects them alike. Prints a Markdown
# table: mean step time, text encoder, denoise setup, peak RSS, and the step time against
# the run without.
#
#   klein synth -o /tmp/synth-4b --tokenizer TOKENIZER_DIR
#   klein convert -m /tmp/synth-4b -t q4 -o /tmp/synth-4b-q4.klein
#   python3 tools/lora/lora_fixture.py synth /tmp/synth-4b/transformer/config.json /tmp/lora-r16.safetensors 16
#   python3 tools/lora/lora_fixture.py synth /tmp/synth-4b/transformer/config.json /tmp/lora-r64.safetensors 64
#   bench/lora.sh /tmp/synth-4b-q4.klein /tmp/lora-r16.safetensors /tmp/lora-r64.safetensors
#
# Options come from the environment: SIZE (256), STEPS (4), REPS (2), THREADS (2), OUT (a new
# temp dir). Needs jq.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
(($# >= 2)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
cmdline="bench/lora.sh$(printf ' %q' "$@")"
model="$1"
shift
loras=("$@")
size="${SIZE:-256}"
steps="${STEPS:-4}"
reps="${REPS:-2}"
threads="${THREADS:-2}"
out="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/klein-lora.XXXXXX")}"
klein="$here/build/klein"
echo "command: $cmdline (SIZE=$size STEPS=$steps REPS=$reps THREADS=$threads)" >&2
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs" >&2
results="$out/results.jsonl"
: >"$results"

run() {  # name, extra args...
  local name=$1 tag
  shift
  tag="$name-$rep"
  "$klein" generate -m "$model" -p "a red fox in fresh snow" -W "$size" -H "$size" -s "$steps" \
    --seed 1 --threads "$threads" --no-cache --json "$@" -o "$out/$tag.png" \
    >"$out/$tag.jsonl" 2>"$out/$tag.log" || { tail -3 "$out/$tag.log" >&2; exit 1; }
  jq -c --arg name "$name" 'select(.event == "result") | . + {name: $name}' "$out/$tag.jsonl" \
    >>"$results"
}

for ((rep = 0; rep < reps; ++rep)); do
  run none
  for lora in "${loras[@]}"; do run "$(basename "$lora" .safetensors)" --lora "$lora"; done
done

echo "| LoRA | file MiB | load LoRA s | step s | vs none | denoise setup s | peak RSS MiB |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
sizes="{}"
for lora in "${loras[@]}"; do
  sizes=$(jq -c --arg k "$(basename "$lora" .safetensors)" --argjson v "$(stat -c %s "$lora")" \
    '. + {($k): $v}' <<<"$sizes")
done
jq -rs --argjson sizes "$sizes" '
  def mean: add / length;
  def r2: . * 100 | round / 100;
  def phase($p): .timings[$p] // 0;
  group_by(.name) as $groups
  | ($groups | map(select(.[0].name == "none")) | first | map(.step_seconds | mean) | mean) as $base
  | $groups | sort_by(if .[0].name == "none" then "" else .[0].name end)[]
  | (map(.step_seconds | mean) | mean) as $step
  | "| \(.[0].name) | \(($sizes[.[0].name] // 0) / 1048576 | round) | \(map(phase("load LoRA")) | mean | r2) | \($step | r2) | \($step / $base | r2)x | \(map(.denoise_setup_seconds) | mean | r2) | \(map(.peak_rss_bytes) | max / 1048576 | round) |"
' "$results"
echo "results: $out" >&2
