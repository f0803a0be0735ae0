"""A minimal safetensors reader and writer for the tests (8-byte little-endian header length, a
JSON header of dtype, shape and data_offsets per tensor, then the data), NumPy only, so that the
checkpoint tests need no safetensors package."""

import json
import struct

import numpy as np

# safetensors dtype -> (NumPy dtype of its storage, bytes per element); F8_E4M3 and BF16 are read
# as their bytes.
_TYPES = {"U8": np.uint8, "F8_E4M3": np.uint8, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read(path):
    """{name: (dtype, shape, NumPy array of the stored elements)} (BF16 as uint16 bits)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=_TYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], info["shape"], arr)
    return out


def write(path, tensors):
    """Writes {name: (dtype, shape, bytes)}."""
    header, chunks, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(bytes(data))
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
