"""The committed assets (bundled benchmarks and models) stay within 60 MB of file bytes; the
benchmarks alone have their own budget (tests/test_benchmarks.py). Built models that are not
committed (``assets/models/bench-*``, most readers: .gitignore) do not count."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ASSETS_BUDGET_BYTES = 60_000_000


def test_the_committed_assets_stay_within_budget() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: which assets are committed is git's answer")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "assets"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    sizes = Counter()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            sizes["/".join(Path(name).parts[:3])] += (REPO / name).stat().st_size
    total = sum(sizes.values())
    largest = ", ".join(f"{folder} {size / 1e6:.1f} MB" for folder, size in sizes.most_common(4))
    assert total < ASSETS_BUDGET_BYTES, f"committed assets take {total / 1e6:.2f} MB ({largest})"
