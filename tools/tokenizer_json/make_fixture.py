#!/usr/bin/env python3
"""Writes the tokenizer.json fixtures of the tests (two variants) from the slow-layout files
of the tiny test model (vocab.json, merges.txt, tokenizer_config.json).

The files have the layout the Hugging Face `tokenizers` library writes for Qwen2/Qwen3
(Tokenizer.save, pretty=True): the fields in its order, two-space indentation, non-ASCII
text unescaped, no trailing newline; normalizer NFC, pre_tokenizer Sequence[Split(regex,
Isolated), ByteLevel], post_processor and decoder ByteLevel, model BPE with the vocabulary in
id order and the merges in rank order. Two variants, because both occur in published
repositories:

  merge-strings/tokenizer.json   merges as "A B" strings (tokenizers before 0.20)
  merge-pairs/tokenizer.json     merges as ["A", "B"] pairs (tokenizers 0.20 and later,
                                 e.g. the Qwen3 repositories)

From the tiny model's files (which are Qwen3's), merge-pairs/tokenizer.json comes out byte for
byte the tokenizer.json of Qwen/Qwen3-0.6B (11 422 654 bytes, SHA-256 aeb13307...4492dae4);
with --expect-pairs-sha256 HEX the script fails unless it does.

The tests write these files at test time (tests/support/testing.cpp: tokenizer_json_fixture,
which passes Qwen3-0.6B's SHA-256), so the repository holds only the slow-layout inputs.

Pure Python 3 standard library. When the `tokenizers` package is importable, each file is
also loaded with it and must serialise back to the same text (it is not needed to write them).

  python3 tools/tokenizer_json/make_fixture.py [--expect-pairs-sha256 HEX] \\
      ../shared/testdata/klein-tiny/model/tokenizer OUT_DIR
"""
import hashlib
import json
import os
import sys

# The Qwen2/Qwen3 pre-tokenization pattern (spec/qwen3-tokenizer.md section 3).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_level(add_prefix_space=False, trim_offsets=False, use_regex=False):
    return {
        "type": "ByteLevel",
        "add_prefix_space": add_prefix_space,
        "trim_offsets": trim_offsets,
        "use_regex": use_regex,
    }


def read_merges(path):
    """merges.txt: an optional '#version' first line, then 'A B' per non-empty line."""
    merges = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line or (number == 1 and line.startswith("#version")):
                continue
            parts = line.split()
            if len(parts) != 2:
                sys.exit(f"{path}: line {number}: expected two symbols, found {line!r}")
            merges.append(parts)
    return merges


def read_added_tokens(path):
    """tokenizer_config.json's added_tokens_decoder as tokenizer.json's added_tokens."""
    with open(path, encoding="utf-8") as f:
        decoder = json.load(f).get("added_tokens_decoder", {})
    added = []
    for key, t in sorted(decoder.items(), key=lambda kv: int(kv[0])):
        added.append({
            "id": int(key),
            "content": t["content"],
            "single_word": t.get("single_word", False),
            "lstrip": t.get("lstrip", False),
            "rstrip": t.get("rstrip", False),
            "normalized": t.get("normalized", False),
            "special": t.get("special", False),
        })
    return added


def tokenizer_json(vocab, merges, added, pairs):
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": SPLIT_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level(),
            ],
        },
        "post_processor": byte_level(),
        "decoder": byte_level(),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [list(m) if pairs else " ".join(m) for m in merges],
        },
    }


def check_with_tokenizers(path, text):
    """Optional: the library that defines the format reads the file and writes it back
    byte for byte the same."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    if Tokenizer.from_file(path).to_str(pretty=True) != text:
        sys.exit(f"{path}: the tokenizers library writes this tokenizer differently")


def main():
    args = sys.argv[1:]
    expect_pairs_sha256 = None
    if len(args) == 4 and args[0] == "--expect-pairs-sha256":
        expect_pairs_sha256, args = args[1].lower(), args[2:]
    if len(args) != 2:
        sys.exit(__doc__)
    source_dir, out_dir = args
    with open(os.path.join(source_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    vocab = dict(sorted(vocab.items(), key=lambda kv: kv[1]))  # id order, as tokenizers writes
    merges = read_merges(os.path.join(source_dir, "merges.txt"))
    added = read_added_tokens(os.path.join(source_dir, "tokenizer_config.json"))
    for name, pairs in (("merge-strings", False), ("merge-pairs", True)):
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        path = os.path.join(out_dir, name, "tokenizer.json")
        text = json.dumps(tokenizer_json(vocab, merges, added, pairs), ensure_ascii=False,
                          indent=2)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        check_with_tokenizers(path, text)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if pairs and expect_pairs_sha256 and digest != expect_pairs_sha256:
            sys.exit(f"{path}: SHA-256 {digest}, expected {expect_pairs_sha256} (the published "
                     "file's)")
        print(f"{path}: {len(vocab)} tokens, {len(merges)} merges, {len(added)} added tokens, "
              f"{len(text.encode('utf-8'))} bytes")


if __name__ == "__main__":
    main()
