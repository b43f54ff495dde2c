#!/usr/bin/env python3
"""Four-component JPEG fixtures and what Pillow makes of them.

The official pipelines load reference and init images with Pillow and convert them to RGB
(diffusers' load_image: image.convert("RGB")). For a CMYK or YCCK JPEG that means Pillow's
decoding (every component inverted, as Adobe writes them) and its CMYK -> RGB formula. This
script writes, with Pillow itself:

  cmyk.jpg           a 40x24 CMYK JPEG (Pillow's encoder: Adobe marker, plain CMYK)
  cmyk-ref.png       Image.open("cmyk.jpg").convert("RGB"), lossless

Usage (Debian: python3-pil, python3-numpy):  /usr/bin/python3 tools/images/cmyk_fixture.py OUT_DIR
The outputs in tests/data/images were made by this script; do not edit them by hand.
"""
import os
import sys

import numpy as np
from PIL import Image


def picture():
    # Smooth ramps in every ink plus a few hard edges, so that rounding and clipping show.
    h, w = 24, 40
    y, x = np.mgrid[0:h, 0:w]
    c = (x * 255 // (w - 1)).astype(np.uint8)
    m = (y * 255 // (h - 1)).astype(np.uint8)
    yy = ((x + y) * 255 // (w + h - 2)).astype(np.uint8)
    k = np.where((x // 8 + y // 8) % 2 == 0, 0, 180).astype(np.uint8)
    k[:, 36:] = 255
    return Image.fromarray(np.stack([c, m, yy, k], axis=-1), mode="CMYK")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "cmyk.jpg")
    picture().save(path, quality=92)
    with Image.open(path) as im:
        assert im.mode == "CMYK", im.mode
        im.convert("RGB").save(os.path.join(out, "cmyk-ref.png"))


if __name__ == "__main__":
    main()
