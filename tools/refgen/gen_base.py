#!/usr/bin/env python3
"""Golden vectors for klein-base: the official Flux2KleinPipeline (diffusers, pinned commit) on the tiny
klein model declared as a base checkpoint (model_index.json with "is_distilled": false), i.e. with
classifier-free guidance: each step runs the transformer on the prompt and on the negative prompt and
takes neg + guidance * (cond - neg).

The official pipeline always encodes "" as the negative prompt; its `negative_prompt_embeds` argument is
how a caller gives another one, so a case with a negative prompt passes the pipeline's own
encode_prompt() of that text there (what the engine's --negative-prompt does). A case whose steps or
guidance are null calls the pipeline without them: its defaults (50 steps, guidance 4.0, the schedule
for that many steps).

Each case writes vectors/base/<name>/: noise ([1,128,H/16,W/16], passed as latents=), prompt_embeds,
negative_prompt_embeds, img_ids, per step the timestep, the latents entering the step, the guided
velocity the scheduler receives and the latents after the Euler step; final_latents, image.npy/.png.
"""
import json, os, sys, tempfile, time
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE)
from gen_vectors import Writer, Recorder, seeded_randn  # noqa: E402


def base_model_dir(model):
    """The tiny model's components under a model_index.json that declares a base checkpoint."""
    d = tempfile.mkdtemp(prefix="klein-tiny-base-")
    for name in os.listdir(model):
        if name != "model_index.json":
            os.symlink(os.path.join(os.path.abspath(model), name), os.path.join(d, name))
    index = json.load(open(os.path.join(model, "model_index.json"), encoding="utf-8"))
    index["is_distilled"] = False
    json.dump(index, open(os.path.join(d, "model_index.json"), "w", encoding="utf-8"), indent=2)
    return d


def main():
    import refgen_env
    a = refgen_env.pipeline_args()
    import torch, diffusers  # noqa: F401  (set up by pipeline_args)
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
    spec = json.load(open(a.spec, encoding="utf-8"))
    pipe = Flux2KleinPipeline.from_pretrained(base_model_dir(a.model), torch_dtype=torch.float32)
    assert pipe.config.is_distilled is False
    pipe.set_progress_bar_config(disable=True)
    W = Writer(a.out); info = []; t0 = time.time()
    with torch.no_grad():
        for c in spec["base"]:
            p = "base/%s/" % c["name"]; w, h = c["width"], c["height"]; h16, w16 = h // 16, w // 16
            noise = seeded_randn((1, 128, h16, w16), c["noise_seed"])
            kwargs = {}
            if c["steps"] is not None: kwargs["num_inference_steps"] = c["steps"]
            if c["guidance"] is not None: kwargs["guidance_scale"] = c["guidance"]
            if c["negative_prompt"] is not None:
                kwargs["negative_prompt_embeds"] = pipe.encode_prompt(prompt=c["negative_prompt"], device=torch.device("cpu"))[0]
            rec_tr = Recorder(pipe.transformer, "forward"); rec_step = Recorder(pipe.scheduler, "step")
            img = pipe(prompt=c["prompt"], height=h, width=w, latents=noise.clone(), output_type="np",
                       return_dict=False, **kwargs)[0]
            rec_tr.restore(); rec_step.restore()
            steps = len(rec_step.calls)
            assert len(rec_tr.calls) == 2 * steps, "classifier-free guidance: two transformer calls per step"
            W.npy(p + "noise.npy", noise, "input: initial noise [1,128,H/16,W/16] passed as latents= (seeded torch.randn)")
            cond, uncond = rec_tr.calls[0][1], rec_tr.calls[1][1]
            W.npy(p + "prompt_embeds.npy", cond["encoder_hidden_states"], "prompt_embeds [1,512,3*hidden]")
            W.npy(p + "negative_prompt_embeds.npy", uncond["encoder_hidden_states"],
                  "negative_prompt_embeds [1,512,3*hidden] (the second transformer call of each step)")
            W.npy(p + "img_ids.npy", cond["img_ids"], "ids of the image tokens [1,N,4]")
            for i, (args, kw, out) in enumerate(rec_step.calls):
                velocity, t, latents = args[0], args[1], args[2]
                W.npy(p + "step%d_timestep.npy" % i, rec_tr.calls[2 * i][1]["timestep"], "step %d: timestep given to the transformer (t/1000) [1]" % i)
                W.npy(p + "step%d_latents_in.npy" % i, latents, "step %d: latents entering the step [1,N,128]" % i)
                W.npy(p + "step%d_velocity.npy" % i, velocity, "step %d: guided velocity neg + g * (cond - neg) given to the scheduler [1,N,128]" % i)
                W.npy(p + "step%d_latents_out.npy" % i, out[0], "step %d: latents after the Euler step [1,N,128]" % i)
            W.npy(p + "final_latents.npy", rec_step.calls[-1][2][0], "final packed latents [1,N,128]")
            W.npy(p + "image.npy", img[0], "final image [H,W,3] float32 in [0,1]")
            W.png(p + "image.png", pipe.image_processor.numpy_to_pil(img)[0], "final image, uint8 RGB PNG")
            info.append({**c, "steps_run": steps, "guidance_used": pipe.guidance_scale,
                         "timesteps": [float(s[0][1]) for s in rec_step.calls], "image_std": float(img.std())})
    W.manifest({"spec": spec["name"], "pipeline": "Flux2KleinPipeline (is_distilled false)", "diffusers": diffusers.__version__,
                "torch": torch.__version__, "threads": a.threads, "seconds": round(time.time() - t0, 1), "cases": info})
    print("wrote %d files in %.1fs" % (len(W.entries), time.time() - t0))


if __name__ == "__main__":
    main()
