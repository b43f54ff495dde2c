#!/usr/bin/env python3
"""The tiny Z-Image transformer under the original checkpoint names, checked with diffusers'
single-file conversion: writes tests/data/zimage-single-file/manifest.json.

Z-Image-Turbo's single file (z_image_turbo_bf16.safetensors, as ComfyUI ships it) has the names of
Tongyi-MAI's original code; diffusers reads it with `convert_z_image_transformer_checkpoint_to_
diffusers` (src/diffusers/loaders/single_file_utils.py). tests/formats/single_file_test.cpp writes
zimage-tiny's transformer under those names (`original_zimage_transformer`) and requires the engine
to load it bit-identical to the diffusers directory. This script builds the same state dict
(q, k, v fused into attention.qkv; attention.out, q_norm, k_norm; x_embedder and final_layer
without "all_" and the patch key "2-1"; plus norm_final.weight, which the original model has and
never uses), runs diffusers' conversion on it and requires the result to be exactly the diffusers
transformer: the same names, dtypes, shapes and bits, nothing left over (norm_final.weight is the
one name the conversion drops). It then records every original tensor (name, dtype, shape and the
FNV-1a 64 of its bytes; for the dropped tensor no hash, its values are not read by the
conversion) in the manifest, which the C++ test requires its file to match tensor for tensor.

Needs Debian's python3-torch and the source trees of tools/refgen/README.md:

  /usr/bin/python3 tools/zimage/original_names.py --diffusers-src DIFFUSERS/src \\
      --diffusers-commit 58eb52c0803ea9af3abec60841c2a093bdf1f951 --hub-src HUGGINGFACE_HUB/src \\
      --transformer ../shared/testdata/zimage-tiny/model/transformer/diffusion_pytorch_model.safetensors \\
      --out tests/data/zimage-single-file
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "refgen"))

DTYPES = {"torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float16": "F16"}


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def original_names(d, torch):
    """The diffusers state dict `d` under the original checkpoint's names."""
    out = {}
    for k, v in d.items():
        if ".attention.to_k." in k or ".attention.to_v." in k:
            continue
        if ".attention.to_q." in k:
            out[k.replace(".to_q.", ".qkv.")] = torch.cat(
                [v, d[k.replace(".to_q.", ".to_k.")], d[k.replace(".to_q.", ".to_v.")]], 0)
            continue
        for new, old in ((".attention.out.", ".attention.to_out.0."),
                         (".attention.q_norm.", ".attention.norm_q."),
                         (".attention.k_norm.", ".attention.norm_k.")):
            k = k.replace(old, new)
        for new, old in (("x_embedder.", "all_x_embedder.2-1."),
                         ("final_layer.", "all_final_layer.2-1.")):
            if k.startswith(old):
                k = new + k[len(old):]
        out[k] = v
    # The original model's final norm: the conversion drops it (any values of its shape).
    out["norm_final.weight"] = d["layers.0.attention_norm1.weight"].clone()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--diffusers-src", required=True)
    ap.add_argument("--diffusers-commit", required=True)
    ap.add_argument("--hub-src", required=True)
    ap.add_argument("--transformer", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import refgen_env
    refgen_env.setup(args.diffusers_src, hub_src=args.hub_src)
    import torch
    from safetensors.torch import load_file
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers)

    diffusers = load_file(args.transformer)
    original = original_names(diffusers, torch)
    back = convert_z_image_transformer_checkpoint_to_diffusers(
        {k: v.clone() for k, v in original.items()})
    assert set(back) == set(diffusers), (set(back) ^ set(diffusers))
    for k, v in diffusers.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    # The names the conversion carries into nothing (it pops them), one name at a time.
    dropped = sorted(k for k in original
                     if not convert_z_image_transformer_checkpoint_to_diffusers({k: original[k]}))
    assert dropped == ["norm_final.weight"], dropped

    tensors = {}
    for k in sorted(original):
        v = original[k]
        entry = {"dtype": DTYPES[str(v.dtype)], "shape": list(v.shape)}
        if k not in dropped:
            raw = v.contiguous().view(torch.int16 if v.element_size() == 2 else torch.int32)
            entry["fnv1a64"] = fnv1a64(raw.numpy().tobytes())
        tensors[k] = entry
    os.makedirs(args.out, exist_ok=True)
    manifest = {
        "diffusers": {"repository": "huggingface/diffusers", "commit": args.diffusers_commit,
                      "function": "loaders/single_file_utils.py: "
                                  "convert_z_image_transformer_checkpoint_to_diffusers"},
        "torch": torch.__version__,
        "transformer": "zimage-tiny/model/transformer/diffusion_pytorch_model.safetensors",
        "converts_back_exactly": True,
        "dropped_by_the_conversion": dropped,
        "tensors": tensors,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(len(tensors), "tensors;", len(back), "after the conversion")


if __name__ == "__main__":
    main()
