#!/usr/bin/env bash
# Thread scaling (issue 34, part 5): the steady step of `klein bench step` at each thread
# count, with what predicts the counts this machine does not have: the speed-up over one
# thread, the serial fraction Amdahl's law gives for it (f = (N / speedup - 1) / (N - 1)), the
# thread pool's loops per forward (each one a synchronisation of every thread) and how long
# the calling thread waited at their ends. Prints the machine, the command and a Markdown
# table (docs/SPEED.md).
#
#   bench/threads.sh -m /tmp/k4b-q4.klein                 # 1, 2, 4, ... up to every CPU
#   bench/threads.sh -m /tmp/k4b-q4.klein -n 1,8,16 -s 512
#   KLEIN_ISA=avx512 bench/threads.sh -m /tmp/k4b-q4.klein
#
# Options:
#   -m, --model PATH     the model (a container or a diffusers directory)
#   -n, --threads LIST   thread counts, comma separated (default: 1 and the powers of two up
#                        to the CPUs this process may use, and that count itself)
#   -s, --size N         square image size (default 256)
#   -f, --forwards N     forwards per count, the first paging the weights in (default 3)
#       --klein PATH     the binary (default: build/klein of this checkout)
#   -h, --help
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cmdline="bench/threads.sh$(printf ' %q' "$@")"
klein="$here/build/klein"
model=""
counts=""
size=256
forwards=3

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "threads.sh: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    -m|--model) model="${2:?}"; shift 2 ;;
    -n|--threads) counts="${2:?}"; shift 2 ;;
    -s|--size) size="${2:?}"; shift 2 ;;
    -f|--forwards) forwards="${2:?}"; shift 2 ;;
    --klein) klein="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ -n "$model" ]] || die "-m/--model is required"
[[ -e "$model" ]] || die "-m: $model does not exist"
[[ -x "$klein" ]] || die "no binary at $klein (build it: ninja -C build klein)"
[[ "$size" =~ ^[0-9]+$ ]] || die "-s: expected a size in pixels, got '$size'"
[[ "$forwards" =~ ^[0-9]+$ && "$forwards" -ge 2 ]] || die "-f: expected at least 2 forwards, got '$forwards'"
if [[ -z "$counts" ]]; then
  cpus=$(nproc)
  counts=1
  for ((n = 2; n < cpus; n *= 2)); do counts+=",$n"; done
  ((cpus > 1)) && counts+=",$cpus"
fi
IFS=, read -ra count_list <<<"$counts"
for n in "${count_list[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "-n: expected positive thread counts, got '$n'"
done

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "command: $cmdline"
echo
echo "| threads | steady step | speed-up | efficiency | serial fraction (Amdahl) | loops per forward | caller waiting per forward | fraction of the peak |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
base=""
for n in "${count_list[@]}"; do
  json=$("$klein" bench step -m "$model" -W "$size" -H "$size" --forwards "$forwards" \
    --threads "$n" --json 2>/dev/null) || die "klein bench step --threads $n failed"
  # The first count is the base of the speed-ups (1 thread unless -n says otherwise).
  [[ -n "$base" ]] || base=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["steady_seconds"])' <<<"$json")
  [[ -n "${base_n:-}" ]] || base_n=$n
  python3 /dev/fd/3 "$n" "$base_n" "$base" <<<"$json" 3<<'PY'
import json, sys
n, base_n, base = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
j = json.load(sys.stdin)
step = j["steady_seconds"]
speedup = base / step
ratio = n / base_n
eff = speedup / ratio
serial_text = "-" if ratio == 1 else f"{100 * (ratio / speedup - 1) / (ratio - 1):.1f} %"
print(f"| {n} | {step:.3f} s | {speedup:.2f}x | {100 * eff:.0f} % | {serial_text} | "
      f"{j['forward_loops'][-1]} | {j['forward_wait_seconds'][-1]:.3f} s | "
      f"{100 * j['peak_fraction']:.1f} % |")
PY
done
