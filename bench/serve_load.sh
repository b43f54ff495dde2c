#!/usr/bin/env bash
# Load test of `klein serve`: after one warm-up request, CLIENTS concurrent clients each send
# REQUESTS text-to-image requests (OpenAI route, fixed size and steps, seeds 1, 2, ...) to one
# server; prints each request's status and latency, then a summary: images per minute,
# latency min / median / max, how many were refused with 429, the server's peak RSS and its
# RSS after the warm-up and after the last request (flat when nothing leaks).
#
#   bench/serve_load.sh -m /tmp/synth-q4.klein -c 2 -n 2 -s 256 --steps 2
#
# Options:
#   -m, --model PATH      the model (required)
#   -c, --clients N       concurrent clients (default 2)
#   -n, --requests N      requests per client (default 2)
#   -s, --size N          square size (default 256)
#       --steps N         denoising steps (default 2)
#   -q, --max-queue N     the server's --max-queue (default 4)
#   -t, --threads N       the server's threads (default 2)
#       --klein PATH      the binary (default: build/klein of this checkout)
# Needs curl and jq.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cmdline="bench/serve_load.sh$(printf ' %q' "$@")"
klein="$here/build/klein"
model="" clients=2 requests=2 size=256 steps=2 max_queue=4 threads=2
die() { echo "serve_load.sh: $*" >&2; exit 2; }
while (($#)); do
  case "$1" in
    -m|--model) model="${2:?}"; shift 2 ;;
    -c|--clients) clients="${2:?}"; shift 2 ;;
    -n|--requests) requests="${2:?}"; shift 2 ;;
    -s|--size) size="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    -q|--max-queue) max_queue="${2:?}"; shift 2 ;;
    -t|--threads) threads="${2:?}"; shift 2 ;;
    --klein) klein="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ -n "$model" ]] || die "no model (-m PATH)"
command -v curl >/dev/null && command -v jq >/dev/null || die "needs curl and jq"

work="$(mktemp -d "${TMPDIR:-/tmp}/klein-load.XXXXXX")"
"$klein" serve -m "$model" --port 0 --threads "$threads" --max-queue "$max_queue" \
  >"$work/serve.out" 2>"$work/serve.err" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q 'http://' "$work/serve.out" 2>/dev/null && break
  kill -0 $server 2>/dev/null || die "the server did not start: $(cat "$work/serve.err")"
  sleep 0.1
done
url="$(grep -o 'http://[0-9.:]*' "$work/serve.out" | head -1)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs" >&2
echo "command: $cmdline (server $url, $threads threads, --max-queue $max_queue)" >&2

client() {
  local c=$1 i seed
  for ((i = 0; i < requests; ++i)); do
    seed=$((c * requests + i + 1))
    curl -s -o "$work/reply-$seed.json" -w "$c $seed %{http_code} %{time_total}\n" \
      -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"a red fox in fresh snow\", \"size\": \"${size}x${size}\", \"steps\": $steps, \"seed\": $seed}" \
      "$url/v1/images/generations"
  done
}
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
# One request first, so that the RSS after it (model opened, first generation's memory
# returned) is the baseline the rest is compared with: a leak shows as growth.
curl -s -o /dev/null -H 'Content-Type: application/json' \
  -d "{\"prompt\": \"warm up\", \"size\": \"${size}x${size}\", \"steps\": $steps, \"seed\": 0}" \
  "$url/v1/images/generations"
rss_first=$(rss)
start=$(date +%s.%N)
for ((c = 0; c < clients; ++c)); do client $c >"$work/client-$c.txt" & done
wait $(jobs -p | grep -v "^$server$") 2>/dev/null || true
end=$(date +%s.%N)
peak_kib=$(awk '/VmHWM/ {print $2}' "/proc/$server/status")
rss_last=$(rss)

echo "| client | seed | status | latency s |"
echo "| ---: | ---: | ---: | ---: |"
cat "$work"/client-*.txt | sort -n -k2 | awk '{printf "| %s | %s | %s | %.1f |\n", $1, $2, $3, $4}'
wall=$(echo "$end - $start" | bc)
total=$(cat "$work"/client-*.txt | wc -l)
busy=$(awk '$3 == 429' "$work"/client-*.txt | wc -l)
awk '$3 == 200 {print $4}' "$work"/client-*.txt | sort -n >"$work/latencies.txt"
ok=$(wc -l <"$work/latencies.txt")
echo
awk -v n="$total" -v ok="$ok" -v busy="$busy" -v wall="$wall" 'BEGIN {
  printf "%d requests in %.1f s: %d images (%.2f per minute), %d refused with 429, %d other errors\n",
    n, wall, ok, ok * 60 / wall, busy, n - ok - busy }'
if ((ok > 0)); then
  awk '{ lat[NR] = $1 } END {
    printf "latency of the served ones: min %.1f s, median %.1f s, max %.1f s\n",
      lat[1], lat[int((NR + 1) / 2)], lat[NR] }' "$work/latencies.txt"
fi
echo "server peak RSS: $((peak_kib / 1024)) MiB; RSS after the warm-up request $((rss_first / 1024)) MiB, after the last $((rss_last / 1024)) MiB"
