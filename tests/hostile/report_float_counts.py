"""Item 1: counts and sizes as huge floats, NaN and Infinity (json allows them in Python)."""

import json
import os
from pathlib import Path

import matplotlib.pyplot as plt

plt.bar(["A", "B"], [1, 2])
plt.savefig("chart.png")
report = json.loads(Path("elements.json").read_text())
report["types"] = {"bar": 1e308}
report["colours"] = {"bar": [[float("nan"), 0.0, 1e300]]}
report["figsize"] = [float("inf"), 1.5]
Path("elements.json").write_text(json.dumps(report))
os._exit(0)
