"""Judged completions per second: the HTTP client against concurrency, the local judge against
batch size, and what the verdict cache saves on a resumed run.

    python benchmarks/judge.py                 # about a minute on 2 cores
    python benchmarks/judge.py --latency 0.2   # a slower judge

HTTP: an OpenAI-compatible server on 127.0.0.1 that answers every request after ``--latency``
seconds (a stand-in for a served judge's time per request, which concurrency hides: what is
measured is how well the client overlaps calls, not a model), ``--pairs`` distinct (question,
answer) pairs scored once per concurrency, then scored again by a "resumed run" (a new cache
object reading the first run's ``judge_cache.jsonl``). Local: the bundled tiny Qwen2.5-VL as a
label-probability judge (``verdict: prob``) at batch sizes 1, 8 and 32. The last line printed
is JSON.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--pairs", type=int, default=128)
    args = parser.parse_args()

    from mmrft import judges
    from mmrft.data import Sample
    from mmrft.rewards import build_reward

    samples = [
        Sample(f"s{i}", [{"role": "user", "content": f"Question {i}?"}], target="x")
        for i in range(args.pairs)
    ]
    completions = [f"<answer>answer {i}</answer>" for i in range(args.pairs)]
    httpd, url = serve(args.latency)
    results: dict[str, dict] = {"http": {}, "local": {}}
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
    print(json.dumps(results))


if __name__ == "__main__":
    main()
