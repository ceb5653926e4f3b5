"""Budgets on what tools run during a rollout (issue 38), and on in-process verifiers.

A tool runs in a tool worker process (``mmrft.rollout.tool.tool_pool``, the verifiers'
``WorkerPool``): a call that holds the GIL is killed at its ``timeout_s`` and reported
``timeout``; one that allocates past ``rollout.tools.worker_memory_mb`` is ``memory``. What a
tool returns is checked (a malformed Observation is a ``tool_error``, never an exception out
of the loop) and bounded before it is tokenised (its text cut to what the trajectory's
remaining tokens can hold). A tool call thought about inside ``<think>`` does not eat the
answer. An in-process verifier's ``MemoryError`` scores ``memory`` instead of stopping the run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from helpers import tiny_policy, zoom_sample

from mmrft import Sample
from mmrft.rewards.reward import build_reward
from mmrft.rollout.tool import (
    Observation,
    ToolCall,
    ToolContext,
    _cut_text,
    enabled_tools,
    parse_tool_calls,
    run_tool_call,
    tool,
    tool_pool,
)
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]

PLUGIN = '''
import math
import re

from PIL import Image

from mmrft.rollout.tool import Observation, VideoClip, tool

EMPTY = {"type": "object", "properties": {}}
SIZE = {"type": "object", "properties": {"mib": {"type": "integer", "minimum": 1}}}
WHAT = {"type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]}


@tool("test_tb_regex", timeout_s=2.0, parameters=EMPTY)
def regex(context):
    """(a|aa)* over 135 a's and a '!': backtracks while holding the GIL, for good."""
    re.fullmatch(r"(a|aa)*", "a" * 135 + "!")
    return Observation(ok=True, text="matched")


@tool("test_tb_quick", parameters=EMPTY)
def quick(context):
    """Says how many images its context holds, and its process id."""
    import os

    return Observation(ok=True, text=f"{len(context.images)} images", info={"pid": os.getpid()})


def text_of(mib):
    """``mib`` MiB of varied text (numbers and words, not one repeated character)."""
    words = " ".join(f"{i} ring{i % 97}" for i in range(200000))
    return (words * (mib * 2**20 // len(words) + 1))[: mib * 2**20]


@tool("test_tb_text", parameters=SIZE)
def big_text(context, *, mib: int = 20):
    """A text result of ``mib`` MiB."""
    return Observation(ok=True, text=text_of(mib))


@tool("test_tb_text_here", parameters=SIZE, isolate=False)
def big_text_here(context, *, mib: int = 20):
    """The same, in the caller's process."""
    return Observation(ok=True, text=text_of(mib))


@tool("test_tb_hog", parameters=SIZE)
def hog(context, *, mib: int = 8192):
    """Allocates and touches ``mib`` MiB."""
    block = bytearray(mib << 20)
    block[::4096] = b"x" * len(block[::4096])
    return Observation(ok=True, text=str(len(block)))


def bad(what):
    image = Image.new("RGB", (64, 48), "red")
    return {
        "images_none": Observation(ok=True, text="x", images=[None]),
        "images_path": Observation(ok=True, text="x", images=["a.png"]),
        "images_tuple": Observation(ok=True, text="x", images=(image,)),
        "empty_image": Observation(ok=True, text="x", images=[Image.new("RGB", (0, 0))]),
        "empty_clip": Observation(
            ok=True, text="x", videos=[VideoClip(frames=[], timestamps_s=[], fps=2.0)]
        ),
        "ragged_clip": Observation(
            ok=True,
            text="x",
            videos=[
                VideoClip(
                    frames=[image, Image.new("RGB", (32, 32))], timestamps_s=[0.0, 0.5], fps=2.0
                )
            ],
        ),
        "nan_fps": Observation(
            ok=True,
            text="x",
            videos=[VideoClip(frames=[image, image], timestamps_s=[0.0, 0.5], fps=math.nan)],
        ),
        "clip_list": Observation(ok=True, text="x", videos=[[image, image]]),
        "text_int": Observation(ok=True, text=123),
        "ok_str": Observation(ok="yes", text="x"),
        "info_object": Observation(ok=True, text="x", info={"o": object()}),
        "info_huge": Observation(ok=True, text="x", info={"o": "x" * 10**6}),
        "reason_huge": Observation(ok=False, text="x", reason="r" * 10**5),
        "not_observation": {"text": "x"},
    }[what]


@tool("test_tb_bad", parameters=WHAT)
def bad_here_or_there(context, *, what: str):
    """Returns a malformed Observation (``what`` says how)."""
    return bad(what)


@tool("test_tb_bad_here", parameters=WHAT, isolate=False)
def bad_here(context, *, what: str):
    """The same, in the caller's process."""
    return bad(what)


@tool("test_tb_grey", parameters=EMPTY)
def grey(context):
    """A grey-scale and a palette image: made RGB."""
    return Observation(
        ok=True, text="x", images=[Image.new("L", (40, 30), 7), Image.new("P", (20, 10))]
    )
'''

BAD = [
    "images_none",
    "images_path",
    "images_tuple",
    "empty_image",
    "empty_clip",
    "ragged_clip",
    "nan_fps",
    "clip_list",
    "text_int",
    "ok_str",
    "info_object",
    "info_huge",
    "reason_huge",
    "not_observation",
]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    from mmrft.plugins import load_plugins

    path = tmp_path_factory.mktemp("tools") / "tool_budget_plugins.py"
    path.write_text(PLUGIN)
    load_plugins([str(path)])
    return path


@pytest.fixture
def pool(plugin):
    tools = enabled_tools(["test_tb_regex", "test_tb_quick", "test_tb_hog", "test_tb_bad"])
    made = tool_pool(tools, memory_mb=256)
    yield tools, made
    made.close()


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name, arguments)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


# -- time ---------------------------------------------------------------------------------------
@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_a_gil_holding_tool_is_killed_at_its_timeout(pool):
    """A backtracking regular expression holds the GIL, so a thread's deadline never fires (the
    old loop waited for it); in the worker it is killed at timeout_s = 2 s and reported
    'timeout', and the next call runs in the replacement worker."""
    tools, workers = pool
    assert run_tool_call(call("test_tb_quick"), ToolContext(), tools, pool=workers).ok
    first = workers.pids[0]
    start = time.monotonic()
    obs = run_tool_call(call("test_tb_regex"), ToolContext(), tools, pool=workers)
    seconds = time.monotonic() - start
    assert (obs.ok, obs.reason) == (False, "timeout"), obs
    assert "2 s budget" in obs.text
    assert seconds < 2 + 8, seconds  # the deadline, and generous slack on a loaded machine
    after = run_tool_call(call("test_tb_quick"), ToolContext(), tools, pool=workers)
    assert after.ok and after.info["pid"] != first
    assert not pid_alive(first)


def test_the_worker_is_started_once_and_stopped_with_the_loop(policy, plugin):
    """A loop's pool starts at the first call, every later call goes to the same process, and
    the loop's close stops it; the built-in tools are isolated too."""
    assert tool_pool(enabled_tools(["crop", "image_zoom_in", "video_frames"])) is not None
    tools = enabled_tools(["test_tb_quick"])
    loop = _loop(policy, ["test_tb_quick"])
    assert loop.pool is not None and loop.pool.pids == []  # nothing started yet
    pids = {
        run_tool_call(call("test_tb_quick"), ToolContext(), tools, pool=loop.pool).info["pid"]
        for _ in range(3)
    }
    assert len(pids) == 1 and pids != {os.getpid()}
    loop.close()
    loop.close()  # idempotent
    (pid,) = pids
    for _ in range(50):
        if not pid_alive(pid):
            break
        time.sleep(0.1)
    assert not pid_alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        run_tool_call(call("test_tb_quick"), ToolContext(), tools, pool=loop.pool)


def test_a_tool_a_worker_cannot_recreate_stays_here_with_a_warning(caplog):
    """A tool defined inside a function runs in the caller's process (warned); one declared
    isolate=False too, silently."""

    @tool("test_tb_local", parameters={"type": "object", "properties": {}})
    def local(context):
        return Observation(ok=True, text=str(os.getpid()))

    @tool("test_tb_local_quiet", isolate=False, parameters={"type": "object", "properties": {}})
    def quiet(context):
        return Observation(ok=True, text=str(os.getpid()))

    with caplog.at_level(logging.WARNING):
        assert tool_pool(enabled_tools(["test_tb_local_quiet"])) is None
        assert caplog.text == ""
        assert tool_pool(enabled_tools(["test_tb_local"])) is None
    assert "test_tb_local' is defined in __main__ or inside a function" in caplog.text
    obs = run_tool_call(call("test_tb_local"), ToolContext(), enabled_tools(["test_tb_local"]))
    assert obs.text == str(os.getpid())


# -- memory -------------------------------------------------------------------------------------
def test_a_tool_over_its_workers_memory_cap_is_memory_not_the_oom_killer(pool):
    """8 GiB asked in a worker capped at 256 MiB beyond its start: 'memory', this process
    untouched, the worker replaced, the next call fine."""
    tools, workers = pool
    before = _rss_mib()
    obs = run_tool_call(call("test_tb_hog", mib=8192), ToolContext(), tools, pool=workers)
    assert (obs.ok, obs.reason) == (False, "memory"), obs
    assert _rss_mib() - before < 200
    assert run_tool_call(call("test_tb_hog", mib=16), ToolContext(), tools, pool=workers).ok


def test_the_tool_workers_memory_cap_is_set(pool):
    """The worker's address-space limit is what it maps after loading plus the cap."""
    tools, workers = pool
    run_tool_call(call("test_tb_quick"), ToolContext(), tools, pool=workers)
    assert _address_space_limit(workers.pids[0]) is not None


def test_a_memory_error_in_this_process_is_memory():
    """An isolate=False tool that raises MemoryError: reason 'memory', not an exception."""

    @tool("test_tb_oom_here", isolate=False, parameters={"type": "object", "properties": {}})
    def oom(context):
        raise MemoryError("no room")

    obs = run_tool_call(
        call("test_tb_oom_here"), ToolContext(), enabled_tools(["test_tb_oom_here"])
    )
    assert (obs.ok, obs.reason) == (False, "memory")


def test_tools_worker_memory_mb_is_checked():
    from mmrft.config import load_config

    with pytest.raises(ConfigError, match=r"rollout\.tools\.worker_memory_mb.*≥ 64"):
        load_config(None, ["train.steps=0", "rollout.tools.worker_memory_mb=10"])
    assert load_config(None, ["train.steps=0"]).rollout.tools.worker_memory_mb == 4096
    off = load_config(None, ["train.steps=0", "rollout.tools.worker_memory_mb=null"])
    assert off.rollout.tools.worker_memory_mb is None


# -- what a tool returns ------------------------------------------------------------------------
@pytest.mark.parametrize("what", BAD)
@pytest.mark.parametrize("where", ["worker", "here"])
def test_a_malformed_observation_is_a_tool_error(pool, what, where):
    """Not an image, an empty or ragged clip, wrong types, info that is not small JSON, a
    reason that is not a short identifier: a 'tool_error' naming what was wrong, in the
    worker and in this process alike (the old loop raised on most of them)."""
    tools, workers = pool
    name = "test_tb_bad" if where == "worker" else "test_tb_bad_here"
    registry = {**tools, **enabled_tools(["test_tb_bad_here"])}
    obs = run_tool_call(call(name, what=what), ToolContext(), registry, pool=workers)
    assert (obs.ok, obs.reason) == (False, "tool_error"), obs
    assert obs.text.startswith(f"Tool '{name}' failed: it returned"), obs.text
    assert len(obs.text) < 300 and obs.images == [] and obs.videos == []


def test_images_come_back_rgb_and_within_the_pixel_budget(pool):
    tools, workers = pool
    registry = {**tools, **enabled_tools(["test_tb_grey"])}
    for given in (workers, None):
        obs = run_tool_call(call("test_tb_grey"), ToolContext(max_pixels=300), registry, pool=given)
        assert obs.ok and [im.mode for im in obs.images] == ["RGB", "RGB"]
        assert all(im.width * im.height <= 300 for im in obs.images)


def test_text_is_cut_to_the_bound_with_a_note(plugin):
    """A 20 MiB text asked to fit 10,000 characters comes back as 10,000 characters ending in
    a note; cutting again changes nothing."""
    registry = enabled_tools(["test_tb_text", "test_tb_text_here"])
    for name in ("test_tb_text", "test_tb_text_here"):
        given = tool_pool(registry) if name == "test_tb_text" else None
        try:
            obs = run_tool_call(
                call(name, mib=20), ToolContext(), registry, pool=given, max_text_chars=10000
            )
        finally:
            if given is not None:
                given.close()
        assert obs.ok and len(obs.text) == 10000
        assert obs.text.endswith("characters are more than this conversation's token budget]")
        assert _cut_text(obs.text, 10000) == obs.text
    assert _cut_text("short", 10) == "short" and _cut_text("x" * 50, 10) == "x" * 10


def test_media_past_the_trajectorys_budget_are_dropped_before_resizing():
    """max_media left: at most one more image than that comes back (the loop still stops
    max_media, as it would with all of them)."""

    @tool("test_tb_many", isolate=False, parameters={"type": "object", "properties": {}})
    def many(context):
        from PIL import Image

        return Observation(ok=True, text="x", images=[Image.new("RGB", (8, 8))] * 1000)

    obs = run_tool_call(
        call("test_tb_many"), ToolContext(), enabled_tools(["test_tb_many"]), max_media=2
    )
    assert obs.ok and len(obs.images) == 3


# -- the loop: tokens and memory ------------------------------------------------------------------
@pytest.fixture(scope="module")
def policy():
    return tiny_policy("model.min_pixels=12544", "model.max_pixels=12544")


def _loop(policy, names, **limits):
    from mmrft.rollout.tool_loop import LoopLimits, ToolLoop

    return ToolLoop(policy.family, policy.processor, enabled_tools(names), LoopLimits(**limits))


def _call_text(name: str, **arguments) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


@pytest.mark.serial  # measures this process's peak memory
@pytest.mark.parametrize("name", ["test_tb_text", "test_tb_text_here"])
def test_a_20_mib_text_adds_well_under_1_gib(policy, plugin, name):
    """A tool returning 20 MiB of text, in a trajectory of max_tokens 4096: the text is cut to
    what 4096 tokens can hold before it is rendered and tokenised, so this process's peak
    resident memory grows by well under 1 GiB (the old loop tokenised all of it first: about
    130 bytes per character); the trajectory ends max_tokens as before."""
    loop = _loop(policy, [name], max_tokens=4096)
    s = zoom_sample()
    if not _reset_peak():
        pytest.skip("this kernel cannot reset the peak resident memory (/proc/self/clear_refs)")
    try:
        base = _rss_mib()
        t = loop.demonstration(s, [_call_text(name, mib=20), "<answer>red</answer>"])
        grown = _peak_mib() - base
    finally:
        loop.close()
    assert t.calls[0]["ok"] and t.stop == "max_tokens", (t.calls, t.stop)
    assert grown < 1024, grown
    print(f"{name}: peak resident memory grew {grown:.0f} MiB")


@pytest.mark.parametrize("what", ["empty_clip", "images_none", "ragged_clip"])
def test_a_malformed_observation_does_not_leave_the_loop(policy, plugin, what):
    """The old loop raised out of the rollout (its renderer on an empty clip, fit_pixels on
    None); now the call is a tool_error observation and the model answers next turn."""
    loop = _loop(policy, ["test_tb_bad"])
    try:
        t = loop.demonstration(
            zoom_sample(), [_call_text("test_tb_bad", what=what), "<answer>red</answer>"]
        )
    finally:
        loop.close()
    assert [(c["ok"], c["reason"]) for c in t.calls] == [(False, "tool_error")]
    assert t.stop == "answer" and len(t.turns) == 2


def test_names_the_model_invents_share_one_metric(policy):
    """A tool name is the model's text: each invented one counts under ``calls/(unknown)``
    (one metric per invented name grew a run's metrics to over a thousand keys), an enabled
    tool under its name."""
    loop = _loop(policy, ["crop"])
    try:
        trajectories = [
            loop.demonstration(
                zoom_sample(), [_call_text(name, box=[0, 0, 10, 10]), "<answer>red</answer>"]
            )
            for name in ["Boxdown", "But up", "crop"]
        ]
        loop._count(trajectories)  # as run() counts its rollouts
        m = loop.metrics()
    finally:
        loop.close()
    calls = {k: v for k, v in m.items() if k.startswith("rollout/tools/calls/")}
    assert calls == {
        "rollout/tools/calls/(unknown)": pytest.approx(2 / 3),
        "rollout/tools/calls/crop": pytest.approx(1 / 3),
    }, calls
    assert m["rollout/tools/failed/unknown_tool"] == pytest.approx(2 / 3)


def test_the_built_in_crop_gives_the_same_observation_in_the_worker(policy):
    """crop in its worker and in this process: the same pixels, text and info."""
    s = zoom_sample()
    context = ToolContext.from_sample(s, policy.family)
    tools = enabled_tools(["crop"])
    box = [10, 10, 60, 50]
    workers = tool_pool(tools)
    try:
        there = run_tool_call(call("crop", bbox_2d=box), context, tools, pool=workers)
    finally:
        workers.close()
    here = run_tool_call(call("crop", bbox_2d=box), context, tools)
    assert there.ok and here.ok and there.text == here.text and there.info == here.info
    assert [im.tobytes() for im in there.images] == [im.tobytes() for im in here.images]
    assert [im.size for im in there.images] == [im.size for im in here.images]


# -- parsing ------------------------------------------------------------------------------------
def test_a_call_thought_about_inside_think_does_not_eat_the_answer(policy):
    """An unclosed <tool_call> that the model's reasoning closes (</think>) is thinking aloud,
    not a call: the turn is the answer (the old parser made it unterminated_tag and the
    trajectory went on without its answer)."""
    text = "<think>I could <tool_call> zoom in, but the ring is clearly red.</think><answer>red</answer>"
    assert parse_tool_calls(text) == []
    loop = _loop(policy, ["crop"])
    try:
        t = loop.demonstration(zoom_sample(), [text])
    finally:
        loop.close()
    assert t.stop == "answer" and t.calls == []


CROP = '{"name": "crop", "arguments": {}}'


@pytest.mark.parametrize(
    ("text", "closed", "reasons"),
    [
        # closed calls inside a think block are calls, as before
        (f"<think><tool_call>{CROP}</tool_call></think>", False, [None]),
        # an unclosed call no </think> follows is still unterminated
        ('<think>so <tool_call>{"name": "crop"', False, ["unterminated_tag"]),
        ('<tool_call>{"name": "crop"} and the answer is B', False, ["unterminated_tag"]),
        # thinking aloud, then a real call after the reasoning
        (f"hmm <tool_call> no</think><tool_call>{CROP}</tool_call>", False, [None]),
        # an unclosed tag reopened before </think> is unterminated; the second is reasoning
        ("<tool_call> a <tool_call> b </think> B", False, ["unterminated_tag"]),
        # a call the stop string closed is read even with </think> in its body
        ('<tool_call>{"name": "crop"} </think>', True, ["bad_json"]),
    ],
)
def test_calls_and_thinking(text, closed, reasons):
    calls = parse_tool_calls(text, closed_by_stop=closed)
    assert [getattr(c, "reason", None) for c in calls] == reasons, calls


# -- verifiers ----------------------------------------------------------------------------------
def test_an_in_process_verifiers_memory_error_scores_memory(caplog):
    """A verifier that runs in this process (isolate=False, async, or defined inside a
    function) and raises MemoryError: its completions score the minimum with reason 'memory'
    (counted), the run goes on; the old code stopped with a VerifierError."""
    from mmrft import Score, verifier

    @verifier("test_tb_oom_verifier", isolate=False)
    def oom(completions, samples):
        if any("hog" in c for c in completions):
            raise MemoryError
        return [Score(1.0) for _ in completions]

    @verifier("test_tb_oom_async", low=-1.0)
    async def oom_async(completions, samples):
        if any("hog" in c for c in completions):
            raise MemoryError
        return [Score(1.0) for _ in completions]

    reward = build_reward(
        [{"name": "test_tb_oom_verifier"}, {"name": "test_tb_oom_async"}], timeout_s=30
    )
    try:
        batch = [Sample(id=f"s{i}", messages=[], target="x") for i in range(2)]
        assert reward(["fine", "fine"], batch).total == [2.0, 2.0]
        with caplog.at_level(logging.WARNING):
            out = reward(["fine", "hog"], batch, context="at step 3")
    finally:
        reward.close()
    assert out.total == [-1.0, -1.0]  # the batch's call raised: both score the minimum
    assert out.reasons == {"test_tb_oom_verifier/memory": 2, "test_tb_oom_async/memory": 2}
    assert "verifier 'test_tb_oom_verifier' raised MemoryError at step 3" in caplog.text


def test_verifier_workers_are_capped_by_default(tmp_path):
    """build_reward's default caps its workers as the config's default does (the Python API
    used to start them uncapped)."""
    from mmrft.plugins import load_plugins

    path = tmp_path / "tb_verifier_plugin.py"
    path.write_text(
        "from mmrft import verifier\n\n"
        '@verifier("test_tb_capped")\n'
        "def capped(completions, samples):\n"
        "    return [1.0 for _ in completions]\n"
    )
    load_plugins([str(path)])
    reward = build_reward([{"name": "test_tb_capped"}], timeout_s=30)
    try:
        (pid,) = reward.pool.pids
        limit = _address_space_limit(pid)
        assert limit is not None and limit > 4096 * 2**20
    finally:
        reward.close()


# -- helpers ------------------------------------------------------------------------------------
def _address_space_limit(pid: int) -> int | None:
    """Process ``pid``'s soft RLIMIT_AS in bytes (None: unlimited), read once it is ready."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max address space"):
                value = line.split()[3]
                return None if value == "unlimited" else int(value)
    raise AssertionError("no address-space line")


def _status(key: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(key)


def _rss_mib() -> float:
    return _status("VmRSS")


def _peak_mib() -> float:
    return _status("VmHWM")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return _peak_mib() - _rss_mib() < 64


def test_context_images_cross_once_and_a_replaced_worker_gets_them_again(policy):
    """The sample's image goes to the worker with the first call only; a worker killed while
    idle is replaced and the next call (which first referred to the image it held) is sent the
    image again: the same crop."""
    import signal

    s = zoom_sample()
    context = ToolContext.from_sample(s, policy.family)
    tools = enabled_tools(["crop"])
    workers = tool_pool(tools)
    box = [10, 10, 60, 50]
    try:
        first = run_tool_call(call("crop", bbox_2d=box), context, tools, pool=workers)
        assert workers._entry(context.images[0])[0] == "ref"  # the worker holds it
        os.kill(workers.pids[0], signal.SIGKILL)
        time.sleep(0.2)
        again = run_tool_call(call("crop", bbox_2d=box), context, tools, pool=workers)
    finally:
        workers.close()
    assert first.ok and again.ok and first.images[0].tobytes() == again.images[0].tobytes()


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_an_in_process_tool_that_held_the_gil_past_its_deadline_is_a_timeout():
    """isolate=False keeps the thread budget, which a GIL-holding call outlives: the caller
    gets control back only when the call ends. It is then a 'timeout', not a success (the old
    loop counted it a success)."""
    import re

    @tool("test_tb_regex_here", isolate=False, timeout_s=0.05, parameters={"type": "object"})
    def regex_here(context):
        re.fullmatch(r"(a|aa)*", "a" * 31 + "!")  # about 0.3 s holding the GIL
        return Observation(ok=True, text="matched")

    obs = run_tool_call(
        call("test_tb_regex_here"), ToolContext(), enabled_tools(["test_tb_regex_here"])
    )
    assert (obs.ok, obs.reason) == (False, "timeout"), obs
