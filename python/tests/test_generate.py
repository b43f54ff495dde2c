"""klein_edge against `klein generate`: the same arguments give the same pixels and the same
metadata (the CLI's images are checked against the official pipelines in tests/e2e)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

import pytest
from PIL import Image

import klein_edge

PROMPT = "a small red cube"


def cli_png(cli, tmp_path, model_path, *args):
    out = tmp_path / "cli.png"
    cli("generate", "-m", model_path, "-p", PROMPT, "--no-cache", "-q", "-o", out, *args)
    return Image.open(out)


def same_pixels(a, b):
    assert a.size == b.size
    assert a.convert("RGB").tobytes() == b.convert("RGB").tobytes()


def test_text_to_image_is_the_cli_image_with_its_metadata(model, cli, tiny_model, tmp_path):
    image = model.generate(PROMPT, width=64, height=48, steps=3, seed=9)
    assert image.mode == "RGB" and image.size == (64, 48)
    expected = cli_png(cli, tmp_path, tiny_model, "--seed", 9, "-W", 64, "-H", 48, "-s", 3)
    same_pixels(image, expected)
    assert image.info["parameters"] == expected.info["parameters"]
    assert image.info["klein"] == expected.info["klein"]
    assert (image.info["seed"], image.info["steps"]) == (9, 3)

    # save() writes the file the CLI writes, byte for byte: pixels, text chunks and the XMP
    # provenance record.
    klein_edge.save(image, tmp_path / "py.png")
    assert (tmp_path / "py.png").read_bytes() == (tmp_path / "cli.png").read_bytes()
    saved = Image.open(tmp_path / "py.png")
    assert "trainedAlgorithmicMedia" in saved.info["XML:com.adobe.xmp"]
    # The same for JPEG: the CLI's file for the same arguments, byte for byte.
    cli("generate", "-m", tiny_model, "-p", PROMPT, "--no-cache", "-q", "-o", tmp_path / "cli.jpg",
        "--seed", 9, "-W", 64, "-H", 48, "-s", 3)
    klein_edge.save(image, tmp_path / "py.jpg")
    assert (tmp_path / "py.jpg").read_bytes() == (tmp_path / "cli.jpg").read_bytes()
    with pytest.raises(klein_edge.KleinError, match="py.gif"):
        klein_edge.save(image, tmp_path / "py.gif")


def test_same_seed_same_image_and_a_random_seed_is_reported(model):
    a = model.generate(PROMPT, width=32, height=32, steps=2, seed=2**63 + 5)
    b = model.generate(PROMPT, width=32, height=32, steps=2, seed=2**63 + 5)
    assert a.tobytes() == b.tobytes()
    assert a.info["seed"] == 2**63 + 5
    c = model.generate(PROMPT, width=32, height=32, steps=2)
    assert 0 <= c.info["seed"] < 2**32
    again = model.generate(PROMPT, width=32, height=32, steps=2, seed=c.info["seed"])
    assert again.tobytes() == c.tobytes()


def test_an_empty_prompt_is_the_cli_image_of_the_empty_prompt(model, cli, tiny_model, tmp_path):
    # "" is a prompt (the official pipelines' unconditional one), not a missing one.
    image = model.generate("", width=64, height=48, steps=2, seed=8)
    expected = cli_png(cli, tmp_path, tiny_model, "--seed", 8, "-W", 64, "-H", 48, "-s", 2)
    assert image.tobytes() != expected.convert("RGB").tobytes()  # PROMPT's image: another one
    out = tmp_path / "empty.png"
    cli("generate", "-m", tiny_model, "-p", "", "--no-cache", "-q", "-o", out, "--seed", 8,
        "-W", 64, "-H", 48, "-s", 2)
    same_pixels(image, Image.open(out))
    assert image.info["klein"] == Image.open(out).info["klein"]
    assert json.loads(image.info["klein"])["prompt"] == ""
    assert model.generate("", width=64, height=48, steps=2, seed=8).tobytes() == image.tobytes()


def test_count_makes_a_batch_of_the_images_made_one_at_a_time(model):
    images = model.generate(PROMPT, width=32, height=48, steps=2, seed=40, count=3)
    assert [i.info["seed"] for i in images] == [40, 41, 42]
    for i, image in enumerate(images):
        alone = model.generate(PROMPT, width=32, height=48, steps=2, seed=40 + i)
        assert image.tobytes() == alone.tobytes()
        assert image.info["klein"] == alone.info["klein"]
    assert images[0].tobytes() != images[1].tobytes()


def test_inpainting_with_a_reference_from_pil_images_and_paths(model, cli, tiny_model,
                                                               testdata, tmp_path):
    case = testdata / "klein-tiny-edit" / "vectors" / "inpaint" / "inpaint_ref_s08_h64_w80"
    init, mask, ref = case / "init.png", case / "mask.png", case / "ref.png"
    expected = cli_png(cli, tmp_path, tiny_model, "--seed", 5, "-s", 4, "-r", ref,
                       "--init-image", init, "--mask", mask, "--strength", 0.8)
    # Images given as PIL images (in their own modes) and as paths make the same pixels.
    image = model.generate(PROMPT, seed=5, steps=4, references=[Image.open(ref)],
                           init_image=init, mask=Image.open(mask), strength=0.8)
    same_pixels(image, expected)
    image = model.generate(PROMPT, seed=5, steps=4, references=[str(ref)],
                           init_image=Image.open(init), mask=mask, strength=0.8)
    same_pixels(image, expected)
    assert image.info["parameters"] == expected.info["parameters"]


def test_loras_with_scales_are_the_cli_loras(model, cli, tiny_model, lora_fixtures, tmp_path):
    bfl, kohya = lora_fixtures / "bfl.safetensors", lora_fixtures / "kohya.safetensors"
    image = model.generate(PROMPT, width=64, height=64, steps=4, seed=4,
                           loras=[bfl, (str(kohya), 0.7)])
    expected = cli_png(cli, tmp_path, tiny_model, "--seed", 4, "-s", 4, "-W", 64, "-H", 64,
                       "--lora", bfl, "--lora", f"{kohya}:0.7")
    same_pixels(image, expected)
    assert "LoRA: bfl:1 kohya:0.7" in image.info["parameters"]
    plain = model.generate(PROMPT, width=64, height=64, steps=4, seed=4)
    assert plain.tobytes() != image.tobytes()


def test_zimage_guidance_options_are_the_cli_ones(cli, testdata, tmp_path):
    path = testdata / "zimage-tiny" / "model"
    with klein_edge.Model(path, threads=2) as zimage:
        image = zimage.generate(PROMPT, width=64, height=48, steps=3, seed=4, guidance=3,
                                negative_prompt="blurry", cfg_normalization=1,
                                cfg_truncation=0.5)
    expected = cli_png(cli, tmp_path, path, "--seed", 4, "-W", 64, "-H", 48, "-s", 3, "-g", 3,
                       "-n", "blurry", "--cfg-normalization", 1, "--cfg-truncation", 0.5)
    same_pixels(image, expected)
    assert image.info["klein"] == expected.info["klein"]


def test_zimage_step_cache_is_the_cli_one(cli, testdata, tmp_path):
    path = testdata / "zimage-tiny" / "model"
    with klein_edge.Model(path, threads=2) as zimage:
        image = zimage.generate(PROMPT, width=64, height=48, steps=3, seed=4, guidance=3,
                                cache="first-block:1e9")
        plain = zimage.generate(PROMPT, width=64, height=48, steps=3, seed=4, guidance=3)
        with pytest.raises(klein_edge.KleinError, match="params.cache: expected first-block:T"):
            zimage.generate(PROMPT, width=64, height=48, steps=3, cache="fbc")
    expected = cli_png(cli, tmp_path, path, "--seed", 4, "-W", 64, "-H", 48, "-s", 3, "-g", 3,
                       "--cache", "first-block:1e9")
    same_pixels(image, expected)
    assert plain.tobytes() != image.tobytes()
    assert json.loads(image.info["klein"])["step_cache"] == {
        "method": "first-block", "threshold": 1e9, "computed": 1, "skipped": 2}


def test_zimage_inpainting_is_the_cli_image(cli, testdata, tmp_path):
    path = testdata / "zimage-tiny" / "model"
    case = testdata / "zimage-control" / "vectors" / "e2e" / "inpaint_rect_h64_w80"
    init, mask = case / "init.png", case / "mask.png"
    with klein_edge.Model(path, threads=2) as zimage:
        image = zimage.generate(PROMPT, steps=3, seed=8, init_image=Image.open(init), mask=mask,
                                strength=0.8)
    expected = cli_png(cli, tmp_path, path, "--seed", 8, "-s", 3, "--init-image", init,
                       "--mask", mask, "--strength", 0.8)
    same_pixels(image, expected)
    assert image.size == (80, 64)
    assert image.info["parameters"] == expected.info["parameters"]


def test_zimage_controlnet_is_the_cli_image(cli, testdata, tmp_path):
    set_dir = testdata / "zimage-control"
    control = set_dir / "vectors" / "e2e" / "controlnet_c075_h64_w96" / "control.png"
    with klein_edge.Model(set_dir / "model", threads=2) as zimage:
        image = zimage.generate(PROMPT, steps=3, seed=5, controlnet=set_dir / "controlnet",
                                control_image=Image.open(control), control_scale=0.9)
    expected = cli_png(cli, tmp_path, set_dir / "model", "--seed", 5, "-s", 3,
                       "--controlnet", set_dir / "controlnet", "--control-image", control,
                       "--control-scale", 0.9)
    same_pixels(image, expected)
    assert image.size == (96, 64)


def test_flux_dev_with_its_embedded_guidance_is_the_cli_image(cli, tmp_path):
    path = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "flux2-dev-tiny" / "model"
    with klein_edge.Model(path, threads=2) as dev:
        image = dev.generate(PROMPT, width=64, height=48, steps=2, seed=6, guidance=4)
        other = dev.generate(PROMPT, width=64, height=48, steps=2, seed=6, guidance=1.5)
    expected = cli_png(cli, tmp_path, path, "--seed", 6, "-W", 64, "-H", 48, "-s", 2, "-g", 4)
    same_pixels(image, expected)
    assert other.tobytes() != image.tobytes()


def test_progress_and_preview_see_every_step(model):
    phases, previews = [], []
    model.generate(PROMPT, width=64, height=48, steps=3, seed=1,
                   progress=lambda phase, done, total, s: phases.append((phase, done, total)),
                   preview=lambda step, steps, im: previews.append((step, steps, im.size)))
    denoise = [(d, t) for p, d, t in phases if p == "denoise"]
    assert denoise[0] == (0, 3) and (1, 3) in denoise and (3, 3) in denoise
    assert {p for p, _, _ in phases} >= {"text encoder", "denoise", "vae decode"}
    assert previews == [(1, 3, (8, 6)), (2, 3, (8, 6)), (3, 3, (8, 6))]


def test_tiny_decoder_previews_and_decodes_as_the_cli(model, cli, tiny_model, tmp_path):
    taef2 = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "taef2" / "taef2_decoder.pth"
    previews = []
    image = model.generate(PROMPT, width=64, height=48, steps=2, seed=3, tiny_vae=taef2,
                           decoder="tiny", preview_size=32,
                           preview=lambda step, steps, im: previews.append(im.size))
    expected = cli_png(cli, tmp_path, tiny_model, "--seed", 3, "-W", 64, "-H", 48, "-s", 2,
                       "--tiny-vae", taef2, "--decoder", "tiny")
    same_pixels(image, expected)
    assert json.loads(image.info["klein"])["decoder"] == {"name": "tiny",
                                                          "file": "taef2_decoder.pth"}
    # 8x6 latent cells, at most 4 a side: 2x2 cells each, 4x3 of them.
    assert previews == [(32, 24), (32, 24)]
    full = model.generate(PROMPT, width=64, height=48, steps=2, seed=3, tiny_vae=taef2)
    same_pixels(full, cli_png(cli, tmp_path, tiny_model, "--seed", 3, "-W", 64, "-H", 48,
                              "-s", 2))
    # Neither tiny_vae nor a container holding a tiny decoder: the engine refuses it.
    with pytest.raises(klein_edge.KleinError, match="no tiny decoder"):
        model.generate(PROMPT, width=64, height=48, steps=2, decoder="tiny")
    with pytest.raises(ValueError, match="decoder"):
        model.generate(PROMPT, width=64, height=48, steps=2, decoder="small")


def test_a_callback_returning_true_cancels_and_the_model_goes_on(model):
    stop = lambda phase, done, total, s: phase == "denoise" and done == 1
    with pytest.raises(klein_edge.Cancelled):
        model.generate(PROMPT, width=32, height=32, steps=4, seed=1, progress=stop)
    with pytest.raises(klein_edge.Cancelled):
        model.generate(PROMPT, width=32, height=32, steps=4, seed=1,
                       preview=lambda step, steps, im: step == 2)
    assert model.generate(PROMPT, width=32, height=32, steps=2, seed=1).size == (32, 32)


def test_cancel_from_another_thread(model):
    # The generating thread waits (inside its progress callback, after the first step) until
    # the other thread has called cancel, so the cancel lands during the generation.
    started, cancelled = threading.Event(), threading.Event()

    def canceller():
        started.wait(30)
        model.cancel()
        cancelled.set()

    def progress(phase, done, total, seconds):
        if phase == "denoise" and done == 1:
            started.set()
            assert cancelled.wait(30)

    thread = threading.Thread(target=canceller)
    thread.start()
    with pytest.raises(klein_edge.Cancelled, match="cancelled"):
        model.generate(PROMPT, width=32, height=32, steps=6, seed=3, progress=progress)
    thread.join()
    # A cancel when nothing runs does not stop the next generation.
    model.cancel()
    assert model.generate(PROMPT, width=32, height=32, steps=2, seed=3).size == (32, 32)


def test_an_exception_in_a_callback_comes_out_of_generate(model):
    def progress(phase, done, total, seconds):
        if phase == "denoise" and done == 2:
            raise ZeroDivisionError("from the callback")

    with pytest.raises(ZeroDivisionError, match="from the callback"):
        model.generate(PROMPT, width=32, height=32, steps=4, seed=1, progress=progress)
    assert model.generate(PROMPT, width=32, height=32, steps=2, seed=1).size == (32, 32)


def test_ctrl_c_stops_the_generation_and_raises_keyboard_interrupt(tiny_model, tmp_path):
    # A generation of 1000 steps (minutes) in a child Python, interrupted after its first step.
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import sys, time, klein_edge\n"
        "m = klein_edge.Model(sys.argv[1], threads=1)\n"
        "def progress(phase, done, total, s):\n"
        "    if phase == 'denoise' and done == 1:\n"
        "        print('denoising', flush=True)\n"
        "try:\n"
        "    m.generate('x', width=128, height=128, steps=1000, seed=1, progress=progress)\n"
        "    print('finished')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
        "print(m.generate('x', width=32, height=32, steps=1, seed=1).size)\n")
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(klein_edge.__file__).parents[1]))
    child = subprocess.Popen([sys.executable, str(script), str(tiny_model)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "denoising", child.stderr.read()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert out.split() == ["interrupted", "(32,", "32)"], err
