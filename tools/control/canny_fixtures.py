#!/usr/bin/env python3
"""Reference edges for the engine's Canny (formats/image/canny.h), made by OpenCV itself.

For a few fixed images (drawn here from numpy seeds: shapes, a smooth colour field, a grey
image with noise) and thresholds (the ControlNet preprocessors' 100/200, others, a swapped and
a fractional pair), runs cv2.Canny(image, low, high) on the RGB array as controlnet_aux's
CannyDetector does (aperture 3, L1 gradient: the defaults) and writes the inputs and the edge
maps as PNG files beside a manifest. tests/formats/canny_test.cpp compares the engine's edges
with them pixel for pixel.

Usage: /usr/bin/python3 tools/control/canny_fixtures.py tests/data/canny
(Debian's python3-opencv and python3-numpy, python3-pil). The files in tests/data/canny were
made by this script; do not edit them by hand.
"""
import json
import os
import sys

import cv2
import numpy as np
from PIL import Image


def shapes(h, w, seed):
    rng = np.random.RandomState(seed)
    img = np.zeros((h, w, 3), np.float64)
    yy, xx = np.mgrid[0:h, 0:w]
    img += (xx / w * 120)[..., None]  # a horizontal ramp
    for _ in range(5):
        cy, cx, r = rng.randint(0, h), rng.randint(0, w), rng.randint(6, max(7, min(h, w) // 3))
        colour = rng.randint(0, 256, 3)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = colour
    for _ in range(3):
        y0, x0 = rng.randint(0, h - 8), rng.randint(0, w - 8)
        img[y0:y0 + rng.randint(4, h // 2), x0:x0 + rng.randint(4, w // 2)] = rng.randint(0, 256, 3)
    img += rng.normal(0, 6, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def field(h, w, seed):
    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(4):
            fy, fx, ph = rng.uniform(0.02, 0.2), rng.uniform(0.02, 0.2), rng.uniform(0, 6.3)
            img[..., c] += 40 * np.sin(fy * yy + fx * xx + ph)
    return np.clip(np.round(img + 128), 0, 255).astype(np.uint8)


def grey(h, w, seed):
    rng = np.random.RandomState(seed)
    g = rng.randint(0, 256, (h // 4, w // 4)).astype(np.uint8)
    g = cv2.resize(g, (w, h), interpolation=cv2.INTER_LINEAR)
    g = np.clip(g.astype(np.int32) + rng.randint(-10, 11, g.shape), 0, 255).astype(np.uint8)
    return np.repeat(g[..., None], 3, axis=2)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    images = {"shapes_96x64": shapes(64, 96, 1), "field_128x96": field(96, 128, 2),
              "grey_80x80": grey(80, 80, 3), "shapes_33x17": shapes(17, 33, 4)}
    thresholds = [(100, 200), (50, 150), (200, 100), (0.5, 30.7), (10, 400)]
    cases = []
    for name, rgb in images.items():
        Image.fromarray(rgb, "RGB").save(os.path.join(out, name + ".png"))
        for low, high in thresholds:
            edges = cv2.Canny(rgb, low, high)
            file = f"{name}_canny_{low}_{high}.png"
            Image.fromarray(edges, "L").save(os.path.join(out, file))
            cases.append({"input": name + ".png", "low": low, "high": high, "edges": file,
                          "edge_pixels": int((edges > 0).sum())})
    manifest = {"made_by": "tools/control/canny_fixtures.py", "opencv": cv2.__version__,
                "call": "cv2.Canny(rgb_uint8, low, high) (apertureSize 3, L2gradient False)",
                "cases": cases}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
