#!/usr/bin/env python3
"""The Z-Image LoRA fixtures as diffusers reads them: writes tests/data/zimage-lora.

`lora_fixture.py make-zimage` writes three LoRA files for the tiny Z-Image transformer at test
time (zimage-peft, zimage-comfy, zimage-kohya; deterministic). This script, run once, makes the
same three files and reads each with the official loader of the pinned diffusers tree,
`ZImageLoraLoaderMixin.lora_state_dict` (which calls `_convert_non_diffusers_z_image_lora_to_
diffusers` of loaders/lora_conversion_utils.py for non-diffusers files: prefixes dropped, kohya
names split, `.alpha` folded into A and B). It writes, per file:

  <name>.safetensors  the converted LoRA: transformer.<weight>.lora_A.weight / .lora_B.weight,
                      F32, one pair per weight of the diffusers transformer it updates
  manifest.json       the diffusers commit, each input file's sha256 and size, and per module of
                      the converted state dict the weights it updates

diffusers' LoRA conversion leaves a module in the original checkpoint's spelling when the file
names it so with lora_A / lora_B (the fused `attention.qkv`, `attention.out`, `x_embedder` of
zimage-comfy); no module of the diffusers model has that name. Such a LoRA updates the original
checkpoint's weight, so its update is mapped as diffusers maps that weight:
`convert_z_image_transformer_checkpoint_to_diffusers` (loaders/single_file_utils.py) is run on
{module.weight: B}, which renames it and chunks a fused qkv's rows in thirds (A is shared); the
script checks that the same function run on B @ A (float64) gives B_part @ A for every output.
Every weight written must be a weight of the tiny transformer.

`lora_fixture.py merge-zimage` merges these converted files (found by the sha256 of the LoRA file
it is given) into the base weights; tests/e2e/zimage_lora_test.cpp compares the engine's
`--lora` with that merge.

Needs Debian's python3-torch and the source trees of tools/refgen/README.md (diffusers
58eb52c0803ea9af3abec60841c2a093bdf1f951, huggingface_hub ee0a4510f4bc15e26cb722be2efc2bdb01383ca0):

  /usr/bin/python3 tools/lora/zimage_lora_reference.py --diffusers-src DIFFUSERS/src \\
      --diffusers-commit 58eb52c0803ea9af3abec60841c2a093bdf1f951 --hub-src HUGGINGFACE_HUB/src \\
      --transformer ../shared/testdata/zimage-tiny/model/transformer/diffusion_pytorch_model.safetensors \\
      --out tests/data/zimage-lora
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "refgen"))
import lora_fixture  # noqa: E402
from safetensors_raw import read_raw, write_raw  # noqa: E402

FIXTURES = ("zimage-peft", "zimage-comfy", "zimage-kohya")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


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
    from diffusers.loaders.lora_pipeline import ZImageLoraLoaderMixin
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers)

    base = {name: shape for name, (_, shape, _) in read_raw(args.transformer).items()}
    os.makedirs(args.out, exist_ok=True)
    manifest = {
        "diffusers": {"repository": "huggingface/diffusers", "commit": args.diffusers_commit,
                      "lora_loader": "ZImageLoraLoaderMixin.lora_state_dict "
                                     "(_convert_non_diffusers_z_image_lora_to_diffusers)",
                      "original_weight_names": "convert_z_image_transformer_checkpoint_to_diffusers"},
        "torch": torch.__version__,
        "made_by": "lora_fixture.py make-zimage " + os.path.basename(args.transformer),
        "files": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        lora_fixture.make_zimage(args.transformer, tmp)
        for name in FIXTURES:
            path = os.path.join(tmp, name + ".safetensors")
            sd = ZImageLoraLoaderMixin.lora_state_dict(path)
            out, modules = {}, []
            for key in sd:
                if not key.endswith(".lora_A.weight"):
                    continue
                module = key[:-len(".lora_A.weight")]
                a = sd[key].float()
                b = sd[module + ".lora_B.weight"].float()
                assert module.startswith("transformer."), key
                weight = module[len("transformer."):] + ".weight"
                if weight in base:
                    parts = {weight: b}
                    via = "lora conversion"
                else:
                    # The original checkpoint's spelling: mapped as diffusers maps that weight.
                    parts = convert_z_image_transformer_checkpoint_to_diffusers({weight: b.clone()})
                    whole = convert_z_image_transformer_checkpoint_to_diffusers(
                        {weight: b.double() @ a.double()})
                    assert set(whole) == set(parts), (whole.keys(), parts.keys())
                    for n, bp in parts.items():
                        assert torch.equal(whole[n], bp.double() @ a.double()), n
                    via = "lora conversion, then single-file conversion of the original weight"
                targets = []
                for target, bp in parts.items():
                    assert target in base, f"{name}: {module} -> {target}: not a weight of the model"
                    assert list(bp.shape) == [base[target][0], a.shape[0]], (target, bp.shape)
                    assert a.shape[1] == base[target][1], (target, a.shape)
                    t = "transformer." + target[:-len(".weight")]
                    out[t + ".lora_A.weight"] = ("F32", list(a.shape), a.contiguous().numpy().tobytes())
                    out[t + ".lora_B.weight"] = ("F32", list(bp.shape),
                                                 bp.contiguous().numpy().tobytes())
                    targets.append(target)
                modules.append({"module": module, "via": via, "updates": targets})
            assert 2 * sum(len(m["updates"]) for m in modules) == len(out)
            converted = os.path.join(args.out, name + ".safetensors")
            write_raw(converted, out)
            manifest["files"].append({
                "fixture": name + ".safetensors", "sha256": sha256(path),
                "bytes": os.path.getsize(path), "converted": name + ".safetensors",
                "converted_sha256": sha256(converted), "modules": modules})
            print(name, len(modules), "modules")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
