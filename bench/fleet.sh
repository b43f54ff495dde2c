#!/usr/bin/env bash
# The fleet of docs/DEPLOY.md, run: three `klein serve` of the tiny test model on loopback
# ports behind HAProxy with docs/haproxy.cfg, a stream of OpenAI text-to-image requests
# (seeds given; 64x64 ones and slower 256x256 ones) sent through HAProxy by a client that
# retries as DEPLOY.md says (bench/fleet_client.py). While it runs, klein2 is SIGKILLed in
# the middle of a generation (and stays dead), klein3 gets SIGTERM in the middle of one and
# is started again on its port. Then checks: every request answered 200 in the end, every
# image decodes fully at its size and is byte for byte the image of the same request sent
# straight to a healthy server; HAProxy marked klein2 down and klein3 down then up again;
# klein1's and the new klein3's /metrics count what HAProxy's stats say they answered.
# Prints a summary; exits 1 when a check fails, 2 when the run could not be set up.
#
#   bench/fleet.sh [-n REQUESTS] [-p PARALLEL] [--port-base PORT] [--klein PATH] [--keep]
#
# Options:
#   -n, --requests N   requests in the stream (default 40)
#   -p, --parallel N   requests in flight at once (default 3)
#       --port-base P  HAProxy on P, the servers on P+1..P+3, its stats on P+9 (default 18480)
#       --klein PATH   the binary (default: build/klein of this checkout)
#       --lb-retries N run HAProxy with "retries N" instead of the configuration's (0: every
#                      failure reaches the client, whose retries must cover it)
#       --keep         keep the work directory (logs, stats, replies) and print its path
# The model: $KLEIN_TESTDATA/klein-tiny/model (default ../shared/testdata of the checkout).
# Installs Debian's haproxy when missing (scripts/install-packages.sh). Everything it starts
# is stopped on exit; the whole run is bounded (about 40 s on 2 cores, at most ~5 minutes).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cmdline="bench/fleet.sh$(printf ' %q' "$@")"
klein="$here/build/klein"
requests=40 parallel=3 base=18480 keep=0 lb_retries=""
die() { echo "fleet.sh: $*" >&2; exit 2; }
while (($#)); do
  case "$1" in
    -n|--requests) requests="${2:?}"; shift 2 ;;
    -p|--parallel) parallel="${2:?}"; shift 2 ;;
    --port-base) base="${2:?}"; shift 2 ;;
    --klein) klein="${2:?}"; shift 2 ;;
    --lb-retries) lb_retries="${2:?}"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
testdata="${KLEIN_TESTDATA:-$here/../shared/testdata}"
model="$testdata/klein-tiny/model"
[[ -d "$model" ]] || die "no test model at $model (set KLEIN_TESTDATA)"
[[ -x "$klein" ]] || die "no binary at $klein (build the klein target)"
command -v haproxy >/dev/null || bash "$here/scripts/install-packages.sh" haproxy
command -v curl >/dev/null || bash "$here/scripts/install-packages.sh" curl
py=/usr/bin/python3
[[ -x $py ]] || py="$(command -v python3)"
client="$here/bench/fleet_client.py"

lb_port=$base stats_port=$((base + 9))
port() { echo $((base + $1)); }
for p in $lb_port $stats_port $(port 1) $(port 2) $(port 3); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "port $p is in use (--port-base)"; fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/klein-fleet.XXXXXX")"
declare -A pid=()
haproxy_pid="" client_pid=""
cleanup() {
  local rc=$? p
  for p in "${pid[@]}" $haproxy_pid $client_pid; do kill "$p" 2>/dev/null || true; done
  for p in "${pid[@]}" $haproxy_pid $client_pid; do wait "$p" 2>/dev/null || true; done
  if ((keep)); then echo "fleet.sh: kept $work" >&2; else rm -rf "$work"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
event() { echo "$1=${2:-$(now)}" >>"$work/events"; }
health() { curl -s -m 2 "http://127.0.0.1:$(port "$1")/health" || true; }
stats() { curl -s -m 2 "http://127.0.0.1:$stats_port/stats;csv"; }
# The status HAProxy gives klein$1 ("UP", "DOWN", "UP 1/2", ...).
lb_status() { stats | awk -F, -v s="klein$1" '$1 == "klein" && $2 == s {print $18}'; }
# Waits (at most $2 s, polling every 50 ms) until `$3...` succeeds.
wait_for() {
  local what=$1 limit=$2 i
  shift 2
  for ((i = 0; i < limit * 20; ++i)); do "$@" && return 0; sleep 0.05; done
  die "timed out after ${limit} s waiting for $what"
}
start_server() {  # $1: 1, 2 or 3
  "$klein" serve -m "$model" --host 127.0.0.1 --port "$(port "$1")" --threads 1 --max-queue 1 \
    >>"$work/klein$1.out" 2>>"$work/klein$1.err" &
  pid[$1]=$!
}
ready() { [[ "$(health "$1")" == *'"status":"ok"'* ]]; }
busy() { [[ "$(health "$1")" == *'"busy":true'* ]]; }
is() { [[ "$(lb_status "$1")" == "$2" ]]; }
all_up() { is 1 UP && is 2 UP && is 3 UP; }
done_count() { [[ -f "$work/results.jsonl" ]] && wc -l <"$work/results.jsonl" || echo 0; }
done_at_least() { (($(done_count) >= $1)); }
client_running() { kill -0 "$client_pid" 2>/dev/null; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs; $(haproxy -v | head -1)"
echo "command: $cmdline"
config="$here/docs/haproxy.cfg"
if [[ -n $lb_retries ]]; then
  sed "s/^\( *retries\) .*/\1 $lb_retries/" "$config" >"$work/haproxy.cfg"
  config="$work/haproxy.cfg"
fi
grep -q "^ *retries ${lb_retries:-[0-9]}" "$config" || die "no retries line in $config"
for i in 1 2 3; do start_server $i; done
for i in 1 2 3; do wait_for "klein$i ready" 60 ready $i; done
KLEIN_LB_LOG=stderr KLEIN_LB_BIND="127.0.0.1:$lb_port" KLEIN_LB_STATS="127.0.0.1:$stats_port" \
  KLEIN_1="127.0.0.1:$(port 1)" KLEIN_2="127.0.0.1:$(port 2)" KLEIN_3="127.0.0.1:$(port 3)" \
  haproxy -db -f "$config" 2>"$work/haproxy.log" &
haproxy_pid=$!
wait_for "HAProxy to see the three servers up" 20 all_up

event stream_start
"$py" "$client" stream --url "http://127.0.0.1:$lb_port" --requests "$requests" \
  --parallel "$parallel" --timeout 60 --deadline 180 --out "$work/results.jsonl" \
  >"$work/client.out" 2>&1 &
client_pid=$!

# SIGKILL klein2 in the middle of a generation, once a few requests are through.
wait_for "4 requests answered" 120 done_at_least 4
wait_for "klein2 busy" 60 busy 2
event kill_busy true  # /health said busy just before
kill -KILL "${pid[2]}"
event kill
wait "${pid[2]}" 2>/dev/null || true
unset 'pid[2]'
wait_for "HAProxy to mark klein2 down" 20 is 2 DOWN
event kill_down

# SIGTERM klein3 in the middle of a generation half way through, start it again.
wait_for "$((requests / 2)) requests answered" 180 done_at_least $((requests / 2))
wait_for "klein3 busy" 60 busy 3
event term_busy true  # /health said busy just before
kill -TERM "${pid[3]}"
event term
# Its exit and HAProxy marking it down, whichever comes first (an idle keep-alive connection
# keeps a stopping server up to 5 s; it refuses new connections meanwhile).
exited="" down=""
for ((i = 0; i < 20 * 20; ++i)); do
  [[ -z $exited ]] && ! kill -0 "${pid[3]}" 2>/dev/null && exited=$(now)
  [[ -z $down ]] && is 3 DOWN && down=$(now)
  [[ -n $exited && -n $down ]] && break
  sleep 0.05
done
[[ -n $exited && -n $down ]] || die "klein3 did not exit or was not marked down within 20 s"
wait "${pid[3]}" || die "klein3 exited $? on SIGTERM"
event term_exit "$exited"
event term_down "$down"
stats >"$work/stats-before-restart.csv"
event restart
start_server 3
wait_for "klein3 ready again" 60 ready 3
event restart_ready
wait_for "HAProxy to mark klein3 up" 20 is 3 UP
event restart_up

for ((i = 0; i < 240 * 10; ++i)); do client_running || break; sleep 0.1; done
client_running && die "the client did not finish"
stream_rc=0
wait "$client_pid" || stream_rc=$?
client_pid=""
event stream_end
[[ -s "$work/client.out" ]] && cat "$work/client.out"

# The same request specs straight to klein1 (healthy, untouched), then every counter.
"$py" "$client" reference --url "http://127.0.0.1:$(port 1)" --out "$work/refs.json" \
  || die "reference requests to klein1 failed"
mkdir -p "$work/metrics"
for i in 1 3; do
  curl -sf "http://127.0.0.1:$(port "$i")/metrics" >"$work/metrics/klein$i.metrics" \
    || die "GET /metrics of klein$i failed"
done
sleep 0.5  # HAProxy's log lines of the last requests
stats >"$work/stats.csv"
rc=0
"$py" "$client" check --results "$work/results.jsonl" --refs "$work/refs.json" \
  --events "$work/events" --log "$work/haproxy.log" --stats "$work/stats.csv" \
  --stats-before-restart "$work/stats-before-restart.csv" --metrics-dir "$work/metrics" \
  --killed klein2 --restarted klein3 --kept klein1 --requests "$requests" \
  --parallel "$parallel" || rc=1
((stream_rc == 0)) || { echo "FAILED: the client's stream exited $stream_rc"; rc=1; }
exit $rc
