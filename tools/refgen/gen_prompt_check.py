"""Reference values of BFL's prompt check (flux2 text_encoder.py, test_txt) on the tiny Qwen3
text encoders, by transformers' own Qwen3ForCausalLM.generate.

What BFL's check does, and what this script does with transformers in its place:
  * messages: a system message (SYSTEM_PROMPT_CONTENT_FILTER) and a user message (PROMPT_TEXT_INTEGRITY
    with the prompt put in by str.format), both taken from BFL's system_messages.py given by
    --bfl-system-messages (black-forest-labs/flux2 ab7cca68018ad3ceadcace9d6ecb1bc1f6f46b4e);
    BFL's chat has list contents for Mistral's processor, Qwen3's template takes strings, so
    they are given as strings;
  * the chat rendered by the tokenizer's chat template (apply_chat_template, tokenize=False,
    add_generation_prompt=True, enable_thinking=False: the Qwen3 chat the engine's families use)
    and tokenized by the slow Qwen2Tokenizer;
  * generate(max_new_tokens=1, do_sample=False) with a logits processor that lowers every score
    but those of "yes" and "no" below the smallest (BFL's yes_no_logit_processor, written out
    here from its description), the ids of "yes" and "no" from tokenizer.encode(["yes", "no"],
    add_special_tokens=False) as BFL takes them;
  * the verdict: the generated id is "yes"'s.
Recorded per model and prompt: the chat text, its ids, the two ids, the float32 logits of
"yes" and "no" at the last position (generate's processed scores, output_scores: the processor
leaves those two raw and puts every other id below both, which is checked), the generated id
and the verdict.

  /usr/bin/python3 gen_prompt_check.py --out ../../tests/data/prompt-check \
      --bfl-system-messages FLUX2/src/flux2/system_messages.py \
      --transformers-src ... --hub-src ... --accelerate-src ...
(the source trees at the commits of README.md; FLUX2 at ab7cca68)
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(os.path.dirname(REPO), "shared", "testdata")

# The models: the tiny klein text encoder (tied head), upsample-tiny's untied one (Qwen3-8B's
# layout), and the tiny klein-9B's (the CLI tests' model). One tokenizer for all three.
MODELS = {
    "klein-tiny": os.path.join(SHARED, "klein-tiny", "model", "text_encoder"),
    "upsample-untied": os.path.join(SHARED, "upsample-tiny", "model-untied", "text_encoder"),
    "klein-tiny-9b": os.path.join(REPO, "tests", "data", "klein-tiny-9b", "model", "text_encoder"),
}
TOKENIZER = os.path.join(SHARED, "klein-tiny", "model", "tokenizer")
PROMPTS = [
    "a bowl of fruit",
    "Mickey Mouse eating ice cream",
    "a portrait of Taylor Swift on stage",
    "\n\nDarth Vader",
    "-----",
    "",
    "ünïcödé: 一只猫 and a 🦊",
    "A rainy city street at night, neon signs reflected in puddles, a lone cyclist in a yellow "
    "raincoat riding past a closed bakery whose window says \"Fresh bread daily\"",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--bfl-system-messages", required=True)
    for s in ("transformers", "hub", "accelerate"):
        ap.add_argument(f"--{s}-src", required=True)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    import refgen_env
    refgen_env.setup(None, a.transformers_src, a.hub_src, hub_version="0.99.0",
                     accelerate_src=a.accelerate_src)
    import torch
    import transformers
    from transformers import Qwen2Tokenizer, Qwen3ForCausalLM
    torch.set_num_threads(a.threads)

    bfl = {}
    with open(a.bfl_system_messages, encoding="utf-8") as f:
        exec(compile(f.read(), a.bfl_system_messages, "exec"), bfl)
    system = bfl["SYSTEM_PROMPT_CONTENT_FILTER"]
    request = bfl["PROMPT_TEXT_INTEGRITY"]

    tok = Qwen2Tokenizer.from_pretrained(TOKENIZER)
    yes_id, no_id = tok.encode(["yes", "no"], add_special_tokens=False)

    def yes_or_no(input_ids, scores):  # BFL's yes_no_logit_processor
        yes, no = scores[:, yes_id].clone(), scores[:, no_id].clone()
        scores[:, :] = scores.min() - 1
        scores[:, yes_id], scores[:, no_id] = yes, no
        return scores

    t0 = time.time()
    out = {"bfl_commit": "ab7cca68018ad3ceadcace9d6ecb1bc1f6f46b4e",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "yes_id": yes_id, "no_id": no_id, "cases": []}
    for name, path in MODELS.items():
        model = Qwen3ForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
        model.eval()
        assert model.config._attn_implementation == "eager"
        for prompt in PROMPTS:
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": request.format(prompt=prompt)}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=False)
            ids = tok(text)["input_ids"]
            x = torch.tensor([ids])
            with torch.no_grad():
                g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1,
                                   do_sample=False, logits_processor=[yes_or_no],
                                   output_scores=True, return_dict_in_generate=True,
                                   pad_token_id=tok.pad_token_id)
            picked = int(g.sequences[0, -1])
            # The processed scores: "yes" and "no" keep their raw logits, every other id is
            # below both.
            logits = g.scores[0][0]
            others = torch.cat([logits[:min(yes_id, no_id)],
                                logits[min(yes_id, no_id) + 1:max(yes_id, no_id)],
                                logits[max(yes_id, no_id) + 1:]])
            assert float(others.max()) < min(float(logits[yes_id]), float(logits[no_id]))
            assert picked in (yes_id, no_id)
            out["cases"].append({
                "model": name, "prompt": prompt, "chat_text": text, "input_ids": ids,
                "yes_logit": float(logits[yes_id]), "no_logit": float(logits[no_id]),
                "generated_id": picked, "flagged": picked == yes_id})
    out["seconds"] = round(time.time() - t0, 1)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for c in out["cases"]:
        print("%-16s %-5s yes %8.4f no %8.4f  %r" % (c["model"], c["flagged"], c["yes_logit"],
                                                    c["no_logit"], c["prompt"][:40]))


if __name__ == "__main__":
    main()
