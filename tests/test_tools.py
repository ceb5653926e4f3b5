"""The tool API of multi-turn rollouts (mmrft.rollout.tool) and the built-in tools (tools/ →
mmrft.tools): registration, schemas, box frames mapped to the original image, budgets, the
video clip, and hostile calls that must all come back as failed observations with a reason."""

from __future__ import annotations

import json
import math
import textwrap
import threading
from pathlib import Path

import pytest
from PIL import Image

from mmrft.data import Sample
from mmrft.data.video import VideoBudget, probe_video
from mmrft.models.qwen_vl import Qwen2VL, Qwen25VL
from mmrft.plugins import TOOLS, UnknownNameError, load_plugin
from mmrft.rollout.tool import (
    MAX_CALL_BYTES,
    Observation,
    ParseError,
    ToolCall,
    ToolContext,
    VideoClip,
    check_schema,
    enabled_tools,
    parse_tool_calls,
    run_tool_call,
    tool,
    tool_schemas,
    tool_stats,
)

RED = (230, 20, 20)
SQUARE = (800, 600, 1000, 800)  # the red square, pixels of the 1600 × 1200 original


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1600 × 1200 grey image with a red 200 × 200 square at :data:`SQUARE`."""
    image = Image.new("RGB", (1600, 1200), (128, 128, 128))
    image.paste(RED, SQUARE)
    path = tmp_path_factory.mktemp("tools") / "picture.png"
    image.save(path)
    return path


def sample_of(path: Path) -> Sample:
    content = [{"type": "image", "image": str(path)}, {"type": "text", "text": "What is red?"}]
    return Sample("s0", [{"role": "user", "content": content}])


def call(text: str, context: ToolContext) -> Observation:
    """Parse ``text`` (one call expected) and run it."""
    calls = parse_tool_calls(text)
    assert len(calls) == 1, calls
    return run_tool_call(calls[0], context)


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def red_share(image: Image.Image) -> float:
    pixels = list(image.convert("RGB").getdata())
    return sum(p == RED for p in pixels) / len(pixels)


# -- registration and schemas ---------------------------------------------------------------
def test_builtins_and_aliases_resolve_to_one_tool():
    for name in ("crop", "image_zoom_in", "rotate", "video_frames"):
        assert name in TOOLS
    assert TOOLS.get("image_zoom_in") is TOOLS.get("crop")
    assert TOOLS.get("crop").aliases == ("image_zoom_in", "image_zoom_in_tool")
    with pytest.raises(UnknownNameError, match=r"unknown tool 'crpo'; did you mean 'crop'"):
        TOOLS.get("crpo")
    with pytest.raises(UnknownNameError, match="did you mean 'rotate'"):
        tool_schemas(["rotat"])


def test_schemas_are_function_descriptions_with_valid_json_schemas():
    names = ["crop", "image_zoom_in", "rotate", "video_frames"]
    schemas = tool_schemas(names)
    assert [s["function"]["name"] for s in schemas] == names  # an alias keeps its name
    for schema in schemas:
        assert json.loads(json.dumps(schema, allow_nan=False)) == schema
        assert schema["type"] == "function"
        assert set(schema["function"]) == {"name", "description", "parameters"}
        assert schema["function"]["description"]
        params = schema["function"]["parameters"]
        check_schema(params)
        assert params["type"] == "object"
        assert set(params["required"]) <= set(params["properties"])
        for prop in params["properties"].values():
            assert prop["type"] in ("array", "number", "integer", "string")
            assert isinstance(prop.get("description", ""), str)
    crop = schemas[0]["function"]["parameters"]["properties"]["bbox_2d"]
    assert crop["minItems"] == crop["maxItems"] == 4 and crop["items"] == {"type": "number"}


def test_decorator_and_file_plugin_register_tools(tmp_path):
    plugin = tmp_path / "my_tools.py"
    plugin.write_text(
        textwrap.dedent(
            '''
            from mmrft.rollout.tool import Observation, tool

            @tool("test_shout", aliases=("test_yell",), timeout_s=5, parameters={
                "type": "object",
                "properties": {"word": {"type": "string"}, "times": {"type": "integer",
                               "minimum": 1, "maximum": 3}},
                "required": ["word"],
            })
            def shout(context, *, word, times=1):
                """Repeat a word loudly."""
                return Observation(ok=True, text=" ".join([word.upper()] * times))
            '''
        )
    )
    load_plugin(str(plugin))
    spec = TOOLS.get("test_yell")
    assert (spec.name, spec.aliases, spec.timeout_s) == ("test_shout", ("test_yell",), 5.0)
    assert spec.description == "Repeat a word loudly."
    ctx = ToolContext()
    obs = call(tool_call("test_yell", word="hi", times=2.0), ctx)  # 2.0 is an integer
    assert (obs.ok, obs.text, obs.reason) == (True, "HI HI", None)
    obs = call(tool_call("test_shout", word="hi", times=4), ctx)
    assert (obs.ok, obs.reason) == (False, "bad_argument")
    assert "times: must be ≤ 3" in obs.text and "Usage: test_shout(word: string" in obs.text
    obs = call(tool_call("test_shout", times=1), ctx)
    assert (obs.ok, obs.reason) == (False, "missing_argument")
    obs = call(tool_call("test_shout", word="hi", volume=11), ctx)
    assert (obs.ok, obs.reason) == (False, "bad_argument")
    assert "unknown argument 'volume'" in obs.text
    # only the enabled tools are callable when a mapping is given
    obs = run_tool_call(ToolCall("crop", {"bbox_2d": [0, 0, 1, 1]}), ctx, enabled_tools(["rotate"]))
    assert obs.reason == "unknown_tool" and "rotate" in obs.text


def test_bad_registrations_fail_at_start_up():
    schema = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    with pytest.raises(ValueError, match="unsupported schema keywords"):
        tool("test_bad1", parameters={**schema, "oneOf": []})
    with pytest.raises(ValueError, match=r"required \['y'\] are not properties"):
        tool("test_bad2", parameters={**schema, "required": ["y"]})
    with pytest.raises(TypeError, match="parameter 'y' is not in the schema"):
        tool("test_bad3", parameters=schema)(lambda context, *, x, y=1: None)
    with pytest.raises(TypeError, match="schema property 'x' is not a parameter"):
        tool("test_bad4", parameters=schema)(lambda context: None)
    assert "test_bad3" not in TOOLS and "test_bad4" not in TOOLS


# -- parsing --------------------------------------------------------------------------------
def test_parse_tool_calls_reads_several_calls_and_string_arguments():
    text = (
        "I will zoom. "
        + tool_call("crop", bbox_2d=[1, 2, 3, 4])
        + ' then <tool_call>{"name": "rotate", "arguments": "{\\"angle\\": 90}"}</tool_call> done'
    )
    assert parse_tool_calls(text) == [
        ToolCall("crop", {"bbox_2d": [1, 2, 3, 4]}),
        ToolCall("rotate", {"angle": 90}),
    ]
    assert parse_tool_calls("no calls here") == []
    # generation stopped at </tool_call> and the stop string was cut off
    cut = '<tool_call>{"name": "rotate", "arguments": {"angle": 180}}'
    assert parse_tool_calls(cut, closed_by_stop=True) == [ToolCall("rotate", {"angle": 180})]
    assert parse_tool_calls(cut)[0].reason == "unterminated_tag"


def test_parse_tool_calls_survives_hostile_text():
    reasons = lambda text: [getattr(c, "reason", "ok") for c in parse_tool_calls(text)]  # noqa: E731
    assert reasons("<tool_call>{not json</tool_call>") == ["bad_json"]
    assert reasons("<tool_call>[1, 2]</tool_call>") == ["bad_json"]
    assert reasons('<tool_call>{"name": 3}</tool_call>') == ["bad_json"]
    assert reasons('<tool_call>{"name": "crop", "arguments": [1]}</tool_call>') == ["bad_json"]
    assert reasons('<tool_call>{"name": "crop", "arguments": "{oops"}</tool_call>') == ["bad_json"]
    assert reasons("<tool_call>" + "[" * 6000 + "</tool_call>") == ["bad_json"]  # deep nesting
    assert reasons("<tool_call><tool_call>" + tool_call("crop")[11:]) == ["unterminated_tag", "ok"]
    assert reasons("<tool_call>" + "x" * (MAX_CALL_BYTES + 1) + "</tool_call>") == [
        "payload_too_large"
    ]
    assert reasons(tool_call("rotate", angle=90) * 20) == ["ok"] * 8 + ["too_many_calls"]
    nan = parse_tool_calls('<tool_call>{"name": "crop", "arguments": {"bbox_2d": NaN}}</tool_call>')
    assert isinstance(nan[0], ToolCall) and math.isnan(nan[0].arguments["bbox_2d"])


# -- crop: box frames -----------------------------------------------------------------------
@pytest.mark.parametrize("family", [Qwen2VL, Qwen25VL])
def test_both_box_frames_crop_the_same_region_of_the_original(picture, family):
    """Qwen2-VL writes the red square in norm1000, Qwen2.5-VL in pixels of its resized input
    (728 × 532 for 1600 × 1200); both crops are the square, cut from the full-resolution image."""
    fam = family()
    ctx = ToolContext.from_sample(sample_of(picture), fam)
    assert ctx.box_frame == fam.box_frame and ctx.images[0].size == (1600, 1200)
    if fam.box_frame == "norm1000":
        box = [round(v) for v in (800 / 1.6, 600 / 1.2, 1000 / 1.6, 800 / 1.2)]
    else:
        assert ctx.input_sizes[0] == (728, 532)
        sx, sy = 1600 / 728, 1200 / 532
        box = [round(v) for v in (800 / sx, 600 / sy, 1000 / sx, 800 / sy)]
    mapped = ctx.to_image_pixels(box)
    assert all(abs(a - b) <= 2.5 for a, b in zip(mapped, SQUARE)), mapped
    for name in ("crop", "image_zoom_in"):
        obs = call(tool_call(name, bbox_2d=box), ctx)
        assert obs.ok and obs.reason is None and len(obs.images) == 1, obs.text
        region = obs.images[0]
        assert abs(region.size[0] - 200) <= 4 and abs(region.size[1] - 200) <= 4
        assert red_share(region) > 0.95
        assert region.getpixel((region.size[0] // 2, region.size[1] // 2)) == RED
    # a box of the grey area beside the square holds no red
    grey = call(tool_call("crop", bbox_2d=[0, 0, 100, 100]), ctx)
    assert grey.ok and red_share(grey.images[0]) == 0.0


def test_crop_respects_the_pixel_budget_and_keeps_the_aspect(picture):
    ctx = ToolContext.from_sample(sample_of(picture), Qwen2VL(), max_pixels=10_000)
    obs = call(tool_call("crop", bbox_2d=[0, 0, 500, 500]), ctx)  # 800 × 600 original pixels
    w, h = obs.images[0].size
    assert obs.ok and w * h <= 10_000 and abs(w / h - 800 / 600) < 0.03
    obs = call(tool_call("crop", bbox_2d=[500, 500, 625, 667]), ctx)  # the square: 200 × 200
    assert obs.ok and obs.images[0].size[0] * obs.images[0].size[1] <= 10_000
    assert red_share(obs.images[0]) > 0.9
    # a crop of a returned crop: image_index 1
    ctx.add_image(obs.images[0], (100, 100))
    again = call(tool_call("crop", bbox_2d=[0, 0, 500, 500], image_index=1), ctx)
    assert again.ok and red_share(again.images[0]) > 0.9
    bad = call(tool_call("crop", bbox_2d=[0, 0, 500, 500], image_index=7), ctx)
    assert (bad.ok, bad.reason) == (False, "bad_argument") and "images are 0 to 1" in bad.text


def test_rotate(picture):
    image = Image.new("RGB", (300, 100), (0, 0, 0))
    image.paste(RED, (0, 0, 50, 50))  # top left
    ctx = ToolContext(images=[image], box_frame="pixels")
    obs = call(tool_call("rotate", angle=90), ctx)
    assert obs.ok and obs.images[0].size == (100, 300)
    assert obs.images[0].getpixel((10, 290)) == RED  # counter-clockwise: now bottom left
    obs = call(tool_call("rotate", angle=45), ctx)
    assert (obs.ok, obs.reason) == (False, "bad_argument") and "one of 90, 180, 270" in obs.text


# -- video_frames ---------------------------------------------------------------------------
def write_clip(path: Path) -> Path:
    """test_video.py's clip: 3 s at 10 fps, a 16-pixel red square moving right."""
    pytest.importorskip("av", reason="PyAV writes the test clips (pip install av)")
    from test_video import write_clip as write

    return write(path)


@pytest.fixture(scope="module")
def video_context(tmp_path_factory: pytest.TempPathFactory) -> ToolContext:
    clip = write_clip(tmp_path_factory.mktemp("clip") / "square.mp4")
    return ToolContext(video=str(clip), video_budget=VideoBudget(max_frames=8), factor=28)


def square_x(frame: Image.Image) -> float:
    """Column centroid (pixels) of the red square on the frame's middle row."""
    row = frame.size[1] // 2
    columns = [x for x in range(frame.size[0]) if frame.getpixel((x, row))[0] > 128]
    return sum(columns) / len(columns)


def test_video_frames_returns_a_clip_with_the_source_timestamps(video_context):
    from mmrft.data.video import fetch_video

    obs = call(tool_call("video_frames", start_s=1.0, end_s=2.0, n=4), video_context)
    assert obs.ok and obs.images == [] and len(obs.videos) == 1, obs.text
    clip = obs.videos[0]
    assert isinstance(clip, VideoClip) and len(clip.frames) == 4
    # frames 10..20 of a 10 frames/s video, linspace(10, 20, 4).round() = 10, 13, 17, 20
    assert clip.timestamps_s == pytest.approx([1.0, 1.3, 1.7, 2.0])
    assert clip.fps == pytest.approx(3 / 1.0)
    assert "1.00, 1.30, 1.70, 2.00 s" in obs.text
    xs = [square_x(f) for f in clip.frames]
    assert xs == sorted(xs) and xs[0] < xs[-1]  # the square moves right over time
    # the clip renders as a video of exactly its frames (not loose images)
    part = obs.content()[0]
    assert part["type"] == "video" and part["nframes"] == 4
    frames, metadata, _ = fetch_video(part, VideoBudget(), 28)
    assert frames.shape[0] == 4 and metadata["total_num_frames"] == 4
    odd = call(tool_call("video_frames", start_s=0, end_s=3.0, n=3), video_context)
    assert odd.ok and len(odd.videos[0].frames) == 4 and "rounded to 4" in odd.text


def test_video_frames_defaults_to_one_second_and_eight_frames(video_context):
    """A call with start_s alone looks at 1 s from there (cut at the video's end) in 8 frames
    (fewer when the video budget allows fewer): ``{"start_s": 1.0}`` is the explicit call's
    twin."""
    short = call(tool_call("video_frames", start_s=1.0), video_context)
    explicit = call(tool_call("video_frames", start_s=1.0, end_s=2.0, n=8), video_context)
    assert short.ok and short.info == explicit.info == {"span_s": [1.0, 2.0], "frames": 8}
    assert short.videos[0].timestamps_s == explicit.videos[0].timestamps_s
    duration = probe_video(video_context.video).duration_s
    late = call(tool_call("video_frames", start_s=duration - 0.5), video_context)
    assert late.ok and late.info["span_s"] == [duration - 0.5, duration]
    few = ToolContext(video=video_context.video, video_budget=VideoBudget(max_frames=4), factor=28)
    assert call(tool_call("video_frames", start_s=1.0), few).info["frames"] == 4


def test_video_frames_decodes_a_window_once_per_file_version(tmp_path):
    """A group's completions fetching the same window decode it once (the tool's clip cache,
    keyed by file, mtime, size, indices and frame size); another window, or the file rewritten,
    decodes again; the cached frames equal a fresh decode."""
    import os

    cache = TOOLS.get("video_frames").fn.__globals__["CLIP_CACHE"]
    clip = write_clip(tmp_path / "square.mp4")
    context = ToolContext(video=str(clip), video_budget=VideoBudget(max_frames=8), factor=28)
    cache.clear()
    first = call(tool_call("video_frames", start_s=1.0, n=4), context)
    again = call(tool_call("video_frames", start_s=1.0, n=4), context)
    assert (cache.misses, cache.hits) == (1, 1)
    assert [f.tobytes() for f in first.videos[0].frames] == [
        f.tobytes() for f in again.videos[0].frames
    ]
    assert call(tool_call("video_frames", start_s=0.5, n=4), context).ok
    assert (cache.misses, cache.hits) == (2, 1)
    stat = clip.stat()
    os.utime(clip, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file "changed"
    assert call(tool_call("video_frames", start_s=1.0, n=4), context).ok
    assert (cache.misses, cache.hits) == (3, 1)


def test_video_frames_refuses_bad_intervals_and_budgets(video_context):
    cases = [
        ({"start_s": 0, "end_s": 1, "n": 1000}, "too_many_frames"),
        ({"start_s": 2, "end_s": 1, "n": 4}, "bad_argument"),
        ({"start_s": 1, "end_s": 1, "n": 4}, "bad_argument"),
        ({"start_s": 5, "end_s": 9, "n": 4}, "interval_outside_video"),
        ({"start_s": 0, "end_s": 1e9, "n": 4}, "interval_outside_video"),
        ({"start_s": -1, "end_s": 1, "n": 4}, "bad_argument"),
        ({"start_s": 0, "end_s": 1, "n": 0}, "bad_argument"),
        ({"start_s": 0, "end_s": 1, "n": 2.5}, "bad_argument"),
        ({"start_s": 0, "end_s": 1, "n": True}, "bad_argument"),
        ({"end_s": 1, "n": 2}, "missing_argument"),
        ({"start_s": 4.5}, "interval_outside_video"),  # the default interval past the end
    ]
    for arguments, reason in cases:
        obs = call(tool_call("video_frames", **arguments), video_context)
        assert (obs.ok, obs.reason) == (False, reason), (arguments, obs.text)
        assert obs.text
    nan = '<tool_call>{"name": "video_frames", "arguments": {"start_s": NaN, "end_s": 1, "n": 2}}</tool_call>'
    assert call(nan, video_context).reason == "bad_argument"
    tight = ToolContext(video=video_context.video, max_video_tokens=1, factor=28)
    assert call(tool_call("video_frames", start_s=0, end_s=1, n=4), tight).reason == (
        "too_many_frames"
    )
    no_video = call(tool_call("video_frames", start_s=0, end_s=1, n=2), ToolContext())
    assert (no_video.ok, no_video.reason) == (False, "bad_argument")


# -- hostile calls --------------------------------------------------------------------------
def test_hostile_crop_calls_fail_with_a_named_reason(picture):
    ctx = ToolContext.from_sample(sample_of(picture), Qwen2VL())
    wide = Image.new("RGB", (3200, 40), (128, 128, 128))
    ctx.add_image(wide, None)
    cases = [
        ("<tool_call>{'name': 'crop'}</tool_call>", "bad_json"),
        ('<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1,2,3</tool_call>', "bad_json"),
        (tool_call("zoom_everything", bbox_2d=[0, 0, 10, 10]), "unknown_tool"),
        (tool_call("crop", bbox_2d=[0, 0, 1e9, 1e9]), "box_outside_image"),
        (tool_call("crop", bbox_2d=[1e9, 1e9, 2e9, 2e9]), "box_outside_image"),
        (tool_call("crop", bbox_2d=[-900, -900, -100, -100]), "box_outside_image"),
        (tool_call("crop", bbox_2d=[1e308, 0, 1.7e308, 10]), "box_outside_image"),
        (
            '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [NaN, 0, 10, 10]}}</tool_call>',
            "bad_argument",
        ),
        (
            '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, Infinity, 10]}}</tool_call>',
            "bad_argument",
        ),
        (tool_call("crop", bbox_2d=[600, 600, 500, 500]), "bad_argument"),  # negative size
        (tool_call("crop", bbox_2d=[0, 0, 0, 10]), "bad_argument"),  # zero width
        (tool_call("crop", bbox_2d=[0, 0, 10]), "bad_argument"),
        (tool_call("crop", bbox_2d=["0", 0, 10, 10]), "bad_argument"),
        (tool_call("crop", bbox_2d=[[0, 0], [10, 10]]), "bad_argument"),
        (tool_call("crop", bbox_2d={"x": 1}), "bad_argument"),
        (tool_call("crop", bbox_2d=[0, 0, 10, 10], image_index=-1), "bad_argument"),
        (tool_call("crop"), "missing_argument"),
        (tool_call("crop", bbox_2d=[100, 100, 110, 200]), "box_too_small"),  # 16 px wide
        (
            "<tool_call>" + json.dumps({"name": "crop", "arguments": {"p": "x" * 2**20}}),
            "unterminated_tag",
        ),
        (
            "<tool_call>"
            + json.dumps({"name": "crop", "arguments": {"p": "x" * 2**20}})
            + "</tool_call>",
            "payload_too_large",
        ),
    ]
    for text, reason in cases:
        obs = call(text, ctx)
        assert (obs.ok, obs.reason) == (False, reason), (text[:100], obs.text)
        assert obs.text and len(obs.text) < 600 and obs.images == []
    # DeepEyes' aspect rule: 3200 × 30 pixels is past a ratio of 100 (norm1000 of image 1)
    obs = call(tool_call("crop", bbox_2d=[0, 0, 1000, 750], image_index=1), ctx)
    assert (obs.ok, obs.reason) == (False, "box_aspect_ratio")
    unknown = call(tool_call("crpo", bbox_2d=[0, 0, 10, 10]), ctx)
    assert "did you mean 'crop'" in unknown.text


def test_slow_and_raising_tools_become_failed_observations():
    release = threading.Event()
    empty = {"type": "object", "properties": {}}

    @tool("test_sleeper", timeout_s=0.2, parameters=empty)
    def sleeper(context):
        """Sleeps until released."""
        release.wait(30)
        return Observation(ok=True, text="late")

    @tool("test_raiser", parameters=empty)
    def raiser(context):
        """Raises."""
        raise ZeroDivisionError("boom")

    @tool("test_wrong_return", parameters=empty)
    def wrong_return(context):
        """Returns a string."""
        return "not an observation"

    before = tool_stats()
    try:
        obs = call(tool_call("test_sleeper"), ToolContext())
        assert (obs.ok, obs.reason) == (False, "timeout") and "0.2 s budget" in obs.text
        stats = tool_stats()
        assert stats["failed/timeout"] == before.get("failed/timeout", 0) + 1
        assert stats["abandoned_running"] >= 1
    finally:
        release.set()
    obs = call(tool_call("test_raiser"), ToolContext())
    assert (obs.ok, obs.reason) == (False, "tool_error")
    assert "ZeroDivisionError: boom" in obs.text
    obs = call(tool_call("test_wrong_return"), ToolContext())
    assert (obs.ok, obs.reason) == (False, "tool_error") and "not an Observation" in obs.text
    assert isinstance(parse_tool_calls("<tool_call>{</tool_call>")[0], ParseError)


def test_list_tools(capsys):
    from mmrft.cli import main

    assert main(["list", "tools"]) == 0
    out = capsys.readouterr().out
    for word in ("crop", "image_zoom_in", "rotate", "video_frames", "30 s"):
        assert word in out
