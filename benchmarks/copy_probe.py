"""Can a model learn to copy the time a question states into its ``video_frames`` call?

    python benchmarks/copy_probe.py --model runs/reader/call/checkpoints/step-000000
    python benchmarks/copy_probe.py --model M --train timing --steps 3000 --save runs/copy

A text-only probe of one skill ``tools/zoom_video`` needs: the prompt is the recipe's own (the
tools' system text, the task's template and options) with the clip left out, the target the
scripted call on the stated time, ``{"start_s": t}``, trained by next-token loss on the call's
tokens only (plain AdamW, gradient norm clipped at 1). Times are drawn uniformly from the
benchmark's range (1.2-8.8 s, to 0.1 s) at ``--seed``. ``--train zoom_video`` asks the
benchmark's own question; ``--train timing`` the other wordings of scripts/make_reader.py's
timing phase (the copy must then carry over to a question it never saw). Every ``--every``
steps: greedy calls on the 50 test clips' questions (the benchmark's own wording), printed as
one JSON line: the loss, the share of calls at the stated time exactly and within 0.25 s, and
how many distinct start times the calls used (1: a constant, no copying).

Why: in the tool recipe neither RL nor 900 supervised steps taught the tiny model to write the
stated time into the call (docs/tools.md). The probe isolates that skill from reading and from
the loop, and costs about 1.2 s a step of 32 on one 2-core-machine thread (the prompt is ~1200
tokens of the byte-level tokenizer, most of them the tool description).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from make_reader import TIMING_QUESTIONS  # noqa: E402

from mmrft.config import load_config  # noqa: E402
from mmrft.data import Sample  # noqa: E402
from mmrft.evaluation.runlog import cpu_model  # noqa: E402
from mmrft.rollout.preflight import preflight  # noqa: E402
from mmrft.rollout.setup import read_data  # noqa: E402
from mmrft.rollout.tool import tool_schemas  # noqa: E402
from mmrft.rollout.tool_loop import demonstration_call, with_tool_descriptions  # noqa: E402

QUESTION = "What colour is the dot that flashes briefly at about {time:.1f} s?"
TIMES = (1.2, 8.8)  # s: where zoom_video's flashes start (ZOOM_VIDEO_EDGE from 8-10 s clips)


def text_only(conversation: list[dict]) -> list[dict]:
    """``conversation`` without its media parts."""
    out = []
    for message in conversation:
        content = message["content"]
        if isinstance(content, list):
            content = [part for part in content if part.get("type") == "text"]
        out.append({**message, "content": content})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", choices=["zoom_video", "timing"], default="zoom_video")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", default=None, help="save the model here every 500 steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = load_config("tools/zoom_video", [f"model.path={args.model}"])
    task, family = preflight(cfg)
    _, test = read_data(cfg, task, family)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(args.model)
    tokenizer = processor.tokenizer
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    schemas = tool_schemas(["video_frames"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def pair(sample: Sample, question: str) -> tuple[list[int], list[int]]:
        def asked(part: dict) -> dict:
            return {**part, "text": question} if part.get("type") == "text" else part

        messages = [{**m, "content": [asked(p) for p in m["content"]]} for m in sample.messages]
        conversation = task.prompt(Sample(sample.id, messages, sample.target, sample.meta), family)
        conversation = text_only(with_tool_descriptions(conversation, sample, schemas))
        text = processor.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        call = demonstration_call(sample, family, ["video_frames"])
        prompt = tokenizer.encode(text, add_special_tokens=False)
        return prompt, tokenizer.encode(call, add_special_tokens=False) + [end]

    def drawn() -> tuple[list[int], list[int]]:
        t = round(rng.uniform(*TIMES), 1)
        template = rng.choice(TIMING_QUESTIONS) if args.train == "timing" else QUESTION
        base = test[0]
        meta = {**base.meta, "zoom_span": [t, round(t + 1.0, 1)], "asked_time": t}
        return pair(Sample(base.id, base.messages, base.target, meta), template.format(time=t))

    def evaluate() -> dict:
        model.eval()
        starts = []
        with torch.no_grad():
            for s in test:
                prompt, _ = pair(s, QUESTION.format(time=s.meta["asked_time"]))
                ids = torch.tensor([prompt])
                out = model.generate(input_ids=ids, max_new_tokens=48, do_sample=False)
                text = tokenizer.decode(out[0, len(prompt) :])
                try:
                    start = float(text.split('"start_s": ')[1].split("}")[0].split(",")[0])
                except (IndexError, ValueError):
                    start = None
                starts.append((start, float(s.meta["asked_time"])))
        model.train()
        valid = [(a, t) for a, t in starts if a is not None]
        return {
            "exact": round(sum(abs(a - t) < 0.05 for a, t in valid) / len(starts), 3),
            "within_0.25": round(sum(abs(a - t) <= 0.25 for a, t in valid) / len(starts), 3),
            "valid": round(len(valid) / len(starts), 3),
            "distinct": len({a for a, _ in valid}),
        }

    print(json.dumps({"command": "python benchmarks/copy_probe.py " + " ".join(sys.argv[1:]),
                      "cpu": cpu_model(), "step": 0, **evaluate()}), flush=True)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id or 0
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = [drawn() for _ in range(args.batch_size)]
        width = max(len(p) + len(c) for p, c in batch)
        ids = torch.full((len(batch), width), pad)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (prompt, call) in enumerate(batch):
            row = prompt + call
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            labels[i, len(prompt) : len(row)] = torch.tensor(call)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.every == 0 or step == args.steps:
            seconds = round(time.perf_counter() - t0)
            print(json.dumps({"step": step, "loss": round(loss.item(), 4), **evaluate(),
                              "seconds": seconds}), flush=True)  # fmt: skip
        if args.save and (step % 500 == 0 or step == args.steps):
            folder = Path(args.save) / f"step-{step:06d}"
            model.save_pretrained(folder)
            processor.save_pretrained(folder)


if __name__ == "__main__":
    main()
