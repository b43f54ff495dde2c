#!/usr/bin/env python3
"""A WebP with an EXIF orientation and what Pillow makes of it.

The official pipelines load reference images with diffusers' load_image, which turns them
upright by their EXIF orientation (PIL.ImageOps.exif_transpose) and converts them to RGB. This
script writes, with Pillow itself (whose WebP writer puts the EXIF chunk in with libwebpmux):

  exif6.webp          a 40x24 lossless WebP, red in its top-left corner, EXIF orientation 6
                      ("turn 90 degrees clockwise to display")
  exif6-ref.png       exif_transpose(Image.open("exif6.webp")).convert("RGB"): 24x40

Usage (Debian: python3-pil):  /usr/bin/python3 tools/images/exif_fixture.py OUT_DIR
The outputs in tests/data/images were made by this script; do not edit them by hand.
"""
import os
import sys

from PIL import Image, ImageOps


def picture():
    w, h = 40, 24
    image = Image.new("RGB", (w, h))
    image.putdata([(255, 0, 0) if x < 8 and y < 4 else (x * 255 // (w - 1), y * 255 // (h - 1), 128)
                   for y in range(h) for x in range(w)])
    return image


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    webp = os.path.join(out, "exif6.webp")
    picture().save(webp, lossless=True, exact=True, exif=exif.tobytes())
    upright = ImageOps.exif_transpose(Image.open(webp)).convert("RGB")
    upright.save(os.path.join(out, "exif6-ref.png"))


if __name__ == "__main__":
    main()
