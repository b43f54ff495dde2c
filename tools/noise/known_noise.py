#!/usr/bin/env python3
"""Known answers for the seed-to-noise mapping, from its documented definition alone.

The engine's initial noise is defined in src/pipeline/noise.h: Philox-4x32 with 10 rounds
(Salmon et al., SC'11) keyed by the 64-bit seed (low word first), counter (pair index low
word, pair index high word, stream, 0), and the Box-Muller transform of the first two words in
double precision, rounded to float32. This script implements that text in plain Python
(no numpy, no engine code) and writes, for a few seeds and lengths, the float32 bit patterns
of the values; tests/pipeline/noise_test.cpp compares gaussian_noise() with them, so a change
to the mapping (and so to every seed's image) cannot pass unnoticed.

Usage: python3 tools/noise/known_noise.py > tests/data/noise/known_noise.json
The output in tests/data/noise was made by this script; do not edit it by hand.
"""
import json
import math
import struct

MASK = 0xFFFFFFFF


def philox4x32_10(counter, key):
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c3 ^ k1) & MASK, p0 & MASK
        k0 = (k0 + 0x9E3779B9) & MASK
        k1 = (k1 + 0xBB67AE85) & MASK
    return c0, c1, c2, c3


def noise(seed, n, stream=0):
    key = (seed & MASK, (seed >> 32) & MASK)
    out = []
    pair = 0
    while len(out) < n:
        r = philox4x32_10((pair & MASK, (pair >> 32) & MASK, stream, 0), key)
        u1 = (r[0] + 1) / 4294967296.0
        u2 = r[1] / 4294967296.0
        radius = math.sqrt(-2.0 * math.log(u1))
        angle = 2.0 * math.pi * u2
        out.append(radius * math.cos(angle))
        out.append(radius * math.sin(angle))
        pair += 1
    return out[:n]


def float32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def main():
    cases = []
    # Seeds at the edges of the 32-bit and 64-bit ranges, a typical one, and an odd length
    # (the last pair's second value unused).
    for seed, n in [(0, 16), (1, 9), (42, 64), (4294967295, 8), (4294967296, 8),
                    (15548176435081533121, 8), (18446744073709551615, 8), (42, 1001)]:
        values = noise(seed, n)
        cases.append({"seed": str(seed), "n": n,
                      "float32_bits": [float32_bits(v) for v in values]})
    # Stream 1 (the VAE's posterior sample) of the same seeds: other values.
    for seed, n in [(0, 16), (42, 33)]:
        values = noise(seed, n, 1)
        cases.append({"seed": str(seed), "n": n, "stream": 1,
                      "float32_bits": [float32_bits(v) for v in values]})
    print('{"definition": "src/pipeline/noise.h", "cases": [')
    print(",\n".join(json.dumps(c) for c in cases))
    print("]}")


if __name__ == "__main__":
    main()
