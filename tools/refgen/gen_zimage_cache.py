#!/usr/bin/env python3
"""Step caching references: diffusers' FirstBlockCache on the tiny Z-Image model.

Runs the official ZImagePipeline (src/diffusers/pipelines/z_image/pipeline_z_image.py) with
the official hook `apply_first_block_cache` (src/diffusers/hooks/first_block_cache.py) on the
transformer of ../shared/testdata/zimage-tiny, from the prompt embeddings and the initial noise
that set stores for its end-to-end cases, and writes per case:

  <case>/case.json         the inputs (steps, guidance, threshold, which embeddings), and per
                           transformer call: the relative change of the first block's residual
                           the hook computed (null on the first call), whether the remaining
                           blocks ran, the caption lengths of the batch
  <case>/stepK_latents.npy the latents after step K (the pipeline's callback_on_step_end)
  <case>/final_latents.npy the pipeline's output (output_type="latent")
  <case>/negative_prompt_embeds.npy (case cfg_padded only) the negative embeddings used

What the script adds around the official code, and why (besides the torch 1.13 shims that
../shared/testdata/zimage-tiny's README lists, made the same way here: a `torch.device` context
manager inside transformer_z_image.py, int32 index tensors widened):
- The hook cannot run on Z-Image as shipped at that commit: it reads each block's input by the
  parameter name "hidden_states", and ZImageTransformerBlock.forward calls it `x` ("Parameter
  'hidden_states' not found in function signature"). The block's registered metadata is told
  that "hidden_states" is the parameter `x` (the first; the main layers pass it positionally).
- ZImageTransformer2DModel is not a CacheMixin, and ZImagePipeline sets no `cache_context`,
  while the hook's StateManager refuses to run without one: the script sets the context
  "zimage" on the transformer's hook registry (as CacheMixin.cache_context does) around each
  run, and resets the hooks' state before it (no pipeline of this commit resets it).
- The relative change is read from the hook's own computation: the script wraps the head
  hook's `_should_compute_remaining_blocks` to record the value it returns and the ratio
  behind it (recomputed there from the same tensors, as the hook computes it).
- Case cfg_padded needs a negative prompt whose padded caption is longer than the prompt's
  (the official batch then pads the shorter sequence with zero rows, which the main layers and
  the hook's mean see): its negative embeddings are seeded normal values (torch.manual_seed,
  40 rows), stored beside the case.

The threshold of each case is set between the relative changes of its run, at least 0.2 % away
from every one of them (float32 rounding moves them by about 1e-6), so that no skip decision
can flip on rounding. (The random-weight model's changes are large and alike from step to step,
1.2 to 1.4 for the turbo case; a trained model's are small and fall as the image settles.)

Needs Debian's python3-torch and the source trees of tools/refgen/README.md (diffusers
58eb52c0803ea9af3abec60841c2a093bdf1f951 and the transformers, huggingface_hub and accelerate
commits there; the pipeline module imports transformers, nothing of it runs):

  /usr/bin/python3 tools/refgen/gen_zimage_cache.py --diffusers-src DIFFUSERS/src \\
      --hub-src HUGGINGFACE_HUB/src --transformers-src TRANSFORMERS/src \\
      --accelerate-src ACCELERATE/src --set ../shared/testdata/zimage-tiny --out tests/data/zimage-cache
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DIFFUSERS_COMMIT = "58eb52c0803ea9af3abec60841c2a093bdf1f951"

# name, end-to-end case of the set (embeddings, noise, size), steps, guidance, threshold
CASES = [
    # No guidance: one sequence per call.
    ("turbo", "turbo_h64_w96", 16, 0.0, None),
    # Guidance, prompt and negative padded to the same length (18 and 15 tokens: 32 rows each).
    ("cfg", "cfg_h64_w64", 20, 4.0, None),
    # Guidance, the negative longer: the prompt's sequence gets 32 batch-padding rows.
    ("cfg_padded", "cfg_h64_w64", 20, 4.0, None),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--diffusers-src", required=True)
    ap.add_argument("--hub-src", required=True)
    ap.add_argument("--transformers-src", required=True)
    ap.add_argument("--accelerate-src", required=True)
    ap.add_argument("--set", required=True, help="../shared/testdata/zimage-tiny")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import refgen_env
    refgen_env.setup(args.diffusers_src, args.transformers_src, args.hub_src, hub_version="0.99.0",
                     accelerate_src=args.accelerate_src)
    import torch
    torch.set_num_threads(2)
    from diffusers.hooks import HookRegistry
    from diffusers.hooks import first_block_cache as fbc
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel
    # refgen_env registers these two packages without their __init__ (see there): the names
    # the pipeline module imports from them are put in place.
    import diffusers.models.autoencoders as autoencoders
    import diffusers.models.transformers as transformers_pkg
    autoencoders.AutoencoderKL = AutoencoderKL
    transformers_pkg.ZImageTransformer2DModel = ZImageTransformer2DModel
    from diffusers.pipelines.z_image.pipeline_z_image import ZImagePipeline
    # torch 1.13's torch.device is no context manager; the transformer module uses one, as
    # `with torch.device("cpu"):` around its RoPE tables, whose tensors all name device="cpu"
    # anyway: that module sees a torch whose device() is also an empty context manager.
    import types
    import diffusers.models.transformers.transformer_z_image as zt

    class _Device:
        def __init__(self, *a, **k):
            self.device = torch.device(*a, **k)

        def __enter__(self):
            return self.device

        def __exit__(self, *exc):
            return False

    shim = types.ModuleType("torch_with_device_context")
    shim.__getattr__ = lambda name: getattr(torch, name)
    shim.device = _Device
    zt.torch = shim
    # torch 1.13 refuses int32 index tensors (torch >= 2 takes them; the RoPE look-up indexes
    # with int32 position ids): they are widened to int64 in Tensor.__getitem__.
    getitem = torch.Tensor.__getitem__

    def widened(self, index):
        def widen(i):
            return i.long() if isinstance(i, torch.Tensor) and i.dtype == torch.int32 else i
        index = tuple(widen(i) for i in index) if isinstance(index, tuple) else widen(index)
        return getitem(self, index)

    torch.Tensor.__getitem__ = widened
    from diffusers.schedulers.scheduling_flow_match_euler_discrete import (
        FlowMatchEulerDiscreteScheduler)

    model = os.path.join(args.set, "model")
    vectors = os.path.join(args.set, "vectors", "e2e")

    # The hook reads its block's input by the parameter name "hidden_states"; ZImageTransformer-
    # Block.forward names it `x` (its first parameter), so as shipped the hook stops with
    # "Parameter 'hidden_states' not found in function signature". The block's metadata (hooks/
    # _helpers.py, registered for ZImageTransformerBlock with hidden index 0) is told that
    # "hidden_states" is its first argument, as the main layers call it positionally.
    from diffusers.hooks._helpers import TransformerBlockRegistry
    from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock
    import inspect
    meta = TransformerBlockRegistry.get(ZImageTransformerBlock)
    names = list(inspect.signature(ZImageTransformerBlock.forward).parameters)[1:]
    meta._cached_parameter_indices = {name: i for i, name in enumerate(names)}
    meta._cached_parameter_indices["hidden_states"] = names.index("x")

    # Record what the head hook decides, from its own inputs.
    calls = []
    original = fbc.FBCHeadBlockHook._should_compute_remaining_blocks

    def recording(self, residual):
        state = self.state_manager.get_state()
        change = None
        if state.head_block_residual is not None:
            prev = state.head_block_residual
            change = ((residual - prev).abs().mean() / prev.abs().mean()).item()
        decision = original(self, residual)
        calls.append({"relative_change": change, "computed": bool(decision),
                      "batch": int(residual.shape[0]), "rows": int(residual.shape[1])})
        return decision

    fbc.FBCHeadBlockHook._should_compute_remaining_blocks = recording

    def load(path):
        return torch.from_numpy(np.load(path).astype(np.float32))

    os.makedirs(args.out, exist_ok=True)
    manifest = {"diffusers": {"repository": "huggingface/diffusers", "commit": DIFFUSERS_COMMIT,
                              "pipeline": "ZImagePipeline",
                              "hook": "hooks/first_block_cache.py apply_first_block_cache"},
                "set": "zimage-tiny", "cases": []}
    for name, source, steps, guidance, _ in CASES:
        src = os.path.join(vectors, source)
        info = json.load(open(os.path.join(src, "case.json")))
        prompt = load(os.path.join(src, "prompt_embeds.npy"))
        negative = None
        negative_file = None
        if guidance > 0:
            if name == "cfg_padded":
                g = torch.Generator().manual_seed(2026120601)
                negative = torch.randn(40, prompt.shape[-1], generator=g) * prompt.std()
                negative_file = "negative_prompt_embeds.npy"
            else:
                negative = load(os.path.join(src, "negative_prompt_embeds.npy"))
                negative_file = source + "/negative_prompt_embeds.npy"
        noise = load(os.path.join(src, "noise.npy"))

        def run(threshold):
            transformer = ZImageTransformer2DModel.from_pretrained(
                os.path.join(model, "transformer"), torch_dtype=torch.float32)
            vae = AutoencoderKL.from_pretrained(os.path.join(model, "vae"),
                                                torch_dtype=torch.float32)
            scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(
                os.path.join(model, "scheduler"))
            pipe = ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=None,
                                  tokenizer=None, transformer=transformer)
            fbc.apply_first_block_cache(transformer, fbc.FirstBlockCacheConfig(threshold=threshold))
            registry = HookRegistry.check_if_exists_or_initialize(transformer)
            registry.reset_stateful_hooks(recurse=True)
            registry._set_context("zimage")
            calls.clear()
            latents = []

            def on_step(p, i, t, kw):
                latents.append(kw["latents"].detach().clone())
                return kw

            with torch.no_grad():
                out = pipe(prompt_embeds=[prompt],
                           negative_prompt_embeds=[negative] if negative is not None else None,
                           height=info["height"], width=info["width"],
                           num_inference_steps=steps, guidance_scale=guidance,
                           latents=noise.clone(), output_type="latent",
                           callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=["latents"])
            registry._set_context(None)
            final = out.images if hasattr(out, "images") else out[0]
            return list(calls), latents, final

        # First with every step computed (threshold 0 skips nothing: a change is > 0) to see
        # the changes, then thresholds around their middle until one skips some steps and
        # computes others (a fifth to four fifths of the calls skipped) with every change of its run
        # at least 0.2 % away from it.
        probe, _, _ = run(0.0)
        changes = sorted(c["relative_change"] for c in probe if c["relative_change"] is not None)
        for threshold in candidates(changes):
            record, latents, final = run(threshold)
            seen = [c["relative_change"] for c in record if c["relative_change"] is not None]
            skipped = sum(not c["computed"] for c in record)
            if all(abs(c - threshold) > 0.002 * threshold for c in seen) and \
                    len(record) // 5 <= skipped <= 4 * len(record) // 5:
                break
        else:
            raise SystemExit("%s: no threshold found among %s" % (name, changes))
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        for i, x in enumerate(latents):
            np.save(os.path.join(d, f"step{i}_latents.npy"), x.numpy().astype(np.float32))
        np.save(os.path.join(d, "final_latents.npy"), final.numpy().astype(np.float32))
        if name == "cfg_padded":
            np.save(os.path.join(d, "negative_prompt_embeds.npy"), negative.numpy().astype(np.float32))
        case = {"name": name, "source_case": source, "height": info["height"],
                "width": info["width"], "steps": steps, "guidance_scale": guidance,
                "threshold": threshold,
                "prompt_embeds": source + "/prompt_embeds.npy", "noise": source + "/noise.npy",
                "negative_prompt_embeds": negative_file,
                "negative_rows": int(negative.shape[0]) if negative is not None else None,
                "calls": record,
                "computed": sum(c["computed"] for c in record),
                "skipped": sum(not c["computed"] for c in record)}
        with open(os.path.join(d, "case.json"), "w") as f:
            json.dump(case, f, indent=1)
        manifest["cases"].append({"name": name, "computed": case["computed"],
                                  "skipped": case["skipped"], "threshold": threshold})
        print(name, "threshold", threshold, "computed", case["computed"], "skipped",
              case["skipped"], flush=True)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def candidates(changes):
    """Thresholds from the middle of the changes outwards (four significant digits)."""
    mid = changes[len(changes) // 2]
    for f in (1.0, 0.995, 1.005, 0.99, 1.01, 0.985, 1.015, 0.98, 1.02, 0.97, 1.03, 0.96, 1.04,
              0.95, 1.05, 0.9, 1.1):
        yield float("%.4g" % (mid * f))


if __name__ == "__main__":
    main()
