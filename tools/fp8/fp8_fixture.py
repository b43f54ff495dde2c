#!/usr/bin/env python3
"""FP8 fixtures for the tiny klein model, and the reference values they are checked against.

  fp8_fixture.py codes OUT.json
      The value of each of the 256 codes of both 8-bit float formats, as the bits of the
      float32 that holds it exactly ("F8_E4M3": [...], "F8_E5M2": [...]):
        E4M3FN (OCP 8-bit floating point specification, "E4M3"): sign, 4 exponent bits with
          bias 7, 3 mantissa bits; exponent 0 is subnormal (m/8 x 2^-6); no infinities, and
          S.1111.111 is NaN, so 1111.110 x 2^8 = 448 is the largest value.
        E5M2: the upper byte of an IEEE 754 binary16, decoded here by numpy's float16.

  fp8_fixture.py make TRANSFORMER.safetensors OUTDIR
      From the tiny model's diffusers transformer (BF16), the same weights under the BFL names
      with ComfyUI's "model.diffusion_model." prefix, every matrix stored as fp8:
        comfy-scaled.safetensors   E4M3FN, ComfyUI "scaled fp8": a "scaled_fp8" marker, one
                                   F32 "<layer>.scale_weight" per matrix (absmax / 448), a
                                   few "<layer>.scale_input"
        weight-scale.safetensors   E4M3FN, "<layer>.weight_scale" (one per tensor, or one per
                                   row shaped [rows, 1] on the fused QKV of double block 0, on
                                   single block 1's linear1 and on the final layer's
                                   modulation), "<layer>.input_scale", ComfyUI's
                                   "<layer>.comfy_quant" records on double block 1
        e5m2.safetensors           E5M2, no scales
      and for each, reference-<name>.safetensors: the same names without the companions, every
      fp8 matrix as F32 holding code value x scale (a float32 product, rounded once), the other
      tensors as they were. Values are rounded to the nearest code (ties to the even code),
      saturating at the largest finite value.

Needs numpy (Debian: python3-numpy).
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from flux2_names import DOUBLE as _DOUBLE, DOUBLE_NORMS as _DOUBLE_NORMS  # noqa: E402
from flux2_names import SHARED as _SHARED, SINGLE as _SINGLE, SINGLE_NORMS as _SINGLE_NORMS  # noqa: E402
from safetensors_raw import read_raw, write_raw  # noqa: E402

# --- the two formats ---------------------------------------------------------------------


def e4m3fn_values():
    """float64 values of the 256 E4M3FN codes (NaN for the two NaN codes)."""
    out = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp, mant = (code >> 3) & 0xF, code & 0x7
        if exp == 0xF and mant == 0x7:
            out[code] = np.nan
        elif exp == 0:
            out[code] = sign * (mant / 8.0) * 2.0 ** -6
        else:
            out[code] = sign * (1.0 + mant / 8.0) * 2.0 ** (exp - 7)
    return out


def e5m2_values():
    """float64 values of the 256 E5M2 codes: numpy's binary16 of the code as the upper byte."""
    halves = (np.arange(256, dtype=np.uint16) << 8).view(np.float16)
    return halves.astype(np.float64)


def _checked(values, name):
    """Spot checks against the published definitions, so that a slip in a formula shows."""
    if name == "E4M3FN":
        assert values[0x7E] == 448.0 and values[0x01] == 2.0 ** -9 and values[0x08] == 2.0 ** -6
        assert values[0x38] == 1.0 and np.isnan(values[0x7F]) and np.isnan(values[0xFF])
        assert values[0x80] == 0.0 and np.signbit(values[0x80])
    else:
        assert values[0x7B] == 57344.0 and values[0x01] == 2.0 ** -16 and values[0x3C] == 1.0
        assert np.isinf(values[0x7C]) and np.isnan(values[0x7D]) and values[0xFC] == -np.inf
    return values


E4M3 = _checked(e4m3fn_values(), "E4M3FN")
E5M2 = _checked(e5m2_values(), "E5M2")
LARGEST = {"F8_E4M3": 448.0, "F8_E5M2": 57344.0}


def f32_bits(values):
    with np.errstate(invalid="ignore"):  # NaN stays NaN
        return ["0x%08x" % b for b in values.astype(np.float32).view(np.uint32)]


def codes(out_path):
    with open(out_path, "w") as f:
        json.dump({"F8_E4M3": f32_bits(E4M3), "F8_E5M2": f32_bits(E5M2)}, f, indent=0)
        f.write("\n")


def encode(x, fmt):
    """Nearest code of each value of x (float64 array), ties to the even code, saturating."""
    table = E4M3 if fmt == "F8_E4M3" else E5M2
    positive = np.array([c for c in range(128) if np.isfinite(table[c])])  # ascending values
    values = table[positive]
    a = np.minimum(np.abs(x), LARGEST[fmt]).ravel()
    hi = np.clip(np.searchsorted(values, a), 1, len(values) - 1)
    lo = hi - 1
    d_lo, d_hi = a - values[lo], values[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (positive[hi] % 2 == 0))
    code = np.where(pick_hi, positive[hi], positive[lo]).astype(np.uint8)
    code |= np.where(np.signbit(x.ravel()) & (code != 0), 0x80, 0).astype(np.uint8)
    return code.reshape(x.shape)


# --- safetensors -------------------------------------------------------------------------


def read_safetensors(path):
    """name -> (dtype, float32 array) for BF16/F32 tensors, in file order."""
    out = {}
    for name, (dtype, shape, raw) in read_raw(path).items():
        if dtype == "BF16":
            v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F32":
            v = np.frombuffer(raw, np.float32)
        else:
            raise SystemExit(f"{path}: {name}: dtype {dtype} not handled")
        out[name] = (dtype, v.reshape(shape))
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes), in order."""
    write_raw(path, tensors)


def bf16_bytes(v):
    """float32 values that are bf16 values (the source's) back to their BF16 bytes."""
    bits = np.ascontiguousarray(v, np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)
    return (bits >> 16).astype(np.uint16).tobytes()


# --- diffusers -> BFL names ----------------------------------------------------------------


def to_bfl(src):
    """The diffusers transformer (name -> float32 array) under BFL names, in a fixed order."""
    out = {}
    for name, (_, v) in src.items():
        module = name[:-len(".weight")]
        parts = module.split(".")
        if parts[0] == "transformer_blocks":
            i, tail = parts[1], ".".join(parts[2:])
            if tail in ("attn.to_q", "attn.add_q_proj"):
                img = tail == "attn.to_q"
                qkv = [f"transformer_blocks.{i}.attn.{n}.weight" for n in
                       (["to_q", "to_k", "to_v"] if img else ["add_q_proj", "add_k_proj", "add_v_proj"])]
                out[f"double_blocks.{i}.{'img' if img else 'txt'}_attn.qkv.weight"] = \
                    np.concatenate([src[n][1] for n in qkv])
            elif tail in _DOUBLE:
                out[f"double_blocks.{i}.{_DOUBLE[tail]}.weight"] = v
            elif tail in _DOUBLE_NORMS:
                out[f"double_blocks.{i}.{_DOUBLE_NORMS[tail]}.scale"] = v
        elif parts[0] == "single_transformer_blocks":
            i, tail = parts[1], ".".join(parts[2:])
            if tail in _SINGLE:
                out[f"single_blocks.{i}.{_SINGLE[tail]}.weight"] = v
            else:
                out[f"single_blocks.{i}.{_SINGLE_NORMS[tail]}.scale"] = v
        elif module == "norm_out.linear":
            half = v.shape[0] // 2  # diffusers scale|shift, BFL shift|scale
            out["final_layer.adaLN_modulation.1.weight"] = np.concatenate([v[half:], v[:half]])
        else:
            out[_SHARED[module] + ".weight"] = v
    return dict(sorted(out.items()))


# --- the fixtures --------------------------------------------------------------------------

PREFIX = "model.diffusion_model."
PER_ROW = ("double_blocks.0.img_attn.qkv", "single_blocks.1.linear1", "final_layer.adaLN_modulation.1")


def quantize(w, fmt, per_row):
    """(codes, float32 scale array of shape [] or [rows, 1], float32 reference values)."""
    w64 = w.astype(np.float64)
    if fmt == "F8_E5M2":
        scale = None
    elif per_row:
        scale = (np.abs(w64).max(axis=1, keepdims=True) / LARGEST[fmt]).astype(np.float32)
    else:
        scale = np.float32(np.abs(w64).max() / LARGEST[fmt])
    scaled = w64 if scale is None else w64 / scale.astype(np.float64)
    code = encode(scaled, fmt)
    with np.errstate(invalid="ignore"):  # the NaN codes, never chosen
        table = (E4M3 if fmt == "F8_E4M3" else E5M2).astype(np.float32)
    ref = table[code]
    if scale is not None:
        ref = ref * scale  # float32 x float32, rounded once
    assert np.all(np.isfinite(ref))
    return code, scale, ref.astype(np.float32)


def make(transformer_path, outdir):
    bfl = to_bfl(read_safetensors(transformer_path))
    for name, fmt in (("comfy-scaled", "F8_E4M3"), ("weight-scale", "F8_E4M3"), ("e5m2", "F8_E5M2")):
        fp8, ref = {}, {}
        if name == "comfy-scaled":
            fp8[PREFIX + "scaled_fp8"] = ("F8_E4M3", [0], b"")
        for key, w in bfl.items():
            layer = key[:-len(".weight")]
            if w.ndim != 2:
                fp8[PREFIX + key] = ("BF16", w.shape, bf16_bytes(w))
                ref[PREFIX + key] = fp8[PREFIX + key]
                continue
            per_row = name == "weight-scale" and layer in PER_ROW
            code, scale, values = quantize(w, fmt, per_row)
            fp8[PREFIX + key] = (fmt, w.shape, code.tobytes())
            ref[PREFIX + key] = ("F32", w.shape, values.tobytes())
            if name == "comfy-scaled":
                fp8[PREFIX + layer + ".scale_weight"] = ("F32", [], scale.tobytes())
                if layer.startswith("double_blocks.0."):
                    fp8[PREFIX + layer + ".scale_input"] = ("F32", [], np.float32(1.0).tobytes())
            elif name == "weight-scale":
                fp8[PREFIX + layer + ".weight_scale"] = ("F32", list(np.shape(scale)), scale.tobytes())
                fp8[PREFIX + layer + ".input_scale"] = ("F32", [], np.float32(0.5).tobytes())
                if layer.startswith("double_blocks.1."):
                    conf = json.dumps({"format": "float8_e4m3fn"}).encode()
                    fp8[PREFIX + layer + ".comfy_quant"] = ("U8", [len(conf)], conf)
        write_safetensors(f"{outdir}/{name}.safetensors", fp8)
        write_safetensors(f"{outdir}/reference-{name}.safetensors", ref)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "codes":
        codes(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
