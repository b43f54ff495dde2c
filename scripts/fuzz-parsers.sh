#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (safetensors + LoRA files, .npy, PNG/JPEG + the
# reference preprocessing, tokenizer files, config JSON + precision policy, the server's
# request fields, GGUF files, PyTorch .pth zips) with clang,
# AddressSanitizer and UBSan, and runs each for a bounded time from a seed corpus. A crash,
# a leak of a klein::Error into anything else, a hang (-timeout) or an allocation beyond
# -rss_limit_mb fails the run; the input that did it is left in the build directory.
# Usage: scripts/fuzz-parsers.sh [seconds per target, default 30] [targets...]
#        scripts/fuzz-parsers.sh --list     the default targets (scripts/fuzz-ci.sh builds them)
# Environment: BUILD_DIR (default build-asan, the tree the sanitizer suite uses too:
# scripts/configure-sanitize.sh), CC/CXX (default clang/clang++).
set -euo pipefail
cd "$(dirname "$0")/.."

default_targets=(safetensors npy image tokenizer config server gguf hub pth)
if [[ "${1:-}" == --list ]]; then
  echo "${default_targets[@]}"
  exit 0
fi

bash scripts/install-packages.sh clang python3

seconds="${1:-30}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=("${default_targets[@]}")
build="${BUILD_DIR:-build-asan}"

# FUZZ_BUILT=1: the targets are built already (scripts/fuzz-ci.sh builds them once for both).
if [[ "${FUZZ_BUILT:-0}" != 1 ]]; then
  bash scripts/configure-sanitize.sh "$build"
  cmake --build "$build" --target "${targets[@]/#/fuzz_}"
fi

# Seeds: small valid inputs of each parser, written here (and fuzz/corpus for images).
seeds="$(pwd)/$build/fuzz-seeds"
rm -rf "$seeds"
mkdir -p "$seeds"/{safetensors,npy,image,tokenizer,config,server,gguf,hub,pth}
cp fuzz/corpus/seed.png fuzz/corpus/seed.jpg fuzz/corpus/seed-exif.jpg tests/data/images/cmyk.jpg \
  tests/data/images/lossy.webp tests/data/images/alpha.webp tests/data/images/animated.webp tests/data/images/exif6.webp "$seeds/image/"
# .pth: torch.save's own small files (views of shared storages, float16; a refused global).
cp tests/data/taef2/bad/*.pth "$seeds/pth/"
python3 - "$seeds" <<'PY'
import json, struct, sys
root = sys.argv[1]

def safetensors(path, tensors, meta=None):
    header, body = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    if meta:
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + body)

safetensors(f"{root}/safetensors/plain", [
    ("a.weight", "F32", [2, 3], struct.pack("<6f", *range(6))),
    ("b", "BF16", [4], b"\x80\x3f" * 4),
    ("c", "F16", [1, 1], b"\x00\x3c")], {"format": "pt"})
safetensors(f"{root}/safetensors/lora", [  # a LoRA of the tiny transformer's proj_out
    ("transformer.proj_out.lora_A.weight", "BF16", [1, 256], b"\x00\x3c" * 256),
    ("transformer.proj_out.lora_B.weight", "BF16", [128, 1], b"\x00\x3c" * 128),
    ("diffusion_model.double_blocks.0.img_attn.qkv.alpha", "F32", [], struct.pack("<f", 1.0))])
safetensors(f"{root}/safetensors/lora-zimage", [  # the tiny Z-Image's fused qkv, kohya names
    ("diffusion_model.layers.0.attention.qkv.lora_A.weight", "BF16", [1, 256], b"\x00\x3c" * 256),
    ("diffusion_model.layers.0.attention.qkv.lora_B.weight", "BF16", [768, 1], b"\x00\x3c" * 768),
    ("lora_unet_layers_1_feed_forward_w2.lora_down.weight", "F32", [1, 682], b"\0" * 4 * 682),
    ("lora_unet_layers_1_feed_forward_w2.lora_up.weight", "F32", [256, 1], b"\0" * 4 * 256),
    ("lora_unet_layers_1_feed_forward_w2.alpha", "F32", [], struct.pack("<f", 1.0))])

def npy(path, descr, shape, raw):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + raw)

npy(f"{root}/npy/f32", "<f4", [1, 2, 2], struct.pack("<4f", 0.5, -1, 2, 3))
npy(f"{root}/npy/i64", "<i8", [3], struct.pack("<3q", 1, 2, 3))

vocab = {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "abc": 5, "\u0120a": 6}
merges = "#version: 0.2\na b\nab c\n\u0120 a\n"
config = {"added_tokens_decoder": {"7": {"content": "<|im_start|>", "special": True}}}
open(f"{root}/tokenizer/files", "wb").write(
    json.dumps(vocab).encode() + b"\x01" + merges.encode() + b"\x01" + json.dumps(config).encode())
tokenizer_json = {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b", ["ab", "c"]]},
                  "added_tokens": [{"id": 7, "content": "<|im_start|>", "special": True}]}
open(f"{root}/tokenizer/json", "wb").write(b"\x01\x01\x01" + json.dumps(tokenizer_json).encode())
# The Tekken form (FLUX.2-dev's): no normaliser, the file's own Split pattern (translated from
# Oniguruma to PCRE2) before byte-level, ignore_merges, a control token; all 256 byte tokens,
# so that the file loads and the fuzzer starts from the pattern's code.
printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
byte_token = {b: chr(b) for b in printable}
byte_token.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in byte_token)})
tekken_vocab = {byte_token[b]: b + 1 for b in range(256)}
tekken_vocab.update({"ab": 257, "abc": 258, byte_token[32] + "a": 259})
tekken_json = {
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": tekken_vocab,
              "merges": ["a b", ["ab", "c"], byte_token[32] + " a"], "ignore_merges": True},
    "added_tokens": [{"id": 0, "content": "[INST]", "special": True}]}
open(f"{root}/tokenizer/tekken", "wb").write(b"\x01\x01\x01" + json.dumps(tekken_json).encode())

transformer = {"_class_name": "Flux2Transformer2DModel", "attention_head_dim": 128,
               "axes_dims_rope": [32, 32, 32, 32], "eps": 1e-06, "guidance_embeds": False,
               "in_channels": 128, "joint_attention_dim": 192, "mlp_ratio": 3.0,
               "num_attention_heads": 2, "num_layers": 2, "num_single_layers": 2,
               "out_channels": None, "patch_size": 1, "rope_theta": 2000,
               "timestep_guidance_channels": 256}
policy = "transformer.*.norm_* f32\nre:^vae\\..* bf16\n@1d >=bf16\n# comment\n"
open(f"{root}/config/transformer", "wb").write(json.dumps(transformer).encode() + b"\x01" + policy.encode())
open(f"{root}/server/openai", "w").write(json.dumps(
    {"prompt": "a fox <lora:style:0.5>", "size": "512x512", "n": 2, "seed": 7, "steps": 4,
     "guidance": 1.0, "response_format": "b64_json", "negative_prompt": ""}))
open(f"{root}/server/img2img", "w").write(json.dumps(
    {"prompt": "x", "width": 64, "height": 64, "batch_size": 1, "n_iter": 2, "seed": -1,
     "cfg_scale": 4, "denoising_strength": 0.6, "init_images": ["data:image/png;base64,iVBORw0KGgo="],
     "mask": "iVBORw0KGgo="}))
scheduler = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
             "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15}
# GGUF: metadata of several value types (a string array, a nested array) and tensors of
# F32, Q8_0 and Q4_K, data aligned to 32.
def gguf(path, kvs, tensors, align=32):
    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, raw in kvs:
        head += string(key) + struct.pack("<I", vtype) + raw
    body = b""
    for name, dims, ttype, raw in tensors:
        body += b"\0" * (-len(body) % align)
        head += string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        head += struct.pack("<IQ", ttype, len(body))
        body += raw
    head += b"\0" * (-len(head) % align)
    open(path, "wb").write(head + body)

def s_(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

gguf(f"{root}/gguf/plain", [
    ("general.architecture", 8, s_("qwen3")),
    ("general.alignment", 4, struct.pack("<I", 32)),
    ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + s_("a") + s_("b")),
    ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 2) + struct.pack("<2i", 1, 3)),
    ("nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 6, 1) + struct.pack("<f", 0.5)),
    ("tokenizer.ggml.model", 8, s_("gpt2")),
    ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + s_("a b")),
    ("flag", 7, b"\1"), ("f64", 12, struct.pack("<d", 2.5))], [
    ("a.weight", [4, 2], 0, struct.pack("<8f", *range(8))),
    ("q8", [32, 1], 8, b"\x00\x3c" + bytes(range(32))),
    ("q4k", [256], 12, b"\x00\x3c\x00\x38" + bytes(range(140))),
    ("blk.0.attn_q.weight", [32, 2], 1, b"\x00\x3c" * 64)])
# Byte-level BPE's 256 byte tokens (GPT-2's printable stand-ins for the bytes).
printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
stand_in = dict(zip(printable, printable))
stand_in.update({b: 256 + i for i, b in enumerate(b for b in range(256) if b not in stand_in)})
byte_tokens = [chr(stand_in[b]) for b in range(256)]
# A Mistral text encoder as llama.cpp writes it: the llama architecture's head counts, head
# width, RoPE base and epsilon, a Tekken pre-tokenizer, interleaved q/k rows.
gguf(f"{root}/gguf/llama", [
    ("general.architecture", 8, s_("llama")),
    ("llama.attention.head_count", 4, struct.pack("<I", 2)),
    ("llama.attention.head_count_kv", 4, struct.pack("<I", 1)),
    ("llama.attention.key_length", 4, struct.pack("<I", 4)),
    ("llama.rope.freq_base", 6, struct.pack("<f", 1e9)),
    ("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
    ("tokenizer.ggml.model", 8, s_("gpt2")),
    ("tokenizer.ggml.pre", 8, s_("tekken")),
    ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 257) + b"".join(map(s_, byte_tokens + ["ab"]))),
    ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + s_("a b"))], [
    ("blk.0.attn_q.weight", [8, 8], 0, struct.pack("<64f", *range(64))),
    ("blk.0.attn_k.weight", [8, 4], 0, struct.pack("<32f", *range(32)))])
open(f"{root}/config/scheduler", "wb").write(json.dumps(scheduler).encode() + b"\x01" + b"*.weight q8\n")
zimage = {"all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16, "dim": 256,
          "n_layers": 2, "n_refiner_layers": 2, "n_heads": 2, "n_kv_heads": 2, "norm_eps": 1e-5,
          "qk_norm": True, "rope_theta": 256.0, "t_scale": 1000.0, "axes_dims": [32, 48, 48],
          "axes_lens": [1536, 512, 512], "cap_feat_dim": 32, "siglip_feat_dim": None,
          "num_hidden_layers": 6, "scaling_factor": 0.3611, "shift_factor": 0.1159}
open(f"{root}/config/zimage", "wb").write(json.dumps(zimage).encode() + b"\x01" + b"*.weight q4\n")
# The Hub: a file-list page (LFS and plain files, a folder, a precision variant), its Link
# header and model_index.json, separated by \x01.
listing = [{"type": "file", "path": "model_index.json", "size": 40, "oid": "a" * 40},
           {"type": "directory", "path": "vae", "oid": "b" * 40},
           {"type": "file", "path": "vae/config.json", "size": 9, "oid": "c" * 40},
           {"type": "file", "path": "vae/diffusion_pytorch_model.safetensors", "size": 99,
            "oid": "d" * 40, "lfs": {"oid": "e" * 64, "size": 99, "pointerSize": 134}},
           {"type": "file", "path": "vae/diffusion_pytorch_model.fp16.safetensors", "size": 50,
            "oid": "f" * 40}]
index = {"_class_name": "Flux2KleinPipeline", "vae": ["diffusers", "AutoencoderKLFlux2"],
         "scheduler": [None, None]}
open(f"{root}/hub/page", "wb").write(json.dumps(listing).encode() + b"\x01" +
    b'<https://hub/api/models/a/b/tree/main?cursor=x>; rel="next"' + b"\x01" +
    json.dumps(index).encode())
PY

# The targets run side by side, one per core (FUZZ_JOBS, default: every core): each is a
# single process, so two at a time on two cores give every target its full seconds and the
# stage half the wall time. Each writes its own log and exit status; the summary below is in
# target order whatever the order they finished in.
fuzz_one() {
  local t=$1 corpus="$build/fuzz-corpus-$1" rc=0
  mkdir -p "$corpus"
  mkdir -p "$build/fuzz-tmp"
  TMPDIR="$(cd "$build/fuzz-tmp" && pwd)" "$build/fuzz_$t" "$corpus" "$seeds/$t" -max_total_time="$seconds" -max_len=8192 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/fuzz_$t-" \
    >"$build/fuzz_$t.log" 2>&1 || rc=$?
  echo "$rc" >"$build/fuzz_$t.rc"
}
jobs_max="${FUZZ_JOBS:-$(nproc)}"
for t in "${targets[@]}"; do
  rm -f "$build/fuzz_$t.rc"
  while (($(jobs -pr | wc -l) >= jobs_max)); do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=0
for t in "${targets[@]}"; do
  echo "== fuzz_$t: ${seconds}s"
  rc=$(cat "$build/fuzz_$t.rc" 2>/dev/null || echo missing)
  if [[ "$rc" != 0 ]]; then
    tail -n 60 "$build/fuzz_$t.log"
    echo "fuzz_$t failed (exit status $rc; log: $build/fuzz_$t.log)"
    failed=1
    continue
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$build/fuzz_$t.log" || true
done
exit "$failed"
