"""The video pipeline (mmrft.data.video): decoders, frame sampling, prompt budgets, the decoded-frame
cache, errors naming the file, and what the Qwen-VL processor makes of the frames.

Clips are written with PyAV into temp dirs: a red square moving right on black.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrft import video as V
from mmrft.data import DataError

av = pytest.importorskip("av", reason="PyAV writes the test clips (pip install av)")

ASSETS = Path(__file__).resolve().parents[1] / "assets"
TINY = ASSETS / "models" / "tiny-qwen2_5_vl"


def write_clip(
    path: Path,
    seconds: float = 3.0,
    fps: int = 10,
    width: int = 64,
    height: int = 64,
    faststart: bool = False,
) -> Path:
    """An H.264 mp4 of ``seconds`` × ``fps`` frames: a 16-pixel red square moving right."""
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        n = round(seconds * fps)
        for i in range(n):
            image = torch.zeros((height, width, 3), dtype=torch.uint8)
            x = round(i * (width - 16) / max(n - 1, 1))
            image[height // 2 - 8 : height // 2 + 8, x : x + 16, 0] = 255
            frame = av.VideoFrame.from_ndarray(image.numpy(), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    good = write_clip(folder / "square.mp4")
    data = good.read_bytes()
    (folder / "empty.mp4").write_bytes(b"")
    (folder / "corrupt.mp4").write_bytes(bytes((i * 37 + 11) % 256 for i in range(4000)))
    (folder / "truncated.mp4").write_bytes(data[: len(data) // 2])  # index (moov) at the end: cut
    fast = write_clip(folder / "fast.mp4", faststart=True).read_bytes()
    (folder / "truncated_faststart.mp4").write_bytes(fast[: len(fast) // 2])  # frames cut
    return {
        "square": good,
        "long": write_clip(folder / "long.mp4", seconds=20, fps=10, width=128, height=96),
        "short": write_clip(folder / "short.mp4", seconds=1, fps=5),
        "single": write_clip(folder / "single.mp4", seconds=0.1, fps=10),
        **{name: folder / f"{name}.mp4" for name in ("empty", "corrupt", "truncated")},
        "truncated_faststart": folder / "truncated_faststart.mp4",
    }


@pytest.fixture
def fresh_cache() -> V.VideoCache:
    return V.VideoCache(max_bytes=64 * 2**20)


def square_x(frame: torch.Tensor) -> float:
    """Column centroid (pixels) of the red square in a ``[3, H, W]`` uint8 frame."""
    red = (frame[0].float() - frame[1].float()).clamp(min=0)
    cols = torch.arange(red.shape[1], dtype=torch.float32)
    return float((red.sum(0) * cols).sum() / red.sum())


# -- decoders --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", V.BACKENDS)
def test_each_backend_decodes_the_clip(backend: str, clips: dict, fresh_cache) -> None:
    if backend not in V.available_backends():
        reasons = {
            "decord": "decord is not installed (pip install decord; x86-64 wheels only)",
            "torchcodec": "torchcodec is not installed or its FFmpeg libraries do not load "
            "(apt-get install ffmpeg)",
            "pyav": "PyAV is not installed (pip install av)",
        }
        if os.environ.get("MMRFT_VIDEO_BACKEND"):
            reasons[backend] = f"MMRFT_VIDEO_BACKEND={os.environ['MMRFT_VIDEO_BACKEND']}"
        pytest.skip(reasons[backend])
    frames, sample_fps, meta = V.read_video(
        clips["square"], V.VideoBudget(), 28, backend=backend, cache=fresh_cache
    )
    assert frames.dtype == torch.uint8 and frames.shape == (6, 3, 56, 56)  # 3 s × 2 fps
    assert sample_fps == pytest.approx(2.0)
    assert meta["backend"] == backend
    assert (meta["fps"], meta["total_num_frames"], meta["duration"]) == (10.0, 30, 3.0)
    assert meta["frames_indices"] == [0, 6, 12, 17, 23, 29]
    xs = [square_x(f) for f in frames]
    assert all(b > a for a, b in itertools.pairwise(xs)), xs  # the square moves right, in order
    assert xs[0] < 15 and xs[-1] > 40
    if backend != "pyav" and "pyav" in V.available_backends():  # decoders agree on the pixels
        reference, _, _ = V.read_video(clips["square"], backend="pyav", cache=fresh_cache)
        assert (frames.float() - reference.float()).abs().mean() < 3.0


def test_backend_order_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    usable = V.available_backends()
    assert usable == [b for b in V.BACKENDS if b in usable]  # decord, torchcodec, pyav
    monkeypatch.setenv("MMRFT_VIDEO_BACKEND", "pyav")
    assert V.available_backends() == (["pyav"] if "pyav" in usable else [])
    monkeypatch.setenv("MMRFT_VIDEO_BACKEND", "opencv")
    with pytest.raises(ValueError, match="opencv"):
        V.available_backends()


# -- sampling ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("clip", "budget", "frames"),
    [
        ("square", V.VideoBudget(fps=2.0), 6),  # 3 s × 2 fps
        ("square", V.VideoBudget(fps=1.0), 4),  # 3 → min_frames 4
        ("square", V.VideoBudget(fps=10.0), 16),  # 30 → max_frames 16
        ("square", V.VideoBudget(fps=0.5, min_frames=3), 4),  # min_frames rounds up to even
        ("square", V.VideoBudget(fps=2.0, max_frames=5), 4),  # max_frames rounds down to even
        ("square", V.VideoBudget(fps=3.5, max_frames=32), 10),  # 10.5 → 10
        ("short", V.VideoBudget(fps=10.0), 4),  # only 5 frames in the file → 4 (even)
        ("single", V.VideoBudget(), 2),  # one frame, repeated to one temporal step
    ],
)
def test_frame_counts(clip: str, budget: V.VideoBudget, frames: int, clips, fresh_cache) -> None:
    out, sample_fps, meta = V.read_video(clips[clip], budget, 28, cache=fresh_cache)
    assert out.shape[0] == frames == len(meta["frames_indices"])
    assert frames % V.TEMPORAL_PATCH == 0
    assert sample_fps == pytest.approx(frames / meta["duration"])
    indices = meta["frames_indices"]
    assert indices[0] == 0 and indices[-1] == meta["total_num_frames"] - 1
    assert indices == sorted(indices)


def test_frame_count_rules() -> None:
    budget = V.VideoBudget(fps=2.0, min_frames=4, max_frames=16)
    assert V.frame_count(3.0, 30, 2.0, budget) == 6
    assert V.frame_count(600.0, 18000, 2.0, budget) == 16
    assert V.frame_count(0.5, 15, 2.0, budget) == 4
    assert V.frame_count(1.0, 3, 2.0, budget) == 2
    assert V.frame_indices(30, 4) == [0, 10, 19, 29]
    assert V.frame_indices(1, 2) == [0, 0]


def test_budget_validation_and_part_overrides() -> None:
    with pytest.raises(ValueError, match="min_frames"):
        V.VideoBudget(min_frames=20, max_frames=16)
    with pytest.raises(ValueError, match="fps"):
        V.VideoBudget(fps=0)
    budget = V.VideoBudget()
    assert (
        budget.override({"nframes": 7}).min_frames
        == budget.override({"nframes": 7}).max_frames
        == 8
    )
    assert budget.override({"max_pixels": 1000}).min_pixels == 1000
    assert budget.override({"type": "video", "video": "x.mp4"}) is budget
    with pytest.raises(ValueError, match="video_start"):
        budget.override({"video_start": 1.0})
    with pytest.raises(ValueError, match="either"):
        budget.override({"fps": 1.0, "nframes": 4})


# -- prompt budget -----------------------------------------------------------------------------
def test_fit_budget_lowers_fps_then_pixels() -> None:
    budget = V.VideoBudget(max_pixels=12544)
    free = V.fit_budget(20.0, 128, 96, budget, text_tokens=30, factor=28)
    assert (free.frames, free.height, free.width, free.visual_tokens) == (16, 84, 140, 120)
    assert not free.reduced and tuple(free) == (free.fps, 84 * 140)
    fps, pixels = V.fit_budget(
        20.0, 128, 96, V.VideoBudget(max_pixels=12544, max_prompt_tokens=90), 30, 28
    )
    assert (fps, pixels) == (8 / 20.0, 84 * 140)  # 8 frames: 4 steps × 15 tokens = 60 ≤ 90 − 30
    fit = V.fit_budget(20.0, 128, 96, V.VideoBudget(max_pixels=12544, max_prompt_tokens=50), 30, 28)
    assert fit.lowered_fps and fit.lowered_pixels and fit.frames == 4
    assert fit.visual_tokens <= 20 and (fit.height, fit.width) == (56, 84)
    with pytest.raises(V.VideoBudgetError, match=r"clip\.mp4.*max_prompt_tokens=31"):
        V.fit_budget(20.0, 128, 96, V.VideoBudget(max_prompt_tokens=31), 30, 28, source="clip.mp4")
    with_total = V.fit_budget(20.0, 640, 480, V.VideoBudget(total_pixels=16 * 28 * 28 * 8), 0, 28)
    assert with_total.visual_tokens <= 16 * 8  # total_pixels / factor² tokens


def video_batch(processor, text: str, videos: list, kwargs: dict) -> tuple:
    """The one video's frames and metadata from ``process_vision_info``, and the processor's
    batch of ``text`` with them (no resizing: the frames are already at the fitted size)."""
    ((frames, metadata),) = videos
    batch = processor(
        text=[text],
        videos=[frames],
        video_metadata=[metadata],
        do_resize=False,
        return_tensors="pt",
        **kwargs,
    )
    return frames, metadata, batch


def test_long_video_fits_and_matches_the_processor(clips, fresh_cache, caplog) -> None:
    """A 20 s clip under a small max_prompt_tokens gets fewer frames and pixels; the token count
    fit_budget computed is the one the tiny Qwen2.5-VL processor produces, and the prompt fits."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(TINY)
    text = processor.apply_chat_template(
        [
            {
                "role": "user",
                "content": [
                    {"type": "video", "video": str(clips["long"])},
                    {"type": "text", "text": "When?"},
                ],
            }
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    (n_text,) = V.count_text_tokens(processor, [text])
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    for limit, lowered in [
        (None, (False, False)),
        (n_text + 60, (True, False)),
        (n_text + 20, (True, True)),
    ]:
        budget = V.VideoBudget(max_pixels=12544, max_prompt_tokens=limit)
        part = {"type": "video", "video": str(clips["long"])}
        with caplog.at_level(logging.WARNING, logger="mmrft.data.video"):
            _, videos, kwargs = V.process_vision_info(
                [[{"role": "user", "content": [part]}]],
                budget=budget,
                return_video_metadata=True,
                text_tokens=[n_text],
            )
        _, _, batch = video_batch(processor, text, videos, kwargs)
        fit = V.fit_budget(20.0, 128, 96, budget, n_text, 28, total_frames=200)
        assert (fit.lowered_fps, fit.lowered_pixels) == lowered
        assert int((batch["input_ids"] == video_pad).sum()) == fit.visual_tokens
        assert batch["video_grid_thw"].tolist() == [
            [fit.frames // 2, fit.height // 14, fit.width // 14]
        ]
        if limit is not None:
            assert batch["input_ids"].shape[1] <= limit
        sample_fps = fit.frames / 20.0
        assert batch["second_per_grid_ts"].tolist() == pytest.approx([2 / sample_fps])
    assert "max_prompt_tokens" in caplog.text and "long.mp4" in caplog.text
    assert V.video_stats()["fps_lowered"] >= 2 and V.video_stats()["pixels_lowered"] >= 1


def test_qwen3_timestamps_count_against_the_budget(clips) -> None:
    """Qwen3-VL prompts carry "<t seconds>" per temporal step: with step_tokens the fitted
    prompt fits max_prompt_tokens, and the timestamps are the sampled frames' times."""
    from transformers import AutoProcessor, Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    base = AutoProcessor.from_pretrained(TINY)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16),
        tokenizer=base.tokenizer,
        video_processor=Qwen3VLVideoProcessor(patch_size=16),
        chat_template=base.chat_template,
    )
    step = V.timestamp_step_tokens(processor)
    assert step >= 2 + len(
        base.tokenizer("<1234.5 seconds>", add_special_tokens=False)["input_ids"]
    )
    part = {"type": "video", "video": str(clips["long"])}
    conv = [{"role": "user", "content": [part, {"type": "text", "text": "When?"}]}]
    text = processor.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    (n_text,) = V.count_text_tokens(processor, [text])
    for limit in (n_text + 150, n_text + 60):
        budget = V.VideoBudget(max_pixels=16384, max_prompt_tokens=limit)
        _, videos, kwargs = V.process_vision_info(
            [conv],
            budget=budget,
            image_patch_size=16,
            return_video_metadata=True,
            text_tokens=[n_text],
            step_tokens=step,
        )
        frames, metadata, batch = video_batch(processor, text, videos, kwargs)
        assert batch["input_ids"].shape[1] <= limit
        assert frames.shape[0] < 16  # the budget lowered the fps
        decoded = processor.tokenizer.decode(batch["input_ids"][0])
        first, last = metadata["frames_indices"][:2], metadata["frames_indices"][-2:]
        assert f"<{sum(first) / 2 / 10:.1f} seconds>" in decoded
        assert f"<{sum(last) / 2 / 10:.1f} seconds>" in decoded


def test_metadata_gives_transformers_the_sampled_rate(clips, fresh_cache) -> None:
    from transformers.video_utils import VideoMetadata

    _, sample_fps, meta = V.read_video(clips["square"], V.VideoBudget(fps=1.5), cache=fresh_cache)
    metadata = VideoMetadata(**V.processor_metadata(meta))
    assert metadata.sampled_fps == pytest.approx(sample_fps) == pytest.approx(4 / 3.0)
    # Qwen3-VL's frame timestamps (seconds) are the sampled frames' own times
    assert metadata.timestamps == pytest.approx([i / 10.0 for i in meta["frames_indices"]])


# -- cache -------------------------------------------------------------------------------------
def test_cache_decodes_once_per_group(clips, fresh_cache, monkeypatch) -> None:
    calls = []
    decode = V._decode

    def counting(*args, **kwargs):
        calls.append(args[0].path)
        return decode(*args, **kwargs)

    monkeypatch.setattr(V, "_decode", counting)
    outs = [V.read_video(clips["square"], cache=fresh_cache) for _ in range(8)]
    assert len(calls) == 1 and fresh_cache.hits == 7 and fresh_cache.misses == 1
    assert all(o[0] is outs[0][0] for o in outs) and outs[0][1] == outs[7][1]
    # concurrent requests of a new key decode once too
    budget = V.VideoBudget(fps=1.0)
    threads = [
        threading.Thread(
            target=V.read_video, args=(clips["square"], budget), kwargs={"cache": fresh_cache}
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 2
    # another budget, or an edited file, is another entry
    V.read_video(clips["square"], V.VideoBudget(min_pixels=784, max_pixels=1568), cache=fresh_cache)
    assert len(calls) == 3
    stat = clips["square"].stat()
    os.utime(clips["square"], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    V.read_video(clips["square"], cache=fresh_cache)
    assert len(calls) == 4


def test_group_of_eight_prompts_decodes_once(clips, monkeypatch) -> None:
    cache = V.VideoCache()
    monkeypatch.setattr(V, "VIDEO_CACHE", cache)
    conv = [{"role": "user", "content": [{"type": "video", "video": str(clips["short"])}]}]
    _, videos, _ = V.process_vision_info([conv] * 8, return_video_metadata=True)
    assert len(videos) == 8 and cache.misses == 1 and cache.hits == 7


def test_cache_is_bounded_in_bytes(clips) -> None:
    one = 6 * 3 * 56 * 56  # bytes of the default sampling of the square clip
    cache = V.VideoCache(max_bytes=int(2.5 * one))
    for fps in (2.0, 2.1, 2.2):  # 6 frames each time: the same sampling decision, one entry
        V.read_video(clips["square"], V.VideoBudget(fps=fps), cache=cache)
    assert len(cache) == 1
    for max_frames in (6, 8, 10, 12):
        V.read_video(clips["square"], V.VideoBudget(fps=10, max_frames=max_frames), cache=cache)
    assert cache.nbytes <= cache.max_bytes and len(cache) == 1  # 8+ frames: one fits at a time
    tiny = V.VideoCache(max_bytes=100)
    V.read_video(clips["square"], cache=tiny)
    assert len(tiny) == 0 and tiny.nbytes == 0  # larger than the bound: not kept


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["empty", "corrupt", "truncated", "truncated_faststart"])
def test_bad_files_raise_data_error_naming_them(name: str, clips, fresh_cache) -> None:
    path = clips[name]
    for backend in [None, *V.available_backends()]:
        with pytest.raises(DataError, match=path.name) as info:
            V.read_video(path, backend=backend, cache=fresh_cache)
        assert str(path) in str(info.value)
    if name != "truncated_faststart":  # its header is intact: only decoding finds the cut
        with pytest.raises(DataError, match=path.name):
            V.probe_video(str(path))


def test_missing_file_and_frames(tmp_path: Path, fresh_cache) -> None:
    with pytest.raises(DataError, match=r"nowhere\.mp4: video file not found"):
        V.read_video(tmp_path / "nowhere.mp4", cache=fresh_cache)
    with pytest.raises(DataError, match=r"gone\.png: video frame not found"):
        V.read_video([str(tmp_path / "gone.png")], cache=fresh_cache)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"bad\.png: corrupt or unreadable video frame"):
        V.read_video([str(bad)], cache=fresh_cache)


# -- frame lists -------------------------------------------------------------------------------
def test_frame_list_is_a_video(tmp_path: Path, fresh_cache) -> None:
    paths = []
    for i in range(20):
        paths.append(str(tmp_path / f"f{i:02d}.png"))
        Image.new("RGB", (64, 48), (10 * i, 0, 0)).save(paths[-1])
    frames, sample_fps, meta = V.read_video(paths[:4], frames_fps=1.0, cache=fresh_cache)
    assert frames.shape == (4, 3, 56, 56) and sample_fps == 1.0
    assert meta["frames_indices"] == [0, 1, 2, 3] and meta["backend"] == "frames"
    frames, sample_fps, meta = V.read_video(paths, V.VideoBudget(max_frames=8), cache=fresh_cache)
    assert frames.shape[0] == 8 and sample_fps == pytest.approx(8 / 10.0)  # 20 frames at 2 fps
    red = frames[:, 0].float().mean(dim=(1, 2))
    assert torch.all(red[1:] > red[:-1])  # in order
    again, _, _ = V.read_video(paths, V.VideoBudget(max_frames=8), cache=fresh_cache)
    assert again is frames and fresh_cache.hits == 1


# -- the Qwen-VL prepare path ------------------------------------------------------------------
def test_prepare_through_mmrft_video(clips, monkeypatch) -> None:
    """The hook in the Qwen2.5-VL family's prepare: a video file becomes grids, frames and a time
    step that survive split/collate, and the model runs on them (before the lead's patch this
    routes qwen-vl-utils' process_vision_info to mmrft.data.video; after it, it is the real path)."""
    import qwen_vl_utils

    from mmrft.models import qwen_vl
    from mmrft.models.qwen_vl import Qwen25VL

    def hook(
        conversations, return_video_kwargs=True, return_video_metadata=False, image_patch_size=14
    ):
        return V.process_vision_info(
            conversations,
            image_patch_size=image_patch_size,
            return_video_metadata=return_video_metadata,
        )

    monkeypatch.setattr(qwen_vl_utils, "process_vision_info", hook)
    monkeypatch.setattr(qwen_vl, "require_video_reader", lambda: None)
    family = Qwen25VL()
    processor = family.load_processor(str(TINY))
    model = family.load_model(str(TINY)).eval()
    conv = [
        {
            "role": "user",
            "content": [
                {"type": "video", "video": str(clips["square"])},
                {"type": "text", "text": "Q"},
            ],
        }
    ]
    batch = family.prepare(processor, [conv, [{"role": "user", "content": "Hi"}]])
    assert batch["video_grid_thw"].tolist() == [[3, 4, 4]]  # 6 frames of 56×56
    assert batch["second_per_grid_ts"].tolist() == pytest.approx([1.0])  # 2 frames / 2 fps
    rows = family.split_rows(batch, processor)
    collated = family.collate_rows(rows, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        assert torch.allclose(model(**batch).logits, model(**collated).logits, atol=1e-5)
    bad = [{"role": "user", "content": [{"type": "video", "video": str(clips["corrupt"])}]}]
    with pytest.raises(DataError, match=r"corrupt\.mp4"):
        family.prepare(processor, [bad])


# -- shuffled frames (T-GRPO) ------------------------------------------------------------------
def test_shuffled_order_is_a_seeded_permutation_never_the_identity() -> None:
    order = V.shuffled_order(16, seed=7)
    assert order == V.shuffled_order(16, seed=7)  # a pure function of (frames, seed)
    assert sorted(order) == list(range(16)) and order != list(range(16))
    assert len({tuple(V.shuffled_order(16, seed)) for seed in range(20)}) == 20
    assert all(V.shuffled_order(2, seed) == [1, 0] for seed in range(20))  # redrawn if identity
    assert V.shuffled_order(1, 3) == [0] and V.shuffled_order(0, 3) == []


def test_shuffled_video_part_permutes_whole_frames(clips, monkeypatch) -> None:
    """``frame_shuffle_seed`` permutes the sampled frames and nothing else: same frame count,
    sizes, metadata and fps; the cached ordered frames stay as they were."""
    cache = V.VideoCache()
    monkeypatch.setattr(V, "VIDEO_CACHE", cache)
    part = {"type": "video", "video": str(clips["square"])}
    frames, metadata, fps = V.fetch_video(part)
    kept = frames.clone()
    conv = [{"role": "user", "content": [part, {"type": "text", "text": "Q"}]}]
    shuffled_conv = V.with_shuffled_frames(conv, seed=11)
    assert conv[0]["content"][0] == part and V.SHUFFLE_KEY not in part  # input untouched
    assert shuffled_conv[0]["content"][1] is conv[0]["content"][1]
    seed = shuffled_conv[0]["content"][0][V.SHUFFLE_KEY]
    assert V.with_shuffled_frames(conv, seed=11) == shuffled_conv  # deterministic
    assert V.with_shuffled_frames(conv, seed=12) != shuffled_conv
    shuffled, shuffled_metadata, shuffled_fps = V.fetch_video(shuffled_conv[0]["content"][0])
    order = V.shuffled_order(6, seed)
    assert shuffled.shape == frames.shape == (6, 3, 56, 56)
    assert torch.equal(shuffled, frames[order]) and order != list(range(6))
    assert shuffled_metadata == metadata and shuffled_fps == fps
    xs = [square_x(f) for f in shuffled]
    assert not all(b > a for a, b in itertools.pairwise(xs))  # the square no longer moves right
    assert torch.equal(frames, kept) and cache.misses == 1  # decoded once, cache untouched
    # two videos in one conversation get different permutations
    two = V.with_shuffled_frames([{"role": "user", "content": [part, part]}], seed=11)
    seeds = [p[V.SHUFFLE_KEY] for p in two[0]["content"]]
    assert seeds[0] == seed and seeds[0] != seeds[1]


def test_prepare_shuffled_video_keeps_the_prompt(clips, monkeypatch) -> None:
    """Through the Qwen2.5-VL family's prepare: the shuffled prompt has the same tokens, grid
    and time step (mRoPE positions), and other pixels."""
    from mmrft.models import qwen_vl
    from mmrft.models.qwen_vl import Qwen25VL

    monkeypatch.setattr(qwen_vl, "require_video_reader", lambda: None)
    family = Qwen25VL()
    processor = family.load_processor(str(TINY))
    conv = [
        {
            "role": "user",
            "content": [
                {"type": "video", "video": str(clips["square"])},
                {"type": "text", "text": "Q"},
            ],
        }
    ]
    ordered = family.prepare(processor, [conv])
    shuffled = family.prepare(processor, [V.with_shuffled_frames(conv, seed=3)])
    for key in ("input_ids", "attention_mask", "video_grid_thw", "second_per_grid_ts"):
        assert torch.equal(ordered[key], shuffled[key]), key
    values, other = ordered["pixel_values_videos"], shuffled["pixel_values_videos"]
    assert values.shape == other.shape and not torch.equal(values, other)
    # the same pixels, in other places: every frame's values appear once in each
    assert torch.equal(values.flatten().sort().values, other.flatten().sort().values)
