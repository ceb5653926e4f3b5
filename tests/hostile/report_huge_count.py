"""Item 1: a report with an enormous call count (the reported hang: the parent expanded the
multiset in one C call that never released the GIL). Draws a real bar chart, then replaces the
element report and exits before the prelude can rewrite it."""

import json
import os
from pathlib import Path

import matplotlib.pyplot as plt

fig, ax = plt.subplots()
ax.bar(["A", "B"], [1, 2])
fig.savefig("chart.png")
report = json.loads(Path("elements.json").read_text())
report["types"] = {"bar": 10**12, "plot": 10**15}
Path("elements.json").write_text(json.dumps(report))
os._exit(0)
