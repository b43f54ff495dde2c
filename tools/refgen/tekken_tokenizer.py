#!/usr/bin/env python3
"""A small tokenizer.json in the layout transformers' Tekken converter writes, and the ids
the official JavaScript implementation of tokenizer.json gives for it.

FLUX.2-dev's text encoder is Mistral-Small-3.1, whose tokenizer on the Hub is Mistral's
"Tekken" vocabulary converted to a Hugging Face tokenizer.json by transformers'
`integrations/mistral.py` (`convert_tekken_tokenizer`, `MistralConverter`). The real file
cannot be obtained here, so this script makes one of the same shape:

  * a byte-level BPE vocabulary learned by a plain BPE training (tiktoken-style: every new
    token is the most frequent adjacent pair, ranks in order of creation) on the committed
    corpus in tekken/ (hand-written multilingual text, and a copy of two project files for
    English prose and code), pre-tokenized with the Split pattern below;
  * Mistral's 1000 control tokens first (ids 0..999), then the 256 single bytes
    (1000..1255), then the learned tokens: the Tekken layout (rank + 1000); the last 8 ids
    are whole pieces of the corpus that the merges cannot build (as real vocabularies have
    some), so that ignore_merges changes ids; 8192 ids in all;
  * the converter's vocabulary and merges: control tokens as themselves, every other token
    in the GPT-2 byte alphabet; for every learned token, a merge for each way of cutting it
    into two tokens of the vocabulary, those of one token ordered by the ranks of the two
    halves, all of them ordered by the rank of the token they make;
  * the converter's pipeline: normalizer null; pre_tokenizer Sequence[Split(Regex(PATTERN),
    "Isolated", invert false), ByteLevel(add_prefix_space false, use_regex false)];
    model BPE with ignore_merges true, fuse_unk false, byte_fallback false; decoder
    ByteLevel; post_processor ByteLevel(trim_offsets false); the control tokens as added
    tokens with special true;
  * PATTERN is the converter's default (Llama 3's pattern): case-insensitive contractions and
    numbers of one to three digits.

tokenizer_config.json names <s>, </s>, <unk> and <pad>, pads on the left (the real value is
to be checked against the real file) and carries Mistral-Small-3.1's chat template, taken
byte for byte from the official transformers test file tests/models/mistral3/
test_processing_mistral3.py (pass it with --mistral3-test).

Then the expected ids: the strings of tekken/strings.json (and the 8 unreachable pieces,
alone and in one text), and the prompts of the FLUX.2-dev
pipeline rendered as the pipeline renders them (diffusers' `format_input` builds the
messages; transformers' own jinja environment, `_compile_jinja_template`, renders them with
add_generation_prompt false and the special tokens as template variables), are tokenized by
@huggingface/tokenizers (tekken/js, run with node).

  /usr/bin/python3 tools/refgen/tekken_tokenizer.py \\
      --transformers-src TRANSFORMERS/src --diffusers-src DIFFUSERS/src \\
      --hub-src HUGGINGFACE_HUB/src --accelerate-src ACCELERATE/src \\
      --mistral3-test test_processing_mistral3.py \\
      --out tests/data/flux2-dev-tiny
(`cd tools/refgen/tekken/js && npm ci` first.) Writes OUT/tokenizer/tokenizer.json,
OUT/tokenizer/tokenizer_config.json and OUT/tokenizer_vectors.json. Deterministic.
"""
import argparse
import ast
import collections
import heapq
import json
import os
import subprocess
import sys

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
TEKKEN = os.path.join(HERE, "tekken")

VOCAB_SIZE = 8192
NUM_CONTROL = 1000
# Tokens added after the training that the merges cannot build (see unreachable_words).
NUM_UNREACHABLE = 8

# The converter's default pattern (MistralConverter.__init__), Llama 3's.
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Mistral's control tokens at the start of the Tekken vocabulary; the rest of the first 1000
# ids are <SPECIAL_n>.
CONTROL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
           "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]",
           "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
           "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]
CONTROL += ["<SPECIAL_%d>" % i for i in range(len(CONTROL), NUM_CONTROL)]

CORPUS_FILES = ["corpus_multilingual.txt", "corpus_project.txt"]


def bytes_to_unicode():
    """The GPT-2 byte alphabet: printable bytes stand for themselves, the others for 256+n."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_SYMBOL = bytes_to_unicode()


def symbols(token):
    return "".join(BYTE_SYMBOL[b] for b in token)


def train(text, size):
    """Byte-level BPE: `size` tokens, the 256 bytes first, then one per merge of the most
    frequent adjacent pair (ties: the smaller pair of byte strings). Returns the tokens in
    rank order."""
    counts = collections.Counter(m.encode("utf-8") for m in regex.findall(PATTERN, text))
    words = [[bytes([b]) for b in w] for w in counts]
    freq = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[a, b] += freq[i]
            where[a, b].add(i)
    heap = [(-n, p) for p, n in pairs.items()]
    heapq.heapify(heap)
    tokens = [bytes([b]) for b in range(256)]
    while len(tokens) < size and heap:
        n, best = heapq.heappop(heap)
        if pairs.get(best, 0) != -n or n == 0:
            continue  # stale entry
        merged = best[0] + best[1]
        tokens.append(merged)
        changed = collections.Counter()
        for i in sorted(where.pop(best)):
            w, f = words[i], freq[i]
            for a, b in zip(w, w[1:]):
                changed[a, b] -= f
            out, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and (w[k], w[k + 1]) == best:
                    out.append(merged)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            words[i] = out
            for a, b in zip(out, out[1:]):
                changed[a, b] += f
                where[a, b].add(i)
        for p, d in changed.items():
            if d == 0:
                continue
            pairs[p] += d
            if pairs[p] <= 0:
                del pairs[p]
            else:
                heapq.heappush(heap, (-pairs[p], p))
        pairs.pop(best, None)
    if len(tokens) < size:
        sys.exit("the corpus gives only %d tokens, %d wanted" % (len(tokens), size))
    return tokens


def converted(tokens):
    """The converter's vocabulary and merges for Tekken tokens in rank order."""
    rank = {t: r for r, t in enumerate(tokens)}
    vocab = {c: i for i, c in enumerate(CONTROL)}
    merges = []
    for r, t in enumerate(tokens):
        vocab[symbols(t)] = NUM_CONTROL + r
        cuts = [(t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in rank and t[k:] in rank]
        cuts.sort(key=lambda lr: (rank[lr[0]], rank[lr[1]]))
        merges += [(r, lr) for lr in cuts]
    merges.sort(key=lambda m: m[0])  # stable: keeps the order within a token
    assert len(vocab) == NUM_CONTROL + len(tokens), "a learned token spells a control token"
    return vocab, [[symbols(a), symbols(b)] for _, (a, b) in merges]


def bpe_parts(word, rank):
    """What the BPE model of tokenizer.json makes of one piece (byte-level symbols) without
    ignore_merges: the lowest-ranked merge of adjacent parts first, the leftmost on ties."""
    parts = list(word)
    while len(parts) > 1:
        best = min(((rank[p], i) for i, p in enumerate(zip(parts, parts[1:])) if p in rank),
                   default=None)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def unreachable_words(tokens, text, count):
    """Real vocabularies carry tokens that their merges cannot build (tokens added after the
    training, a vocabulary cut down), which is what ignore_merges is for. A fresh training has
    none, so `count` are added as such: the most frequent whole pieces of the corpus that BPE
    leaves in three parts or more (one merge more cannot join three parts, so the pieces stay
    unreachable however the converter's merges for them look)."""
    counts = collections.Counter(m.encode("utf-8") for m in regex.findall(PATTERN, text))
    extra = []
    for word, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0])):
        if len(extra) == count:
            break
        piece = word.decode("utf-8")
        if word in tokens or regex.findall(PATTERN, piece) != [piece] or piece.isspace():
            continue
        _, merges = converted(tokens + extra)
        rank = {tuple(m): i for i, m in enumerate(merges)}
        if len(bpe_parts(symbols(word), rank)) >= 3:
            extra.append(word)
    return extra


def byte_level(add_prefix_space, trim_offsets, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": trim_offsets, "use_regex": use_regex}


def tokenizer_json(vocab, merges):
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(CONTROL)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated",
             "invert": False},
            byte_level(False, True, False)]},
        "post_processor": byte_level(True, False, True),
        "decoder": byte_level(True, True, True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }


def chat_template_from(test_file):
    """The "chat_template" of prepare_processor_dict() in the official test file, as written."""
    tree = ast.parse(open(test_file, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "prepare_processor_dict":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return):
                    return ast.literal_eval(ret.value)["chat_template"]
    sys.exit("%s: no prepare_processor_dict returning a chat_template" % test_file)


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for s in ("transformers", "diffusers", "hub", "accelerate"):
        ap.add_argument("--%s-src" % s, required=True)
    ap.add_argument("--mistral3-test", required=True,
                    help="tests/models/mistral3/test_processing_mistral3.py of transformers")
    ap.add_argument("--out", required=True, help="the model set, e.g. tests/data/flux2-dev-tiny")
    a = ap.parse_args()

    text = "".join(open(os.path.join(TEKKEN, f), encoding="utf-8").read() for f in CORPUS_FILES)
    tokens = train(text, VOCAB_SIZE - NUM_CONTROL - NUM_UNREACHABLE)
    extra = unreachable_words(tokens, text, NUM_UNREACHABLE)
    vocab, merges = converted(tokens + extra)
    rank = {tuple(m): i for i, m in enumerate(merges)}
    assert all(len(bpe_parts(symbols(w), rank)) > 1 for w in extra)
    tok_dir = os.path.join(a.out, "model", "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    write_json(os.path.join(tok_dir, "tokenizer.json"), tokenizer_json(vocab, merges))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    template = chat_template_from(a.mistral3_test)
    write_json(os.path.join(tok_dir, "tokenizer_config.json"), {
        **special, "padding_side": "left", "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": template})

    # The pipeline's messages and the official renderer.
    sys.path.insert(0, HERE)
    import refgen_env
    refgen_env.setup(a.diffusers_src, a.transformers_src, a.hub_src, hub_version="0.99.0",
                     accelerate_src=a.accelerate_src)
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from transformers.utils.chat_template_utils import _compile_jinja_template
    compiled = _compile_jinja_template(template)
    spec = json.load(open(os.path.join(TEKKEN, "strings.json"), encoding="utf-8"))
    prompts = []
    for p in spec["prompts"]:
        (messages,) = format_input([p])
        rendered = compiled.render(messages=messages, tools=None, documents=None,
                                   add_generation_prompt=False, **special)
        prompts.append({"prompt": p, "messages": messages, "rendered": rendered})

    # Each unreachable word alone and all of them in one text: one id each with
    # ignore_merges, several without.
    words = [w.decode("utf-8") for w in extra]
    strings = spec["strings"] + words + ["\n".join(words)]
    request = {"strings": strings, "prompts": [p["rendered"] for p in prompts]}
    js = subprocess.run(
        ["node", os.path.join(TEKKEN, "js", "encode.mjs"), os.path.join(tok_dir, "tokenizer.json"),
         os.path.join(tok_dir, "tokenizer_config.json")],
        input=json.dumps(request), capture_output=True, text=True)
    if js.returncode != 0:
        sys.exit("encode.mjs failed:\n" + js.stderr)
    result = json.loads(js.stdout)
    for p, r in zip(prompts, result["prompts"]):
        p.update(r)
    write_json(os.path.join(a.out, "tokenizer_vectors.json"), {
        "made_by": "tools/refgen/tekken_tokenizer.py",
        "implementation": result["implementation"],
        "system_message": SYSTEM_MESSAGE,
        "vocab_size": len(vocab),
        "merges": len(merges),
        "unreachable_words": words,
        "strings": result["strings"],
        "prompts": prompts,
    })
    print("%d ids, %d merges, %d strings, %d prompts" %
          (len(vocab), len(merges), len(result["strings"]), len(prompts)))


if __name__ == "__main__":
    main()
