#!/usr/bin/env bash
# Batches (issue 34, part 4): images per minute of `klein generate --batch N` for each N and
# size, at a fixed seed and thread count, with the prompt cache off. The wall time of the
# whole command (load, text encoder once, every image's steps and VAE decode). Prints the
# machine, the commands and a Markdown table (docs/SPEED.md, "Batches").
#
#   bench/batch.sh -m /tmp/synth-q4.klein
#   bench/batch.sh -m /tmp/synth-4b -s 256 -n 1,2,4 --steps 2
#
# Options:
#   -m, --model PATH   the model (a container or a diffusers directory)
#   -s, --sizes LIST   square sizes, comma separated (default 256,512)
#   -n, --batches LIST batch sizes, comma separated (default 1,2,4)
#   -t, --threads N    worker threads (default 2)
#       --steps N      denoising steps (default 4)
#   -o, --out DIR      where images and logs go (default: a new temp dir)
#       --klein PATH   the binary (default: build/klein of this checkout)
#   -h, --help
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cmdline="bench/batch.sh$(printf ' %q' "$@")"
klein="$here/build/klein"
model=""
sizes="256,512"
batches="1,2,4"
threads=2
steps=4
out=""

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "batch.sh: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    -m|--model) model="${2:?}"; shift 2 ;;
    -s|--sizes) sizes="${2:?}"; shift 2 ;;
    -n|--batches) batches="${2:?}"; shift 2 ;;
    -t|--threads) threads="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    -o|--out) out="${2:?}"; shift 2 ;;
    --klein) klein="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ -n "$model" ]] || die "-m/--model is required"
[[ -x "$klein" ]] || die "no binary at $klein (build it: ninja -C build klein)"
out="${out:-$(mktemp -d /tmp/klein-batch.XXXXXX)}"
mkdir -p "$out"

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "command: $cmdline"
echo
echo "| size | batch | steps | wall s | s per image | images per minute | vs batch 1 |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
IFS=, read -ra size_list <<<"$sizes"
IFS=, read -ra batch_list <<<"$batches"
for size in "${size_list[@]}"; do
  base=""
  for n in "${batch_list[@]}"; do
    log="$out/${size}-b${n}.log"
    start=$(date +%s.%N)
    "$klein" generate -m "$model" -p "a red fox in fresh snow, morning light" -W "$size" \
      -H "$size" -s "$steps" --seed 1 --batch "$n" --threads "$threads" --no-cache -q \
      -o "$out/${size}-b${n}.png" >"$log" 2>&1 || die "run failed, see $log"
    wall=$(echo "$(date +%s.%N) - $start" | bc -l)
    ipm=$(echo "60 * $n / $wall" | bc -l)
    [[ -n "$base" ]] || base=$ipm
    printf '| %s | %s | %s | %.1f | %.1f | %.2f | %.2fx |\n' "$size" "$n" "$steps" "$wall" \
      "$(echo "$wall / $n" | bc -l)" "$ipm" "$(echo "$ipm / $base" | bc -l)"
  done
done
