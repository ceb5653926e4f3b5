"""Item 1: no early exit: the chart patches json.dump, so that the prelude's own final capture
writes the forged report (a type with a billion calls, a 4000-digit integer)."""

import json

import matplotlib.pyplot as plt

_dump = json.dump


def forged(obj, fh, *args, **kwargs):
    if isinstance(obj, dict) and "types" in obj:
        obj = dict(obj, types={"bar": 10**9, "pie": int("9" * 4000)})
    return _dump(obj, fh, *args, **kwargs)


json.dump = forged
plt.bar(["A", "B"], [1, 2])
