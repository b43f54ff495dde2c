#!/usr/bin/env bash
# Prompt upsampling's speed on containers converted with --keep-llm: prefill and decode
# separately (tokens per second), peak RSS, and the decode's weight bandwidth (every new
# token reads every text-encoder layer, the final norm and the lm_head, which for Qwen3-4B
# is the whole embedding table) against this machine's memcpy bandwidth in the same run.
#
#   klein synth -o /tmp/synth4b --tokenizer TOKENIZER_DIR
#   klein convert -m /tmp/synth4b -t q4 --keep-llm -o /tmp/synth-q4-llm.klein
#   klein convert -m /tmp/synth4b -t q8 --keep-llm -o /tmp/synth-q8-llm.klein
#   bench/upsample.sh /tmp/synth-q4-llm.klein /tmp/synth-q8-llm.klein
#
# Options from the environment: TOKENS (new tokens, 120), THREADS (2), RESIDENCY (auto:
# paged; resident keeps the layers mapped between tokens), KLEIN (build/klein).
# Random weights rarely end a turn on their own; a run that stopped early says so.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
(($# >= 1)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
klein="${KLEIN:-$here/build/klein}"
tokens="${TOKENS:-120}"
threads="${THREADS:-2}"
residency="${RESIDENCY:-auto}"
echo "command: bench/upsample.sh $* (TOKENS=$tokens THREADS=$threads RESIDENCY=$residency)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"

copy=$("$klein" bench matmul -t q8 --rows 1 --threads "$threads" --min-seconds 0.3 --json |
  python3 -c 'import json,sys; rows=json.load(sys.stdin); rows=rows.get("rows",rows) if isinstance(rows,dict) else rows; print(max(r.get("copy_gbps",0) for r in rows))')
echo "memcpy bandwidth: $copy GB/s ($threads threads)"
printf '%-28s %8s %9s %8s %9s %9s %9s %8s %6s\n' container prompt prefill_s tokens decode_s tok/s "GB/token" "GB/s" "of_copy"
for c in "$@"; do
  bytes=$("$klein" inspect --json "$c" | python3 -c '
import json, sys
d = json.load(sys.stdin)
units = {u["name"]: u["bytes"] for u in d["units"]}
head = units.get("text_encoder.lm_head", units["text_encoder.embed"])  # tied: the table
print(sum(b for n, b in units.items() if n.startswith("text_encoder.layer."))
      + units["text_encoder.norm"] + head)')
  "$klein" upsample -m "$c" -p "a red fox in fresh snow at dawn" --max-tokens "$tokens" \
    --threads "$threads" --residency "$residency" --json | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
c, b, copy = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rate = r["decode_tokens_per_second"]
gbps = b * rate / 1e9
print("%-28s %8d %9.2f %8d %9.2f %9.2f %9.3f %8.2f %5.0f%%%s" % (
    c.split("/")[-1], r["prompt_tokens"], r["prefill_seconds"], r["new_tokens"],
    r["decode_seconds"], rate, b / 1e9, gbps, 100 * gbps / copy,
    "" if r["new_tokens"] >= int(sys.argv[4]) else "  (stopped early)"))
print("  peak RSS %.0f MiB" % (r["peak_rss_bytes"] / 2**20))' "$c" "$bytes" "$copy" "$tokens"
done
