"""Rendering-similarity verifiers: ``chart_code`` (matplotlib chart-to-code) and ``svg`` (RLRF).

Both run model-written content only through :mod:`mmrft.rewards.sandbox`, on module-level pools that
are created lazily at the first non-empty batch and shared by every call (one pool per kind,
one warm fork server per CPU core). A whole batch goes through one ``pool.map``, so a GRPO
group of 8 costs about ``ceil(8 / cores)`` renders of wall time.

chart_code (ChartMimic low-level metrics + MSRL stage-2 image similarity)
    The model's script never runs bare: the sandbox runs a fixed *instrumentation prelude*
    (:data:`_CHART_PRELUDE`) that reads the script from ``solution.py`` in the workdir and
    ``exec``s it as ``__main__`` after

    * forcing the Agg backend (``matplotlib.use`` / ``plt.switch_backend`` become no-ops,
      ``plt.show`` does nothing) and, for a completion, the reference render's figure size
      and dpi (``rcParams`` at start; ``set_size_inches`` + ``dpi=`` when saving), so both
      renders have the same pixel size;
    * blocking process creation (``os.system``, ``os.popen``, ``os.fork``, ``os.exec*``,
      ``os.spawn*``, ``os.posix_spawn*``, ``subprocess``): a chart script has no use for it,
      and the call raises ``PermissionError`` (reason ``exception: PermissionError``). The
      sandbox remains the security boundary; this is defence in depth;
    * wrapping ``Axes`` plotting methods (outermost call only, so ``hist`` is not also counted
      as ``bar``) to record, per root figure, the plot *types* called (``plot``, ``bar``,
      ``barh``, ``scatter``, ``pie``, ``hist``, ``fill``, ``fill_between``, ``errorbar``,
      ``boxplot``, ``violinplot``, ``stem``, ``step``, ``stackplot``, ``imshow``, ``contour``,
      ... ; ``loglog``/``semilog*`` count as ``plot``) and the *colours* of the artists each
      call added (``Line2D`` colour; a patch's face colour, else its edge colour; a
      collection's face colours, else edge colours; fully transparent ones skipped), as RGB;
    * wrapping ``Text.draw`` to record every non-empty visible string drawn (titles, axis
      labels, tick labels, legend entries, annotations, bar labels) while the final image is
      saved;
    * wrapping ``Figure.savefig`` so that each save by the script is mirrored to ``out.png``.

    The captured figure is the last one the script saved (saved again at the end if still
    open, to include later changes), else the current pyplot figure at the end (an empty one
    if there is none: a blank render). At that save the prelude writes ``out.png`` and
    ``elements.json``: ``texts``, ``types`` (call counts), ``colours`` (type → distinct RGB,
    at most 32 per type), ``layout`` (per visible axes ``[nrows, ncols, row_start,
    row_stop, col_start, col_stop]`` of its gridspec, or ``["free", x0, y0, w, h]`` rounded
    to 2 decimals for axes placed without one), ``figsize`` and ``dpi``; each list is capped
    (:data:`REPORT_LIMITS`).

    The reference script (``sample.target``) is run the same way once per distinct code
    (cache key: SHA-256 of the code) without the size forcing; its ``figsize``/``dpi`` (the
    ``dpi=`` of its ``savefig`` when given) become the forcing of the completions.

What comes back is untrusted
    The script runs in the same process as the prelude, so it can overwrite ``out.png`` and
    ``elements.json`` with anything (or exit before the prelude writes them). Everything read
    back is therefore treated as hostile input, and scoring one completion takes bounded time
    and memory whatever it returns:

    * the sandbox refuses a render over :data:`MAX_PNG_BYTES` or a report over
      :data:`MAX_REPORT_BYTES` without reading it (``file too large``);
    * a report outside the prelude's format and limits is ``bad element report``; element
      scores are computed from the (bounded) counts, never by expanding a multiset;
    * a render must be a PNG of exactly the forced size (``wrong size``) and at most
      :data:`MAX_PIXELS`; it is decoded as 8-bit planes and compared (SSIM) at most at
      :data:`SCORE_PIXELS`;
    * code longer than :data:`MAX_CODE_CHARS` (``code too long``) or that does not compile
      (``syntax error``, this process's own check) is not run.

    A forged report can claim at most what a chart of its size could have drawn; a forged
    image must still look like the reference. The sandbox shows the script no file that holds
    an answer: neither the dataset nor the reference script nor the target image exist in its
    filesystem, and the reference is run in a job of its own.

Decisions
    * Images are compared at most at :data:`SCORE_PIXELS` (1 MP; downscaled, aspect kept),
      which bounds the parent's memory (SSIM holds several float arrays of the image size);
      charts and SVG targets up to that size are compared at full resolution.
    * SSIM ∈ [−1, 1] is clipped at 0 (``max(0, SSIM)``) rather than mapped by (1 + s)/2,
      which would give unrelated charts on white backgrounds ~0.8 (pitfall 11).
    * Colour is matched per type only: a red line never pays for a red bar.
    * Sub-scores are logged only for completions that rendered; ``exec`` for all.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import json
import math
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmrft.data import Sample, local_media_path
from mmrft.rewards import Score, verifier
from mmrft.rewards.answers import check_answer_tag, extract_answer
from mmrft.rewards.sandbox import SandboxJob, SandboxPool, SandboxResult

__all__ = [
    "chart_code",
    "colour_score",
    "count_f1",
    "extract_code",
    "extract_svg",
    "fit_pixels",
    "multiset_f1",
    "ssim01",
    "svg",
    "svg_similarity",
    "svg_tokens",
]

CHART_PRELOAD = ("matplotlib", "matplotlib.pyplot", "numpy")
SVG_PRELOAD = ("cairosvg", "cairosvg.surface")
BLANK_STD = 0.01  # grayscale std (in [0, 1]) below which a render is "blank"
MAX_PIXELS = 3000 * 3000  # larger renders and target images are refused before decoding
SCORE_PIXELS = 1024 * 1024  # images are compared at most this large (downscaled, aspect kept)
REFERENCE_TIMEOUT_S = 60.0
MAX_CODE_CHARS = 100_000  # longer chart code is refused ("code too long") without running
MAX_PNG_BYTES = 16 * 1024 * 1024  # a larger render is refused by the sandbox, never read
MAX_REPORT_BYTES = 1024 * 1024  # likewise for the element report
#: Bounds of an element report; the prelude never writes more, so more means a forged report.
REPORT_LIMITS = {"texts": 2000, "text_chars": 200, "kinds": 64, "calls": 10_000,
                 "colours": 32, "axes": 100}  # fmt: skip
_CACHE_SIZE = 4096
_CACHE_BYTES = 256 * 1024 * 1024  # decoded images kept across calls (references, targets)

# --------------------------------------------------------------------------- pools

_POOLS: dict[str, SandboxPool] = {}
_POOL_LOCK = threading.Lock()


def _pool(kind: str) -> SandboxPool:
    """The shared pool for ``kind`` ("chart" or "svg"), created at first use."""
    with _POOL_LOCK:
        pool = _POOLS.get(kind)
        if pool is None:
            pool = SandboxPool(preload=CHART_PRELOAD if kind == "chart" else SVG_PRELOAD)
            _POOLS[kind] = pool
        return pool


@atexit.register
def _close_pools() -> None:
    with _POOL_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


# --------------------------------------------------------------------------- metrics


def multiset_f1(pred: Iterable[Any], ref: Iterable[Any]) -> float:
    """F1 of two multisets: 2·|P ∩ R| / (|P| + |R|); 1.0 when both are empty.

    >>> multiset_f1(["A", "B", "B"], ["A", "B"])
    0.8
    >>> multiset_f1([], [])
    1.0
    """
    return count_f1(Counter(pred), Counter(ref))


def count_f1(pred: Mapping[Any, int], ref: Mapping[Any, int]) -> float:
    """:func:`multiset_f1` of two multisets given as counts: 2·Σ min(p_k, r_k) / (Σ p + Σ r),
    in time linear in the number of keys whatever the counts (a multiset is never expanded).

    >>> count_f1({"bar": 1, "plot": 2}, {"bar": 1, "plot": 1})
    0.8
    >>> count_f1({"bar": 10**12}, {"bar": 1}) < 1e-11
    True
    """
    n = sum(pred.values()) + sum(ref.values())
    if n == 0:
        return 1.0
    return 2.0 * sum(min(v, ref.get(k, 0)) for k, v in pred.items()) / n


def colour_score(
    pred: Mapping[str, Sequence[Sequence[float]]], ref: Mapping[str, Sequence[Sequence[float]]]
) -> float:
    """Soft colour F1 over element types: 2·Σ sim / (n_pred + n_ref), 1.0 when both are empty.

    Within each type, predicted and reference colours (RGB in [0, 1]) are matched one to one
    maximising Σ sim (Hungarian), sim = max(0, 1 − ΔE₀₀/100) with ΔE₀₀ the CIEDE2000
    difference in CIELAB; unmatched colours and types present on one side only add to the
    denominator.

    >>> colour_score({"bar": [[1, 0, 0]]}, {"bar": [[1, 0, 0]]})
    1.0
    >>> round(colour_score({"bar": [[1, 0, 0]]}, {"bar": [[0, 0, 1]]}), 3)
    0.471
    >>> colour_score({"plot": [[1, 0, 0]]}, {"bar": [[1, 0, 0]]})
    0.0
    """
    from scipy.optimize import linear_sum_assignment
    from skimage.color import deltaE_ciede2000, rgb2lab

    n = sum(len(v) for v in pred.values()) + sum(len(v) for v in ref.values())
    if n == 0:
        return 1.0
    total = 0.0
    for kind in set(pred) & set(ref):
        a, b = np.asarray(pred[kind], float), np.asarray(ref[kind], float)
        if not len(a) or not len(b):
            continue
        lab_a = rgb2lab(np.clip(a, 0, 1)[None])[0]
        lab_b = rgb2lab(np.clip(b, 0, 1)[None])[0]
        delta = deltaE_ciede2000(lab_a[:, None, :], lab_b[None, :, :])
        sim = np.clip(1.0 - delta / 100.0, 0.0, 1.0)
        rows, cols = linear_sum_assignment(-sim)
        total += float(sim[rows, cols].sum())
    return 2.0 * total / n


def ssim01(pred: np.ndarray, ref: np.ndarray) -> float:
    """max(0, SSIM) of two grayscale images in [0, 1] of the same shape (skimage, data_range 1,
    7×7 window or the largest odd window that fits; 1 − mean |Δ| below 3 px).

    >>> img = np.tile(np.linspace(0, 1, 16), (16, 1))
    >>> ssim01(img, img)
    1.0
    >>> ssim01(img, 1 - img)
    0.0
    """
    from skimage.metrics import structural_similarity

    side = min(pred.shape)
    if side < 3:
        return float(max(0.0, 1.0 - np.abs(pred - ref).mean()))
    win = min(7, side if side % 2 else side - 1)
    value = structural_similarity(pred, ref, data_range=1.0, win_size=win)
    return float(min(1.0, max(0.0, value)))


def fit_pixels(size: tuple[int, int], limit: int = SCORE_PIXELS) -> tuple[int, int]:
    """``(W, H)`` scaled down, aspect kept, to at most ``limit`` pixels (unchanged if within).

    >>> fit_pixels((4000, 2000), 1000 * 500)
    (1000, 500)
    >>> fit_pixels((160, 120))
    (160, 120)
    """
    w, h = size
    if w * h <= limit:
        return w, h
    scale = math.sqrt(limit / (w * h))
    return max(1, math.floor(w * scale)), max(1, math.floor(h * scale))


_TARGET_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


def _decode_gray(
    data: bytes,
    size: tuple[int, int] | None = None,
    *,
    expect: tuple[int, int] | None = None,
    fit: int | None = None,
    formats: Sequence[str] = ("PNG",),
) -> tuple[np.ndarray | None, str | None]:
    """Image bytes → ``(gray, None)``: grayscale float32 in [0, 1] (Rec. 709 luma, alpha
    composited on white), resized to ``size`` = (W, H) when given, else scaled down to at
    most ``fit`` pixels when given; or ``(None, reason)``.

    Memory and time are bounded before anything is decoded: only ``formats`` are tried (a
    render is a PNG, so no other decoder ever sees model output), the header's size must equal
    ``expect`` when given (``"wrong size"``) and be at most :data:`MAX_PIXELS` (``"too
    large"``); a file that does not decode is ``"bad render"``. The full-size image lives only
    as 8-bit RGBA, RGB and L planes; floats exist at the output size.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=list(formats)) as image:
            width, height = image.size
            if expect is not None and (width, height) != tuple(expect):
                return None, "wrong size"
            if width * height > MAX_PIXELS or min(width, height) < 1:
                return None, "too large"
            rgba = image.convert("RGBA")
    except Image.DecompressionBombError:  # PIL's own bound, far above ours, refused the header
        return None, "wrong size" if expect is not None else "too large"
    except Exception:  # any decoder failure is a "bad render"
        return None, "bad render"
    try:
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        rgb = Image.alpha_composite(white, rgba).convert("RGB")
        del rgba, white
        gray = rgb.convert("L", matrix=(0.2125, 0.7154, 0.0721, 0.0)).convert("F")
        del rgb
        if size is None and fit is not None:
            size = fit_pixels(gray.size, fit)
        if size is not None and gray.size != tuple(size):
            gray = gray.resize(tuple(size), Image.BILINEAR)
    except Exception:  # any decoder failure is a "bad render"
        return None, "bad render"
    return np.asarray(gray, dtype=np.float32) / np.float32(255.0), None


def _is_blank(gray: np.ndarray) -> bool:
    return float(gray.std()) < BLANK_STD


class _BoundedCache:
    """LRU cache of decoded images, bounded in entries and in bytes (``nbytes`` of the values'
    arrays), shared by verifier calls in threads."""

    def __init__(self, entries: int = _CACHE_SIZE, max_bytes: int = _CACHE_BYTES) -> None:
        self.entries, self.max_bytes = entries, max_bytes
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Any, value: Any, nbytes: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes -= old[1] if old else 0
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._items and (len(self._items) > self.entries or self._bytes > self.max_bytes):
                _, (_, size) = self._items.popitem(last=False)
                self._bytes -= size


def _sandbox_reason(result: SandboxResult) -> str:
    return result.reason or "sandbox error"


def _check_weight(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")


def _check_call(timeout_s: float, answer_tag: str) -> None:
    """The render verifiers' checks of ``timeout_s`` (seconds, in (0, 600]) and ``answer_tag``
    (a non-empty word)."""
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 600):
        raise ValueError(f"timeout_s must be in (0, 600], got {timeout_s!r}")
    check_answer_tag(answer_tag)


# --------------------------------------------------------------------------- chart_code

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str, tag: str = "answer") -> tuple[str | None, str | None]:
    """The Python code of a completion: the content of exactly one ``<tag>`` block, or of the
    one fenced block inside it (language ``python``, ``py`` or none).

    Reasons: those of :func:`extract_answer`, ``"several code blocks"``, ``"unclosed code
    block"``, ``"no code"``.

    >>> extract_code("<answer>```python\\nprint(1)\\n```</answer>")
    ('print(1)\\n', None)
    >>> extract_code("<answer>print(2)</answer>")
    ('print(2)', None)
    >>> extract_code("<answer>```python\\na\\n``` and ```python\\nb\\n```</answer>")
    (None, 'several code blocks')
    """
    answer, reason = extract_answer(text, tag)
    if answer is None:
        return None, reason
    if "```" not in answer:
        return answer, None
    blocks = [
        body for lang, body in _FENCE_RE.findall(answer) if lang.lower() in ("", "python", "py")
    ]
    if len(blocks) > 1:
        return None, "several code blocks"
    if not blocks:
        return None, "unclosed code block" if answer.count("```") % 2 else "no code"
    if not blocks[0].strip():
        return None, "no code"
    return blocks[0], None


_CHART_PRELUDE = r"""
def _mmrft_run():
    import builtins, functools, json, linecache, os, subprocess, sys
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib import colors as mcolors
    from matplotlib.axes import Axes
    from matplotlib.collections import Collection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.text import Text

    cfg = json.loads(__CONFIG__)
    force_size, force_dpi, limits = cfg["figsize"], cfg["dpi"], cfg["limits"]
    if force_size:
        matplotlib.rcParams["figure.figsize"] = force_size
        matplotlib.rcParams["figure.dpi"] = force_dpi
    matplotlib.use = lambda *a, **k: None
    plt.switch_backend = lambda *a, **k: None
    plt.show = lambda *a, **k: None

    def _blocked(*a, **k):
        raise PermissionError("process creation is disabled in chart code")
    for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
                 "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                 "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
                 "spawnvpe"):
        if hasattr(os, name):
            setattr(os, name, _blocked)
    subprocess.Popen._execute_child = _blocked

    state = {"depth": 0, "recording": False, "texts": [], "saved": None}
    types = {
        "plot": "plot", "loglog": "plot", "semilogx": "plot", "semilogy": "plot",
        "bar": "bar", "barh": "barh", "scatter": "scatter", "pie": "pie", "hist": "hist",
        "hist2d": "hist2d", "fill": "fill", "fill_between": "fill_between",
        "fill_betweenx": "fill_betweenx", "errorbar": "errorbar", "boxplot": "boxplot",
        "violinplot": "violinplot", "stem": "stem", "step": "step", "stackplot": "stackplot",
        "imshow": "imshow", "matshow": "imshow", "pcolor": "pcolor",
        "pcolormesh": "pcolormesh", "contour": "contour", "contourf": "contourf",
        "hexbin": "hexbin", "quiver": "quiver", "streamplot": "streamplot",
        "axhline": "axhline", "axvline": "axvline", "axhspan": "axhspan",
        "axvspan": "axvspan", "hlines": "hlines", "vlines": "vlines",
        "broken_barh": "broken_barh", "eventplot": "eventplot", "tripcolor": "tripcolor",
        "tricontour": "tricontour", "tricontourf": "tricontourf", "triplot": "triplot",
    }

    def root(fig):
        for _ in range(16):
            if isinstance(fig, Figure) or fig is None:
                return fig
            fig = getattr(fig, "figure", None)
        return None

    def rgb(colour):
        try:
            r, g, b, a = mcolors.to_rgba(colour)
        except (ValueError, TypeError):
            return None
        return None if a <= 0 else [round(r, 4), round(g, 4), round(b, 4)]

    def colours_of(artist):
        out = []
        try:
            if isinstance(artist, Line2D):
                if artist.get_linestyle() not in ("None", "none", "", " ") or artist.get_marker() not in (None, "None", "none", "", " "):
                    out.append(rgb(artist.get_color()))
            elif isinstance(artist, Patch):
                face = rgb(artist.get_facecolor()) if artist.get_fill() else None
                out.append(face or rgb(artist.get_edgecolor()))
            elif isinstance(artist, Collection):
                faces = [rgb(c) for c in artist.get_facecolors()]
                faces = [c for c in faces if c]
                if not faces:
                    faces = [rgb(c) for c in artist.get_edgecolors()]
                out.extend(faces[:64])
        except Exception:
            return []
        return [c for c in out if c]

    def wrap(name, kind):
        original = getattr(Axes, name, None)
        if original is None:
            return

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            if state["depth"]:
                return original(self, *args, **kwargs)
            before = {id(c) for c in self.get_children()}
            state["depth"] += 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                state["depth"] -= 1
            fig = root(self.figure)
            if fig is not None:
                record = fig.__dict__.setdefault("_mmrft_calls", [])
                found = []
                for child in self.get_children():
                    if id(child) not in before:
                        for c in colours_of(child):
                            if c not in found and len(found) < limits["colours"]:
                                found.append(c)
                record.append((kind, found))
            return result

        setattr(Axes, name, wrapper)

    for name, kind in types.items():
        wrap(name, kind)

    text_draw = Text.draw

    def draw_text(self, renderer, *args, **kwargs):
        if state["recording"] and self.get_visible() and len(state["texts"]) < limits["texts"]:
            text = self.get_text()
            if isinstance(text, str) and text.strip():
                state["texts"].append(text.strip()[: limits["text_chars"]])
        return text_draw(self, renderer, *args, **kwargs)

    Text.draw = draw_text
    savefig = Figure.savefig

    def capture(fig, dpi):
        if force_size:
            fig.set_size_inches(force_size, forward=False)
            dpi = force_dpi
        state["texts"] = []
        state["recording"] = True
        try:
            with matplotlib.rc_context({"savefig.bbox": "standard", "savefig.transparent": False}):
                savefig(fig, "out.png", dpi=dpi, format="png", bbox_inches=None)
        finally:
            state["recording"] = False
        layout = []
        for ax in fig.get_axes():
            if not ax.get_visible() or len(layout) >= limits["axes"]:
                continue
            spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
            if spec is None:
                layout.append(["free"] + [round(float(v), 2) for v in ax.get_position().bounds])
            else:
                rows, cols = spec.get_gridspec().get_geometry()
                layout.append([rows, cols, spec.rowspan.start, spec.rowspan.stop,
                               spec.colspan.start, spec.colspan.stop])
        counts, colours = {}, {}
        for kind, found in fig.__dict__.get("_mmrft_calls", []):
            counts[kind] = min(counts.get(kind, 0) + 1, limits["calls"])
            bucket = colours.setdefault(kind, [])
            for c in found:
                if c not in bucket and len(bucket) < limits["colours"]:
                    bucket.append(c)
        elements = {
            "texts": state["texts"], "types": counts, "colours": colours, "layout": layout,
            "figsize": [float(v) for v in fig.get_size_inches()], "dpi": float(dpi),
        }
        with open("elements.json", "w") as fh:
            json.dump(elements, fh)

    def save_dpi(fig, kwargs):
        dpi = kwargs.get("dpi", matplotlib.rcParams["savefig.dpi"])
        return float(dpi) if isinstance(dpi, (int, float)) and 1 <= dpi <= 1000 else float(fig.dpi)

    def mirrored_savefig(self, *args, **kwargs):
        result = savefig(self, *args, **kwargs)
        fig = root(self)
        if fig is not None:
            state["saved"] = (fig, save_dpi(fig, kwargs))
            capture(*state["saved"])
        return result

    Figure.savefig = mirrored_savefig

    with open("solution.py", encoding="utf-8", errors="replace") as fh:
        source = fh.read()
    linecache.cache["<model>"] = (len(source), None, source.splitlines(True), "<model>")
    code = compile(source, "<model>", "exec", dont_inherit=True)
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": "<model>"}
    try:
        exec(code, namespace)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    saved = state["saved"]
    if saved is not None and getattr(saved[0], "number", None) in (None, *plt.get_fignums()):
        capture(*saved)  # still open (or not managed by pyplot): include later changes
    elif saved is None:
        fig = plt.gcf()
        capture(fig, save_dpi(fig, {}))


_mmrft_run()
"""


def _chart_job(
    code: str, figsize: Sequence[float] | None, dpi: float | None, timeout_s: float
) -> SandboxJob:
    config = json.dumps(
        {"figsize": list(figsize) if figsize else None, "dpi": dpi, "limits": REPORT_LIMITS}
    )
    return SandboxJob(
        _CHART_PRELUDE.replace("__CONFIG__", repr(config)),
        timeout_s=timeout_s,
        inputs={"solution.py": code.encode("utf-8", "replace")},
        outputs={"out.png": MAX_PNG_BYTES, "elements.json": MAX_REPORT_BYTES},
        preload=CHART_PRELOAD,
    )


def _parse_elements(data: bytes | None) -> dict[str, Any] | None:
    """Validate ``elements.json``, or ``None``.

    The prelude writes it *in the code's own process*, so the code can replace it with
    anything; it is untrusted input. Parsing is bounded (at most :data:`MAX_REPORT_BYTES`, no
    recursion error escapes) and nothing outside the prelude's format and
    :data:`REPORT_LIMITS` is accepted: call counts are ints in [0, calls], strings and lists
    are short, numbers finite, so every score computed from it takes bounded time and memory.
    A forged report can claim at most what a chart of that size could have drawn.
    """
    if not data or len(data) > MAX_REPORT_BYTES:
        return None
    try:
        raw = json.loads(data.decode("utf-8"))
        texts, types, colours = raw["texts"], raw["types"], raw["colours"]
        layout, figsize, dpi = raw["layout"], raw["figsize"], raw["dpi"]
    except (ValueError, RecursionError, TypeError, KeyError):
        return None
    limit = REPORT_LIMITS

    def number(x: Any, low: float, high: float) -> bool:  # NaN and ±inf fail the comparison
        return isinstance(x, (int, float)) and not isinstance(x, bool) and low <= x <= high

    def name(key: Any) -> bool:
        return isinstance(key, str) and 0 < len(key) <= 40

    def sized(value: Any, kind: type, most: int) -> bool:
        return isinstance(value, kind) and len(value) <= most

    def axes(item: Any) -> bool:
        if sized(item, list, 6) and len(item) == 6:
            return all(isinstance(v, int) and number(v, 0, 1000) for v in item)
        return (
            sized(item, list, 5)
            and len(item) == 5
            and item[0] == "free"
            and all(number(v, -100, 100) for v in item[1:])
        )

    valid = (
        sized(texts, list, limit["texts"])
        and all(sized(t, str, limit["text_chars"]) for t in texts)
        and sized(types, dict, limit["kinds"])
        and all(name(k) and isinstance(v, int) and number(v, 0, limit["calls"]) for k, v in types.items())
        and sized(colours, dict, limit["kinds"])
        and all(
            name(k)
            and sized(v, list, limit["colours"])
            and all(sized(c, list, 3) and len(c) == 3 and all(number(x, 0, 1) for x in c) for c in v)
            for k, v in colours.items()
        )
        and sized(layout, list, limit["axes"])
        and all(axes(item) for item in layout)
        and sized(figsize, list, 2)
        and len(figsize) == 2
        and all(number(v, 0.01, 1000) for v in figsize)
        and number(dpi, 1, 10_000)
    )  # fmt: skip
    if not valid:
        return None
    return {
        "texts": texts,
        "types": types,
        "colours": {k: [[float(x) for x in c] for c in v] for k, v in colours.items()},
        "layout": [tuple(item) for item in layout],
        "figsize": [float(v) for v in figsize],
        "dpi": float(dpi),
    }


class _Rendered:
    """A successful chart render: its elements, its pixel size (W, H) and its grayscale image
    (at that size, or downscaled to :data:`SCORE_PIXELS`)."""

    __slots__ = ("elements", "gray", "size")

    def __init__(self, elements: dict[str, Any], gray: np.ndarray, size: tuple[int, int]) -> None:
        self.elements = elements
        self.gray = gray
        self.size = size


def _rendered(
    result: SandboxResult, expect: tuple[int, int] | None, size: tuple[int, int] | None
) -> tuple[_Rendered | None, str | None, bool]:
    """(render, reason, executed) from a sandbox result.

    A completion's render must be exactly ``expect`` = (W, H) pixels, the size it was forced
    to (``"wrong size"``), and is decoded straight to ``size`` (the comparison size). A
    reference (``expect=None``) keeps its own size; its report must agree with it.
    """
    if not result.ok:
        return None, _sandbox_reason(result), False
    elements = _parse_elements(result.files.get("elements.json"))
    if elements is None:
        return None, "bad element report", True
    data = result.files.get("out.png", b"")
    gray, problem = _decode_gray(data, size, expect=expect, fit=SCORE_PIXELS)
    if gray is None:
        return None, "wrong size" if problem == "wrong size" else "bad render", True
    native = expect or _png_size(data)
    if expect is None:  # the completions are forced to figsize × dpi: it must be this size
        width, height = (v * elements["dpi"] for v in elements["figsize"])
        if abs(width - native[0]) > 1 or abs(height - native[1]) > 1:
            return None, "bad render", True
    if _is_blank(gray):
        return None, "blank render", True
    return _Rendered(elements, gray, native), None, True


def _png_size(data: bytes) -> tuple[int, int]:
    """(W, H) from a PNG header (the render was decoded already, so the header is valid)."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _code_problem(code: str) -> str | None:
    """Why ``code`` is not run at all: ``"code too long"`` or ``"syntax error"`` (this
    process's own check: nothing the code does can produce or hide it)."""
    if len(code) > MAX_CODE_CHARS:
        return "code too long"
    try:
        compile(code, "<model>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        return "syntax error"
    return None


_REFERENCES = _BoundedCache()


def _reference_key(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8", "replace")).hexdigest()


def _references(codes: Sequence[str]) -> dict[str, tuple[_Rendered | None, str | None]]:
    """Render the distinct reference scripts not yet cached (one ``pool.map``); key → result."""
    keys = {_reference_key(c): c for c in codes}
    found: dict[str, tuple[_Rendered | None, str | None]] = {}
    jobs: dict[str, SandboxJob] = {}
    for key, code in keys.items():
        cached = _REFERENCES.get(key)
        if cached is not None:
            found[key] = cached
        elif (problem := _code_problem(code)) is not None:
            found[key] = (None, problem)
        else:
            jobs[key] = _chart_job(code, None, None, REFERENCE_TIMEOUT_S)
    results = _pool("chart").map(list(jobs.values())) if jobs else []
    for key, result in zip(jobs, results):
        render, reason, _ = _rendered(result, None, None)
        found[key] = (render, reason)
        if render is None and reason in ("sandbox error", "timeout"):
            continue  # transient: not cached, tried again next time
        _REFERENCES.put(key, (render, reason), render.gray.nbytes if render else 0)
    return found


def _target_size(sample: Sample, ref: _Rendered) -> tuple[int, int]:
    """The comparison size: ``meta["image_size"]`` (else the reference render's size), scaled
    down to at most :data:`SCORE_PIXELS`."""
    size = sample.meta.get("image_size")
    if (
        isinstance(size, (list, tuple))
        and len(size) == 2
        and all(isinstance(v, int) and 0 < v <= 4096 for v in size)
    ):
        return fit_pixels((int(size[0]), int(size[1])))
    return fit_pixels(ref.size)


def _resized(gray: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    if gray.shape == (size[1], size[0]):
        return gray
    image = Image.fromarray(np.ascontiguousarray(gray, dtype=np.float32), mode="F")
    return np.asarray(image.resize(size, Image.BILINEAR), dtype=np.float32)


def _chart_parts(pred: _Rendered, ref: _Rendered, size: tuple[int, int]) -> dict[str, float]:
    """The six parts; every element score is computed from bounded counts (never by expanding
    a multiset), SSIM at ``size`` (at most :data:`SCORE_PIXELS`)."""
    p, r = pred.elements, ref.elements
    return {
        "exec": 1.0,
        "text_f1": count_f1(Counter(p["texts"]), Counter(r["texts"])),
        "type_f1": count_f1(p["types"], r["types"]),
        "colour": colour_score(p["colours"], r["colours"]),
        "layout_f1": count_f1(Counter(p["layout"]), Counter(r["layout"])),
        "ssim": ssim01(_resized(pred.gray, size), _resized(ref.gray, size)),
    }


@verifier("chart_code", low=0.0, high=1.0)
def chart_code(
    completions: list[str],
    samples: list[Sample],
    *,
    low_level_weight: float = 0.5,
    image_weight: float = 0.5,
    timeout_s: float = 10.0,
    answer_tag: str = "answer",
) -> list[Score]:
    """Chart-to-code: run the completion's matplotlib script and compare it with the
    reference script ``sample.target``. Range [0, 1].

    score = exec · (w_low · low + w_img · ssim) / (w_low + w_img), where w_low =
    ``low_level_weight``, w_img = ``image_weight`` and

    * exec = 1 when the script ran to completion in the sandbox and rendered, else 0;
    * low = mean(text_f1, type_f1, colour, layout_f1), ChartMimic's low-level score:
      ``text_f1`` multiset F1 of the strings drawn; ``type_f1`` multiset F1 of the plotting
      calls (``bar`` ×1, ``plot`` ×2, ...); ``colour`` soft F1 of the element colours per type
      (:func:`colour_score`, 1 − CIEDE2000/100); ``layout_f1`` multiset F1 of the axes'
      gridspec tuples (exact match);
    * ssim = max(0, SSIM) of the grayscale renders at ``meta["image_size"]`` (else the
      reference render's size), scaled down to at most :data:`SCORE_PIXELS`.

    All six are logged as parts (only ``exec`` when nothing rendered). See the module
    docstring for the instrumentation and the sandbox.

    Parse rules: the content of exactly one ``<answer_tag>`` block; if it holds a fenced block
    (```python, ```py or bare ```), exactly one, whose content is the code.

    Score 0 with a reason: the :func:`extract_answer` reasons, ``several code blocks``,
    ``unclosed code block``, ``no code``, ``code too long``, ``syntax error``; the sandbox's
    reason (``timeout``, ``memory limit``, ``exception: <Type>``, ``no output file``,
    ``file too large``, ...); ``blank render`` (grayscale std < 0.01); ``bad render``,
    ``wrong size``, ``bad element report`` (see "What comes back is untrusted" in the module
    docstring); data problems: ``no reference code``, ``reference failed: <reason>``.

    >>> from mmrft.data import Sample
    >>> ref = "import matplotlib.pyplot as plt\\nplt.bar(['a', 'b'], [1, 3], color='red')\\n"
    >>> s = Sample("c1", [], target=ref, meta={"image_size": [160, 120]})
    >>> good = chart_code(["<answer>```python\\n" + ref + "```</answer>"], [s])[0]
    >>> good.value, good.parts["colour"]
    (1.0, 1.0)
    >>> blue = chart_code(["<answer>" + ref.replace("red", "blue") + "</answer>"], [s])[0]
    >>> blue.value < 1.0, blue.parts["colour"] < 1.0, blue.parts["text_f1"]
    (True, True, 1.0)
    >>> chart_code(["<answer>import matplotlib.pyplot as plt\\nplt.figure()</answer>"], [s])[0].reason
    'blank render'
    >>> chart_code(["<answer>while True: pass</answer>"], [s], timeout_s=1.0)[0].reason
    'timeout'
    """
    _check_weight("low_level_weight", low_level_weight)
    _check_weight("image_weight", image_weight)
    if low_level_weight + image_weight <= 0:
        raise ValueError("low_level_weight + image_weight must be > 0")
    _check_call(timeout_s, answer_tag)
    if not completions:
        return []

    scores: list[Score | None] = [None] * len(completions)
    codes: dict[int, str] = {}
    for i, (text, sample) in enumerate(zip(completions, samples)):
        if not isinstance(sample.target, str) or not sample.target.strip():
            scores[i] = Score(0.0, reason="no reference code", parts={"exec": 0.0})
            continue
        code, reason = extract_code(text, answer_tag)
        reason = reason if code is None else _code_problem(code)
        if reason is not None:
            scores[i] = Score(0.0, reason=reason, parts={"exec": 0.0})
        else:
            codes[i] = code  # type: ignore[assignment]

    refs = _references([samples[i].target for i in codes]) if codes else {}
    jobs: list[SandboxJob] = []
    pending: list[tuple[int, _Rendered]] = []
    for i, code in codes.items():
        ref, reason = refs[_reference_key(samples[i].target)]
        if ref is None:
            scores[i] = Score(0.0, reason=f"reference failed: {reason}", parts={"exec": 0.0})
            continue
        jobs.append(_chart_job(code, ref.elements["figsize"], ref.elements["dpi"], timeout_s))
        pending.append((i, ref))

    results = _pool("chart").map(jobs) if jobs else []
    total = low_level_weight + image_weight
    for (i, ref), result in zip(pending, results):
        size = _target_size(samples[i], ref)
        pred, reason, executed = _rendered(result, ref.size, size)
        if pred is None:
            scores[i] = Score(0.0, reason=reason, parts={"exec": float(executed)})
            continue
        parts = _chart_parts(pred, ref, size)
        low = (parts["text_f1"] + parts["type_f1"] + parts["colour"] + parts["layout_f1"]) / 4
        value = (low_level_weight * low + image_weight * parts["ssim"]) / total
        value = min(1.0, max(0.0, value))
        scores[i] = Score(value, reason=None if value > 0 else "no similarity", parts=parts)
    return scores  # type: ignore[return-value]


# --------------------------------------------------------------------------- svg

_SVG_RE = re.compile(r"<svg[\s>].*?</svg\s*>", re.DOTALL | re.IGNORECASE)
_EXTERNAL_RE = re.compile(
    r"""(?:href|src)\s*=\s*["']\s*(?!data:|#)[^"'\s]|url\(\s*["']?\s*(?!data:|#)[a-z][\w+.-]*:""",
    re.IGNORECASE,
)
_TOKEN_RE = re.compile(r"[A-Za-z_]+|\d+(?:\.\d+)?|\S")

#: The SVG script's exit status when the document referenced an external resource.
_EXTERNAL_EXIT = 3
_SVG_SCRIPT = r"""
import json, os, sys
from cairosvg.surface import PNGSurface


_fetched = []


def _fetch(url, resource_type=None):
    if isinstance(url, str) and url.startswith("data:"):
        from cairosvg.url import fetch
        return fetch(url, resource_type)
    _fetched.append(str(url)[:200])
    raise ValueError("external resource")


_size = json.loads(__SIZE__)
with open("in.svg", "rb") as fh:
    _data = fh.read()
try:
    PNGSurface.convert(bytestring=_data, write_to="out.png", output_width=_size[0],
                       output_height=_size[1], url_fetcher=_fetch, unsafe=False)
finally:
    if _fetched:  # an exit status, which only this script chooses (the SVG runs no code)
        sys.stderr.write(f"external resource: {_fetched[0]}\n")
        sys.stderr.flush()
        os._exit(__EXTERNAL_EXIT__)
"""


def extract_svg(text: str, tag: str = "answer") -> tuple[str | None, str | None]:
    """The one ``<svg …>…</svg>`` document inside the ``<tag>`` block.

    Reasons: those of :func:`extract_answer`, ``"no svg"``, ``"several svg documents"``.

    >>> extract_svg('<answer>```svg\\n<svg width="2"><rect/></svg>\\n```</answer>')
    ('<svg width="2"><rect/></svg>', None)
    >>> extract_svg('<answer>a circle</answer>')
    (None, 'no svg')
    """
    answer, reason = extract_answer(text, tag)
    if answer is None:
        return None, reason
    found = _SVG_RE.findall(answer)
    if not found:
        return None, "no svg"
    if len(found) > 1:
        return None, "several svg documents"
    return found[0], None


def svg_tokens(text: str) -> int:
    """Length of an SVG in tokens: words, numbers and single punctuation characters.

    >>> svg_tokens('<rect x="1.5"/>')
    9
    """
    return len(_TOKEN_RE.findall(text))


def svg_similarity(pred: np.ndarray, ref: np.ndarray, sigma: float = 1.0) -> float:
    """RLRF image reward: clip(1 − MSE(z(blur(pred)), z(blur(ref))), −1, 1).

    blur is a Gaussian of ``sigma`` px (0 = none), z(x) = (x − mean x) / (std x + 1e-8) on
    grayscale in [0, 1]. For z-normalised images MSE = 2 (1 − ρ) with ρ the Pearson
    correlation, so the reward is 2ρ − 1 before clipping: 1 identical, ≤ −1 uncorrelated.

    >>> img = np.tile(np.linspace(0, 1, 16), (16, 1))
    >>> round(svg_similarity(img, img), 6)
    1.0
    >>> svg_similarity(img, 1 - img)
    -1.0
    """
    from scipy.ndimage import gaussian_filter

    def z(image: np.ndarray) -> np.ndarray:
        if sigma > 0:
            image = gaussian_filter(image, sigma)
        return (image - image.mean()) / (image.std() + 1e-8)

    mse = float(np.mean((z(pred) - z(ref)) ** 2))
    return float(min(1.0, max(-1.0, 1.0 - mse)))


_TARGETS = _BoundedCache()
MAX_TARGET_BYTES = 64 * 1024 * 1024  # a larger target image file is not read


def _svg_target(sample: Sample) -> tuple[np.ndarray | None, str | None]:
    """The sample's target image as grayscale, at most :data:`SCORE_PIXELS` (cached)."""
    source = sample.meta.get("image")
    if not isinstance(source, str):
        images = sample.media("image")
        source = images[0] if images else None
    if not source:
        return None, "no target image"
    path = local_media_path(source)
    if path is None:
        return None, "target image not local"
    try:
        stat = Path(path).stat()
    except OSError:
        return None, "target image not found"
    key = (path, stat.st_mtime_ns, stat.st_size)
    cached = _TARGETS.get(key)
    if cached is None:
        if stat.st_size > MAX_TARGET_BYTES:
            return None, "target image too large"
        try:
            data = Path(path).read_bytes()
        except OSError:
            return None, "target image not found"
        cached, problem = _decode_gray(data, fit=SCORE_PIXELS, formats=_TARGET_FORMATS)
        if cached is None:
            return None, "target image too large" if problem == "too large" else "bad target image"
        _TARGETS.put(key, cached, cached.nbytes)
    if _is_blank(cached):
        return None, "blank target image"
    return cached, None


def _target_tokens(sample: Sample, target_len: int | None) -> int | None:
    if target_len is not None:
        return target_len
    meta_len = sample.meta.get("svg_tokens")
    if isinstance(meta_len, int) and meta_len > 0:
        return meta_len
    if isinstance(sample.target, str) and _SVG_RE.search(sample.target):
        return max(1, svg_tokens(sample.target))
    return None


@verifier("svg", low=-1.0, high=1.0)
def svg(
    completions: list[str],
    samples: list[Sample],
    *,
    length_weight: float = 0.0,
    target_len: int | None = None,
    blur_sigma: float = 1.0,
    timeout_s: float = 10.0,
    answer_tag: str = "answer",
) -> list[Score]:
    """Image-to-SVG reward in the style of RLRF (arXiv:2505.20793). Range [−1, 1].

    score = clip(sim − length_weight · max(0, n / L − 1), −1, 1), where

    * sim = clip(1 − MSE(z(blur(R)), z(blur(T))), −1, 1) (:func:`svg_similarity`): R the
      completion's SVG rendered by cairosvg *inside the sandbox* at the target's pixel size
      (``output_width``/``output_height``; a target over :data:`SCORE_PIXELS` is scaled down
      first), T the target image, both grayscale in [0, 1] with
      alpha composited on white, blur a Gaussian of ``blur_sigma`` px, z per-image
      zero-mean/unit-variance. Equals 2ρ − 1 (ρ: Pearson correlation) before clipping;
    * n = :func:`svg_tokens` of the completion's SVG, L = ``target_len``, else
      ``meta["svg_tokens"]``, else the token count of ``sample.target`` when it is an SVG;
      with none of these the length term is 0.

    Parts: ``sim``, ``tokens`` (and ``length_penalty`` when a length term applies).

    The target is the image at ``meta["image"]``, else the sample's first image (any format
    PIL reads; a local path). External resources are never fetched: references other than
    ``data:`` URIs and ``#fragments`` are refused before rendering, and inside the sandbox
    (no network) cairosvg's URL fetcher refuses them too.

    Parse rules: exactly one ``<answer_tag>`` block holding exactly one ``<svg …>…</svg>``.

    Score −1 with a reason: the :func:`extract_answer` reasons, ``no svg``, ``several svg
    documents``, ``external resource``, ``invalid svg`` (cairosvg raised), the sandbox's
    reason (``timeout``, ``memory limit``, ...), ``blank render``, ``bad render``; data
    problems: ``no target image``, ``target image not local``, ``target image not found``,
    ``bad target image``, ``target image too large``, ``blank target image``.

    >>> import tempfile, os, cairosvg
    >>> doc = '<svg xmlns="http://www.w3.org/2000/svg" width="32" height="32"><rect x="4" y="4" width="12" height="12"/></svg>'
    >>> path = os.path.join(tempfile.mkdtemp(), "t.png")
    >>> cairosvg.svg2png(bytestring=doc.encode(), write_to=path)
    >>> s = Sample("v1", [], meta={"image": path})
    >>> round(svg([f"<answer>{doc}</answer>"], [s])[0].value, 3)
    1.0
    >>> svg(["<answer><svg><rect</svg></answer>"], [s])[0].reason
    'invalid svg'
    """
    _check_weight("length_weight", length_weight)
    _check_weight("blur_sigma", blur_sigma)
    if target_len is not None and (not isinstance(target_len, int) or target_len < 1):
        raise ValueError(f"target_len must be a positive int or null, got {target_len!r}")
    _check_call(timeout_s, answer_tag)
    if not completions:
        return []

    scores: list[Score | None] = [None] * len(completions)
    jobs: list[SandboxJob] = []
    pending: list[tuple[int, str, np.ndarray]] = []
    for i, (text, sample) in enumerate(zip(completions, samples)):
        target, reason = _svg_target(sample)
        if target is None:
            scores[i] = Score(-1.0, reason=reason)
            continue
        doc, reason = extract_svg(text, answer_tag)
        if doc is None:
            scores[i] = Score(-1.0, reason=reason)
            continue
        if _EXTERNAL_RE.search(doc):
            scores[i] = Score(-1.0, reason="external resource")
            continue
        size = json.dumps([int(target.shape[1]), int(target.shape[0])])
        jobs.append(
            SandboxJob(
                _SVG_SCRIPT.replace("__SIZE__", repr(size)).replace(
                    "__EXTERNAL_EXIT__", str(_EXTERNAL_EXIT)
                ),
                timeout_s=timeout_s,
                inputs={"in.svg": doc.encode("utf-8", "replace")},
                outputs={"out.png": MAX_PNG_BYTES},
                preload=SVG_PRELOAD,
            )
        )
        pending.append((i, doc, target))

    results = _pool("svg").map(jobs) if jobs else []
    for (i, doc, target), result in zip(pending, results):
        if not result.ok:
            reason = result.reason or "sandbox error"
            if result.exit_code == _EXTERNAL_EXIT and reason == f"exit code {_EXTERNAL_EXIT}":
                reason = "external resource"
            elif reason.startswith("exception: "):
                reason = "invalid svg"
            scores[i] = Score(-1.0, reason=reason)
            continue
        size = (target.shape[1], target.shape[0])
        gray, _ = _decode_gray(result.files.get("out.png", b""), size, expect=size)
        if gray is None:
            scores[i] = Score(-1.0, reason="bad render")
            continue
        if _is_blank(gray):
            scores[i] = Score(-1.0, reason="blank render")
            continue
        sim = svg_similarity(gray, target, blur_sigma)
        tokens = svg_tokens(doc)
        parts = {"sim": sim, "tokens": float(tokens)}
        value = sim
        reference_len = _target_tokens(samples[i], target_len)
        if reference_len is not None:
            penalty = length_weight * max(0.0, tokens / reference_len - 1.0)
            parts["length_penalty"] = penalty
            value -= penalty
        value = min(1.0, max(-1.0, value))
        scores[i] = Score(value, reason=None if value > -1.0 else "no similarity", parts=parts)
    return scores  # type: ignore[return-value]
