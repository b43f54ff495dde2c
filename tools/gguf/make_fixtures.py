#!/usr/bin/env python3
"""GGUF fixtures made by gguf-py (the GGUF package of llama.cpp), and the float32 values gguf-py
decodes them to, which the engine's GGUF reader must reproduce bit for bit.

  make_fixtures.py types KLEIN_TINY_MODEL_DIR OUTDIR
      OUTDIR/types.gguf              one tensor per GGML type the engine reads (below), and
                                     metadata of every GGUF value type
      OUTDIR/types-ref.safetensors   each tensor as gguf-py decodes it (F32, our shape order)
      Legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and BF16 are quantized by gguf-py from rows
      of the tiny transformer's weights; gguf-py has no K-quant quantizer, so Q2_K..Q6_K (and a
      Q8_0 tensor holding -128) are random valid blocks (finite positive f16 scales, random
      bytes elsewhere) that gguf-py decodes.

  make_fixtures.py model KLEIN_TINY_MODEL_DIR OUTDIR
      OUTDIR/transformer.gguf        the tiny transformer under BFL names, as ComfyUI-GGUF
                                     files name a FLUX.2 transformer, with a mix of types
      OUTDIR/text_encoder.gguf       the tiny Qwen3 under llama.cpp's names (token_embd,
                                     blk.N.attn_q ... output_norm) with its tokenizer in the
                                     metadata (tokenizer.ggml.*), as llama.cpp's converter
                                     writes a Qwen3 model (gpt2 tokenizer model, no Q/K
                                     permutation: Qwen2/Qwen3 use NEOX rope); the
                                     embedding Q4_0 to keep the file small
      OUTDIR/decoded.json            what gguf-py decodes both files to, per tensor of a klein
                                     container (transformer.<diffusers name>,
                                     text_encoder.<transformers name>; the fused BFL QKV split
                                     into its thirds, the final layer's halves swapped back):
                                     shape and XXH3-64 of the float32 little-endian values.
      The decoded values themselves (70 MB of float32) are not kept: a container converted
      from the GGUF files with -t f32 must hold exactly these bytes, which the test checks
      tensor by tensor before it uses that container as the reference.
      Needs python3-xxhash besides numpy.

gguf-py is pure Python + numpy: point GGUF_PY at the gguf-py directory of a llama.cpp checkout
(or put it on PYTHONPATH). numpy: Debian's python3-numpy. gguf-py's vocab module imports
sentencepiece, which none of this uses; a stand-in is put in its place when it is missing.

  GGUF_PY=~/llama.cpp/gguf-py python3 tools/gguf/make_fixtures.py types \\
      ../shared/testdata/klein-tiny/model tests/data/gguf
"""
import json
import os
import struct
import sys
import types

import numpy as np

if os.environ.get("GGUF_PY"):
    sys.path.insert(0, os.environ["GGUF_PY"])
try:
    import sentencepiece  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("sentencepiece")
    stand_in.SentencePieceProcessor = None
    sys.modules["sentencepiece"] = stand_in
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

# --- safetensors (read BF16/F32, write F32) ---------------------------------------------------


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=e - b, offset=8 + n + b)
        if info["dtype"] == "BF16":
            v = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            v = raw.view(np.float32)
        else:
            raise SystemExit(f"{path}: {name}: dtype {info['dtype']} not handled")
        out[name] = v.reshape(info["shape"]).copy()
    return out


def read_model_dir(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        shards = sorted(set(json.load(open(index))["weight_map"].values()))
        out = {}
        for s in shards:
            out.update(read_safetensors(os.path.join(directory, s)))
        return out
    for stem in ("diffusion_pytorch_model", "model"):
        p = os.path.join(directory, stem + ".safetensors")
        if os.path.exists(p):
            return read_safetensors(p)
    raise SystemExit(f"{directory}: no safetensors")


def write_safetensors(path, tensors):
    header, body = {}, bytearray()
    for name, v in tensors.items():
        raw = np.ascontiguousarray(v, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(body))


# --- GGUF through gguf-py -----------------------------------------------------------------------


def add_quantized(writer, name, values, qtype):
    """`values` (float32, our shape) quantized by gguf-py to qtype."""
    if qtype == Q.F32:
        writer.add_tensor(name, values.astype(np.float32))
    elif qtype == Q.F16:
        writer.add_tensor(name, values.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(values.astype(np.float32), qtype), raw_dtype=qtype)


def add_blocks(writer, name, raw, shape, qtype):
    """Raw blocks (uint8 [rows, bytes per row]) of a tensor of `shape` (ours)."""
    writer.add_tensor(name, raw.reshape(shape[:-1] + (-1,)), raw_dtype=qtype)


def decoded(path):
    """Every tensor of a GGUF file as gguf-py's reader and dequantizer see it, our shape."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(v, dtype=np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))
    return out


def finite_f16(rng, n, low, high):
    return rng.uniform(low, high, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng, qtype, n_blocks):
    """Random valid blocks: the f16 scales finite and positive, every other byte random."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    # Byte offsets of the f16 scales in each block (gguf-py's dequantize_blocks splits).
    scales = {Q.Q8_0: [0], Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
    for at in scales[qtype]:
        b[:, at:at + 2] = finite_f16(rng, n_blocks, 1e-4, 0.05)
    return b


def make_types(model_dir, out_dir):
    rng = np.random.default_rng(20)
    tr = read_model_dir(os.path.join(model_dir, "transformer"))
    rows = tr["transformer_blocks.0.attn.to_q.weight"][:4].astype(np.float32)  # [4, 256]
    path = os.path.join(out_dir, "types.gguf")
    w = gguf.GGUFWriter(path, "klein-test")
    # Metadata of every value type (and arrays of strings, integers and arrays).
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.25)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "klein ✓")
    w.add_uint64("test.u64", 1 << 40)
    w.add_int64("test.i64", -(1 << 40))
    w.add_float64("test.f64", -2.5)
    w.add_array("test.strings", ["a", "", "ü"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.nested", [[1, 2], [3]])
    add_quantized(w, "f32", rows[:2, :64], Q.F32)
    add_quantized(w, "f16", rows[:2, :64], Q.F16)
    add_quantized(w, "bf16", rows[:2, :64], Q.BF16)
    add_quantized(w, "f16_3d", rows[:3, :128].reshape(2, 3, 64), Q.F16)
    for qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        add_quantized(w, qtype.name.lower(), rows, qtype)
    q8 = random_blocks(rng, Q.Q8_0, 16)
    q8[0, 2] = 0x80  # -128, which gguf-py's quantizer never writes but a block may hold
    add_blocks(w, "q8_0_random", q8, (2, 256), Q.Q8_0)
    for qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
        add_blocks(w, qtype.name.lower(), random_blocks(rng, qtype, 16), (4, 1024), qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_safetensors(os.path.join(out_dir, "types-ref.safetensors"), decoded(path))


# --- the tiny model under the names of GGUF files ------------------------------------------


# diffusers names -> BFL names of the transformer's unfused tensors: the shared ones, a double
# block's (after "transformer_blocks.N." / "double_blocks.N.") and a single block's (after
# "single_transformer_blocks.N.attn." / "single_blocks.N."). The fused QKV and the final
# layer's swapped halves are handled where they are used.
SHARED = {
    "x_embedder.weight": "img_in.weight",
    "context_embedder.weight": "txt_in.weight",
    "time_guidance_embed.timestep_embedder.linear_1.weight": "time_in.in_layer.weight",
    "time_guidance_embed.timestep_embedder.linear_2.weight": "time_in.out_layer.weight",
    "double_stream_modulation_img.linear.weight": "double_stream_modulation_img.lin.weight",
    "double_stream_modulation_txt.linear.weight": "double_stream_modulation_txt.lin.weight",
    "single_stream_modulation.linear.weight": "single_stream_modulation.lin.weight",
    "proj_out.weight": "final_layer.linear.weight",
}
DOUBLE_BLOCK = {
    "attn.norm_q.weight": "img_attn.norm.query_norm.scale",
    "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
    "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
    "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
    "attn.to_out.0.weight": "img_attn.proj.weight",
    "attn.to_add_out.weight": "txt_attn.proj.weight",
    "ff.linear_in.weight": "img_mlp.0.weight",
    "ff.linear_out.weight": "img_mlp.2.weight",
    "ff_context.linear_in.weight": "txt_mlp.0.weight",
    "ff_context.linear_out.weight": "txt_mlp.2.weight",
}
SINGLE_BLOCK = {
    "to_qkv_mlp_proj.weight": "linear1.weight",
    "to_out.weight": "linear2.weight",
    "norm_q.weight": "norm.query_norm.scale",
    "norm_k.weight": "norm.key_norm.scale",
}
# The fused QKV of a double block: BFL tensor -> its diffusers thirds, in order.
FUSED_QKV = {
    "img_attn.qkv.weight": ["attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight"],
    "txt_attn.qkv.weight": ["attn.add_q_proj.weight", "attn.add_k_proj.weight", "attn.add_v_proj.weight"],
}


def swap_halves(m):
    half = m.shape[0] // 2
    return np.concatenate([m[half:], m[:half]])


def count(names, pattern):
    n = 0
    while pattern.format(n) in names:
        n += 1
    return n


def unfused_pairs(double_blocks, single_blocks):
    """(diffusers name, BFL name) of every tensor that is renamed only."""
    pairs = list(SHARED.items())
    for i in range(double_blocks):
        pairs += [(f"transformer_blocks.{i}." + x, f"double_blocks.{i}." + y) for x, y in DOUBLE_BLOCK.items()]
    for i in range(single_blocks):
        pairs += [(f"single_transformer_blocks.{i}.attn." + x, f"single_blocks.{i}." + y)
                  for x, y in SINGLE_BLOCK.items()]
    return pairs


def bfl_transformer(d):
    """diffusers names -> BFL names (fused QKV, final layer's halves swapped), as in
    tests/formats/single_file_test.cpp."""
    d = dict(d)
    doubles = count(d, "transformer_blocks.{}.attn.to_q.weight")
    singles = count(d, "single_transformer_blocks.{}.attn.to_out.weight")
    out = {b: d.pop(a) for a, b in unfused_pairs(doubles, singles)}
    out["final_layer.adaLN_modulation.1.weight"] = swap_halves(d.pop("norm_out.linear.weight"))
    for i in range(doubles):
        for fused, parts in FUSED_QKV.items():
            out[f"double_blocks.{i}." + fused] = np.concatenate([d.pop(f"transformer_blocks.{i}." + x) for x in parts])
    assert not d, f"unconverted: {sorted(d)}"
    return out


def diffusers_transformer(bfl):
    """BFL names -> the diffusers names of a klein container: the inverse of bfl_transformer
    (the fused QKV rows split into thirds, the final layer's halves swapped back)."""
    bfl = dict(bfl)
    doubles = count(bfl, "double_blocks.{}.img_attn.qkv.weight")
    singles = count(bfl, "single_blocks.{}.linear1.weight")
    out = {a: bfl.pop(b) for a, b in unfused_pairs(doubles, singles)}
    out["norm_out.linear.weight"] = swap_halves(bfl.pop("final_layer.adaLN_modulation.1.weight"))
    for i in range(doubles):
        for fused, parts in FUSED_QKV.items():
            for x, rows in zip(parts, np.split(bfl.pop(f"double_blocks.{i}." + fused), 3)):
                out[f"transformer_blocks.{i}." + x] = rows
    assert not bfl, f"unmapped: {sorted(bfl)}"
    return out


# transformers' Qwen3 names -> llama.cpp's (gguf-py tensor_mapping: MODEL_TENSOR names).
QWEN3_LAYER = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_name(name):
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".", 3)  # model, layers, N, rest
    assert parts[:2] == ["model", "layers"], name
    return f"blk.{parts[2]}.{QWEN3_LAYER[parts[3]]}"


# Types for the model fixtures, cycled over the 2-D weights so that every readable type is
# used by some tensor; 1-D tensors (norms) stay F32 as the converters keep them.
MODEL_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.F16, Q.BF16]


def qwen3_tokenizer(writer, tokenizer_dir, vocab_size):
    """The tokenizer metadata of llama.cpp's converter for a gpt2-type (byte-level BPE) model:
    the tokens in id order padded to the vocabulary size with [PADn], their types (NORMAL,
    CONTROL for special added tokens, USER_DEFINED for the other added ones, UNUSED for the
    padding), the merges and the special ids, through gguf-py's SpecialVocab."""
    vocab = json.load(open(os.path.join(tokenizer_dir, "vocab.json"), encoding="utf-8"))
    config = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8"))
    added = {int(i): t for i, t in config.get("added_tokens_decoder", {}).items()}
    by_id = {i: t for t, i in vocab.items()}
    tokens, kinds = [], []
    for i in range(vocab_size):
        if i in added:
            tokens.append(added[i]["content"])
            kinds.append(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            kinds.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            kinds.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    gguf.SpecialVocab(tokenizer_dir, load_merges=True).add_to_gguf(writer)


def digest(tensors, prefix):
    import xxhash
    return {prefix + name: {"shape": list(v.shape),
                            "xxh3": xxhash.xxh3_64_hexdigest(np.ascontiguousarray(v, dtype="<f4").tobytes())}
            for name, v in tensors.items()}


def make_model(model_dir, out_dir):
    source = read_model_dir(os.path.join(model_dir, "transformer"))
    tr = bfl_transformer(source)
    path = os.path.join(out_dir, "transformer.gguf")
    w = gguf.GGUFWriter(path, "flux")
    w.add_uint32("general.quantization_version", 2)
    n = 0
    for name, v in tr.items():
        if v.ndim == 1 or v.shape[-1] % 32:
            add_quantized(w, name, v, Q.F32)
        else:
            add_quantized(w, name, v, MODEL_TYPES[n % len(MODEL_TYPES)])
            n += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    back = diffusers_transformer(decoded(path))
    assert sorted(back) == sorted(source), "the BFL names do not map back onto the diffusers ones"
    digests = digest(back, "transformer.")

    te_dir = os.path.join(model_dir, "text_encoder")
    te = read_model_dir(te_dir)
    cfg = json.load(open(os.path.join(te_dir, "config.json")))
    path = os.path.join(out_dir, "text_encoder.gguf")
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    qwen3_tokenizer(w, os.path.join(model_dir, "tokenizer"), cfg["vocab_size"])
    n = 0
    for name, v in te.items():
        if name == "lm_head.weight":
            continue  # tied to the embedding: llama.cpp writes no output.weight then
        if v.ndim == 1:
            add_quantized(w, llama_cpp_name(name), v, Q.F32)
        elif name == "model.embed_tokens.weight":
            # 151936 x 64, most of the file: Q4_0 (half the bytes of Q8_0) keeps the fixture small.
            add_quantized(w, llama_cpp_name(name), v, Q.Q4_0)
        else:
            add_quantized(w, llama_cpp_name(name), v, MODEL_TYPES[n % len(MODEL_TYPES)])
            n += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    hf = {v: k for k, v in ((k, llama_cpp_name(k)) for k in te if k != "lm_head.weight")}
    digests.update(digest({hf[k]: v for k, v in decoded(path).items()}, "text_encoder."))
    with open(os.path.join(out_dir, "decoded.json"), "w", encoding="utf-8") as f:
        json.dump({"made_by": "tools/gguf/make_fixtures.py model (gguf-py " + gguf_version() + ")",
                   "tensors": digests}, f, indent=1, sort_keys=True)
        f.write("\n")


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "from GGUF_PY"


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("types", "model"):
        raise SystemExit(__doc__)
    os.makedirs(sys.argv[3], exist_ok=True)
    (make_types if sys.argv[1] == "types" else make_model)(sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
