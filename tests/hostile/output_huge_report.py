"""Item 2: a 60 MB element report (parsed whole, it took the parent to about 1 GB)."""

import os

import matplotlib.pyplot as plt

plt.bar(["A", "B"], [1, 2])
plt.savefig("chart.png")
with open("elements.json", "w") as fh:
    fh.write('{"texts": [')
    chunk = ",".join(['"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"'] * 10_000)
    for _ in range(180):
        fh.write(chunk + ",")
    fh.write('"x"], "types": {}, "colours": {}, "layout": [], "figsize": [2, 1.5], "dpi": 80}')
os._exit(0)
