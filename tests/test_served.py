"""The served vLLM engine's parts that need no vLLM (``rollout.engine=vllm_server``).

Config checks; the HTTP client against a tiny fake server (``http.server`` in a thread) that
answers garbage, too much, an error status, nothing, or too late; the engine's requests,
reply parsing, parity check, weight push and failure messages against a fake vLLM server; a
started server that dies during start-up. The real server runs in tests/test_vllm.py
(``make test-vllm``).
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import LocalServer, closed_after

from mmrft.config import ServerConfig, VLLMConfig, load_config
from mmrft.policy.model import load_policy, merged_weights
from mmrft.rollout import served
from mmrft.rollout.base import Sampling
from mmrft.rollout.engine import ENGINES, build_engine
from mmrft.rollout.served import (
    ServedEngine,
    ServerError,
    content_parts,
    decode_frames,
    encode_frames,
    parse_generation,
    request_json,
    write_weights,
)
from mmrft.rollout.vllm import EngineParityError
from mmrft.runtime import distributed
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "assets" / "models" / "tiny-qwen2_5_vl"


# -- config --------------------------------------------------------------------------------------


def config(*overrides: str):
    return load_config(None, ["train.steps=0", "rollout.engine=vllm_server", *overrides])


def test_the_engine_is_known_and_its_defaults_load() -> None:
    assert "vllm_server" in ENGINES
    server = config().rollout.server
    assert server == ServerConfig()
    assert server.url is None and server.port == 0 and server.host == "127.0.0.1"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.server.url=localhost:8000", "rollout.server.url"),
        ("rollout.server.url=http://host:8000/v1", "rollout.server.url"),
        ("rollout.server.url=ftp://host:8000", "rollout.server.url"),
        ("rollout.server.port=-1", "rollout.server.port"),
        ("rollout.server.port=65536", "rollout.server.port"),
        ("rollout.server.host=' '", "rollout.server.host"),
        ("rollout.server.start_timeout_s=0", "rollout.server.start_timeout_s"),
        ("rollout.server.request_timeout_s=-5", "rollout.server.request_timeout_s"),
        ("rollout.server.extra_args=['']", "rollout.server.extra_args"),
        ("rollout.server.devices='0;1'", "rollout.server.devices"),
        ("rollout.server.devices=cuda:1", "rollout.server.devices"),
        ("rollout.timeout_s=10", "rollout.timeout_s"),
        ("rollout.server.prot=8000", "rollout.server.port"),  # unknown key: the closest named
    ],
)
def test_config_checks_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config(override)


def test_extra_args_belong_to_a_started_server() -> None:
    config("rollout.server.extra_args=[--max-num-seqs, '8']")  # fine without a URL
    with pytest.raises(ConfigError, match=r"rollout\.server\.extra_args: applies to a server"):
        config("rollout.server.url=http://gpu-7:8000", "rollout.server.extra_args=[--x]")


def test_a_started_server_gets_its_own_devices(monkeypatch) -> None:
    """rollout.server.devices becomes the started server's CUDA_VISIBLE_DEVICES (the trainer's
    own environment unchanged); a server at a URL cannot be given devices."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cfg = config("rollout.server.devices='4,5,6,7'")
    env = served.server_environment(cfg.rollout.server)
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert served.server_environment(config().rollout.server)["CUDA_VISIBLE_DEVICES"] == "0"
    with pytest.raises(ConfigError, match=r"rollout\.server\.devices: applies to a server"):
        config("rollout.server.url=http://gpu-7:8000", "rollout.server.devices='1'")


def test_urls_and_paths_that_are_accepted(tmp_path, monkeypatch) -> None:
    for url in ("http://127.0.0.1:8000", "https://gpu-7.cluster:443/", "http://[::1]:8000"):
        assert config(f"rollout.server.url={url}").rollout.server.url == url
    monkeypatch.chdir(tmp_path)
    server = config("rollout.server.weights_dir=shared/w", "rollout.server.log=logs/s.log")
    assert server.rollout.server.weights_dir == str(tmp_path / "shared" / "w")
    assert server.rollout.server.log == str(tmp_path / "logs" / "s.log")


# -- the HTTP client against a fake server -------------------------------------------------------


class Fake(LocalServer):
    """An HTTP server in a thread: ``routes[path](handler, body)`` answers each request (a
    JSON reply of :meth:`reply` by default, ``{}``); ``calls`` records ``(path, body)``."""

    def __init__(self) -> None:
        fake = self
        self.routes: dict[str, Callable[[Any, Any], None]] = {}
        self.calls: list[tuple[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                path = self.path.split("?")[0]
                fake.calls.append((path, body))
                fake.routes.get(path, lambda h, b: Fake.reply(h, {}))(self, body)

            do_GET = do_POST = handle_one

            def log_message(self, *args: Any) -> None:
                pass

        self.serve(Handler)

    @staticmethod
    def reply(handler: Any, payload: Any, status: int = 200) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


@pytest.fixture
def fake():
    yield from closed_after(Fake())


def test_a_json_reply_is_parsed_and_the_body_sent(fake) -> None:
    fake.routes["/echo"] = lambda h, body: Fake.reply(h, {"got": body})
    assert request_json(fake.url + "/echo", {"a": [1, 2]}, 5.0, 1000) == {"got": {"a": [1, 2]}}
    assert request_json(fake.url + "/empty", None, 5.0, 1000) == {}
    assert fake.calls == [("/echo", {"a": [1, 2]}), ("/empty", None)]


def test_garbage_is_refused(fake) -> None:
    fake.routes["/garbage"] = lambda h, body: Fake.reply(h, b"<html>\x00\xffnot json")
    with pytest.raises(ServerError, match=r"/garbage answered something that is not JSON"):
        request_json(fake.url + "/garbage", {}, 5.0, 1000)


def test_a_huge_reply_is_refused_before_it_is_read(fake) -> None:
    fake.routes["/huge"] = lambda h, body: Fake.reply(h, b"[" + b"1," * 50_000 + b"1]")
    with pytest.raises(ServerError, match=r"answered 100003 bytes, more than the 4096 read"):
        request_json(fake.url + "/huge", {}, 5.0, 4096)


def test_a_huge_reply_without_a_length_is_cut_off(fake) -> None:
    def stream(handler: Any, body: Any) -> None:  # HTTP/1.0: the body ends with the connection
        handler.send_response(200)
        handler.end_headers()
        for _ in range(100):
            handler.wfile.write(b" " * 1000)

    fake.routes["/stream"] = stream
    with pytest.raises(ServerError, match=r"/stream answered more than 4096 bytes"):
        request_json(fake.url + "/stream", {}, 5.0, 4096)


def test_an_error_status_carries_the_start_of_its_body(fake) -> None:
    detail = {"error": {"message": "Scale-out endpoints are disabled. " + "x" * 5000}}
    fake.routes["/fail"] = lambda h, body: Fake.reply(h, detail, status=403)
    with pytest.raises(ServerError, match=r"answered HTTP 403: .*Scale-out endpoints") as info:
        request_json(fake.url + "/fail", {}, 5.0, 1000)
    assert len(str(info.value)) < 1200


def test_a_server_that_dies_mid_request(fake) -> None:
    def die(handler: Any, body: Any) -> None:
        handler.connection.shutdown(socket.SHUT_RDWR)

    fake.routes["/die"] = die
    with pytest.raises(ServerError, match=r"no answer from http://127\.0\.0\.1:\d+/die"):
        request_json(fake.url + "/die", {}, 5.0, 1000)


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_a_server_that_stops_answering_times_out(fake) -> None:
    fake.routes["/slow"] = lambda h, body: time.sleep(3)
    start = time.monotonic()
    with pytest.raises(ServerError, match=r"no answer from .*/slow \((TimeoutError|timeout)"):
        request_json(fake.url + "/slow", {}, 0.5, 1000)
    assert time.monotonic() - start < 2.5


def test_nothing_listening() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ServerError, match=rf"no answer from http://127\.0\.0\.1:{port}/health"):
        request_json(f"http://127.0.0.1:{port}/health", None, 2.0, 1000)


# -- replies and media ---------------------------------------------------------------------------


def choice(index: int, ids: list[int], reason: str = "stop") -> dict[str, Any]:
    content = [{"token_id": t, "logprob": -0.1 * (i + 1)} for i, t in enumerate(ids)]
    return {
        "index": index,
        "token_ids": ids,
        "logprobs": {"content": content},
        "finish_reason": reason,
    }


def test_a_generation_reply_is_read_in_choice_order() -> None:
    reply = {
        "prompt_token_ids": [1, 2, 3],
        "choices": [choice(1, [7], "length"), choice(0, [5, 6])],
    }
    prompt, choices = parse_generation(reply, 2)
    assert prompt == [1, 2, 3]
    assert choices == [([5, 6], [-0.1, -0.2], False), ([7], [-0.1], True)]


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ([], "not a JSON object"),
        ({"choices": [choice(0, [5])]}, "prompt_token_ids is not a list"),
        ({"prompt_token_ids": [1, -2], "choices": [choice(0, [5])]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1], "choices": []}, "0 choices instead of 1"),
        ({"prompt_token_ids": [1], "choices": [choice(3, [5])]}, "indices"),
        ({"prompt_token_ids": [1], "choices": [{**choice(0, [5]), "token_ids": [5, 6]}]}, "log-probs do not match"),
        ({"prompt_token_ids": [1], "choices": [{**choice(0, [5]), "token_ids": ["5"]}]}, "token_ids"),
        ({"prompt_token_ids": [1], "choices": [{**choice(0, [5]), "finish_reason": None}]}, "finish_reason"),
        (
            {"prompt_token_ids": [1], "choices": [{**choice(0, [5]), "logprobs": {"content": [{"token_id": 9, "logprob": -1}]}}]},
            "another token",
        ),
        (
            {"prompt_token_ids": [1], "choices": [{**choice(0, [5]), "logprobs": {"content": [{"logprob": "x"}]}}]},
            "not a number",
        ),
    ],
)  # fmt: skip
def test_malformed_replies_are_named(reply: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_generation(reply, 1)


def test_video_frames_and_their_metadata_round_trip() -> None:
    frames = np.random.default_rng(0).integers(0, 255, (4, 28, 56, 3), dtype=np.uint8)
    metadata = {
        "fps": 30.0,
        "total_num_frames": np.int64(90),
        "frames_indices": np.arange(0, 90, 30),
    }
    back, meta = decode_frames(encode_frames(frames, metadata))
    assert np.array_equal(back, frames) and back.dtype == np.uint8
    assert meta == {"fps": 30.0, "total_num_frames": 90, "frames_indices": [0, 30, 60]}
    _, default = decode_frames(encode_frames(frames, None))
    assert default["frames_indices"] == [0, 1, 2, 3] and default["fps"] == 2.0
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\] uint8"):
        decode_frames(encode_frames(frames[..., :2], None))


def test_media_go_as_lossless_data_urls() -> None:
    import base64

    import soundfile
    from PIL import Image

    pixels = np.random.default_rng(1).integers(0, 255, (28, 42, 3), dtype=np.uint8)
    clip = np.sin(np.arange(1600, dtype=np.float32) / 7.0)
    frames = np.zeros((2, 28, 28, 3), dtype=np.uint8)
    parts = content_parts(
        {
            "image": [Image.fromarray(pixels)],
            "video": [(frames, {"fps": 2.0})],
            "audio": [(clip, 16000)],
        }
    )
    assert [p["type"] for p in parts] == ["image_url", "video_url", "audio_url"]
    image_data = base64.b64decode(parts[0]["url"].removeprefix("data:image/png;base64,"))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(image_data))), pixels)
    assert parts[1]["url"].startswith("data:video/x-mmrft-frames;base64,")
    audio = base64.b64decode(parts[2]["url"].removeprefix("data:audio/wav;base64,"))
    read, rate = soundfile.read(io.BytesIO(audio), dtype="float32")
    assert rate == 16000 and np.array_equal(read, clip)


# -- the engine against a fake vLLM server -------------------------------------------------------


@pytest.fixture(scope="module")
def policy():
    cfg = load_config(None, [f"model.path={MODEL}", "train.steps=0"])
    return load_policy(cfg.model, torch.device("cpu"))


def fake_vllm(fake: Fake) -> Fake:
    """Health, dev mode, cache resets, reload, and generation that echoes the prompt with
    ``n`` completions ``[5 + i, 6]`` (listed last first), cut by the length limit."""

    def generate(handler: Any, body: Any) -> None:
        n = body["sampling_params"]["n"]
        choices = [choice(i, [5 + i, 6], "length") for i in reversed(range(n))]
        Fake.reply(handler, {"prompt_token_ids": body["token_ids"], "choices": choices})

    fake.routes["/health"] = lambda h, b: Fake.reply(h, b"")
    fake.routes["/is_paused"] = lambda h, b: Fake.reply(h, {"is_paused": False})
    fake.routes["/reset_prefix_cache"] = lambda h, b: Fake.reply(h, {"success": True})
    fake.routes["/collective_rpc"] = lambda h, b: Fake.reply(h, {"results": [None]})
    fake.routes[served.GENERATE_PATH] = generate
    return fake


def engine_at(policy, url: str, tmp_path: Path, **server: Any) -> ServedEngine:
    settings = ServerConfig(url=url, request_timeout_s=2.0, weights_dir=str(tmp_path), **server)
    return ServedEngine(policy, VLLMConfig(seed=0), settings, {}, str(MODEL))


def text(question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": question}]}]


def test_generation_requests_and_group_contiguous_rollouts(policy, fake, tmp_path) -> None:
    engine = engine_at(policy, fake_vllm(fake).url, tmp_path)
    torch.manual_seed(3)
    out = engine.generate([text("one?"), text("two?")], 3, Sampling(8, top_k=5))
    assert out.prompt_index == [0, 0, 0, 1, 1, 1]
    assert out.completion_ids == [[5, 6], [6, 6], [7, 6]] * 2
    assert out.logprobs == [[-0.1, -0.2]] * 6 and all(out.truncated)
    prompts = [r["input_ids"].tolist() for r in out.prompts]
    # the two requests are in flight together: they arrive in either order
    bodies = [b for p, b in fake.calls if p == served.GENERATE_PATH]
    bodies.sort(key=lambda body: prompts.index(body["token_ids"]))
    assert [b["token_ids"] for b in bodies] == prompts
    params = bodies[0]["sampling_params"]
    assert params["n"] == 3 and params["top_k"] == 5 and params["logprobs"] == 0
    assert params["max_tokens"] == 8 and params["detokenize"] is False
    placeholders = set(policy.family.suppress_token_ids(policy.processor))
    assert placeholders and not placeholders & set(params["allowed_token_ids"])
    assert bodies[0]["return_token_ids"] is True and "content_parts" not in bodies[0]
    torch.manual_seed(3)
    seeds = torch.randint(0, 2**31 - 1, (2,)).tolist()
    assert [b["sampling_params"]["seed"] for b in bodies] == seeds  # torch's RNG, one each
    engine.generate([text("one?")], 1, Sampling(4, greedy=True))
    assert fake.calls[-1][1]["sampling_params"]["seed"] is None
    assert fake.calls[-1][1]["sampling_params"]["temperature"] == 0.0
    engine.close()


def test_another_prompt_on_the_server_is_a_parity_error(policy, fake, tmp_path) -> None:
    def shifted(handler: Any, body: Any) -> None:
        ids = body["token_ids"][:5] + [0] + body["token_ids"][5:]
        Fake.reply(handler, {"prompt_token_ids": ids, "choices": [choice(0, [5])]})

    fake_vllm(fake).routes[served.GENERATE_PATH] = shifted
    engine = engine_at(policy, fake.url, tmp_path)
    with pytest.raises(EngineParityError, match=r"prompt for sample 'a' differs .* at token 5"):
        engine.check_parity([text("one?")], ["a"])
    with pytest.raises(EngineParityError, match=r"conversation 0 of a batch differs"):
        engine.generate([text("one?")], 1, Sampling(4))
    engine.close()


def test_a_garbage_reply_stops_with_the_server_named(policy, fake, tmp_path) -> None:
    fake_vllm(fake).routes[served.GENERATE_PATH] = lambda h, b: Fake.reply(h, {"choices": 3})
    engine = engine_at(policy, fake.url, tmp_path)
    with pytest.raises(
        ServerError,
        match=rf"vLLM server at {fake.url}: generating 1 prompts × 2: a malformed reply",
    ):
        engine.generate([text("one?")], 2, Sampling(4))
    engine.close()


def test_a_server_gone_mid_run_stops_with_the_server_named(policy, fake, tmp_path) -> None:
    engine = engine_at(policy, fake_vllm(fake).url, tmp_path)
    engine.generate([text("one?")], 2, Sampling(4))
    fake.close()
    with pytest.raises(ServerError, match=rf"vLLM server at {fake.url}: generating .* no answer"):
        engine.generate([text("one?")], 2, Sampling(4))
    with pytest.raises(ServerError, match=r"reloading the weights from .*: no answer"):
        engine.sync_weights()
    engine.close()
    engine.close()  # idempotent


def test_a_server_without_dev_endpoints_is_refused(policy, fake, tmp_path) -> None:
    fake_vllm(fake).routes["/is_paused"] = lambda h, b: Fake.reply(h, {"detail": "Not Found"}, 404)
    with pytest.raises(ConfigError, match=r"VLLM_SERVER_DEV_MODE=1"):
        engine_at(policy, fake.url, tmp_path)
    assert list(tmp_path.iterdir()) == []  # its weights directory is gone again


def test_one_url_for_several_ranks_is_refused(policy, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    with pytest.raises(ConfigError, match=r"rollout\.server\.url: one server per trainer"):
        engine_at(policy, "http://127.0.0.1:9", tmp_path)


def test_a_weight_push_writes_safetensors_and_reloads(policy, fake, tmp_path) -> None:
    from safetensors.torch import load_file

    engine = engine_at(policy, fake_vllm(fake).url, tmp_path)
    fake.calls.clear()
    engine.sync_weights()
    paths = [p for p, _ in fake.calls]
    assert paths == [
        "/collective_rpc",
        "/reset_prefix_cache",
        "/reset_encoder_cache",
        "/reset_mm_cache",
    ]
    rpc = fake.calls[0][1]
    assert rpc["method"] == "reload_weights"
    assert rpc["kwargs"] == {"weights_path": str(engine.weights_dir)}  # strings only
    assert engine.weights_dir.parent == tmp_path
    index = json.loads((engine.weights_dir / "model.safetensors.index.json").read_text())
    written = {}
    for file in set(index["weight_map"].values()):
        written.update(load_file(str(engine.weights_dir / file)))
    expected = dict(merged_weights(policy.model))
    embeddings = policy.model.get_input_embeddings().weight
    tied = embeddings.data_ptr() == policy.model.get_output_embeddings().weight.data_ptr()
    missing = set(expected) - set(written)
    assert missing == ({"lm_head.weight"} if tied else set())  # a tied tensor goes once
    assert all(torch.equal(written[n], expected[n]) for n in written)
    assert set(engine.push_timings) == {"write_s", "reload_s", "total_s", "bytes"}
    engine.close()
    assert not engine.weights_dir.exists()


def test_a_lora_push_sends_the_adapter_alone(fake, tmp_path) -> None:
    """push 'lora': each push writes a peft adapter folder (a new one; the last removed),
    loads it in place under one name, and later requests ask for that name; the adapter
    equals the policy's (peft's own save), a small share of the full weights."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    lora = ["model.lora.enabled=true", "model.freeze_vision=true"]
    cfg = load_config(None, [f"model.path={MODEL}", "train.steps=0", *lora])
    lora_policy = load_policy(cfg.model, torch.device("cpu"))
    fake_vllm(fake).routes["/v1/load_lora_adapter"] = lambda h, b: Fake.reply(
        h, b"Success: LoRA adapter 'mmrft-policy' added successfully."
    )
    engine = engine_at(lora_policy, fake.url, tmp_path, push="lora")
    folders = []
    for scale in (0.0, 0.5):
        with torch.no_grad():
            for name, p in lora_policy.model.named_parameters():
                if "lora_B" in name:
                    p.fill_(scale)
        fake.calls.clear()
        engine.sync_weights()
        assert [p for p, _ in fake.calls] == [
            "/v1/load_lora_adapter",
            "/reset_prefix_cache",
            "/reset_encoder_cache",
            "/reset_mm_cache",
        ]
        load = fake.calls[0][1]
        folder = Path(load["lora_path"])
        assert load == {
            "lora_name": served.LORA_NAME,
            "lora_path": str(folder),
            "load_inplace": True,
        }
        assert folder.parent == engine.weights_dir and folder not in folders
        written = load_file(str(folder / "adapter_model.safetensors"))
        expected = get_peft_model_state_dict(lora_policy.model)
        assert written.keys() == expected.keys()
        assert all(torch.equal(written[k], expected[k]) for k in written)
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["r"] == cfg.model.lora.r and config["lora_alpha"] == cfg.model.lora.alpha
        folders.append(folder)
    assert not folders[0].exists()  # the last push's folder replaced the first
    full = sum(t.numel() * t.element_size() for _, t in merged_weights(lora_policy.model))
    assert engine.push_timings["bytes"] < full
    engine.generate([text("one?")], 2, Sampling(4))
    assert fake.calls[-1][1]["model"] == served.LORA_NAME
    engine.close()


def test_a_lora_push_needs_lora(policy, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.server\.push: 'lora' pushes the LoRA"):
        config("rollout.server.push=lora")
    with pytest.raises(ConfigError, match=r"rollout\.server\.push: 'lora' pushes the LoRA"):
        engine_at(policy, "http://127.0.0.1:9", tmp_path, push="lora")
    cfg = load_config(None, [f"model.path={MODEL}", "train.steps=0", "model.lora.enabled=true"])
    vision_lora = load_policy(cfg.model, torch.device("cpu"))  # adapters on the vision tower too
    with pytest.raises(ConfigError, match=r"language model only, and 6 adapted modules.*visual"):
        engine_at(vision_lora, "http://127.0.0.1:9", tmp_path, push="lora")
    args = served.serve_arguments(policy, VLLMConfig(), {}, "m", "127.0.0.1", 8000, lora_rank=12)
    assert args[-5:] == ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "16"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in served.server_environment(
        ServerConfig(push="lora")
    )


def test_shards_and_a_second_push_replace_the_first(policy, tmp_path) -> None:
    first = write_weights(merged_weights(policy.model), tmp_path, shard_bytes=2**16)
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) > 2 and files[0].endswith(f"-of-{len(files):05d}.safetensors")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == first
    assert sorted(set(index["weight_map"].values())) == files
    write_weights(
        merged_weights(policy.model), tmp_path
    )  # one shard now: the others are stale, removed
    assert [p.name for p in tmp_path.glob("*.safetensors")] == ["model-00001-of-00001.safetensors"]


def test_a_server_that_fails_to_start_names_its_log(policy, tmp_path, monkeypatch) -> None:
    """This virtualenv has no vLLM: refused at once; pretending it has, the started server
    dies on its first import, and the error carries the end of its log (which is kept)."""
    rollout = config(f"rollout.server.weights_dir={tmp_path / 'w'}").rollout
    with pytest.raises(ConfigError, match=r"vllm_server starts vLLM's server from this Python"):
        build_engine(rollout, policy, model_path=str(MODEL))
    real = served.importlib.util.find_spec
    monkeypatch.setattr(
        served.importlib.util, "find_spec", lambda name: name == "vllm" or real(name)
    )
    log = tmp_path / "server.log"
    rollout.server.log = str(log)
    with pytest.raises(ServerError, match=r"the server stopped while starting") as info:
        build_engine(rollout, policy, model_path=str(MODEL))
    message = str(info.value)
    assert "exited with code 1" in message and f"last lines of its log ({log})" in message
    assert "No module named 'vllm'" in message
    assert "--logprobs-mode raw_logprobs" in log.read_text()  # the command, first line
    assert list((tmp_path / "w").iterdir()) == []  # the weights directory is removed


CHILD = """
import subprocess, sys, time
from mmrft.rollout.served import watch_parent

watch_parent(int(sys.argv[1]), 0.1)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[2], "w").write(str(helper.pid))
time.sleep(120)
"""

PARENT = """
import os, subprocess, sys, time

child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2]],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_started_server_dies_with_its_parent(tmp_path) -> None:
    """The watcher in a started server (``--parent``) kills its process group, the server and
    what it started (vLLM's engine core), once the trainer's process is gone."""
    import subprocess
    import sys

    marker = tmp_path / "helper.pid"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(marker)], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the child never started its helper"
        time.sleep(0.1)
    helper = int(marker.read_text())
    assert not gone(child) and not gone(helper)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while not (gone(child) and gone(helper)):
        assert time.monotonic() < deadline, "the server's group outlived its parent"
        time.sleep(0.1)


# -- a teacher served by vLLM (teacher.server.url) ----------------------------------------------


def teacher_logprob(token: int) -> float:
    """The fake teacher's log-prob of a token, and its argmax when the token is even."""
    return -0.001 * token - 0.01


def fake_teacher(
    fake: Fake, policy, expansions: dict[tuple[int, ...], list[int]], root: Path = MODEL
) -> Fake:
    """A fake teacher server: ``/v1/models`` names ``root``; ``/detokenize`` decodes with the
    policy's tokenizer; the token-in route expands a collapsed prompt by ``expansions`` and
    scores every position with :func:`teacher_logprob`."""

    def generate(handler: Any, body: Any) -> None:
        ids = expansions.get(tuple(body["token_ids"]), body["token_ids"])
        scored = [None] + [
            {str(t): {"logprob": teacher_logprob(t), "rank": 1 if t % 2 == 0 else 7}}
            for t in ids[1:]
        ]
        reply = {"prompt_token_ids": ids, "prompt_logprobs": scored, "choices": [choice(0, [5])]}
        Fake.reply(handler, reply)

    fake.routes["/v1/models"] = lambda h, b: Fake.reply(
        h, {"data": [{"id": "t", "root": str(root)}]}
    )
    fake.routes["/detokenize"] = lambda h, b: Fake.reply(
        h, {"prompt": policy.tokenizer.decode(b["tokens"])}
    )
    fake.routes[served.GENERATE_PATH] = generate
    return fake


def teacher_config(url: str, *extra: str):
    return load_config(
        None, ["train.steps=0", f"model.path={MODEL}", f"teacher.server.url={url}", *extra]
    )


def image_conversation(tmp_path: Path) -> list[dict[str, Any]]:
    from PIL import Image

    Image.new("RGB", (56, 56), (200, 30, 30)).save(tmp_path / "red.png")
    image = {"type": "image", "image": str(tmp_path / "red.png")}
    return [{"role": "user", "content": [image, {"type": "text", "text": "Colour?"}]}]


def test_a_served_teacher_scores_each_sampled_token(policy, fake, tmp_path) -> None:
    """Each completion goes as its prompt row + tokens (placeholder runs collapsed, the image
    as a data URL) with prompt_logprobs 0; the reply's entries at the completion's positions
    become its log-probs and argmax agreement, right-padded for the loss."""
    from mmrft.rollout.hf import HFEngine
    from mmrft.rollout.served_teacher import ServedTeacher, padded_scores
    from mmrft.rollout.vllm import collapse_runs

    torch.manual_seed(0)
    out = HFEngine(policy, 8, keep_media=True).generate(
        [image_conversation(tmp_path), text("Two?")], 2, Sampling(5)
    )
    expansions = {}
    for i in range(4):
        ids = out.prompts[out.prompt_index[i]]["input_ids"].tolist() + out.completion_ids[i]
        expansions[tuple(collapse_runs(ids, served.collapsed_tokens(policy)))] = ids
    teacher = ServedTeacher(teacher_config(fake_teacher(fake, policy, expansions).url), policy)
    scores = teacher.score(out, [0, 1, 2, 3])
    for i in range(4):
        assert scores[i].logps == pytest.approx([teacher_logprob(t) for t in out.completion_ids[i]])
        assert scores[i].agree == [float(t % 2 == 0) for t in out.completion_ids[i]]
    bodies = [b for p, b in fake.calls if p == served.GENERATE_PATH]
    assert len(bodies) == 4 and all(tuple(b["token_ids"]) in expansions for b in bodies)
    assert all(
        b["sampling_params"]
        == {"max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0, "detokenize": False}
        for b in bodies
    )
    with_image = [b for b in bodies if "content_parts" in b]
    assert len(with_image) == 2 and all(len(b["content_parts"]) == 1 for b in with_image)
    assert with_image[0]["content_parts"][0]["url"].startswith("data:image/png;base64,")
    width = max(len(ids) for ids in out.completion_ids[:2]) + 2
    logps, agree = padded_scores(scores, [0, 1], torch.zeros(2, width))
    assert logps[0, : len(out.completion_ids[0])].tolist() == pytest.approx(scores[0].logps)
    assert logps[:, -2:].abs().sum() == 0 and agree[:, -2:].sum() == 0


def test_the_hf_engine_keeps_the_media_without_changing_a_row(policy, tmp_path) -> None:
    from mmrft.rollout.hf import HFEngine

    convs = [image_conversation(tmp_path), text("Two?")]
    for shared in (True, False):
        rows = {}
        for keep in (False, True):
            torch.manual_seed(0)
            engine = HFEngine(policy, 8, group_shared=shared, keep_media=keep)
            rows[keep] = engine.generate(convs, 2, Sampling(4)).prompts
        for plain, kept in zip(rows[False], rows[True]):
            assert plain.keys() == kept.keys() - {"engine_media", "engine_ids"}
            assert all(torch.equal(plain[k], kept[k]) for k in plain)
        assert [len(r["engine_media"].get("image", [])) for r in rows[True]][:1] == [1]


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ([], "not a JSON object"),
        ({"prompt_token_ids": [1, 2, 4], "prompt_logprobs": [None] * 3}, "other tokens"),
        ({"prompt_token_ids": [1, 2, 3], "prompt_logprobs": [None] * 2}, "2 entries for 3"),
        ({"prompt_token_ids": [1, 2, 3]}, "no entries"),
        ({"prompt_token_ids": [1, "2", 3], "prompt_logprobs": [None] * 3}, "not a list of token"),
        ({"prompt_token_ids": [1, 2, 3], "prompt_logprobs": [None, {}, {"3": {"logprob": -1.0, "rank": 1}}]}, "position 1 has no log-prob of its token 2"),
        ({"prompt_token_ids": [1, 2, 3], "prompt_logprobs": [None, {"2": {"logprob": float("nan"), "rank": 1}}, None]}, "not a finite"),
        ({"prompt_token_ids": [1, 2, 3], "prompt_logprobs": [None, {"2": {"logprob": 3.0, "rank": 1}}, None]}, "positive"),
        ({"prompt_token_ids": [1, 2, 3], "prompt_logprobs": [None, {"2": {"logprob": -1.0, "rank": True}}, None]}, "rank"),
        ({"prompt_token_ids": [1, 2, 3], "prompt_logprobs": [None, {"2": {"logprob": -1.0, "rank": 0}}, None]}, "rank"),
        ({"prompt_token_ids": [1, 2, 3], "prompt_logprobs": [None, {"2": "-1"}, None]}, "no log-prob"),
    ],
)  # fmt: skip
def test_malformed_teacher_scores_are_named(reply: Any, problem: str) -> None:
    from mmrft.rollout.served_teacher import parse_scores

    with pytest.raises(ValueError, match=problem):
        parse_scores(reply, [1, 2, 3], 1, "completion 0")


def test_teacher_scores_may_skip_only_unscored_positions() -> None:
    from mmrft.rollout.served_teacher import parse_scores

    reply = {
        "prompt_token_ids": [1, 2, 3, 4],
        "prompt_logprobs": [None, {"2": {"logprob": -9.0, "rank": 3}}, None, {"4": {"logprob": -0.5, "rank": 1}, "9": {"logprob": -0.5, "rank": 1}}],
    }  # fmt: skip
    scores = parse_scores(reply, [1, 2, 3, 4], 2, "completion 0")
    assert scores.logps == [0.0, -0.5] and scores.agree == [0.0, 1.0]


def test_a_served_teacher_is_checked_at_start_up(policy, fake, tmp_path) -> None:
    """Another tokenizer on the server, another family at the path it reports, no model,
    nothing listening: each stops the run naming the teacher's server."""
    from mmrft.rollout.served_teacher import ServedTeacher

    fake_teacher(fake, policy, {})
    fake.routes["/detokenize"] = lambda h, b: Fake.reply(h, {"prompt": "something else"})
    with pytest.raises(ConfigError, match="decodes token ids otherwise than the policy's"):
        ServedTeacher(teacher_config(fake.url), policy)
    other = REPO / "assets" / "models" / "tiny-qwen3_vl"
    fake_teacher(fake, policy, {}, root=other)
    with pytest.raises(
        ConfigError,
        match=r"teacher.server.url \(the checkpoint it serves, .*tiny-qwen3_vl\): a qwen3_vl model",
    ):
        ServedTeacher(teacher_config(fake.url), policy)
    ServedTeacher(teacher_config(fake.url, f"teacher.path={MODEL}"), policy)  # teacher.path wins
    fake.routes["/v1/models"] = lambda h, b: Fake.reply(h, {"data": []})
    with pytest.raises(ServerError, match="lists no model"):
        ServedTeacher(teacher_config(fake.url), policy)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(
        ServerError, match=f"teacher at http://127.0.0.1:{port}: listing its models"
    ):
        ServedTeacher(teacher_config(f"http://127.0.0.1:{port}"), policy)


def test_a_wrong_or_garbled_teacher_reply_stops_the_step(policy, fake, tmp_path) -> None:
    from mmrft.rollout.hf import HFEngine
    from mmrft.rollout.served_teacher import ServedTeacher

    torch.manual_seed(0)
    out = HFEngine(policy, 8, keep_media=True).generate([text("One?")], 2, Sampling(4))
    teacher = ServedTeacher(teacher_config(fake_teacher(fake, policy, {}).url), policy)
    fake.routes[served.GENERATE_PATH] = lambda h, b: Fake.reply(
        h, {"prompt_token_ids": b["token_ids"][1:], "prompt_logprobs": []}
    )
    with pytest.raises(EngineParityError, match="the teacher's server ran other tokens"):
        teacher.score(out, [0, 1])
    fake.routes[served.GENERATE_PATH] = lambda h, b: Fake.reply(h, b"x" * 60_000)
    with pytest.raises(ServerError, match="scoring 2 completions: .*more than"):
        teacher.score(out, [0, 1])
    fake.routes[served.GENERATE_PATH] = lambda h, b: Fake.reply(
        h, {"prompt_token_ids": b["token_ids"], "prompt_logprobs": None}
    )
    with pytest.raises(ServerError, match="malformed score of completion 0"):
        teacher.score(out, [0, 1])


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("algorithm.distill_loss=full", "algorithm.distill_loss: 'full' needs the teacher's whole"),
        ("teacher.server.request_timeout_s=0", "teacher.server.request_timeout_s: must be > 0"),
        ("algorithm.distill_coef=0", "algorithm.distill_coef: must be > 0"),
    ],
)
def test_served_teacher_keys_are_checked(override: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        teacher_config("http://127.0.0.1:8000", override)
    with pytest.raises(
        ConfigError, match="teacher.server.url: 'localhost:8000' must be a base URL"
    ):
        teacher_config("localhost:8000")
