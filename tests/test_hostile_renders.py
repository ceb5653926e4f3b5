"""Chart code that attacks the parent instead of the sandbox (issue 12, items 1-3, 5).

The corpus is ``tests/hostile/*.py``, chart programs written for these tests: each says in its
docstring what it attempts. The scoring process (``mmrft verify chart_code`` in a subprocess,
exactly as a user runs it) must return within the verifier budget plus a few seconds with a
peak RSS under 500 MB, and score every hostile program 0 with the parent's own reason; code that
searches the disk for its answer must score no more than an honest chart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("skimage")

from helpers import verify_measured

from mmrft.data import Sample, read_mmrft_jsonl
from mmrft.plugins import VERIFIERS

REPO = Path(__file__).resolve().parents[1]
HOSTILE = Path(__file__).parent / "hostile"
CHARTS = REPO / "assets" / "benchmarks" / "charts"
PEAK_RSS_MB = 500  # the bound on the parent's peak resident memory
GRACE_S = 15  # "the verifier timeout plus a few seconds": server start-up on a loaded 2-core VM

#: corpus file -> the reason the parent must give (score 0)
EXPECTED = {
    "report_huge_count.py": "bad element report",
    "report_float_counts.py": "bad element report",
    "report_deep_nesting.py": "bad element report",
    "report_many_entries.py": "bad element report",
    "report_patched_writer.py": "bad element report",
    "output_huge_report.py": "file too large",
    "output_giant_png.py": "wrong size",
    "output_big_render.py": "wrong size",
    "output_not_a_png.py": "bad render",
    "forge_reason.py": "exit code 1",
}


def answer(code: str) -> str:
    return f"<answer>```python\n{code}```</answer>"


def verify_in_subprocess(lines: list[dict], tmp_path: Path, *params: str, limit_s: float):
    """Run ``mmrft verify chart_code`` in a fresh process; its scores, wall time and peak RSS
    (the verifying process alone: the sandbox's processes are its children)."""
    return verify_measured("chart_code", lines, tmp_path, *params, timeout_s=limit_s + 60)


@pytest.fixture(scope="module")
def bar() -> Sample:
    samples, _ = read_mmrft_jsonl(CHARTS / "code_test.jsonl")
    return next(s for s in samples if s.meta["kind"] == "bar")


def test_corpus_covers_every_file():
    assert {p.name for p in HOSTILE.glob("*.py")} == set(EXPECTED) | {"seek_answer.py"}


def test_hostile_reports_and_outputs_score_zero_in_bounded_time_and_memory(bar, tmp_path):
    record = {"target": bar.target, "meta": bar.meta}
    lines = [{"id": "honest", "completion": answer(bar.target), **record}]
    lines += [
        {"id": name, "completion": answer((HOSTILE / name).read_text()), **record}
        for name in EXPECTED
    ]
    budget_s = 120.0
    scores, stats, proc = verify_in_subprocess(
        lines, tmp_path, "timeout_s=20", f"reward.timeout_s={budget_s:g}", limit_s=budget_s
    )
    assert stats["status"] == 0, proc.stderr[-2000:]
    print(f"{len(lines)} completions: {stats['seconds']:.1f} s, peak RSS {stats['peak_mb']:.0f} MB")
    assert stats["seconds"] < budget_s + GRACE_S
    assert stats["peak_mb"] < PEAK_RSS_MB
    assert scores["honest"]["score"] >= 0.99
    got = {name: (scores[name]["score"], scores[name]["reason"]) for name in EXPECTED}
    assert got == {name: (0.0, reason) for name, reason in EXPECTED.items()}


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_verify_returns_within_its_budget_when_a_render_does_not(bar, tmp_path):
    """A render that would run for a minute: ``mmrft verify`` scores it ``timeout`` after its
    2 s budget and the process exits at once, its sandbox processes with it."""
    lines = [{"id": "loop", "completion": answer("while True:\n    pass\n"), "target": bar.target}]
    start = time.monotonic()
    scores, stats, _ = verify_in_subprocess(
        lines, tmp_path, "timeout_s=60", "reward.timeout_s=2", limit_s=2
    )
    elapsed = time.monotonic() - start  # until the process exited, not just until it printed
    assert (scores["loop"]["score"], scores["loop"]["reason"]) == (0.0, "timeout")
    assert stats["seconds"] < 2 + GRACE_S and elapsed < 2 + GRACE_S, (stats, elapsed)


def test_report_parser_rejects_forgeries_quickly():
    """The parser alone, on reports no sandbox run is needed for."""
    render = pytest.importorskip("mmrft.verifiers.render")
    good = {"texts": ["A"], "types": {"bar": 1}, "colours": {"bar": [[1, 0, 0]]},
            "layout": [[1, 1, 0, 1, 0, 1], ["free", 0.1, 0.1, 0.8, 0.8]],
            "figsize": [2.0, 1.5], "dpi": 80}  # fmt: skip
    assert render._parse_elements(json.dumps(good).encode()) is not None
    forged = [
        {**good, "types": {"bar": 10**12}},
        {**good, "types": {"bar": True}},
        {**good, "types": {"bar": 1.0}},
        {**good, "texts": ["x" * 10_000]},
        {**good, "texts": [["nested"]]},
        {**good, "colours": {"bar": [[float("nan"), 0, 0]]}},
        {**good, "layout": [[1, 1, 0, 1, 0]]},
        {**good, "figsize": [float("inf"), 1.5]},
        {**good, "dpi": -1},
        {k: v for k, v in good.items() if k != "dpi"},
        ["not", "an", "object"],
    ]
    for report in forged:
        assert render._parse_elements(json.dumps(report).encode()) is None, report
    assert render._parse_elements(b"[" * 100_000 + b"]" * 100_000) is None
    assert render._parse_elements(b"{" + b" " * (2 << 20) + b"}") is None  # over the cap
    assert render.count_f1({"bar": 10**12}, {"bar": 1}) < 1e-11


def test_images_are_decoded_at_a_bounded_size():
    """Item 2 without a sandbox run: refusals come from the header, before any decoding."""
    import io

    from mmrft.verifiers import render
    from PIL import Image

    def png(size: tuple[int, int]) -> bytes:
        buffer = io.BytesIO()
        Image.new("L", size, 128).save(buffer, format="PNG")
        return buffer.getvalue()

    wide = png((2000, 1000))
    gray, _ = render._decode_gray(wide, fit=render.SCORE_PIXELS)
    assert gray.shape == (724, 1448) and gray.dtype.name == "float32"  # 1 MP, aspect kept
    assert render._decode_gray(wide, expect=(160, 120)) == (None, "wrong size")
    assert render._decode_gray(png((4000, 3000))) == (None, "too large")
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"
    assert render._decode_gray(eps) == (None, "bad render")  # never handed to Ghostscript


# -- answer-seeking code (item 3) -----------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, bar) -> tuple[Sample, str, Path]:
    """A chart-to-code dataset on disk, as a user keeps one: the JSONL with the reference
    script and the chart image the model is shown, under a title no other file holds."""
    marker = f"Quarterly widgets {uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("dataset")
    (root / "images").mkdir()
    code = bar.target.replace('ax.set_title("Scores")', f"ax.set_title({marker!r})")
    assert code != bar.target
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=root / "images",
        check=True,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    line = {
        "id": "secret-0",
        "messages": [{"role": "user", "content": [{"type": "image", "image": "images/chart.png"}]}],
        "target": code,
        "meta": bar.meta,
    }
    (root / "code.jsonl").write_text(json.dumps(line) + "\n")
    (sample,), _ = read_mmrft_jsonl(root / "code.jsonl")
    return sample, marker, root


def seeker(marker: str, seconds: float) -> str:
    code = (HOSTILE / "seek_answer.py").read_text()
    return code.replace("__MARKER__", marker).replace("__SECONDS__", str(seconds))


def honest(marker: str) -> str:
    """The seeker's own fallback: what it draws when it finds nothing."""
    return textwrap.dedent(
        f"""
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots()
        ax.bar(["A", "B", "C", "D", "E"], [60, 40, 40, 90, 20], color="#2ca02c")
        ax.set_title({marker!r})
        """
    )


def test_the_seeker_finds_its_answer_where_files_are_readable(dataset, tmp_path):
    """Outside the sandbox the hostile program does find the dataset and the image, so the
    tests below would catch a sandbox that let it."""
    _, marker, root = dataset
    script = "import matplotlib\nmatplotlib.rcParams.update({'figure.figsize': [2.0, 1.5], "
    script += "'figure.dpi': 80.0})\n" + seeker(marker, 20)
    script = script.replace('roots = ["/tmp"', f'roots = [{str(root)!r}, "/tmp"')
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("FOUND")]
    assert str(root / "code.jsonl") in found


@pytest.mark.parametrize(
    "disable",
    [(), ("mountns",), ("mountns", "landlock")],
    ids=["private-root", "landlock-read-rules", "neither"],
)
def test_answer_seeking_code_finds_nothing_in_the_sandbox(dataset, disable):
    """With a private root or Landlock read rules the seeker finds nothing; with both switched
    off it finds its answer, and the isolation report says so."""
    from mmrft.verifiers import render

    from mmrft.rewards.sandbox import _landlock_abi

    if "landlock" not in disable and disable and _landlock_abi() < 1:
        pytest.skip("without a mount namespace only Landlock hides files")
    sample, marker, _ = dataset
    ((ref, reason),) = render._references([sample.target]).values()
    assert ref is not None, reason
    job = render._chart_job(seeker(marker, 6), ref.elements["figsize"], ref.elements["dpi"], 30)
    result = render._pool("chart").run(dataclasses.replace(job, disable=disable))
    assert result.ok, (result.reason, result.stderr[-2000:])
    reads = result.isolation["reads"]
    if len(disable) == 2:
        assert "FOUND" in result.stdout and reads.startswith("unrestricted")
        assert any("no private root and no landlock" in f for f in result.isolation["fallbacks"])
    else:
        assert "FOUND" not in result.stdout, result.stdout
        assert reads.startswith("landlock" if disable else "private root")


def test_answer_seeking_code_scores_no_more_than_an_honest_chart(dataset):
    sample, marker, _ = dataset
    bound = VERIFIERS.get("chart_code").bind({"timeout_s": 30.0})
    hacker, fair, reference = bound(
        [answer(seeker(marker, 6)), answer(honest(marker)), answer(sample.target)], [sample] * 3
    )
    assert reference.value >= 0.99  # the answer it was looking for
    assert fair.value > 0 and hacker.value <= fair.value + 1e-9, (hacker, fair)
