#!/usr/bin/env python3
"""LoRA fixtures for the tiny klein model, and the reference merge they are checked against.

  lora_fixture.py make TRANSFORMER.safetensors OUTDIR
      Writes three LoRA files for the tiny transformer, one per key spelling in use:
        peft.safetensors   diffusers/PEFT names (transformer.<module>.lora_A/lora_B.weight), BF16
        bfl.safetensors    BFL/ai-toolkit names (diffusion_model.double_blocks.N.img_attn.qkv...),
                           with one .alpha, F32
        kohya.safetensors  kohya names (lora_unet_double_blocks_N_..., lora_down/lora_up, .alpha)
      Values are drawn from Python's random with fixed seeds, so the files are reproducible.

  lora_fixture.py synth TRANSFORMER_CONFIG.json OUT.safetensors RANK
      A LoRA for benchmarks: every linear weight of every block of the transformer that
      config.json describes (diffusers/PEFT names, BF16, random values of magnitude ~0.01).
      Sizes and timings are real; what it does to an image is not meaningful.

  lora_fixture.py make-zimage TRANSFORMER.safetensors OUTDIR
      The same for the tiny Z-Image transformer: zimage-peft (diffusers/PEFT names, BF16),
      zimage-comfy (the original names ComfyUI and musubi-tuner write: fused attention.qkv,
      attention.out, x_embedder; one .alpha) and zimage-kohya (lora_unet_layers_0_..., alphas).

  lora_fixture.py merge-zimage BASE.safetensors OUT.safetensors LORA[:SCALE] ...
      As merge below, for the files of make-zimage only: each is replaced by what diffusers'
      Z-Image LoRA loader converts it to (ZImageLoraLoaderMixin.lora_state_dict, alphas folded;
      a module it leaves in the original checkpoint's names, such as a fused qkv, mapped by
      diffusers' single-file conversion: A shared, B in thirds), committed in
      tests/data/zimage-lora by zimage_lora_reference.py and found by the file's sha256.

  lora_fixture.py merge BASE.safetensors OUT.safetensors LORA[:SCALE] ...
      The reference: every LoRA merged into the base transformer's float32 weights,
      W' = W + scale * alpha/r * B @ A, accumulated in float64 and rounded once to float32 (the
      changed tensors are stored as F32, the others as they were).
      The key mapping follows diffusers' FLUX.2 LoRA conversion (loaders/lora_conversion_utils.py:
      _convert_non_diffusers_flux2_lora_to_diffusers, _convert_kohya_flux2_lora_to_diffusers):
      a fused BFL qkv's A is shared by to_q/to_k/to_v and its B splits in thirds. The BFL final
      layer's modulation stores shift|scale where diffusers' norm_out.linear stores scale|shift,
      so B's halves swap there, as they do for the weight itself.

Pure Python (no torch/numpy on the machines that run it): the safetensors reader/writer below
handles F32, F16 and BF16 little-endian tensors.
"""
import json
import os
import random
import struct
import sys
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import flux2_names  # noqa: E402
from safetensors_raw import read_raw, write_raw  # noqa: E402

# --- safetensors -----------------------------------------------------------------------------


def _bf16_to_float(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def _float_to_bf16(x):
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even (finite values)


def read_safetensors(path):
    """name -> (dtype, shape, list of floats)."""
    out = {}
    for name, (dtype, shape, raw) in read_raw(path).items():
        if dtype == "F32":
            values = array("f", raw).tolist()
        elif dtype == "BF16":
            values = [_bf16_to_float(h) for h in array("H", raw)]
        elif dtype == "F16":
            values = [struct.unpack("<e", raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        else:
            raise SystemExit(f"{path}: {name}: dtype {dtype} not handled")
        out[name] = (dtype, shape, values)
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype "F32" or "BF16", shape, list of floats), in insertion order."""
    raw = {}
    for name, (dtype, shape, values) in tensors.items():
        if dtype == "F32":
            blob = array("f", values).tobytes()
        elif dtype == "BF16":
            blob = array("H", [_float_to_bf16(v) for v in values]).tobytes()
        else:
            raise SystemExit(f"cannot write {dtype}")
        raw[name] = (dtype, shape, blob)
    write_raw(path, raw)


# --- making the LoRA files -------------------------------------------------------------------


def _random_pair(rng, rows, cols, rank):
    """A [rank, cols] and B [rows, rank] with an update B @ A of a visible but moderate size."""
    a = [rng.uniform(-1.0, 1.0) / cols ** 0.5 for _ in range(rank * cols)]
    b = [rng.uniform(-1.0, 1.0) * 0.6 for _ in range(rows * rank)]
    return a, b


def _lora_tensors(rng, modules, rank, dtype, key, down="lora_A", up="lora_B", alpha=None):
    """The A and B of every module {module: (rows, cols)}, drawn in order, under key(module)
    + ".lora_A.weight" / ".lora_B.weight" (or the given part names), with alpha(i) after the
    i-th module's pair when given."""
    out = {}
    for i, (module, (rows, cols)) in enumerate(modules.items()):
        a, b = _random_pair(rng, rows, cols, rank)
        out[f"{key(module)}.{down}.weight"] = (dtype, [rank, cols], a)
        out[f"{key(module)}.{up}.weight"] = (dtype, [rows, rank], b)
        if alpha:
            out[f"{key(module)}.alpha"] = ("F32", [], [alpha(i)])
    return out


def make(transformer_path, outdir):
    base = read_safetensors(transformer_path)

    def shape(name):
        return base["transformer." + name if "transformer." + name in base else name][1]

    rank = 4
    # diffusers / PEFT spelling, stored as BF16.
    peft = {m: tuple(shape(m + ".weight")) for m in [
        "transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.to_add_out",
        "transformer_blocks.0.ff.linear_in", "transformer_blocks.1.ff_context.linear_out",
        "single_transformer_blocks.0.attn.to_qkv_mlp_proj",
        "single_transformer_blocks.1.attn.to_out", "norm_out.linear", "proj_out",
        "context_embedder"]}
    write_safetensors(f"{outdir}/peft.safetensors", _lora_tensors(
        random.Random(1), peft, rank, "BF16", lambda m: "transformer." + m))

    # BFL / ai-toolkit spelling: fused qkv, linear1/linear2, the final layer's modulation.
    rng = random.Random(2)
    d = shape("transformer_blocks.0.attn.to_q.weight")[0]
    f_in = shape("transformer_blocks.0.ff.linear_in.weight")
    bfl_modules = {
        "double_blocks.1.img_attn.qkv": (3 * d, d),
        "double_blocks.0.txt_attn.qkv": (3 * d, d),
        "double_blocks.0.img_mlp.2": tuple(shape("transformer_blocks.0.ff.linear_out.weight")),
        "double_blocks.1.txt_attn.proj": (d, d),
        "single_blocks.1.linear1": tuple(shape("single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight")),
        "single_blocks.0.linear2": tuple(shape("single_transformer_blocks.0.attn.to_out.weight")),
        "final_layer.adaLN_modulation.1": tuple(shape("norm_out.linear.weight")),
        "img_in": tuple(shape("x_embedder.weight")),
    }
    del f_in
    bfl = _lora_tensors(rng, bfl_modules, rank, "F32", lambda m: "diffusion_model." + m)
    bfl["diffusion_model.double_blocks.1.img_attn.qkv.alpha"] = ("F32", [], [2.0])
    write_safetensors(f"{outdir}/bfl.safetensors", bfl)

    # kohya spelling: lora_down / lora_up and an alpha per module.
    rng = random.Random(3)
    kohya_modules = {
        "lora_unet_double_blocks_1_txt_attn_qkv": (3 * d, d),
        "lora_unet_double_blocks_0_img_attn_proj": (d, d),
        "lora_unet_double_blocks_1_img_mlp_0": tuple(shape("transformer_blocks.1.ff.linear_in.weight")),
        "lora_unet_single_blocks_0_linear1": tuple(shape("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight")),
        "lora_unet_single_blocks_1_linear2": tuple(shape("single_transformer_blocks.1.attn.to_out.weight")),
        "lora_unet_time_in_in_layer": tuple(shape("time_guidance_embed.timestep_embedder.linear_1.weight")),
    }
    write_safetensors(f"{outdir}/kohya.safetensors", _lora_tensors(
        rng, kohya_modules, rank, "F32", lambda m: m, "lora_down", "lora_up",
        lambda i: float(2 + i % 3)))


def synth(config_path, out_path, rank):
    import os
    with open(config_path) as f:
        c = json.load(f)
    d = c["num_attention_heads"] * c["attention_head_dim"]
    f_hidden = int(d * c["mlp_ratio"])
    shapes = {}
    for i in range(c["num_layers"]):
        p = f"transformer.transformer_blocks.{i}."
        for name in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
                     "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"):
            shapes[p + name] = (d, d)
        for ff in ("ff", "ff_context"):
            shapes[f"{p}{ff}.linear_in"] = (2 * f_hidden, d)
            shapes[f"{p}{ff}.linear_out"] = (d, f_hidden)
    for i in range(c["num_single_layers"]):
        p = f"transformer.single_transformer_blocks.{i}.attn."
        shapes[p + "to_qkv_mlp_proj"] = (3 * d + 2 * f_hidden, d)
        shapes[p + "to_out"] = (d, d + f_hidden)
    header, offset, parts = {}, 0, []
    for module, (rows, cols) in shapes.items():
        for suffix, shape in ((".lora_A.weight", [rank, cols]), (".lora_B.weight", [rows, rank])):
            n = shape[0] * shape[1]
            header[module + suffix] = {"dtype": "BF16", "shape": shape,
                                       "data_offsets": [offset, offset + 2 * n]}
            parts.append(n)
            offset += 2 * n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(out_path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for n in parts:
            # BF16 values with random mantissas and signs at exponent 2^-7 (about 0.008-0.016).
            raw = bytearray(os.urandom(2 * n))
            raw[1::2] = bytes(b & 0x80 | 0x3C for b in raw[1::2])
            f.write(raw)


# --- the reference merge ---------------------------------------------------------------------

_BFL_DOUBLE = {bfl: diffusers for diffusers, bfl in flux2_names.DOUBLE.items()}
_BFL_SHARED = {bfl: diffusers for diffusers, bfl in flux2_names.SHARED.items()}
_KOHYA_TAILS = {
    "img_attn_qkv": "img_attn.qkv", "txt_attn_qkv": "txt_attn.qkv",
    "img_attn_proj": "img_attn.proj", "txt_attn_proj": "txt_attn.proj",
    "img_mlp_0": "img_mlp.0", "img_mlp_2": "img_mlp.2", "txt_mlp_0": "txt_mlp.0",
    "txt_mlp_2": "txt_mlp.2", "linear1": "linear1", "linear2": "linear2",
}
_KOHYA_SHARED = {
    "img_in": "img_in", "txt_in": "txt_in", "time_in_in_layer": "time_in.in_layer",
    "time_in_out_layer": "time_in.out_layer", "final_layer_linear": "final_layer.linear",
}


def _bfl_module(module):
    """A module name without prefix in BFL spelling, from kohya's when it is one."""
    if module.startswith("lora_unet_"):
        rest = module[len("lora_unet_"):]
        for kind in ("double_blocks_", "single_blocks_"):
            if rest.startswith(kind):
                index, tail = rest[len(kind):].split("_", 1)
                return f"{kind[:-1]}.{index}.{_KOHYA_TAILS[tail]}"
        return _KOHYA_SHARED[rest]
    for prefix in ("diffusion_model.", "transformer."):
        if module.startswith(prefix):
            return module[len(prefix):]
    return module


def _targets(module, rows):
    """(diffusers weight name, row range of B, swap halves) for a module."""
    parts = module.split(".")
    if parts[0] == "double_blocks":
        i, tail = parts[1], ".".join(parts[2:])
        if tail in ("img_attn.qkv", "txt_attn.qkv"):
            names = (["to_q", "to_k", "to_v"] if tail.startswith("img")
                     else ["add_q_proj", "add_k_proj", "add_v_proj"])
            d = rows // 3
            return [(f"transformer_blocks.{i}.attn.{n}.weight", (k * d, (k + 1) * d), False)
                    for k, n in enumerate(names)]
        return [(f"transformer_blocks.{i}.{_BFL_DOUBLE[tail]}.weight", (0, rows), False)]
    if parts[0] == "single_blocks":
        i, tail = parts[1], parts[2]
        name = {"linear1": "attn.to_qkv_mlp_proj", "linear2": "attn.to_out"}[tail]
        return [(f"single_transformer_blocks.{i}.{name}.weight", (0, rows), False)]
    if module in _BFL_SHARED:
        return [(_BFL_SHARED[module] + ".weight", (0, rows), module.startswith("final_layer.adaLN"))]
    return [(module + ".weight", (0, rows), False)]  # already diffusers


def merge(base_path, out_path, lora_args, targets_of=None):
    targets_of = targets_of or (lambda module, rows: _targets(_bfl_module(module), rows))
    base = read_safetensors(base_path)
    merged = {name: [dtype, shape, list(values)] for name, (dtype, shape, values) in base.items()}
    accum = {}  # name -> float64 deltas
    for arg in lora_args:
        path, scale = arg, 1.0
        if ":" in arg:
            path, s = arg.rsplit(":", 1)
            scale = float(s)
        lora = read_safetensors(path)
        modules = {}
        for key, (_, shape, values) in lora.items():
            for suffix, part in ((".lora_A.weight", "A"), (".lora_B.weight", "B"),
                                 (".lora_down.weight", "A"), (".lora_up.weight", "B"),
                                 (".alpha", "alpha")):
                if key.endswith(suffix):
                    modules.setdefault(key[:-len(suffix)], {})[part] = (shape, values)
                    break
            else:
                raise SystemExit(f"{path}: {key}: not a LoRA tensor")
        for module, p in modules.items():
            (r, cols), a = p["A"]
            (rows, _), b = p["B"]
            s = scale * (p["alpha"][1][0] / r if "alpha" in p else 1.0)
            for name, (r0, r1), swap in targets_of(module, rows):
                key = name if name in merged else "transformer." + name
                n = r1 - r0
                delta = accum.setdefault(key, [0.0] * (len(merged[key][2])))
                for i in range(n):
                    src = r0 + ((i + n // 2) % n if swap else i)
                    brow = b[src * r:(src + 1) * r]
                    out = i * cols
                    for j in range(r):
                        coef = s * brow[j]
                        if coef == 0.0:
                            continue
                        arow = a[j * cols:(j + 1) * cols]
                        for k in range(cols):
                            delta[out + k] += coef * arow[k]
    for key, delta in accum.items():
        _, shape, values = merged[key]
        # Base values are exact in float64 whatever their storage; the sum is stored as F32.
        merged[key][0] = "F32"
        merged[key][2] = [float(w) + d for w, d in zip(values, delta)]
    write_safetensors(out_path, {k: (v[0], v[1], v[2]) for k, v in merged.items()})


# --- Z-Image ---------------------------------------------------------------------------------


def make_zimage(transformer_path, outdir):
    """Three LoRA files for the tiny Z-Image transformer (diffusers names, no prefix)."""
    base = read_safetensors(transformer_path)

    def shape(name):
        return tuple(base[name][1])

    rank = 4
    d = shape("layers.0.attention.to_q.weight")[0]
    # diffusers / PEFT spelling, BF16.
    peft = {m: shape(m + ".weight") for m in [
        "layers.0.attention.to_q", "layers.1.attention.to_out.0", "layers.0.feed_forward.w1",
        "layers.1.feed_forward.w2", "noise_refiner.0.attention.to_v",
        "context_refiner.1.feed_forward.w3", "layers.0.adaLN_modulation.0",
        "all_final_layer.2-1.linear"]}
    write_safetensors(f"{outdir}/zimage-peft.safetensors", _lora_tensors(
        random.Random(11), peft, rank, "BF16", lambda m: "transformer." + m))

    # The original names (ComfyUI, musubi-tuner): fused qkv, attention.out, an alpha.
    rng = random.Random(12)
    original = {
        "layers.1.attention.qkv": (3 * d, d),
        "noise_refiner.1.attention.qkv": (3 * d, d),
        "layers.0.attention.out": (d, d),
        "context_refiner.0.feed_forward.w2": shape("context_refiner.0.feed_forward.w2.weight"),
        "x_embedder": shape("all_x_embedder.2-1.weight"),
    }
    comfy = _lora_tensors(rng, original, rank, "F32", lambda m: "diffusion_model." + m)
    comfy["diffusion_model.layers.1.attention.qkv.alpha"] = ("F32", [], [2.0])
    write_safetensors(f"{outdir}/zimage-comfy.safetensors", comfy)

    # kohya spelling: underscores, lora_down / lora_up, an alpha per module.
    rng = random.Random(13)
    kohya_modules = {
        "lora_unet_layers_0_attention_to_k": "layers.0.attention.to_k",
        "lora_unet_noise_refiner_1_feed_forward_w1": "noise_refiner.1.feed_forward.w1",
        "lora_unet_context_refiner_0_attention_to_out_0": "context_refiner.0.attention.to_out.0",
        "lora_unet_layers_1_adaLN_modulation_0": "layers.1.adaLN_modulation.0",
        "lora_unet_t_embedder_mlp_2": "t_embedder.mlp.2",
        "lora_unet_cap_embedder_1": "cap_embedder.1",
        "lora_unet_all_final_layer_2-1_adaLN_modulation_1": "all_final_layer.2-1.adaLN_modulation.1",
    }
    kohya = {m: shape(w + ".weight") for m, w in kohya_modules.items()}
    write_safetensors(f"{outdir}/zimage-kohya.safetensors", _lora_tensors(
        rng, kohya, rank, "F32", lambda m: m, "lora_down", "lora_up", lambda i: float(2 + i % 3)))


# The Z-Image LoRA fixtures as diffusers' Z-Image LoRA loader converts them, written once by
# zimage_lora_reference.py with the pinned diffusers tree (tests/data/zimage-lora).
ZIMAGE_REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "data", "zimage-lora")


def _zimage_converted(arg):
    """LORA[:SCALE] -> the converted file of that LoRA (found by its sha256)[:SCALE]."""
    import hashlib
    path, scale = arg, None
    if ":" in arg:
        path, scale = arg.rsplit(":", 1)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(ZIMAGE_REFERENCE, "manifest.json")) as f:
        files = json.load(f)["files"]
    for entry in files:
        if entry["sha256"] == digest:
            converted = os.path.join(ZIMAGE_REFERENCE, entry["converted"])
            return converted if scale is None else f"{converted}:{scale}"
    raise SystemExit(f"{path}: not one of the LoRA files of {ZIMAGE_REFERENCE}/manifest.json "
                     "(make-zimage changed? run tools/lora/zimage_lora_reference.py)")


def merge_zimage(base_path, out_path, lora_args):
    """merge() of the diffusers conversions of the given fixtures: every module is a weight of
    the diffusers transformer and every alpha is already folded into A and B."""
    def targets_of(module, rows):
        return [(module[len("transformer."):] + ".weight", (0, rows), False)]
    merge(base_path, out_path, [_zimage_converted(a) for a in lora_args], targets_of)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "synth":
        synth(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "merge":
        merge(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 4 and sys.argv[1] == "make-zimage":
        make_zimage(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 5 and sys.argv[1] == "merge-zimage":
        merge_zimage(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        raise SystemExit(__doc__)
