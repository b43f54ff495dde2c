#!/usr/bin/env python3
"""WebP fixtures and what Pillow makes of them.

The official pipelines load reference and init images with Pillow and convert them to RGB
(diffusers' load_image: image.convert("RGB")). This script writes, with Pillow itself (which
decodes WebP with libwebp):

  lossy.webp          a 40x24 lossy WebP (quality 80) of an RGB picture
  lossy-ref.png       Image.open("lossy.webp").convert("RGB"), lossless
  alpha.webp          a 40x24 lossless WebP with an alpha channel (some pixels transparent)
  alpha-ref.png       Image.open("alpha.webp").convert("RGB"): alpha dropped, not composited
  animated.webp       two frames, which the engine refuses

Usage (Debian: python3-pil, python3-numpy):  /usr/bin/python3 tools/images/webp_fixture.py OUT_DIR
The outputs in tests/data/images were made by this script; do not edit them by hand.
"""
import os
import sys

import numpy as np
from PIL import Image


def picture():
    # Smooth ramps in every channel plus hard edges, so that the lossy codec's chroma
    # upsampling and rounding show.
    h, w = 24, 40
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // (w - 1)).astype(np.uint8)
    g = (y * 255 // (h - 1)).astype(np.uint8)
    b = np.where((x // 8 + y // 8) % 2 == 0, 30, 220).astype(np.uint8)
    return np.stack([r, g, b], axis=-1)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rgb = picture()
    Image.fromarray(rgb, "RGB").save(os.path.join(out, "lossy.webp"), quality=80, method=4)
    Image.open(os.path.join(out, "lossy.webp")).convert("RGB").save(os.path.join(out, "lossy-ref.png"))

    alpha = np.where(rgb[..., 0] > 128, 0, 255).astype(np.uint8)
    alpha[:, :4] = 128
    rgba = np.concatenate([rgb, alpha[..., None]], axis=-1)
    Image.fromarray(rgba, "RGBA").save(os.path.join(out, "alpha.webp"), lossless=True, exact=True)
    Image.open(os.path.join(out, "alpha.webp")).convert("RGB").save(os.path.join(out, "alpha-ref.png"))

    frames = [Image.fromarray(rgb, "RGB"), Image.fromarray(255 - rgb, "RGB")]
    frames[0].save(os.path.join(out, "animated.webp"), save_all=True, append_images=frames[1:],
                   duration=100, lossless=True)


if __name__ == "__main__":
    main()
