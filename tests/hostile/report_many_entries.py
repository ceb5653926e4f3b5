"""Item 1: just under the report's size cap, as many entries as fit: 150 000 texts, 5000
element kinds, 3000 axes (the prelude itself records at most REPORT_LIMITS of each)."""

import json
import os
from pathlib import Path

import matplotlib.pyplot as plt

plt.bar(["A", "B"], [1, 2])
plt.savefig("chart.png")
report = json.loads(Path("elements.json").read_text())
report["texts"] = ["A"] * 150_000
report["types"] = {f"k{i}": 1 for i in range(5000)}
report["layout"] = [[1, 1, 0, 1, 0, 1]] * 3000
Path("elements.json").write_text(json.dumps(report, separators=(",", ":")))
os._exit(0)
