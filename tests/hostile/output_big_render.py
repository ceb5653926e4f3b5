"""Item 2: a real render far larger than the forced size (the reference is 160 × 120): the
chart is drawn again at 6000 × 4500 pixels over out.png, past the prelude's savefig."""

import os

import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg

fig, ax = plt.subplots()
ax.bar(["A", "B", "C", "D", "E"], [69, 39, 41, 91, 18])
fig.savefig("chart.png")
fig.set_size_inches(20, 15)
fig.set_dpi(300)
FigureCanvasAgg(fig).print_png("out.png")
os._exit(0)
