"""The rendering verifiers chart_code and svg: self-similarity, the right sub-score dropping,
hostile code, blank renders, batching through one pool.map, SVG external resources."""

from __future__ import annotations

import glob
import importlib
import os
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("skimage")
cairosvg = pytest.importorskip("cairosvg")

from helpers import check_doctests, check_registered  # noqa: E402
from helpers import run_verifier as run  # noqa: E402

from mmrft.data import Sample, read_mmrft_jsonl  # noqa: E402
from mmrft.plugins import VERIFIERS  # noqa: E402
from mmrft.typecheck import ConfigError  # noqa: E402

render = importlib.import_module("mmrft.verifiers.render")
CHARTS = Path(__file__).resolve().parents[1] / "assets" / "benchmarks" / "charts"


def answer(code: str) -> str:
    return f"<think>draw it</think><answer>```python\n{code}```</answer>"


@pytest.fixture(scope="module")
def charts() -> list[Sample]:
    samples, _ = read_mmrft_jsonl(CHARTS / "code_test.jsonl")
    return samples


@pytest.fixture(scope="module")
def bar(charts) -> Sample:
    return next(s for s in charts if s.meta["kind"] == "bar")


def test_docstring_examples_run():
    check_doctests("mmrft.verifiers.render")


@pytest.mark.parametrize(("name", "low"), [("chart_code", 0.0), ("svg", -1.0)])
def test_registered_with_range_and_doc(name, low):
    check_registered(name, low)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("chart_code", {"low_level_weight": 0.0, "image_weight": 0.0}),
        ("chart_code", {"image_weight": -1.0}),
        ("chart_code", {"timeout_s": 0.0}),
        ("chart_code", {"answer_tag": ""}),
        ("svg", {"target_len": 0}),
        ("svg", {"length_weight": -0.1}),
    ],
)
def test_bad_params_fail_at_bind(name, params):
    with pytest.raises(ConfigError):
        VERIFIERS.get(name).bind(params)


# -- chart_code ------------------------------------------------------------------------------


def test_reference_scores_itself(charts):
    picked = [s for s in charts if s.meta["kind"] == "bar"][:2] + [
        s for s in charts if s.meta["kind"] == "line"
    ][:2]
    scores = run("chart_code", [answer(s.target) for s in picked], picked)
    for sample, score in zip(picked, scores):
        assert score.value >= 0.99, (sample.id, score)
        assert score.parts["exec"] == 1.0 and score.reason is None


def modify(sample: Sample, what: str) -> str:
    code, meta = sample.target, sample.meta
    if what == "colour":
        return code.replace(meta["colour"], "#d62728" if meta["colour"] != "#d62728" else "#1f77b4")
    if what == "values":
        return code.replace(str(meta["values"]), str([v // 2 + 5 for v in meta["values"]]))
    if what == "kind":
        assert meta["kind"] == "bar"
        return code.replace("ax.bar(", "ax.plot(").replace("ax.bar_label(bars, padding=1)\n", "")
    if what == "title":
        return "".join(line for line in code.splitlines(True) if "set_title" not in line)
    if what == "layout":
        return code.replace("fig, ax = plt.subplots(", "fig, (ax, _) = plt.subplots(1, 2, ")
    raise AssertionError(what)


@pytest.mark.parametrize(
    ("what", "drops"),
    [
        ("colour", ["colour"]),
        ("values", ["text_f1", "ssim"]),
        ("kind", ["type_f1", "colour"]),
        ("title", ["text_f1", "ssim"]),
        ("layout", ["layout_f1"]),
    ],
)
def test_modified_code_scores_lower_on_the_right_part(bar, what, drops):
    same, changed = run("chart_code", [answer(bar.target), answer(modify(bar, what))], [bar, bar])
    assert changed.value < same.value
    for part in drops:
        assert changed.parts[part] < same.parts[part], (part, changed.parts)
    untouched = {"text_f1", "type_f1", "colour", "layout_f1"} - set(drops)
    if what in ("colour", "layout"):  # these leave the other element checks alone
        for part in untouched - {"text_f1"}:
            assert changed.parts[part] == 1.0, (part, changed.parts)


def test_size_is_forced_to_the_reference(bar):
    bigger = bar.target.replace("figsize=(2.0, 1.5), dpi=80", "figsize=(8, 6), dpi=50")
    no_save = bar.target.replace('fig.savefig("chart.png", dpi=80)', "plt.show()")
    scores = run("chart_code", [answer(bigger), answer(no_save)], [bar, bar])
    assert [s.value for s in scores] == [1.0, 1.0]


def sandbox_dirs() -> set[str]:
    """This process's sandbox directories (other processes on the machine have their own)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"mmrft-sandbox-*{os.getpid()}.*")))


@pytest.mark.parametrize(
    ("code", "reasons"),
    [
        ("while True:\n    pass\n", {"timeout", "cpu limit"}),
        ("import os\nos.system('touch {out}')\n", {"exception: PermissionError"}),
        ("import subprocess\nsubprocess.run(['touch', '{out}'])\n", {"exception: PermissionError"}),
        ("print(open('/etc/passwd').read())\n", {"blank render"}),  # /etc/passwd is visible
        (  # the path does not even exist in the sandbox's filesystem
            "open('{out}', 'w').write('x')\n",
            {"exception: PermissionError", "exception: OSError", "exception: FileNotFoundError"},
        ),
        ("x = bytearray(8 * 1024 ** 3)\n", {"memory limit"}),
        ("x = [0] * (4 * 1024 ** 3)\n", {"memory limit"}),
        ("def f(\n", {"syntax error"}),
    ],
)
def test_hostile_code_scores_zero_and_leaves_nothing(bar, tmp_path, code, reasons):
    run("chart_code", [answer(bar.target)], [bar])  # warm pool and reference cache
    outside = tmp_path / "pwned"
    os.chmod(tmp_path, 0o777)  # writable by anyone: only the sandbox can stop the write
    before = sandbox_dirs()
    hostile = code.replace("{out}", str(outside))
    if "passwd" not in code:  # the rest fail before drawing
        hostile += "import matplotlib.pyplot as plt\nplt.plot([1, 2])\n"
    (score,) = run("chart_code", [answer(hostile)], [bar], timeout_s=2.0)
    assert score.value == 0.0
    assert score.reason in reasons, score
    assert "root:" not in repr(score)
    assert not outside.exists()
    assert sandbox_dirs() <= before


def test_blank_figure_scores_zero(bar):
    blank = "import matplotlib.pyplot as plt\nfig = plt.figure()\nfig.savefig('chart.png')\n"
    nothing = "x = 1\n"
    scores = run("chart_code", [answer(blank), answer(nothing)], [bar, bar])
    assert [(s.value, s.reason) for s in scores] == [(0.0, "blank render")] * 2
    assert scores[0].parts["exec"] == 1.0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no tags at all", "no answer tag"),
        ("<answer>```python\na = 1\n``` ```python\nb = 2\n```</answer>", "several code blocks"),
        ("<answer>```python\nimport matplotlib\n</answer>", "unclosed code block"),
    ],
)
def test_unparsable_answers(bar, text, reason):
    (score,) = run("chart_code", [text], [bar])
    assert (score.value, score.reason) == (0.0, reason)


def test_batch_of_eight_goes_through_one_map(bar, monkeypatch):
    run("chart_code", [answer(bar.target)], [bar])  # reference cached
    pool = render._pool("chart")
    calls: list[int] = []
    original = pool.map

    def spy(jobs):
        jobs = list(jobs)
        calls.append(len(jobs))
        return original(jobs)

    monkeypatch.setattr(pool, "map", spy)
    variants = ["colour", "values", "kind", "title", "layout"]
    completions = [answer(bar.target)] * 3 + [answer(modify(bar, v)) for v in variants]
    start = time.perf_counter()
    scores = run("chart_code", completions, [bar] * 8)
    elapsed = time.perf_counter() - start
    assert calls == [8]
    assert len(scores) == 8 and all(s.value > 0 for s in scores)
    print(f"8 completions on {pool.workers} workers: {elapsed:.2f} s")


def test_reference_failure_is_a_data_problem(bar):
    broken = Sample("b", [], target="raise RuntimeError('bad data')\n", meta=bar.meta)
    (score,) = run("chart_code", [answer(bar.target)], [broken])
    assert (score.value, score.reason) == (0.0, "reference failed: exception: RuntimeError")


# -- svg -------------------------------------------------------------------------------------

DOC = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="48" viewBox="0 0 64 48">'
    '<rect width="64" height="48" fill="white"/>'
    '<circle cx="{x}" cy="24" r="10" fill="#1f77b4"/>'
    '<rect x="36" y="8" width="20" height="30" fill="#d62728"/></svg>'
)


@pytest.fixture(scope="module")
def svg_sample(tmp_path_factory) -> Sample:
    path = tmp_path_factory.mktemp("svg") / "target.png"
    cairosvg.svg2png(bytestring=DOC.format(x=20).encode(), write_to=str(path))
    return Sample("svg-1", [{"role": "user", "content": [{"type": "image", "image": str(path)}]}])


def test_svg_same_scores_one_shifted_lower(svg_sample):
    same, shifted, far = run(
        "svg",
        [f"<answer>{DOC.format(x=x)}</answer>" for x in (20, 24, 50)],
        [svg_sample] * 3,
    )
    assert same.value == pytest.approx(1.0, abs=1e-3)
    assert same.value > shifted.value > far.value
    assert shifted.reason is None and "sim" in shifted.parts


def test_svg_target_from_meta_image_and_length_term(svg_sample):
    sample = Sample("svg-2", [], meta={"image": svg_sample.media("image")[0]})
    doc = DOC.format(x=20)
    plain, long = run(
        "svg",
        [f"<answer>{doc}</answer>"] * 2,
        [sample] * 2,
        length_weight=0.5,
        target_len=render.svg_tokens(doc) // 2,
    )
    assert plain.value == long.value == pytest.approx(0.5, abs=1e-3)
    assert plain.parts["length_penalty"] == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ("<svg><rect</svg>", "invalid svg"),
        ('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>', "blank render"),
        ("a picture of a circle", "no svg"),
        (
            '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
            'width="64" height="48"><image xlink:href="http://10.255.255.1/x.png" width="64" '
            'height="48"/></svg>',
            "external resource",
        ),
    ],
)
def test_svg_failures_score_minus_one(svg_sample, doc, reason):
    (score,) = run("svg", [f"<answer>{doc}</answer>"], [svg_sample])
    assert (score.value, score.reason) == (-1.0, reason)


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_svg_external_image_refused_inside_the_sandbox_too(svg_sample, monkeypatch):
    """Past the textual pre-check, cairosvg's URL fetcher in the sandbox refuses the fetch."""
    monkeypatch.setattr(render, "_EXTERNAL_RE", render.re.compile(r"(?!)"))
    doc = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="48">'
        '<rect width="30" height="30" fill="red"/>'
        '<image href="http://10.255.255.1/x.png" width="64" height="48"/></svg>'
    )
    start = time.perf_counter()
    (score,) = run("svg", [f"<answer>{doc}</answer>"], [svg_sample], timeout_s=5.0)
    assert (score.value, score.reason) == (-1.0, "external resource")
    assert time.perf_counter() - start < 5.0


def test_object_oriented_figure_and_clean_exit(bar):
    """A Figure made without pyplot is captured through its savefig; sys.exit(0) still counts."""
    oo = bar.target.replace(
        "fig, ax = plt.subplots(figsize=(2.0, 1.5), dpi=80)",
        "from matplotlib.figure import Figure\nfig = Figure(figsize=(2.0, 1.5), dpi=80)\n"
        "ax = fig.subplots()",
    )
    assert oo != bar.target
    exits = bar.target + "import sys\nsys.exit(0)\n"
    fails = bar.target + "import sys\nsys.exit(3)\n"
    scores = run("chart_code", [answer(oo), answer(exits), answer(fails)], [bar] * 3)
    assert scores[0].value >= 0.99 and scores[1].value >= 0.99
    assert (scores[2].value, scores[2].reason) == (0.0, "exit code 3")
