#!/usr/bin/env bash
# End-to-end benchmark of `klein generate`: wall time per phase (load, text encoding, each
# denoising step, VAE decode) and peak RSS, for every model x size x residency, at a fixed
# seed and thread count, with the prompt cache off. Prints the machine, the command and a
# Markdown table (BENCHMARKS.md, "End to end"); keeps every run's JSON result and log.
#
#   bench/e2e.sh -m q4=/tmp/synth-q4.klein -m bf16-safetensors=/tmp/synth-4b
#   bench/e2e.sh --quick -m q8=/tmp/synth-q8.klein
#
# Options:
#   -m, --model NAME=PATH   a model to run: a container, or a diffusers directory (repeat)
#   -s, --sizes LIST        square sizes, comma separated (default 256,512,1024)
#   -r, --residency LIST    paged,resident (default both); auto lets klein decide
#   -t, --threads N         worker threads (default 2)
#       --steps N           denoising steps (default 4, the distilled klein's)
#       --seed N            (default 1)
#   -p, --prompt TEXT
#   -o, --out DIR           where images, logs and results.jsonl go (default: a new temp dir)
#       --klein PATH        the binary (default: build/klein of this checkout)
#   -x, --extra ARGS        more `klein generate` options for every run (e.g. "--precision exact")
#       --no-warm           do not read each model's files once before its runs
#       --quick             256x256 only, both residencies, 2 steps: checks the machinery
#       --table FILE        print the table of an earlier results.jsonl and exit
#   -h, --help
#
# Each model's files are read once before its first run (unless --no-warm), so that paged
# and resident runs both start from the page cache, as the paging target is stated.
# Needs jq.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cmdline="bench/e2e.sh$(printf ' %q' "$@")"
klein="$here/build/klein"
models=()
sizes="256,512,1024"
residencies="paged,resident"
threads=2
steps=4
seed=1
prompt="a red fox in fresh snow, morning light"
out=""
warm=1
table_only=""
extra=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "e2e.sh: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    -m|--model) [[ $# -ge 2 && "$2" == *=* ]] || die "$1 wants NAME=PATH"; models+=("$2"); shift 2 ;;
    -s|--sizes) sizes="${2:?}"; shift 2 ;;
    -r|--residency) residencies="${2:?}"; shift 2 ;;
    -t|--threads) threads="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --seed) seed="${2:?}"; shift 2 ;;
    -p|--prompt) prompt="${2:?}"; shift 2 ;;
    -o|--out) out="${2:?}"; shift 2 ;;
    --klein) klein="${2:?}"; shift 2 ;;
    -x|--extra) read -ra more <<<"${2:?}"; extra+=("${more[@]}"); shift 2 ;;
    --no-warm) warm=0; shift ;;
    --quick) sizes=256; steps=2; shift ;;
    --table) table_only="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
command -v jq >/dev/null || die "needs jq (apt-get install jq)"

# The Markdown table of a results.jsonl (one klein --json result per line, with "model" and
# "residency_asked" added).
print_table() {
  echo "| model | size | residency | precision | load s | text s | denoise setup s | steps s | VAE decode s | total s | peak RSS MiB | peak RSS text / denoise / VAE MiB |"
  echo "| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"
  jq -r '
    def mib: . / 1048576 | round;
    def s: . * 10 | round / 10;
    "| \(.model) | \(.width)x\(.height) | \(.residency) | \(.precision // "-") | \(.timings.load | s) | \(.timings["text encoder"] | s) | \(.denoise_setup_seconds | s) | \(.step_seconds | map(s | tostring) | join(" / ")) | \(.timings["vae decode"] | s) | \(.total_seconds | s) | \(.peak_rss_bytes | mib) | \(.phase_peak_rss_bytes["text encoder"] | mib) / \(.phase_peak_rss_bytes.denoise | mib) / \(.phase_peak_rss_bytes["vae decode"] | mib) |"
  ' "$1"
  # Paging against resident: mean step time of each (model, size) measured both ways.
  jq -rs '
    group_by([.model, .width, .height])[]
    | (map(select(.residency == "paged")) | first) as $p
    | (map(select(.residency == "resident")) | first) as $r
    | select($p != null and $r != null)
    | def mean: add / length;
      ($p.step_seconds | mean) as $ps | ($r.step_seconds | mean) as $rs
    | "paging cost, \($p.model) \($p.width)x\($p.height): mean step \($ps * 100 | round / 100) s paged, \($rs * 100 | round / 100) s resident (\((($ps / $rs - 1) * 1000 | round) / 10)%); whole run \(($p.total_seconds / $r.total_seconds - 1) * 1000 | round / 10)%"
  ' "$1"
}

if [[ -n "$table_only" ]]; then
  print_table "$table_only"
  exit 0
fi
((${#models[@]})) || die "no model given (-m NAME=PATH; see --help)"
[[ -x "$klein" ]] || die "no klein binary at $klein (build it, or pass --klein)"
[[ -n "$out" ]] || out="$(mktemp -d "${TMPDIR:-/tmp}/klein-e2e.XXXXXX")"
mkdir -p "$out"
results="$out/results.jsonl"
: >"$results"

# The machine and the command, for the record.
{
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB RAM", $2 / 1048576}' /proc/meminfo), $(uname -sr)"
  echo "klein: $("$klein" --version 2>/dev/null | head -1)${KLEIN_ISA:+, KLEIN_ISA=$KLEIN_ISA}"
  echo "command: $cmdline (sizes $sizes, residency $residencies, $threads threads, $steps steps, seed $seed)"
  echo "results: $results"
} | tee "$out/machine.txt" >&2

warm_model() {
  local path="$1"
  echo "reading $path into the page cache..." >&2
  if [[ -d "$path" ]]; then
    find "$path" -type f -name '*.safetensors' -exec cat {} + >/dev/null
  else
    cat "$path" >/dev/null
  fi
}

IFS=, read -ra size_list <<<"$sizes"
IFS=, read -ra residency_list <<<"$residencies"
for entry in "${models[@]}"; do
  name="${entry%%=*}"
  path="${entry#*=}"
  [[ -e "$path" ]] || die "model $name: $path does not exist"
  ((warm)) && warm_model "$path"
  for size in "${size_list[@]}"; do
    for residency in "${residency_list[@]}"; do
      tag="$name-${size}-$residency"
      echo "run $tag" >&2
      if ! "$klein" generate -m "$path" -p "$prompt" -W "$size" -H "$size" -s "$steps" \
          --seed "$seed" --threads "$threads" --residency "$residency" --no-cache --json \
          "${extra[@]}" -o "$out/$tag.png" >"$out/$tag.jsonl" 2>"$out/$tag.log"; then
        echo "  failed: see $out/$tag.log" >&2
        tail -3 "$out/$tag.log" >&2
        continue
      fi
      jq -c --arg model "$name" --arg asked "$residency" \
        'select(.event == "result") | . + {model: $model, residency_asked: $asked}' \
        "$out/$tag.jsonl" >>"$results"
      jq -r 'select(.event == "result") | "  \(.total_seconds * 10 | round / 10) s, peak RSS \(.peak_rss_bytes / 1048576 | round) MiB"' \
        "$out/$tag.jsonl" >&2
    done
  done
done

echo
print_table "$results"
