"""Fixtures for the watermark tests from the official `invisible-watermark` library.

Runs the library's dwtDct encoder and decoder (ShieldMnt/invisible-watermark, imported from a
source tree given on the command line; its package __init__ imports torch for the rivaGan
method, which dwtDct never touches, so an empty stand-in module is installed when torch is
missing) on crops of the library's own test photos, and `klein watermark --embed` on the same
crops, and writes into --out:

  <name>.png           the crop (the input of both encoders)
  <name>-official.webp the library's encoding of it with BFL's message (lossless WebP)
  manifest.json        per crop: the library's decoder on its own output and on ours (bits),
                       the FNV-1a 64 of our marked pixels (RGB rows, so a test can tell that it
                       made the very pixels the library read), how many pixels of ours differ
                       from the library's, PSNRs; and the PSNR of both marks on the two full
                       photos (docs/WATERMARK.md)

Debian 12: python3-opencv python3-pywt python3-numpy; run with /usr/bin/python3. The library
tree used for tests/data/watermark is ShieldMnt/invisible-watermark at commit
68d0376d94a4701ed240af0841ec12e00676e325 (its newest; the package's 0.2.0 code, which is what
`pip install invisible-watermark` gives BFL's flux2 repository: only README.md changed after the
0.2.0 version bump 85b1074). An exported tree (git archive) is not a checkout, so pass --commit:

  /usr/bin/python3 tools/watermark/official.py --imwatermark INVISIBLE_WATERMARK_CHECKOUT \
      --commit 68d0376d94a4701ed240af0841ec12e00676e325 --klein build/klein --out tests/data/watermark
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import types

import cv2
import numpy as np
import pywt

# BFL's message as flux2's src/flux2/watermark.py builds it: bin() of a 48-digit literal,
# which drops its two leading zeros (46 bits).
BFL_MESSAGE = 0b001010101111111010000111100111001111010100101110
BFL_BITS = [int(b) for b in bin(BFL_MESSAGE)[2:]]

# (name, photo, top, left, height, width): the smallest size the method takes, a non-square
# one, and one whose sides are not multiples of 4 (the library floors them). Only original.jpg
# is used: the provenance of the library's other test photo (peppers.png, a classic test image)
# is not clear enough to keep crops of it here.
CROPS = [
    ("original-256x256", "original.jpg", 600, 300, 256, 256),
    ("original-320x208", "original.jpg", 436, 800, 208, 320),
    ("original-270x250", "original.jpg", 415, 1100, 250, 270),
]


def load_library(root):
    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            sys.modules["torch"] = types.ModuleType("torch")
    sys.path.insert(0, root)
    from imwatermark import WatermarkDecoder, WatermarkEncoder
    return WatermarkEncoder, WatermarkDecoder


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return round(10 * math.log10(255.0 ** 2 / mse), 2)


def git_head(root):
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--imwatermark", required=True, help="invisible-watermark source tree")
    ap.add_argument("--commit", help="the tree's commit, when it is not a git checkout")
    ap.add_argument("--klein", required=True, help="the klein binary")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    Encoder, Decoder = load_library(args.imwatermark)

    def official_encode(bgr):
        e = Encoder()
        e.set_watermark("bits", BFL_BITS)
        return e.encode(bgr.copy(), "dwtDct")

    def official_decode(bgr):
        return "".join(str(int(b)) for b in Decoder("bits", len(BFL_BITS)).decode(bgr, "dwtDct"))

    def ours(bgr, tmp):
        src, dst = os.path.join(tmp, "in.png"), os.path.join(tmp, "out.png")
        cv2.imwrite(src, bgr)
        subprocess.run([args.klein, "watermark", "--embed", src, "-o", dst], check=True,
                       capture_output=True)
        return cv2.imread(dst, cv2.IMREAD_COLOR)

    os.makedirs(args.out, exist_ok=True)
    photos = os.path.join(args.imwatermark, "test_vectors")
    bfl = "".join(map(str, BFL_BITS))
    manifest = {
        "library": {"repository": "ShieldMnt/invisible-watermark", "commit": git_head(args.imwatermark) or args.commit,
                    "opencv": cv2.__version__, "pywavelets": pywt.__version__,
                    "numpy": np.__version__},
        "message_bits": bfl,
        "crops": [],
        "full_photos": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, photo, top, left, h, w in CROPS:
            bgr = np.ascontiguousarray(cv2.imread(os.path.join(photos, photo))[top:top + h, left:left + w])
            cv2.imwrite(os.path.join(args.out, name + ".png"), bgr)
            official = official_encode(bgr)
            cv2.imwrite(os.path.join(args.out, name + "-official.webp"), official,
                        [cv2.IMWRITE_WEBP_QUALITY, 101])  # above 100: lossless
            assert (cv2.imread(os.path.join(args.out, name + "-official.webp")) == official).all()
            mine = ours(bgr, tmp)
            differ = np.any(mine != official, axis=-1)
            manifest["crops"].append({
                "name": name, "width": w, "height": h,
                "official_decoder_on_official": official_decode(official),
                "official_decoder_on_ours": official_decode(mine),
                "ours_rgb_fnv1a64": fnv1a64(np.ascontiguousarray(mine[:, :, ::-1]).tobytes()),
                "pixels_differing_from_official": int(differ.sum()),
                "max_difference_from_official": int(np.abs(mine.astype(int) - official.astype(int)).max()),
                "psnr_official": psnr(bgr, official), "psnr_ours": psnr(bgr, mine),
            })
            print(manifest["crops"][-1])
        for photo in ("original.jpg",):
            bgr = cv2.imread(os.path.join(photos, photo))
            official, mine = official_encode(bgr), ours(bgr, tmp)
            manifest["full_photos"].append({
                "photo": photo, "width": bgr.shape[1], "height": bgr.shape[0],
                "psnr_official": psnr(bgr, official), "psnr_ours": psnr(bgr, mine),
                "official_decoder_on_official": official_decode(official) == bfl,
                "official_decoder_on_ours": official_decode(mine) == bfl,
                "pixels_differing_from_official": int(np.any(mine != official, axis=-1).sum()),
            })
            print(manifest["full_photos"][-1])
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
