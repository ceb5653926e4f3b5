"""Environments served by an OpenEnv server (mmrft/rollout/openenv.py) against a local fake
server speaking OpenEnv's session protocol (``/ws``: reset / step / close messages,
``GET /schema``), scripted through the tool loop.

The fake environment: guess a digit; the reset's ``seed`` sets it, a wrong guess gets a hint
and reward 0, the right one ends the episode with reward 10 (``reward_range`` (0, 10)); some
guesses make the server misbehave (a reply that is not JSON, an ``error`` reply, a reply past
the size bound, a NaN reward, a dropped connection), which must come back as failed
observations or an episode ended without a reward, never an exception.
"""

from __future__ import annotations

import json
import threading

import pytest
from helpers import ScriptedEngine, tiny_policy

pytest.importorskip("websockets")

from mmrft.data import Sample
from mmrft.plugins import ENVIRONMENTS, load_plugin
from mmrft.rollout.base import Sampling
from mmrft.rollout.tool_loop import LoopLimits, ToolLoop

ACTION_SCHEMA = {
    "title": "GuessAction",
    "type": "object",
    "properties": {
        "guess": {"title": "Guess", "type": "integer", "description": "a digit 0-9"},
        "metadata": {"title": "Metadata", "type": "object"},
    },
    "required": ["guess"],
}


def guess_server():
    """A fake OpenEnv server on 127.0.0.1 (thread); returns ``(url, server)``."""
    from websockets.sync.server import serve

    def schema(connection, request):
        if request.path == "/schema":
            body = json.dumps({"action": ACTION_SCHEMA, "observation": {}, "state": {}})
            return connection.respond(200, body)
        return None  # the WebSocket handshake

    def session(socket):
        target, tries = None, 0
        for raw in socket:
            message = json.loads(raw)
            if message["type"] == "close":
                return
            if message["type"] == "reset":
                target, tries = int(message["data"].get("seed", 0)) % 10, 0
                reply = {"observation": {"prompt": "Guess my digit."}, "reward": 0.0, "done": False}
            else:
                guess = message["data"].get("guess")
                tries += 1
                if guess == -1:
                    socket.send("this is not JSON")
                    continue
                if guess == -2:
                    socket.send(json.dumps({"type": "error", "data": {"message": "bad action"}}))
                    continue
                if guess == -3:
                    socket.send(json.dumps({"type": "observation", "data": {"x": "y" * 100_000}}))
                    continue
                if guess == -4:
                    socket.send('{"type": "observation", "data": {"observation": {}, '
                                '"reward": NaN, "done": false}}')  # fmt: skip
                    continue
                if guess == -5:
                    return  # drops the connection
                hit = guess == target
                reply = {
                    "observation": {"hint": "right" if hit else ("higher" if guess < target else "lower"), "tries": tries},
                    "reward": 10.0 if hit else 0.0,
                    "done": hit,
                }  # fmt: skip
            socket.send(json.dumps({"type": "observation", "data": reply}))

    server = serve(session, "127.0.0.1", 0, process_request=schema)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.socket.getsockname()[:2]
    return f"http://{host}:{port}", server


PLUGIN = """
from mmrft.rollout.openenv import openenv_environment

openenv_environment(
    "test_guess", "{url}", tool="guess", description="Guess the digit.",
    reward_range=(0.0, 10.0), timeout_s=5.0, max_message_bytes=4096,
    reset_arguments=lambda sample: {{"seed": sample.meta["seed"]}},
)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    url, server = guess_server()
    path = tmp_path_factory.mktemp("plugins") / "guess_env.py"
    path.write_text(PLUGIN.format(url=url))
    load_plugin(str(path))
    yield ENVIRONMENTS.get("test_guess"), url
    server.shutdown()


@pytest.fixture(scope="module")
def policy():
    return tiny_policy("model.min_pixels=3136", "model.max_pixels=3136")


def call(policy, guess) -> list[int]:
    body = json.dumps({"name": "guess", "arguments": {"guess": guess}})
    return policy.tokenizer.encode(f"<tool_call>{body}</tool_call>", add_special_tokens=False)


def answer(policy) -> list[int]:
    tok = policy.tokenizer
    return tok.encode("<answer>7</answer>", add_special_tokens=False) + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]


def run(policy, spec, scripts, n):
    sample = Sample("s0", [{"role": "user", "content": "Play."}], "7", {"seed": 17})
    loop = ToolLoop(policy.family, policy.processor, {}, LoopLimits(max_turns=4), environment=spec)
    conversation = loop.with_tools([{"role": "user", "content": "Play."}], sample)
    sampling = Sampling(max_new_tokens=48, temperature=1.0)
    out = loop.run(ScriptedEngine(policy, scripts), [conversation], [sample], n, sampling)
    loop.close()
    return loop, conversation, out


def test_the_servers_action_schema_is_the_tool(served) -> None:
    """The one tool is the server's action, its schema fetched from GET /schema, titles
    left out."""
    from mmrft.rollout.openenv import fetch_action_schema

    spec, url = served
    [tool] = spec.tools.values()
    assert tool.name == "guess" and tool.description == "Guess the digit."
    assert tool.parameters["properties"]["guess"] == {
        "type": "integer",
        "description": "a digit 0-9",
    }
    assert "title" not in tool.parameters and tool.parameters["required"] == ["guess"]
    assert fetch_action_schema(url) == tool.parameters


def test_episodes_through_the_servers_sessions(served, policy) -> None:
    """Two trajectories, one session each, in the environment's worker: the reset's
    observation joins the prompt; a wrong guess gets the server's hint, the right one ends the
    episode with reward 10 of (0, 10) = 1.0; the other answers before finishing."""
    spec, _ = served
    scripts = [[call(policy, 3), answer(policy)], [call(policy, 7)]]
    _, _, out = run(policy, spec, scripts, 2)
    first, second = out.trajectories
    prompt = policy.tokenizer.decode(out.prompts[0]["input_ids"])
    assert '{"prompt": "Guess my digit."}' in prompt and '"guess"' in prompt
    assert first.stop == "env_done"  # 3 (lower than 7: "higher"), then 7
    assert [c["text"] for c in first.calls] == [
        '{"hint": "higher", "tries": 1}',
        '{"hint": "right", "tries": 2}',
    ]
    assert first.environment["reward"] == 1.0 and first.environment["state"]["steps"] == 2
    assert first.environment["state"]["rewards"] == [0.0, 10.0]
    assert second.stop == "answer" and second.environment["done"] is False


@pytest.mark.parametrize(
    ("guess", "reason", "ended"),
    [
        (-1, "not JSON", True),
        (-2, "refused it: bad action", False),
        (-3, "failed", True),  # past max_message_bytes: the client closes the session
        (-4, "failed", True),  # NaN is not a JSON number the client takes
        (-5, "failed", True),  # the server drops the connection
        ("seven", "bad_argument", False),  # the schema refuses it before the server sees it
    ],
)
def test_a_misbehaving_server_is_a_failed_observation(served, policy, guess, reason, ended):
    """What the server sends is untrusted: a broken reply ends the episode without a reward
    (its reason in the state), a refused action is a failed observation and the episode goes
    on; the loop never raises."""
    spec, _ = served
    _, _, out = run(policy, spec, [[call(policy, guess)], [call(policy, 7)]], 1)
    [t] = out.trajectories
    first = t.calls[0]
    assert not first["ok"] and (reason in first["text"] or reason == first["reason"]), first
    if ended:
        assert t.stop == "env_done" and t.environment["reward"] is None
        assert t.environment["state"]["error"]
    else:
        assert t.calls[1]["ok"] and t.environment["reward"] == 1.0


def test_bad_factory_arguments_and_a_missing_server_name_the_problem(served) -> None:
    from mmrft.rollout.openenv import fetch_action_schema, openenv_environment

    with pytest.raises(ValueError, match="reward_range"):
        openenv_environment("x", "http://127.0.0.1:9", reward_range=(1.0, 1.0))
    with pytest.raises(ValueError, match="episode_reward"):
        openenv_environment("x", "http://127.0.0.1:9", episode_reward="mean")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="127.0.0.1:9/schema"):
        fetch_action_schema("http://127.0.0.1:9", timeout_s=2.0)
