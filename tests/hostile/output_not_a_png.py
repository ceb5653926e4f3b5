"""Item 2: out.png is an Encapsulated PostScript file (a decoder that tried every format
would hand it to Ghostscript in the parent)."""

import os
from pathlib import Path

import matplotlib.pyplot as plt

plt.bar(["A", "B"], [1, 2])
plt.savefig("chart.png")
Path("out.png").write_text("%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 160 120\nshowpage\n")
os._exit(0)
