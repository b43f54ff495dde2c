#!/usr/bin/env bash
# The prompt check's cost (klein check-prompt: BFL's chat of about 270 tokens, of which about
# 245 are the same for every prompt and kept in the prompt cache, and the "yes"/"no" logits)
# without and with the prompt cache, beside what the goal measures it against: a prefill of
# the prompt and 16 generated tokens (klein upsample --max-tokens 16: its own chat's prefill
# per token, and its 16 tokens).
#
#   klein synth -o /tmp/synth4b --tokenizer TOKENIZER_DIR
#   klein convert -m /tmp/synth4b -t q4 --keep-llm -o /tmp/synth-q4-llm.klein
#   bench/prompt_check.sh /tmp/synth-q4-llm.klein
#
# Options from the environment: THREADS (2), RESIDENCY (auto), KLEIN (build/klein).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
(($# >= 1)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
klein="${KLEIN:-$here/build/klein}"
threads="${THREADS:-2}"
residency="${RESIDENCY:-auto}"
prompt="a red fox in fresh snow at dawn"
echo "command: bench/prompt_check.sh $* (THREADS=$threads RESIDENCY=$residency)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
cache="$(mktemp -d)"
trap 'rm -rf "$cache"' EXIT
for c in "$@"; do
  echo "== $c"
  # Without the prompt cache (BFL's fixed text computed), then with it twice: the first run
  # computes and stores the fixed text's keys and values, the second reads them.
  { "$klein" check-prompt -m "$c" -p "$prompt" --threads "$threads" --residency "$residency" \
      --json --no-cache || [[ $? == 2 ]]
    for run in 1 2; do
      "$klein" check-prompt -m "$c" -p "$prompt" --threads "$threads" --residency "$residency" \
        --json --cache-dir "$cache" || [[ $? == 2 ]]
    done; } | python3 -c '
import json, sys
for line, how in zip(sys.stdin, ["no prompt cache", "cache: computed, stored", "cache: read"]):
    r = json.loads(line)
    print("check-prompt (%s): %d chat tokens, %d kept, %.2f s, flagged %s" % (
        how, r["chat_tokens"], r["reused_tokens"], r["seconds"], r["flagged"]))'
  "$klein" upsample -m "$c" -p "$prompt" --max-tokens 16 --threads "$threads" \
    --residency "$residency" --json | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
per = r["prefill_seconds"] / r["prompt_tokens"]
print("upsample: prefill %d tokens %.2f s (%.1f ms/token), %d new tokens %.2f s" % (
    r["prompt_tokens"], r["prefill_seconds"], 1000 * per, r["new_tokens"], r["decode_seconds"]))'
done
