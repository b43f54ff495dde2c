#!/usr/bin/env python3
"""A full-size synthetic copy of the safety classifier (Falconsai/nsfw_image_detection, a
ViT-B/16 ViTForImageClassification: hidden 768, 12 layers of 12 heads, MLP 3072, 224x224
images, labels normal/nsfw) in its Hugging Face layout, with random weights: for timing
`klein safety` and the generation's check (bench/safety.sh). Its verdicts mean nothing.

usage: bench/safety_synth_vit.py OUT_DIR [--dtype F32|BF16]   (numpy only; about 343 MB at F32)
"""
import argparse
import json
import os
import struct

import numpy as np

HIDDEN, LAYERS, HEADS, MLP, PATCH, IMAGE = 768, 12, 12, 3072, 16, 224


def tensors():
    tokens = (IMAGE // PATCH) ** 2 + 1
    yield "vit.embeddings.cls_token", (1, 1, HIDDEN)
    yield "vit.embeddings.position_embeddings", (1, tokens, HIDDEN)
    yield "vit.embeddings.patch_embeddings.projection.weight", (HIDDEN, 3, PATCH, PATCH)
    yield "vit.embeddings.patch_embeddings.projection.bias", (HIDDEN,)
    for i in range(LAYERS):
        p = f"vit.encoder.layer.{i}."
        for name in ("query", "key", "value"):
            yield p + f"attention.attention.{name}.weight", (HIDDEN, HIDDEN)
            yield p + f"attention.attention.{name}.bias", (HIDDEN,)
        yield p + "attention.output.dense.weight", (HIDDEN, HIDDEN)
        yield p + "attention.output.dense.bias", (HIDDEN,)
        yield p + "intermediate.dense.weight", (MLP, HIDDEN)
        yield p + "intermediate.dense.bias", (MLP,)
        yield p + "output.dense.weight", (HIDDEN, MLP)
        yield p + "output.dense.bias", (HIDDEN,)
        for norm in ("layernorm_before", "layernorm_after"):
            yield p + norm + ".weight", (HIDDEN,)
            yield p + norm + ".bias", (HIDDEN,)
    yield "vit.layernorm.weight", (HIDDEN,)
    yield "vit.layernorm.bias", (HIDDEN,)
    yield "classifier.weight", (2, HIDDEN)
    yield "classifier.bias", (2,)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["F32", "BF16"], default="F32")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    blobs, header, offset = [], {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors():
        if name.endswith("layernorm_before.weight") or name.endswith("layernorm_after.weight") \
                or name == "vit.layernorm.weight":
            x = np.ones(shape, np.float32)
        else:
            x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if a.dtype == "BF16":
            data = (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        else:
            data = x.tobytes()
        header[name] = {"dtype": a.dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)
    config = {
        "architectures": ["ViTForImageClassification"], "attention_probs_dropout_prob": 0.0,
        "encoder_stride": 16, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
        "hidden_size": HIDDEN, "id2label": {"0": "normal", "1": "nsfw"}, "image_size": IMAGE,
        "initializer_range": 0.02, "intermediate_size": MLP,
        "label2id": {"normal": "0", "nsfw": "1"}, "layer_norm_eps": 1e-12, "model_type": "vit",
        "num_attention_heads": HEADS, "num_channels": 3, "num_hidden_layers": LAYERS,
        "patch_size": PATCH, "problem_type": "single_label_classification", "qkv_bias": True,
        "torch_dtype": "float32"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    pre = {"do_normalize": True, "do_rescale": True, "do_resize": True,
           "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "ViTImageProcessor",
           "image_std": [0.5, 0.5, 0.5], "resample": 2, "rescale_factor": 1 / 255,
           "size": {"height": 224, "width": 224}}
    with open(os.path.join(a.out, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f, indent=2)


if __name__ == "__main__":
    main()
