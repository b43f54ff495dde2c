#!/usr/bin/python3
"""Error of candidate 4-bit weight formats against the container's Q4 (issue 34, part 2).

The Q4 kernels spend 3 float operations (a scale product and two fused multiply-adds) on every
block of 32 columns for every activation row, beside the 8 int8 dot products of that block;
where the two share execution units (Zen 4), that caps the kernel at 8 / 11 of the int8 peak.
A format whose scales cover 64 columns halves that work (cap 16 / 19), a symmetric one drops
the zero point's multiply-add (cap 8 / 10). This script measures what each would cost in
precision, with the same kind of search for every format, on weights drawn from a Gaussian and
from Student-t distributions (heavier tails), and the error of a whole product y = W x with
the activations quantized as the kernels do (int8, one scale per block of 32 or of 64, on
activations with heavy tails and a few large channels).

numpy only; deterministic (seeded). Usage: bench/q4_formats.py [--rows R] [--cols K]
Prints a markdown table (docs/SPEED.md keeps its output).
"""
import argparse

import numpy as np


def f16(v):
    return v.astype(np.float16).astype(np.float32)


def q4_code_scale(d):
    """The container's 8-bit scale code: an f16 with 3 mantissa bits, times 2^-8 (blocks.h)."""
    d = np.maximum(d, np.float32(2.0**-24))
    m, e = np.frexp(d * 256.0)  # d * 256 = m * 2^e, m in [0.5, 1)
    m = np.round(m * 16.0) / 16.0
    return (np.ldexp(m, e) / 256.0).astype(np.float32)


class Best:
    """The lowest-error candidate of every block so far (ties keep the earlier one)."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.err = np.full(blocks.shape[0], np.inf, np.float32)
        self.out = np.zeros_like(blocks)

    def offer(self, y):
        e = ((y - self.blocks) ** 2).sum(1)
        take = e < self.err
        self.err = np.where(take, e, self.err)
        self.out[take] = y[take]


def asym(x, block, scale_of, zero_steps):
    """Asymmetric 4-bit blocks: w = d (q - z), q in 0..15, with the container's search (25
    trials trimming the range 0..4 steps of 3 % at either end; the lowest squared error wins).
    scale_of rounds d to the format's scale; zero_steps > 0 rounds z to 1/zero_steps of a level
    (the container: 16), 0 keeps the minimum as an f16 instead (w = d q + m)."""
    b = x.reshape(-1, block)
    lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
    span = np.maximum(hi - lo, 1e-30)
    best = Best(b)
    for a in range(5):
        for c in range(5):
            l = lo + span * 0.03 * a
            w = span * (1 - 0.03 * (a + c))
            d = scale_of(w / 15.0)
            if zero_steps:
                z = np.clip(np.round(-l / d * zero_steps) / zero_steps, 0, 255 / zero_steps)
                q = np.clip(np.round(b / d + z), 0, 15)
                y = d * (q - z)
            else:
                m = f16(l)
                q = np.clip(np.round((b - m) / d), 0, 15)
                y = d * q + m
            best.offer(y)
    return best.out.reshape(x.shape)


def sym(x, block):
    """Symmetric 4-bit blocks with an f16 scale: w = d q, q in -8..7, scale searched over 16
    candidates between 0.75 and 1.0 of max|w| / 7 (the lowest squared error wins)."""
    b = x.reshape(-1, block)
    amax = np.maximum(np.abs(b).max(1, keepdims=True), 1e-30)
    best = Best(b)
    for t in np.linspace(0.75, 1.0, 16):
        d = f16(amax * t / 7.0)
        best.offer(d * np.clip(np.round(b / d), -8, 7))
    return best.out.reshape(x.shape)


def act_q8(x, block):
    """Activations as the kernels quantize them: int8, d = max|x| / 127 per block."""
    b = x.reshape(-1, block)
    d = np.abs(b).max(1, keepdims=True) / 127.0
    d = np.where(d > 0, d, 1.0)
    return (np.round(b / d).clip(-127, 127) * d).reshape(x.shape)


def act_q8_row(x):
    """Activations with one int8 scale per row (per token): d = max|x| / 127 over all of K."""
    d = np.abs(x).max(1, keepdims=True) / 127.0
    d = np.where(d > 0, d, 1.0)
    return np.round(x / d).clip(-127, 127) * d


def act_q8_pow2(x, block):
    """Activations with one float scale per row and, per block of 32, that scale divided by the
    largest power of two (up to 2^15) that still holds the block's max|x| in 127 steps: the
    kernel could then shift the integer sums into one per-row scale instead of multiplying
    each block's scales in float."""
    row = np.abs(x).max(1, keepdims=True) / 127.0
    row = np.where(row > 0, row, 1.0)
    b = x.reshape(x.shape[0], -1, block)
    amax = np.abs(b).max(2, keepdims=True) / 127.0
    k = np.floor(np.log2(row[:, :, None] / np.maximum(amax, 1e-30))).clip(0, 15)
    d = row[:, :, None] / 2.0**k
    return (np.round(b / d).clip(-127, 127) * d).reshape(x.shape)


FORMATS = [
    # name, bits per weight, activation quantizer, weight quantizer, cap on Zen 4
    ("Q4 (container): 32, 8-bit scale code + 8-bit zero", 4.5, lambda x: act_q8(x, 32),
     lambda w: asym(w, 32, q4_code_scale, 16), 8 / 11),
    ("Q4 weights, activations one scale per row", 4.5, act_q8_row,
     lambda w: asym(w, 32, q4_code_scale, 16), 8 / 10),
    ("Q4 weights, activations per-row scale / 2^k per block", 4.5, lambda x: act_q8_pow2(x, 32),
     lambda w: asym(w, 32, q4_code_scale, 16), 8 / 10),
    ("64, 8-bit scale code + 8-bit zero", 4.25, lambda x: act_q8(x, 64),
     lambda w: asym(w, 64, q4_code_scale, 16), 16 / 19),
    ("64, f16 scale + f16 minimum", 4.5, lambda x: act_q8(x, 64),
     lambda w: asym(w, 64, f16, 0), 16 / 19),
    ("32, symmetric, f16 scale", 4.5, lambda x: act_q8(x, 32), lambda w: sym(w, 32), 8 / 10),
    ("64, symmetric, f16 scale", 4.25, lambda x: act_q8(x, 64), lambda w: sym(w, 64), 16 / 18),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=3072)
    args = ap.parse_args()
    rng = np.random.default_rng(34)
    N, K, M = args.rows, args.cols, 64
    weights = {
        "Gaussian": rng.standard_normal((N, K)).astype(np.float32),
        "Student-t(5)": rng.standard_t(5, (N, K)).astype(np.float32),
        "Student-t(3)": rng.standard_t(3, (N, K)).astype(np.float32),
    }
    # Activations: heavy tails, and 8 of every 1024 channels 20x larger (the outlier channels
    # of transformer activations), so that blocks holding one differ from the others.
    x = rng.standard_t(4, (M, K)).astype(np.float32)
    x[:, rng.choice(K, K // 128, replace=False)] *= 20.0
    # The exact products, once per weight distribution.
    exact = {n: x.astype(np.float64) @ w.T.astype(np.float64) for n, w in weights.items()}

    print("| format | bits/weight | cap (Zen 4) | " +
          " | ".join(f"W RMSE {n}" for n in weights) + " | " +
          " | ".join(f"Wx error {n}" for n in weights) + " | x error |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in range(2 * len(weights) + 1)) + " |")
    for name, bpw, act, quant, cap in FORMATS:
        rmse, prod = [], []
        xq = act(x)
        for n, w in weights.items():
            wq = quant(w)
            rmse.append(np.sqrt(((wq - w) ** 2).mean() / (w**2).mean()))
            y = exact[n]
            yq = xq.astype(np.float64) @ wq.T.astype(np.float64)
            prod.append(np.sqrt(((yq - y) ** 2).mean() / (y**2).mean()))
        print(f"| {name} | {bpw} | {cap:.0%} | " + " | ".join(f"{v:.4f}" for v in rmse) +
              " | " + " | ".join(f"{v:.4f}" for v in prod) +
              f" | {np.sqrt(((xq - x) ** 2).mean() / (x**2).mean()):.4f} |")


if __name__ == "__main__":
    main()
