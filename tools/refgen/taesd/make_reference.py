#!/usr/bin/python3
"""Reference values of the tiny autoencoders (tests/taesd) from madebyollin/taesd's own taesd.py.

    /usr/bin/python3 tools/refgen/taesd/make_reference.py TAESD_DIR [OUT_DIR] [--astronaut PNG]

TAESD_DIR holds taesd.py and taef2_{encoder,decoder}.pth of madebyollin/taesd at commit
5cccb12dc72074a4be35680c3b108548a7c69978 (the .pth files are the ones in tests/data/taef2,
byte for byte; the script checks their sha256). OUT_DIR defaults to tests/data/taef2.
Debian's torch 1.13 on the CPU, float32, one thread; nothing is downloaded.

Writes:
  ref/taef2_{dec,enc}_in.npy          fixed inputs: latents [1, 32, 2, 3] (decoder), an image
                                      [1, 3, 16, 24] in [0, 1] (encoder)
  ref/taef2_{dec,enc}_NN.npy          the output of layer NN of taesd.py's nn.Sequential (all
                                      but the decoder's 1, 6, 11, 16: fused into the next)
  taef1_random_decoder.safetensors    a TAEF1-shaped network (16 latent channels, no GroupNorm
  taef1_random_encoder.pth            pools) with seeded random weights, every value a small
                                      multiple of a power of two (exact in float16, stored as
                                      F16: the decoder as safetensors, the encoder by torch.save)
  ref/taef1_{dec,enc}_in.npy, ref/taef1_{dec,enc}_NN.npy
                                      the same for it: latents [1, 16, 1, 2], image [1, 3, 8, 16]
  bad/*.pth                           small files the .pth reader must refuse or read (below)
  astronaut-128.png                   a public-domain photograph (NASA's portrait of Eileen
                                      Collins, scikit-image's skimage/data/astronaut.png, 512x512)
                                      reduced to 128x128 with Pillow's LANCZOS; made only when
                                      --astronaut names that file, else read as committed
  ref/photo.json                      TAEF2's round trip of it: decoder(encoder(x)).clamp(0, 1)
                                      against x, PSNR (dB) and SSIM (Gaussian window 11, sigma 1.5,
                                      K1 0.01, K2 0.03, per channel over the valid windows, float64)
  ref/manifest.json                   versions, hashes, shapes
"""
import hashlib
import io
import json
import os
import struct
import sys
import zipfile

import numpy as np
import torch

TAESD_COMMIT = "5cccb12dc72074a4be35680c3b108548a7c69978"
SHA256 = {
    "taef2_encoder.pth": "10a4e1021e89d7551eaf161352da8dbd0b1aa83872ae28b150c1df1ce2f147b6",
    "taef2_decoder.pth": "0a44a31e1ae59eb9dbf9359d24942fd3ef5928162c1800d97a28c61d51be0ab5",
}


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def save(path, array):
    np.save(path, np.ascontiguousarray(array.detach().numpy().astype(np.float32)))


def run_layers(net, x, prefix, out):
    """Runs the nn.Sequential layer by layer, saving each layer's output as prefix_NN.npy;
    not those the engine fuses into the next layer (an Upsample, a conv whose next layer is a
    ReLU), which have no output of their own there."""
    shapes = {}
    with torch.no_grad():
        for i, layer in enumerate(net):
            x = layer(x)
            fused = isinstance(layer, torch.nn.Upsample) or (
                i + 1 < len(net) and isinstance(net[i + 1], torch.nn.ReLU))
            if fused:
                continue
            save(os.path.join(out, f"{prefix}_{i:02d}.npy"), x[0])
            shapes[f"{prefix}_{i:02d}"] = list(x.shape[1:])
    return x, shapes


def write_safetensors(path, tensors):
    """A .safetensors file of float16 tensors (the format's header, then the raw bytes)."""
    header, body = {}, b""
    for name, t in tensors.items():
        raw = t.detach().contiguous().half().numpy().tobytes()
        header[name] = {"dtype": "F16", "shape": list(t.shape),
                        "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)


def seeded_weights(net, seed):
    """Draws every parameter again: PyTorch's default init, then rounded to a multiple of a
    power of two near a quarter of its spread (a few distinct values, all exact in float16).
    GroupNorm weights stay 1 + a small multiple, biases small."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            fan_in = p[0].numel() if p.dim() > 1 else 64
            std = (1.0 / fan_in) ** 0.5
            step = 2.0 ** round(np.log2(std / 4))
            v = torch.randn(p.shape, generator=g) * std
            if name.endswith("bias"):
                v = v * 0.5
            v = torch.round(v / step) * step
            if p.dim() == 1 and "pool.1.weight" in name:
                v = 1 + v
            p.copy_(v)


def ssim(a, b):
    """Mean SSIM of two [C, H, W] float64 arrays in [0, 1] (Wang et al. 2004): Gaussian
    window 11x11, sigma 1.5, over the valid positions, per channel, then averaged."""
    x = np.arange(11) - 5
    g = np.exp(-(x ** 2) / (2 * 1.5 ** 2))
    g /= g.sum()

    def blur(img):  # separable, 'valid'
        rows = np.stack([np.convolve(r, g, mode="valid") for r in img])
        return np.stack([np.convolve(c, g, mode="valid") for c in rows.T]).T

    c1, c2 = 0.01 ** 2, 0.03 ** 2
    out = []
    for p, q in zip(a, b):
        mp, mq = blur(p), blur(q)
        vp, vq, cov = blur(p * p) - mp * mp, blur(q * q) - mq * mq, blur(p * q) - mp * mq
        s = ((2 * mp * mq + c1) * (2 * cov + c2)) / ((mp * mp + mq * mq + c1) * (vp + vq + c2))
        out.append(s.mean())
    return float(np.mean(out))


def photo_round_trip(tae, out, astronaut):
    from PIL import Image
    path = os.path.join(out, "astronaut-128.png")
    if astronaut:
        Image.open(astronaut).convert("RGB").resize((128, 128), Image.LANCZOS).save(path)
    x = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0)
    x = x.permute(2, 0, 1)[None].contiguous()
    with torch.no_grad():
        y = tae.decoder(tae.encoder(x)).clamp(0, 1)
    a, b = x[0].double().numpy(), y[0].double().numpy()
    mse = float(np.mean((a - b) ** 2))
    return {"image": "astronaut-128.png", "psnr_db": 10 * np.log10(1.0 / mse), "ssim": ssim(b, a),
            "what": "decoder(encoder(x)).clamp(0, 1) against x, float64, x = pixels / 255"}


def bad_files(out):
    """Files for the reader's refusals, and one with views into shared storages."""
    os.makedirs(out, exist_ok=True)
    # A state dict with a float besides the tensor: BINFLOAT, which the reader refuses.
    torch.save({"w": torch.zeros(2), "lr": 0.5}, os.path.join(out, "float_value.pth"))
    # A transposed (not row-major) tensor.
    torch.save({"t": torch.arange(6.0).reshape(3, 2).t()}, os.path.join(out, "transposed.pth"))
    # Views of one storage at offsets, and a float16 tensor: read, not refused.
    x = torch.arange(12.0).reshape(4, 3)
    torch.save({"whole": x, "rows": x[1:3], "half": torch.arange(4, dtype=torch.float16) / 4},
               os.path.join(out, "views.pth"))
    # A storage entry 4 bytes shorter than its tensor needs (the pickle says 12 floats).
    saved = io.BytesIO()
    torch.save({"whole": x}, saved)
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(
            os.path.join(out, "short_storage.pth"), "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("/data/0"):
                data = data[:-4]
            name = "short_storage/" + info.filename.split("/", 1)[1]
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    # A pickle that would call os.system if unpickled: GLOBAL 'os system', REDUCE.
    evil = (b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
    with zipfile.ZipFile(os.path.join(out, "os_system.pth"), "w", zipfile.ZIP_STORED) as z:
        for name, data in [("data.pkl", evil), ("byteorder", b"little"), ("version", b"3\n")]:
            z.writestr(zipfile.ZipInfo("os_system/" + name, date_time=(1980, 1, 1, 0, 0, 0)), data)


def main():
    args = sys.argv[1:]
    astronaut = None
    if "--astronaut" in args:
        i = args.index("--astronaut")
        astronaut = args[i + 1]
        del args[i:i + 2]
    taesd_dir = args[0]
    out = args[1] if len(args) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "data", "taef2")
    out = os.path.abspath(out)
    ref = os.path.join(out, "ref")
    os.makedirs(ref, exist_ok=True)
    torch.set_num_threads(1)
    sys.path.insert(0, taesd_dir)
    import taesd  # noqa: E402  (madebyollin/taesd's taesd.py)

    for name, digest in SHA256.items():
        got = sha256(os.path.join(taesd_dir, name))
        assert got == digest, f"{name}: sha256 {got}, expected {digest} (commit {TAESD_COMMIT})"

    manifest = {"taesd_commit": TAESD_COMMIT, "torch": torch.__version__, "numpy": np.__version__,
                "shapes": {}}
    # TAEF2, the published weights, through taesd.py's own loading (the file name picks
    # 32 latent channels and the flux_2 variant).
    tae = taesd.TAESD(os.path.join(taesd_dir, "taef2_encoder.pth"),
                      os.path.join(taesd_dir, "taef2_decoder.pth")).float().eval()
    g = torch.Generator().manual_seed(2)
    latents = torch.randn(1, 32, 2, 3, generator=g) * 1.5
    save(os.path.join(ref, "taef2_dec_in.npy"), latents[0])
    _, shapes = run_layers(tae.decoder, latents, "taef2_dec", ref)
    manifest["shapes"].update(shapes)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 16), torch.linspace(0, 1, 24), indexing="ij")
    image = torch.stack([xx, yy, 0.5 + 0.5 * torch.sin(6 * xx + 4 * yy)])[None]
    image = (0.8 * image + 0.2 * torch.rand(1, 3, 16, 24, generator=g)).clamp(0, 1)
    save(os.path.join(ref, "taef2_enc_in.npy"), image[0])
    _, shapes = run_layers(tae.encoder, image, "taef2_enc", ref)
    manifest["shapes"].update(shapes)

    with open(os.path.join(ref, "photo.json"), "w") as f:
        json.dump(photo_round_trip(tae, out, astronaut), f, indent=1, sort_keys=True)
        f.write("\n")

    # TAEF1's shape with seeded weights (taef1's published weights are not in the snapshot).
    decoder, encoder = taesd.Decoder(16), taesd.Encoder(16)
    seeded_weights(decoder, 11)
    seeded_weights(encoder, 12)
    write_safetensors(os.path.join(out, "taef1_random_decoder.safetensors"), decoder.state_dict())
    torch.save({k: v.half() for k, v in encoder.state_dict().items()},
               os.path.join(out, "taef1_random_encoder.pth"))
    latents = torch.randn(1, 16, 1, 2, generator=g) * 1.5
    save(os.path.join(ref, "taef1_dec_in.npy"), latents[0])
    _, shapes = run_layers(decoder.eval(), latents, "taef1_dec", ref)
    manifest["shapes"].update(shapes)
    image = torch.rand(1, 3, 8, 16, generator=g)
    save(os.path.join(ref, "taef1_enc_in.npy"), image[0])
    _, shapes = run_layers(encoder.eval(), image, "taef1_enc", ref)
    manifest["shapes"].update(shapes)

    bad_files(os.path.join(out, "bad"))
    manifest["sha256"] = {os.path.relpath(os.path.join(d, f), out): sha256(os.path.join(d, f))
                          for d in (out, os.path.join(out, "bad"))
                          for f in sorted(os.listdir(d)) if f.endswith((".pth", ".safetensors"))}
    with open(os.path.join(ref, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
