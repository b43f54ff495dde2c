#!/usr/bin/env python3
"""A tiny random-weight FLUX.2-dev and what the official code computes from it (refgen).

Builds the model with the official classes (diffusers Flux2Transformer2DModel with the
guidance embedder, AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline for
model_index.json; transformers Mistral3ForConditionalGeneration with a Mistral language model
and a Pixtral vision tower), re-draws every weight with make_tiny_models.redraw, saves it in
bf16 with the official writers, loads it back with Flux2Pipeline.from_pretrained in float32
and records:
  text_encoder/  Flux2Pipeline._get_mistral_3_small_prompt_embeds on harness-chosen token ids
                 (left and right padding to 512): hidden states 10, 20, 30 and the stacked context
  transformer/   one Flux2Transformer2DModel forward with guidance: inputs, temb, every block, output
  e2e/           Flux2Pipeline.__call__(prompt_embeds=...) runs: noise, every step, VAE input, image
The tokenizer is not part of this set: the token ids are chosen here in the shape of the
Mistral chat format (see the README), and the pipeline's processor is replaced by a stand-in
that returns them from apply_chat_template.  Everything downstream of the ids is official.

  e2e_prompt/    Flux2Pipeline.__call__(prompt=TEXT) whole, with --tokenizer-set: the processor
                 returns the official tokenizers library's ids of the rendered chat
Usage:
  python3 gen_dev.py --spec specs/flux2-dev-tiny.json --out OUT_DIR \
      --diffusers-src D/src --transformers-src T/src --hub-src H/src --accelerate-src A/src \
      [--tokenizer-set tests/data/flux2-dev-tiny]
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

LAYERS = (10, 20, 30)


class ProcessorStandIn:
    """Takes the place of the PixtralProcessor: apply_chat_template returns fixed ids."""

    def __init__(self, ids, mask):
        self.ids, self.mask = ids, mask
        self.calls = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append((messages, kwargs))
        return {"input_ids": self.ids.clone(), "attention_mask": self.mask.clone()}


def chat_ids(spec, prompt, padding):
    """Token ids in the layout of the Mistral chat format, padded to max_sequence_length:
    <s> [SYSTEM_PROMPT] sys... [/SYSTEM_PROMPT] [INST] user... [/INST], then <pad> on the
    given side. Ordinary tokens are drawn from [1000, vocab) (Mistral reserves the first
    1000 ids for control tokens)."""
    import torch
    s = spec["special_ids"]
    vocab = spec["model"]["text_config"]["vocab_size"]
    rng = np.random.RandomState(prompt["seed"])
    body = ([s["bos"], s["system"]] + list(rng.randint(1000, vocab, prompt["system_tokens"])) +
            [s["system_end"], s["inst"]] + list(rng.randint(1000, vocab, prompt["user_tokens"])) +
            [s["inst_end"]])
    n = spec["max_sequence_length"]
    pad = [s["pad"]] * (n - len(body))
    ids = body + pad if padding == "right" else pad + body
    mask = [1] * len(body) + [0] * len(pad) if padding == "right" else [0] * len(pad) + [1] * len(body)
    return (torch.tensor([ids], dtype=torch.int64), torch.tensor([mask], dtype=torch.int64), len(body))


def build_model(spec, out):
    import torch
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
    from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteScheduler
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration
    from make_tiny_models import SCHEDULER_CONFIG, build_transformer_and_vae, redraw

    V = spec["model"]
    seed = V["seed"]
    cfg = Mistral3Config(text_config=dict(V["text_config"]), vision_config=dict(V["vision_config"]),
                         **V["mistral3"])
    torch.manual_seed(seed)
    text_encoder = Mistral3ForConditionalGeneration(cfg)
    redraw(text_encoder, seed, "text_encoder", torch)
    joint_dim = len(LAYERS) * cfg.text_config.hidden_size

    transformer, vae = build_transformer_and_vae(V, seed, joint_dim, torch)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)

    text_encoder.to(torch.bfloat16).save_pretrained(
        os.path.join(out, "text_encoder"), safe_serialization=True,
        max_shard_size=V["text_encoder_max_shard_size"])
    transformer.to(torch.bfloat16).save_pretrained(os.path.join(out, "transformer"), safe_serialization=True)
    vae.to(torch.bfloat16).save_pretrained(os.path.join(out, "vae"), safe_serialization=True)
    scheduler.save_pretrained(os.path.join(out, "scheduler"))
    Flux2Pipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=None,
                  transformer=transformer).save_config(out)
    return {"seed": seed, "joint_attention_dim": joint_dim, "scheduler": SCHEDULER_CONFIG,
            "weight_rules": [l.strip() for l in redraw.__doc__.strip().splitlines()]}


def gen_text_encoder(pipe, spec, W, ctx):
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
    from gen_vectors import Recorder
    te = pipe.text_encoder
    attn = te.language_model.config._attn_implementation
    assert attn == "eager", attn
    cases = []
    for prompt in spec["prompts"]:
        for padding in ("left", "right"):
            name = "%s_%s" % (prompt["name"], padding)
            ids, mask, n_real = chat_ids(spec, prompt, padding)
            proc = ProcessorStandIn(ids, mask)
            rec = Recorder(te, "forward")
            emb = Flux2Pipeline._get_mistral_3_small_prompt_embeds(
                text_encoder=te, tokenizer=proc, prompt="(the ids stand for this prompt)",
                max_sequence_length=spec["max_sequence_length"])
            rec.restore()
            _, kw, res = rec.calls[0]
            assert kw["input_ids"].equal(ids) and kw["attention_mask"].equal(mask)
            p = "text_encoder/%s_" % name
            W.npy(p + "input_ids.npy", ids[0], "%s: input_ids [512] given to the text encoder" % name)
            W.npy(p + "attention_mask.npy", mask[0], "%s: attention_mask [512] (1 = token, 0 = padding)" % name)
            for k in LAYERS:
                W.npy(p + "hidden_%02d.npy" % k, res.hidden_states[k][0],
                      "%s: hidden_states[%d] [512, hidden] = output of decoder layer %d (1-based)" % (name, k, k))
            W.npy(p + "context.npy", emb[0], "%s: prompt_embeds [512, 3*hidden]: for each token the hidden "
                  "states of layers 10, 20, 30 side by side (column = j*hidden + c for the j-th layer)" % name)
            ctx.setdefault("context", {})[name] = emb
            msgs, kwargs = proc.calls[0]
            cases.append({"name": name, "prompt": prompt, "padding": padding, "real_tokens": n_real,
                          "apply_chat_template_kwargs": {k: v for k, v in kwargs.items()},
                          "messages_passed": msgs})
    W.json("text_encoder/cases.json", {
        "how": "Flux2Pipeline._get_mistral_3_small_prompt_embeds(text_encoder, tokenizer=<stand-in returning the "
               "ids and mask below>, max_sequence_length=512): text_encoder(input_ids, attention_mask, "
               "output_hidden_states=True, use_cache=False), hidden_states[10, 20, 30] stacked and permuted to "
               "[1, 512, 3*hidden]; eager attention (transformers on torch 1.13), position ids 0..511 whatever "
               "the padding",
        "attn_implementation": attn, "cases": cases}, "text encoder cases: ids, padding side, what the pipeline passed to the processor")


def gen_transformer(pipe, spec, W, ctx):
    import torch
    from gen_vectors import hook_outputs, seeded_randn
    c = spec["transformer_case"]
    tr = pipe.transformer
    emb = ctx["context"]["%s_%s" % (c["prompt"], c["padding"])]
    h16, w16 = c["height"] // 16, c["width"] // 16
    latents = pipe._pack_latents(seeded_randn((1, 128, h16, w16), c["seed"]))
    img_ids = pipe._prepare_latent_ids(torch.zeros(1, 128, h16, w16))
    txt_ids = pipe._prepare_text_ids(emb)
    timestep = torch.tensor([c["timestep"]], dtype=torch.float32)
    guidance = torch.tensor([c["guidance"]], dtype=torch.float32)
    mods = [("time_guidance_embed", tr.time_guidance_embed), ("x_embedder", tr.x_embedder),
            ("context_embedder", tr.context_embedder), ("norm_out", tr.norm_out)]
    mods += [("transformer_blocks.%d" % i, b) for i, b in enumerate(tr.transformer_blocks)]
    mods += [("single_transformer_blocks.%d" % i, b) for i, b in enumerate(tr.single_transformer_blocks)]
    store, handles = hook_outputs(mods)
    with torch.no_grad():
        out = tr(hidden_states=latents, timestep=timestep, guidance=guidance, encoder_hidden_states=emb,
                 txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
    for h in handles:
        h.remove()
    p = "transformer/"
    W.npy(p + "hidden_states.npy", latents[0], "input: packed noisy latents [N, 128] (seeded torch.randn, packed)")
    W.npy(p + "encoder_hidden_states.npy", emb[0], "input: context [512, 3*hidden] (text_encoder/%s_%s_context)"
          % (c["prompt"], c["padding"]))
    W.npy(p + "img_ids.npy", img_ids[0], "input: img_ids [N, 4] (t, h, w, l)")
    W.npy(p + "txt_ids.npy", txt_ids[0], "input: txt_ids [512, 4] = (0, 0, 0, l)")
    W.json(p + "inputs.json", {"timestep": c["timestep"], "guidance": c["guidance"], "height": c["height"],
                               "width": c["width"], "note": "the model multiplies timestep and guidance by 1000"},
           "transformer inputs: timestep and guidance as passed (pipeline scale: sigma and guidance_scale)")
    for k, v in store.items():
        v = v[0]
        if k.startswith("transformer_blocks"):
            W.npy(p + "%s_txt.npy" % k.replace(".", "_"), v[0][0], "output of %s: text stream" % k)
            W.npy(p + "%s_img.npy" % k.replace(".", "_"), v[1][0], "output of %s: image stream" % k)
        else:
            t = v[0] if isinstance(v, tuple) else v
            W.npy(p + "%s.npy" % k.replace(".", "_"), t[0] if t.dim() > 1 else t,
                  "output of %s (first batch row)" % k)
    W.npy(p + "out.npy", out[0], "output velocity [N, 128]")


def gen_e2e(pipe, spec, W, ctx):
    import torch
    from PIL import Image
    from gen_vectors import Recorder, make_ref_image, seeded_randn
    tr = pipe.transformer
    info = []
    for c in spec["e2e"]:
        p = "e2e/%s/" % c["name"]
        h16, w16 = c["height"] // 16, c["width"] // 16
        noise = seeded_randn((1, 128, h16, w16), c["seed"])
        refs = []
        for j, r in enumerate(c.get("references", [])):
            W.png(p + "reference%d.png" % j, make_ref_image(r["width"], r["height"], r["seed"]),
                  "input: reference image %d (%dx%d RGB, synthetic)" % (j, r["width"], r["height"]))
            refs.append(Image.open(os.path.join(W.root, p + "reference%d.png" % j)).convert("RGB"))
        emb = ctx["context"]["%s_%s" % (c["prompt"], c["padding"])]
        rec_tr = Recorder(tr, "forward")
        rec_dec = Recorder(pipe.vae, "decode")
        steps = []

        def cb(pipeline, i, t, kw):
            steps.append(kw["latents"].clone())
            return {}

        images = pipe(image=refs or None, prompt_embeds=emb.clone(), height=c["height"], width=c["width"],
                      num_inference_steps=c["steps"], guidance_scale=c["guidance"], latents=noise.clone(),
                      output_type="np", return_dict=False, callback_on_step_end=cb,
                      callback_on_step_end_tensor_inputs=["latents"])[0]
        rec_tr.restore()
        rec_dec.restore()
        n = h16 * w16
        first = rec_tr.calls[0][1]
        W.npy(p + "noise.npy", noise, "input: initial noise [1,128,H/16,W/16] passed as latents= (seeded torch.randn)")
        W.npy(p + "img_ids.npy", first["img_ids"][0], "img_ids [N(+R), 4] as passed to the transformer")
        if refs:
            W.npy(p + "ref_tokens.npy", first["hidden_states"][0, n:], "reference tokens [R, 128] after the N "
                  "image tokens at every step")
        for i, (a, kw, out) in enumerate(rec_tr.calls):
            W.npy(p + "step%d_timestep.npy" % i, kw["timestep"], "step %d: timestep passed to the transformer [1]" % i)
            W.npy(p + "step%d_guidance.npy" % i, kw["guidance"], "step %d: guidance passed to the transformer [1]" % i)
            W.npy(p + "step%d_latents_in.npy" % i, kw["hidden_states"][0, :n], "step %d: latents before the step [N,128]" % i)
            W.npy(p + "step%d_velocity.npy" % i, out[0][0, :n], "step %d: velocity, first N rows [N,128]" % i)
            W.npy(p + "step%d_latents_out.npy" % i, steps[i][0], "step %d: latents after the Euler step [N,128]" % i)
        dz = rec_dec.calls[0][0][0] if rec_dec.calls[0][0] else rec_dec.calls[0][1]["z"]
        W.npy(p + "vae_input.npy", dz[0], "latents passed to vae.decode [32,H/8,W/8]")
        W.npy(p + "image.npy", images[0], "final image [H,W,3] float32 in [0,1] (output_type='np')")
        W.png(p + "image.png", pipe.image_processor.numpy_to_pil(images)[0], "final image, uint8 RGB PNG")
        info.append({"name": c["name"], "prompt": c["prompt"], "padding": c["padding"], "height": c["height"],
                     "width": c["width"], "steps": c["steps"], "guidance": c["guidance"], "noise_seed": c["seed"],
                     "references": c.get("references", []),
                     "sigmas": [float(x) for x in pipe.scheduler.sigmas],
                     "image_std": float(images.std())})
    W.json("e2e/cases.json", {"how": "Flux2Pipeline.__call__(image=references or None, prompt_embeds=<the text "
                              "encoder case's context>, height, width, num_inference_steps, guidance_scale, "
                              "latents=noise, output_type='np')", "cases": info}, "end-to-end runs")


class TokenizedProcessor:
    """The pipeline's processor for prompts whose rendered chat text was tokenized by the
    official tokenizers library (tokenizer_vectors.json, tools/refgen/tekken_tokenizer.py):
    checks that the pipeline passes the recorded messages, returns those ids padded to
    max_length with <pad> on the side tokenizer_config.json names."""

    def __init__(self, vectors, pad_id, pad_left):
        self.by_prompt = {p["prompt"]: p for p in vectors["prompts"]}
        self.pad_id, self.pad_left = pad_id, pad_left
        self.calls = []

    def apply_chat_template(self, messages, **kwargs):
        import torch
        self.calls.append((messages, kwargs))
        assert len(messages) == 1
        user = messages[0][-1]["content"][0]["text"]
        rec = self.by_prompt[user]
        assert messages[0] == rec["messages"], (messages[0], rec["messages"])
        ids = list(rec["ids"])[: kwargs["max_length"]]
        pad = [self.pad_id] * (kwargs["max_length"] - len(ids))
        full = pad + ids if self.pad_left else ids + pad
        mask = ([0] * len(pad) + [1] * len(ids)) if self.pad_left else ([1] * len(ids) + [0] * len(pad))
        return {"input_ids": torch.tensor([full]), "attention_mask": torch.tensor([mask])}


def gen_e2e_prompt(pipe, spec, W, tokenizer_set):
    """Prompt text -> image through the whole official pipeline (its encode_prompt included).
    tokenizer_set: the set directory holding tokenizer_vectors.json and model/tokenizer/
    (tools/refgen/tekken_tokenizer.py)."""
    from gen_vectors import Recorder, seeded_randn
    with open(os.path.join(tokenizer_set, "tokenizer_vectors.json"), encoding="utf-8") as f:
        vectors = json.load(f)
    with open(os.path.join(tokenizer_set, "model", "tokenizer", "tokenizer_config.json"),
              encoding="utf-8") as f:
        tok_cfg = json.load(f)
    proc = TokenizedProcessor(vectors, spec["special_ids"]["pad"], tok_cfg.get("padding_side") == "left")
    pipe.tokenizer = proc
    info = []
    for c in spec["e2e_prompt"]:
        p = "e2e_prompt/%s/" % c["name"]
        h16, w16 = c["height"] // 16, c["width"] // 16
        noise = seeded_randn((1, 128, h16, w16), c["seed"])
        rec_te = Recorder(pipe.text_encoder, "forward")
        rec_tr = Recorder(pipe.transformer, "forward")
        images = pipe(prompt=c["prompt"], height=c["height"], width=c["width"],
                      num_inference_steps=c["steps"], guidance_scale=c["guidance"], latents=noise.clone(),
                      output_type="np", return_dict=False)[0]
        rec_te.restore()
        rec_tr.restore()
        kw = rec_te.calls[0][1]
        W.npy(p + "noise.npy", noise, "input: initial noise [1,128,H/16,W/16] passed as latents=")
        W.npy(p + "input_ids.npy", kw["input_ids"][0], "the ids the processor gave the text encoder [512]")
        W.npy(p + "attention_mask.npy", kw["attention_mask"][0], "their attention mask [512]")
        W.npy(p + "prompt_embeds.npy", rec_tr.calls[0][1]["encoder_hidden_states"][0],
              "the context the transformer received [512, 3*hidden]")
        W.npy(p + "image.npy", images[0], "final image [H,W,3] float32 in [0,1]")
        W.png(p + "image.png", pipe.image_processor.numpy_to_pil(images)[0], "final image, uint8 RGB PNG")
        info.append(dict(c, sigmas=[float(x) for x in pipe.scheduler.sigmas]))
    W.json("e2e_prompt/cases.json", {
        "how": "Flux2Pipeline.__call__(prompt=TEXT, ...) with the processor replaced by one that returns the "
               "official tokenizers library's ids for the chat text the pipeline's messages render to "
               "(tokenizer_vectors.json), padded to 512 with <pad> on tokenizer_config.json's side",
        "cases": info}, "end-to-end runs from a prompt text")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    for s in ("diffusers", "transformers", "hub", "accelerate"):
        ap.add_argument("--%s-src" % s, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokenizer-set", help="a set directory with tokenizer_vectors.json and "
                    "model/tokenizer/ (tools/refgen/tekken_tokenizer.py's output): adds the e2e_prompt runs")
    a = ap.parse_args()
    import refgen_env
    refgen_env.setup(a.diffusers_src, a.transformers_src, a.hub_src, hub_version="0.99.0",
                     accelerate_src=a.accelerate_src)
    import torch
    torch.set_num_threads(a.threads)
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
    from gen_vectors import Writer

    with open(a.spec, encoding="utf-8") as f:
        spec = json.load(f)
    model_dir = os.path.join(a.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    build = build_model(spec, model_dir)
    files = {}
    for root, _, names in os.walk(model_dir):
        for nm in sorted(names):
            path = os.path.join(root, nm)
            import hashlib
            with open(path, "rb") as f:
                files[os.path.relpath(path, model_dir)] = hashlib.sha256(f.read()).hexdigest()
    build["files_sha256"] = files
    with open(os.path.join(a.out, "build.json"), "w") as f:
        json.dump(build, f, indent=1)
    with open(os.path.join(a.out, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)

    pipe = Flux2Pipeline.from_pretrained(model_dir, tokenizer=None, torch_dtype=torch.float32)
    W = Writer(os.path.join(a.out, "vectors"))
    ctx = {}
    with torch.no_grad():
        gen_text_encoder(pipe, spec, W, ctx)
        gen_transformer(pipe, spec, W, ctx)
        gen_e2e(pipe, spec, W, ctx)
        if spec.get("e2e_prompt") and a.tokenizer_set:
            gen_e2e_prompt(pipe, spec, W, a.tokenizer_set)
    W.manifest({"set": spec["name"], "threads": a.threads, "torch": torch.__version__})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
