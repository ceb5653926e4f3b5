"""Judged completions per second: the HTTP client against concurrency, the local judge against
batch size, what the verdict cache saves on a resumed run, and what async verifiers overlap.

    python benchmarks/judge.py                 # about a minute and a half on 2 cores
    python benchmarks/judge.py --latency 0.2   # a slower judge
    python benchmarks/judge.py --overlap-only  # only the overlap section (about 40 s)

HTTP: an OpenAI-compatible server on 127.0.0.1 that answers every request after ``--latency``
seconds (a stand-in for a served judge's time per request, which concurrency hides: what is
measured is how well the client overlaps calls, not a model), ``--pairs`` distinct (question,
answer) pairs scored once per concurrency, then scored again by a "resumed run" (a new cache
object reading the first run's ``judge_cache.jsonl``). Local: the bundled tiny Qwen2.5-VL as a
label-probability judge (``verdict: prob``) at batch sizes 1, 8 and 32.

Overlap (async verifiers, :mod:`mmrft.rewards`): (a) two HTTP judges in one reward, each asking
``--pairs`` pairs of the stand-in server at concurrency 16: seconds per batch scored one judge
after the other (``score_one`` each) and concurrently (one reward call: both coroutines on the
reward's event loop); (b) a step's collection on the bundled tiny Qwen2.5-VL (hf engine,
4 prompts × 8 completions decoded in rounds of 8, ``rollout.batch_size`` < P·G) scored by the
HTTP judge (a request per completion answered after ``--overlap-latency`` seconds, concurrency 8):
seconds of ``collect`` with the overlap (each round's finished group judged while the next
round decodes) and without it (the batch judged after generation), alternated. The last line
printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def serve(latency: float) -> tuple[ThreadingHTTPServer, str]:
    """A chat-completions server that replies ``<score>7</score>`` after ``latency`` seconds."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(latency)
            body = json.dumps({"choices": [{"message": {"content": "<score>7</score>"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ThreadingHTTPServer.request_queue_size = 256
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


def two_judges(url: str, completions: list[str], samples: list, repeats: int = 3) -> dict:
    """(a) Two HTTP judges in one reward: seconds per batch, one after the other vs together."""
    from mmrft.plugins import VERIFIERS
    from mmrft.rewards import verifier
    from mmrft.rewards.reward import build_reward

    if "judge_b" not in VERIFIERS:  # the built-in judge again under a second name
        verifier("judge_b", low=0.0, high=1.0, isolate=False)(VERIFIERS.get("judge").fn)
    # two judge models (the stand-in server answers for any): each has its own 16 requests in
    # flight; two verifiers on one endpoint and model would share them (judges.shared_gate)
    params = {"base_url": url, "model": "m", "concurrency": 16, "cache": False}
    reward = build_reward(
        [
            {"name": "judge", "params": params},
            {"name": "judge_b", "params": {**params, "model": "m-b"}},
        ]
    )
    seconds = {"sequential": 0.0, "concurrent": 0.0}
    for _ in range(repeats):
        start = time.perf_counter()
        for name in reward.names:
            reward.score_one(name, completions, samples)
        seconds["sequential"] += (time.perf_counter() - start) / repeats
        start = time.perf_counter()
        reward(completions, samples)
        seconds["concurrent"] += (time.perf_counter() - start) / repeats
    reward.close()
    out = {k: round(v, 3) for k, v in seconds.items()}
    out["ratio"] = round(seconds["sequential"] / seconds["concurrent"], 2)
    print(
        f"two judges, {len(completions)} pairs each: {seconds['sequential']:.3f} s per batch one "
        f"after the other, {seconds['concurrent']:.3f} s together ({out['ratio']}x)",
        flush=True,
    )
    return out


def collection(url: str, run_dir: Path, latency: float, repeats: int = 4) -> dict:
    """(b) One step's collect on the tiny model with an HTTP judge, with and without the
    overlap of judging and decoding (alternated; the first collect warms up)."""
    from rich.console import Console

    import mmrft
    from mmrft.training.setup import setup

    judge = {
        "name": "judge",
        "params": {
            "base_url": url,
            "model": "m",
            "concurrency": 8,
            "answer_tag": "",
            "cache": False,
        },
    }
    cfg = mmrft.load_config(
        REPO / "configs" / "demo.yaml",
        [
            f"output_dir={run_dir}",
            "name=overlap",
            "warm_start.steps=0",
            "train.prompts_per_step=4",
            "rollout.group_size=8",
            "rollout.batch_size=8",
            "eval.before=false",
            f"reward.verifiers=[{json.dumps(judge)}]",
        ],
    )
    run = setup(cfg, Console(quiet=True))
    collector = run.collector
    assert collector.overlap, "the judge should be an async verifier on the hf engine"
    collector.collect(0)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    reward_s: dict[bool, list[float]] = {False: [], True: []}
    for step in range(1, repeats + 1):
        for overlap in (False, True):
            collector.overlap = overlap
            start = time.perf_counter()
            batch = collector.collect(step)
            seconds[overlap].append(time.perf_counter() - start)
            reward_s[overlap].append(batch.timings["time/reward_s"])
    collector.overlap = True
    run.engine.close()
    run.reward.close()
    run.runlog.close()
    mean = {k: sum(v) / len(v) for k, v in seconds.items()}
    exposed = {k: sum(v) / len(v) for k, v in reward_s.items()}
    out = {
        "collect_s_without": round(mean[False], 3),
        "collect_s_with": round(mean[True], 3),
        "ratio": round(mean[False] / mean[True], 2),
        "reward_s_without": round(exposed[False], 3),
        "reward_s_with": round(exposed[True], 3),
        "latency_s": latency,
    }
    print(
        f"collect of 4 prompts x 8 completions in rounds of 8, judge latency {latency:g} s: "
        f"{mean[False]:.3f} s without the overlap, {mean[True]:.3f} s with it "
        f"({out['ratio']}x); reward seconds after generation {exposed[False]:.3f} -> "
        f"{exposed[True]:.3f}",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--pairs", type=int, default=128)
    parser.add_argument("--overlap-latency", type=float, default=0.1)
    parser.add_argument("--overlap-only", action="store_true")
    args = parser.parse_args()

    from mmrft import judges
    from mmrft.data import Sample

    samples = [
        Sample(f"s{i}", [{"role": "user", "content": f"Question {i}?"}], target="x")
        for i in range(args.pairs)
    ]
    completions = [f"<answer>answer {i}</answer>" for i in range(args.pairs)]
    results: dict[str, dict] = {"http": {}, "local": {}}
    if not args.overlap_only:
        throughput(args, completions, samples, results)
    with tempfile.TemporaryDirectory() as run:
        httpd, url = serve(args.latency)
        results["overlap"] = {"two_judges": two_judges(url, completions, samples)}
        httpd.shutdown()
        httpd, url = serve(args.overlap_latency)
        results["overlap"]["collect"] = collection(url, Path(run), args.overlap_latency)
        httpd.shutdown()
    judges.use_run_dir(None)
    print(json.dumps(results if not args.overlap_only else {"overlap": results["overlap"]}))


def throughput(
    args: argparse.Namespace, completions: list[str], samples: list, results: dict
) -> None:
    """Judged answers per second: HTTP against concurrency, the resumed run, the local judge."""
    from mmrft import judges
    from mmrft.rewards.reward import build_reward

    httpd, url = serve(args.latency)
    with tempfile.TemporaryDirectory() as run:
        for concurrency in (1, 4, 16, 64):
            judges.use_run_dir(Path(run) / f"c{concurrency}")
            judges._CACHES.clear()
            params = {"base_url": url, "model": "m", "concurrency": concurrency}
            reward = build_reward([{"name": "judge", "params": params}])
            start = time.perf_counter()
            reward(completions, samples)
            seconds = time.perf_counter() - start
            results["http"][concurrency] = round(args.pairs / seconds, 1)
            print(
                f"http concurrency {concurrency:3d}: {args.pairs / seconds:7.1f} judged/s",
                flush=True,
            )
        judges._CACHES.clear()  # the resumed run: only the file is left
        start = time.perf_counter()
        reward(completions, samples)
        resumed = time.perf_counter() - start
        cache = judges.current_cache()
        hit_rate = cache.hits / max(1, cache.hits + cache.misses)
        results["resumed"] = {"seconds": round(resumed, 3), "hit_rate": round(hit_rate, 3)}
        print(f"resumed run: {resumed:.3f} s for {args.pairs} pairs, cache hit rate {hit_rate:.2f}")
    httpd.shutdown()
    judges.use_run_dir(None)
    model = REPO / "assets" / "models" / "tiny-qwen2_5_vl"
    for batch in (1, 8, 32):
        judges._CACHES.clear()
        params = {
            "backend": "local",
            "path": str(model),
            "batch_size": batch,
            "verdict": {"kind": "prob", "labels": {"yes": 1, "no": 0}},
            "cache": False,
        }
        reward = build_reward([{"name": "judge", "params": params}])
        reward(completions[:8], samples[:8])  # loads the model
        start = time.perf_counter()
        reward(completions[:64], samples[:64])
        rate = 64 / (time.perf_counter() - start)
        results["local"][batch] = round(rate, 1)
        print(f"local batch {batch:2d}: {rate:7.1f} judged/s", flush=True)


if __name__ == "__main__":
    main()
