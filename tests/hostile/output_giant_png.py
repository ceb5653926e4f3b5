"""Item 2: a valid PNG of 30 000 × 30 000 gray pixels (900 MB decoded, 7 GB as float64)
written over the render; it compresses to about 1 MB."""

import os
import struct
import zlib

import matplotlib.pyplot as plt


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


plt.bar(["A", "B"], [1, 2])
plt.savefig("chart.png")
width = height = 30_000
packer = zlib.compressobj(9)
row = b"\0" * (width + 1)
with open("out.png", "wb") as fh:
    fh.write(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    )
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    fh.write(chunk(b"IDAT", data) + chunk(b"IEND", b""))
os._exit(0)
