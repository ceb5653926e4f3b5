"""Verifier budgets enforced by the operating system (issue 23, item 1).

A verifier that holds the GIL in one long C call (a big-integer power inside sympy, a
backtracking regular expression) cannot be stopped by a thread: under
``reward.isolation=process`` it runs in a worker process that is killed at
``reward.timeout_s``, the batch is re-scored one completion at a time and only the culprit
scores ``timeout``. The built-in verifiers also refuse such inputs themselves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import NO_EVAL, one_error_line, short_run

from mmrft import Sample
from mmrft.rewards import verifier
from mmrft.rewards.reward import build_reward
from mmrft.rewards.verifier import VerifierError, VerifierTimeoutError

TOWER = "<answer>$9^{9^{9^{9}}}$</answer>"  # 27 characters that stalled training for good
BACKTRACK = "a" * 135 + "!"  # (a|aa)* tries every split of the a's before failing at '!'

PLUGIN = '''
import ctypes, os, re
from math_verify import parse, verify
from mmrft import Score, verifier
from mmrft.rewards.answers import extract_answer


@verifier("test_budget_regex")
def backtracking(completions, samples, *, always: bool = False):
    """The standard library's re, which has no timeout: (a|aa)* on 135 a's and a '!'."""
    pattern = re.compile(r"(a|aa)*")
    texts = ["a" * 135 + "!" if always else c for c in completions]
    return [Score(1.0) if pattern.fullmatch(t) else Score(0.0, reason="no") for t in texts]


@verifier("test_budget_math")
def raw_math(completions, samples):
    """math_verify without the accuracy verifier's guards: equal to 5?"""
    gold = parse("$5$")
    return [
        1.0 if verify(gold, parse(extract_answer(c)[0] or ""), timeout_seconds=None) else 0.0
        for c in completions
    ]


@verifier("test_budget_crash")
def crash(completions, samples, *, how: str = "segv"):
    if any("crash" in c for c in completions):
        if how == "segv":
            ctypes.string_at(0)
        os._exit(3)
    return [len(c) / 100 for c in completions]


@verifier("test_budget_hog")
def hog(completions, samples, *, mib: int = 1024):
    """Allocates (and touches) ``mib`` MiB for a completion that asks for it."""
    for c in completions:
        if "hog" in c:
            block = bytearray(mib << 20)
            block[::4096] = b"x" * len(block[::4096])
    return [len(c) / 100 for c in completions]
'''


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    from mmrft.plugins import load_plugins

    path = tmp_path / "budget_plugins.py"
    path.write_text(PLUGIN)
    load_plugins([str(path)])
    return path


def samples(n: int, target: object = "5") -> list[Sample]:
    return [Sample(id=f"s{i}", messages=[], target=target) for i in range(n)]


def alive(pid: int) -> bool:
    """Whether any thread of process ``pid`` runs. A killed process's main thread can show as a
    zombie while its other threads still hold its files (its sockets stay open), so every task
    is read, not only the main one."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            continue
    return False


@pytest.mark.serial  # wall-clock budget: make test runs it alone
@pytest.mark.parametrize(
    ("name", "culprit", "good"),
    [
        ("test_budget_regex", BACKTRACK, "aaaa"),
        ("test_budget_math", TOWER, "<answer>$5$</answer>"),
    ],
)
def test_a_stuck_c_call_is_killed_and_only_the_culprit_scores_timeout(
    plugin, caplog, name, culprit, good
):
    reward = build_reward([{"name": name}], timeout_s=1.0)
    try:
        start = time.monotonic()
        out = reward([good, culprit, good], samples(3), context="at step 4")
        elapsed = time.monotonic() - start
        scores = out.scores[name]
        assert [(s.value, s.reason) for s in scores] == [(1.0, None), (0.0, "timeout"), (1.0, None)]
        assert out.reasons == {f"{name}/timeout": 1}
        # the batch's call (1 s), the culprit alone (1 s), two worker restarts
        assert elapsed < 1.0 * 2 + 6, elapsed
        assert f"verifier '{name}' exceeded its 1s budget at step 4 on 1 of 3" in caplog.text
        assert "of samples s1;" in caplog.text
        again = reward([good], samples(1))  # the recycled worker scores the next batch
        assert again.scores[name][0].value == 1.0
    finally:
        reward.close()


def test_on_timeout_stop_raises_naming_the_culprit(plugin):
    reward = build_reward([{"name": "test_budget_regex"}], timeout_s=1.0, on_timeout="stop")
    try:
        with pytest.raises(VerifierTimeoutError, match=r"exceeded its 1s budget at step 2") as info:
            reward(["aa", BACKTRACK], samples(2), context="at step 2")
        assert info.value.sample_ids == ["s1"] and info.value.step == 2
    finally:
        reward.close()


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_isolation_time_is_bounded(plugin, caplog):
    """Six completions that all hang: isolation stops starting calls after 2 × timeout_s of
    them, the rest score timeout unexamined, counted in the warning."""
    reward = build_reward(
        [{"name": "test_budget_regex", "params": {"always": True}}], timeout_s=0.5
    )
    try:
        start = time.monotonic()
        out = reward(["x"] * 6, samples(6))
        elapsed = time.monotonic() - start
        assert [s.reason for s in out.scores["test_budget_regex"]] == ["timeout"] * 6
        assert "were not re-scored alone" in caplog.text
        assert elapsed < 0.5 * 4 + 8, elapsed  # batch + ≤ 3 singles, plus restarts
    finally:
        reward.close()


def test_train_stops_on_timeout_with_a_failure_record(tmp_path, capsys, plugin):
    from mmrft.cli import main

    args = [
        "train",
        *short_run(tmp_path, "budget"),
        "data.max_test_samples=2",
        *NO_EVAL,
        f"plugins=[{plugin}]",
        "reward.verifiers=[{name: test_budget_regex, params: {always: true}}]",
        "reward.timeout_s=1",
        "reward.on_timeout=stop",
    ]
    start = time.monotonic()
    assert main(args) == 2
    assert time.monotonic() - start < 60
    error = one_error_line(capsys.readouterr().err)
    assert "verifier 'test_budget_regex' exceeded its 1s budget" in error
    failure = json.loads((tmp_path / "budget" / "failure.json").read_text())
    assert failure["step"] == 1 and failure["verifier"] == "test_budget_regex"
    assert failure["samples"] and failure["reason"] == error.removeprefix("error: ")


@pytest.mark.serial  # wall-clock budget: make test runs it alone
@pytest.mark.parametrize(
    ("how", "what"),
    [
        ("segv", "ended its worker process (signal 11, SIGSEGV)"),
        ("exit", "ended its worker process (exit status 3)"),
    ],
)
def test_a_worker_that_dies_is_an_error_naming_the_verifier(plugin, how, what):
    reward = build_reward([{"name": "test_budget_crash", "params": {"how": how}}], timeout_s=30)
    try:
        start = time.monotonic()
        with pytest.raises(VerifierError) as info:
            reward(["fine", "crash"], samples(2), context="at step 5")
        assert time.monotonic() - start < 10
        assert str(info.value) == f"verifier 'test_budget_crash' {what} at step 5 on samples s0, s1"
        out = reward(["fine"], samples(1))  # replaced
        assert out.scores["test_budget_crash"][0].value == pytest.approx(0.04)
    finally:
        reward.close()


def test_a_completion_over_the_workers_memory_cap_scores_memory_alone(plugin, caplog):
    """The worker's address space is capped (reward.worker_memory_mb beyond what it holds):
    the completion that makes the verifier allocate 1 GiB scores the minimum with reason
    'memory' (found by re-scoring alone), its batch-mates are scored, the worker is replaced,
    and the run goes on; without the cap the same batch is scored whole."""
    reward = build_reward([{"name": "test_budget_hog"}], timeout_s=30, worker_memory_mb=256)
    try:
        out = reward(["fine", "hog", "ok"], samples(3), context="at step 3")
        scores = out.scores["test_budget_hog"]
        assert [(s.value, s.reason) for s in scores] == [
            (0.04, None),
            (0.0, "memory"),
            (0.02, None),
        ]
        assert out.reasons == {"test_budget_hog/memory": 1}
        assert (
            "went over its worker's memory cap (reward.worker_memory_mb) at step 3 on 1 of 3"
            in (caplog.text)
        )
        assert "of samples s1;" in caplog.text
        again = reward(["fine"], samples(1))  # the replaced worker scores the next batch
        assert again.scores["test_budget_hog"][0].value == pytest.approx(0.04)
    finally:
        reward.close()
    uncapped = build_reward(
        [{"name": "test_budget_hog", "params": {"mib": 300}}], timeout_s=30, worker_memory_mb=None
    )
    try:
        out = uncapped(["fine", "hog"], samples(2))
        assert [s.value for s in out.scores["test_budget_hog"]] == [0.04, 0.03]
    finally:
        uncapped.close()


def test_cap_memory_sets_the_address_space_limit_above_what_is_mapped():
    import subprocess
    import sys

    code = (
        "import resource; from mmrft.rewards.pool import cap_memory; "
        "cap = cap_memory(64); print(cap, resource.getrlimit(resource.RLIMIT_AS)[0]); "
        "bytearray(128 << 20)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "MemoryError" in result.stderr  # 128 MiB more than the cap's 64
    cap, soft = map(int, result.stdout.split())
    assert cap == soft and cap > 64 << 20


def test_a_worker_killed_while_idle_is_replaced_with_a_warning(plugin, caplog):
    reward = build_reward([{"name": "test_budget_crash"}])
    try:
        (pid,) = reward.pool.pids
        os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.01)
        out = reward(["ab"], samples(1))
        assert out.scores["test_budget_crash"][0].value == pytest.approx(0.02)
        assert "ended while idle (signal 9, SIGKILL); replaced it" in caplog.text
        assert reward.pool.pids != [pid]
    finally:
        reward.close()


def test_workers_split_a_batch_and_keep_its_order(plugin):
    reward = build_reward([{"name": "test_budget_crash"}], workers=2)
    try:
        assert len(set(reward.pool.pids)) == 2
        texts = ["a" * k for k in range(1, 6)]
        out = reward(texts, samples(5))
        assert [s.value for s in out.scores["test_budget_crash"]] == [k / 100 for k in range(1, 6)]
    finally:
        reward.close()


def test_no_worker_survives_the_pool_or_its_parent(plugin):
    reward = build_reward([{"name": "test_budget_crash"}])
    pids = reward.pool.pids
    assert pids and all(alive(pid) for pid in pids)
    reward.close()
    assert not any(alive(pid) for pid in pids)

    script = (
        "import sys, time\n"
        "from mmrft.plugins import load_plugins\n"
        "from mmrft.rewards import build_reward\n"
        f"load_plugins([{str(plugin)!r}])\n"
        "reward = build_reward([{'name': 'test_budget_crash'}], workers=2)\n"
        "print(*reward.pool.pids, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids)
    finally:
        parent.kill()
        parent.wait()


@verifier("test_budget_local_parent_only", low=0, high=1e9, isolate=False)
def parent_only(completions, samples):
    return [os.getpid() for _ in completions]


def test_which_verifiers_run_in_the_workers(plugin, caplog):
    @verifier("test_budget_local_closure", low=0, high=1e9)
    def closure(completions, samples):
        return [os.getpid() for _ in completions]

    specs = [{"name": "test_budget_crash"}, {"name": "test_budget_local_closure"}]
    reward = build_reward([*specs, {"name": "test_budget_local_parent_only"}])
    try:
        assert reward.pool.names == {"test_budget_crash"}
        assert (
            "verifier 'test_budget_local_closure' is defined in __main__ or inside" in caplog.text
        )
        out = reward(["x"], samples(1))
        assert out.scores["test_budget_local_closure"][0].value == os.getpid()
        assert out.scores["test_budget_local_parent_only"][0].value == os.getpid()
    finally:
        reward.close()
    assert build_reward(specs, isolation="inline").pool is None


def test_reward_isolation_and_workers_are_checked():
    from mmrft.config import DEFAULT_CONFIG, load_config
    from mmrft.typecheck import ConfigError

    assert load_config(DEFAULT_CONFIG, ["reward.isolation=inline"]).reward.isolation == "inline"
    with pytest.raises(ConfigError, match="reward.isolation"):
        load_config(DEFAULT_CONFIG, ["reward.isolation=thread"])
    with pytest.raises(ConfigError, match="reward.workers: must be ≥ 1"):
        load_config(DEFAULT_CONFIG, ["reward.workers=0"])


# -- the built-in verifiers' own defences (in this process, no worker) -------------------------


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_accuracy_math_refuses_numbers_too_large_to_build():
    from mmrft.verifiers.accuracy import accuracy

    answers = [TOWER, "<answer>$x^{9^{9^{9}}}$</answer>", "<answer>$(10^{7})!$</answer>"]
    start = time.monotonic()
    scores = accuracy([*answers, "<answer>$5$</answer>"], samples(4), mode="math")
    assert time.monotonic() - start < 10
    assert [(s.value, s.reason) for s in scores] == [(0.0, "math too large")] * 3 + [(1.0, None)]
    (target,) = accuracy(["<answer>5</answer>"], samples(1, "$9^{9^{9}}$"), mode="math")
    assert (target.value, target.reason) == (0.0, "target too large")


@pytest.mark.parametrize(
    ("text", "too_large"),
    [
        ("9^{9^{9}}", True),  # 370 million digits
        ("2^{100000}", False),  # 30,103 digits: sympy builds it in milliseconds
        ("3^{10^{6}}", True),
        ("x^{10^{100}}", False),  # symbolic: the exponent has 101 digits
        (r"\binom{10^{9}}{10^{5}}", True),
        (r"\binom{10}{3}", False),
        (r"\frac{2^{400000}}{3}", True),
        ("9**9**9", True),
        ("e^{-x^{2}/2}", False),
        ("{" * 60 + "1" + "}" * 60, True),  # nested deeper than MATH_MAX_DEPTH
    ],
)
def test_math_too_large_bounds(text, too_large):
    from mmrft.rewards.answers import math_too_large

    assert math_too_large(text) is too_large


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_format_pattern_has_a_time_limit():
    from mmrft.verifiers.format import PATTERN_TIMEOUT_S, check_format

    start = time.monotonic()
    scores = check_format([BACKTRACK, "aaaa"], samples(2), pattern="(a|aa)*")
    assert time.monotonic() - start < PATTERN_TIMEOUT_S + 3
    assert [(s.value, s.reason) for s in scores] == [(0.0, "pattern timed out"), (1.0, None)]


def test_builtin_verifiers_defend_themselves_in_the_workers_too():
    reward = build_reward(
        [
            {"name": "accuracy", "params": {"mode": "math"}},
            {"name": "format", "params": {"pattern": "(a|aa)*"}},
        ],
        timeout_s=20,
    )
    try:
        out = reward([TOWER, BACKTRACK, "<answer>5</answer>"], samples(3))
        assert [s.reason for s in out.scores["accuracy"]] == [
            "math too large",
            "no answer tag",
            None,
        ]
        assert [s.reason for s in out.scores["format"]][1] == "pattern timed out"
    finally:
        reward.close()
