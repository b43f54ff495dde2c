#!/usr/bin/env python3
"""Mistral's tekken.json for a tokenizer.json in the layout transformers' Tekken converter
writes: the inverse of that conversion, so that a test can read the same tokenizer in both
forms and require the same ids (the ids themselves come from the official implementation of
tokenizer.json, tests/data/flux2-dev-tiny/tokenizer_vectors.json).

  /usr/bin/python3 tools/tekken/tekken_json.py TOKENIZER_JSON OUT_TEKKEN_JSON

What is written (mistral_common's Tekkenizer file, version v7):
  config          pattern (the tokenizer.json Split regex), default_vocab_size (the special
                  tokens plus the regular ones), default_num_special_tokens, num_vocab_tokens,
                  version;
  vocab           the regular tokens (ids from the number of special tokens on) in rank order:
                  rank = id - special tokens, token_bytes = base64 of the token's bytes (the
                  GPT-2 byte alphabet undone), token_str = the bytes as UTF-8 or null;
  special_tokens  the added tokens, each {rank: id, token_str, is_control: true}.
Real files list more vocab entries than the vocabulary uses (num_vocab_tokens is larger than
default_vocab_size less the special tokens), so EXTRA entries follow, which a reader must not
use. Standard library only; deterministic.
"""
import base64
import json
import sys

EXTRA = [b"zzzz", b"the cube", b"\xf0\x9f"]


def byte_alphabet():
    """The GPT-2 byte-level alphabet: printable bytes stand for themselves, others 256 + n."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
                 + list(range(0xAE, 0xFF + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def main(src, out):
    with open(src, encoding="utf-8") as f:
        t = json.load(f)
    symbol_byte = byte_alphabet()
    specials = sorted((a for a in t["added_tokens"] if a["special"]), key=lambda a: a["id"])
    num_special = len(specials)
    assert [a["id"] for a in specials] == list(range(num_special)), "special ids not 0..n-1"
    regular = sorted((i, s) for s, i in t["model"]["vocab"].items() if i >= num_special)
    assert [i for i, _ in regular] == list(range(num_special, num_special + len(regular)))
    vocab = []
    for i, s in regular + [(None, None)] * len(EXTRA):
        rank = len(vocab)
        b = bytes(symbol_byte[c] for c in s) if s is not None else EXTRA[rank - len(regular)]
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        vocab.append({"rank": rank, "token_bytes": base64.b64encode(b).decode("ascii"),
                      "token_str": text})
    pattern = t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    tekken = {
        "config": {"pattern": pattern, "num_vocab_tokens": len(vocab),
                   "default_vocab_size": num_special + len(regular),
                   "default_num_special_tokens": num_special, "version": "v7"},
        "vocab": vocab,
        "special_tokens": [{"rank": a["id"], "token_str": a["content"], "is_control": True}
                           for a in specials],
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tekken, f, ensure_ascii=False)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
