"""Item 1: a report nested 200 000 lists deep (a recursion error in a naive parser)."""

import os
from pathlib import Path

import matplotlib.pyplot as plt

plt.bar(["A", "B"], [1, 2])
plt.savefig("chart.png")
depth = 200_000
Path("elements.json").write_text('{"texts": ' + "[" * depth + "]" * depth + "}")
os._exit(0)
