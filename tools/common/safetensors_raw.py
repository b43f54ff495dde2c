"""safetensors files as raw bytes, for the fixture scripts of tools/ (standard library only).

A file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
data_offsets; an optional "__metadata__"), padded here with spaces to a multiple of 8, then the
tensors' bytes. These functions neither decode nor encode values: each script does that for
the dtypes it handles.
"""
import json
import struct


def read_raw(path):
    """name -> (dtype, shape, bytes), in the header's order, without "__metadata__"."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), body[begin:end])
    return out


def write_raw(path, tensors):
    """tensors: name -> (dtype, shape, bytes), written in that order, header compact."""
    header, offset = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, (_, _, raw) in tensors.items():
            f.write(raw)
