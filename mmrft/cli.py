"""Command line: ``mmrft train | eval | verify | list | make-tiny | report``.

Configuration errors (unknown keys, unknown plugin names, bad data lines, missing media) are
printed as one message naming the key or file, with exit status 2 and no traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mmrft.config import (
    DEFAULT_CONFIG,
    REPO_ROOT,
    config_names,
    help_table,
    load_config,
    parse_override,
)
from mmrft.data import DataError, Sample, parse_json, utf8
from mmrft.errors import ServerError
from mmrft.plugins import (
    ENVIRONMENTS,
    MODEL_FAMILIES,
    SAMPLERS,
    TASKS,
    TOOLS,
    VERIFIERS,
    PluginError,
    UnknownNameError,
    first_paragraph,
    load_plugins,
)
from mmrft.rewards.verifier import RewardError
from mmrft.rollout.preflight import preflight
from mmrft.typecheck import ConfigError, keyword_params_doc

#: Printed as one line, exit status 2. RewardError: a verifier plugin raised, returned a value
#: outside its range or NaN/inf, or overran its budget under reward.on_timeout=stop.
#: ServerError: the served engine's vLLM server failed (its URL and log's last lines follow).
USER_ERRORS = (
    ConfigError,
    DataError,
    UnknownNameError,
    PluginError,
    RewardError,
    ServerError,
    FileNotFoundError,
)


def split_config_arg(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """``mmrft train lr=1`` has no config: a first argument with '=' is an override."""
    if config is not None and "=" in config:
        return None, [config, *overrides]
    return config, list(overrides)


def report_native_crashes() -> None:
    """Have a process that dies of a native fault (SIGSEGV, SIGABRT, ...: a media decoder, a
    collective's thread, "terminate called ...") print every thread's Python stack first
    (:mod:`faulthandler`). Skipped where stderr has no file descriptor (a captured stream)."""
    import contextlib
    import faulthandler

    with contextlib.suppress(AttributeError, ValueError, OSError):
        faulthandler.enable(all_threads=True)


def cmd_train(args: argparse.Namespace, console: Console) -> int:
    if args.help_config:
        for key, type_, default, help_text in help_table():
            console.print(
                f"[bold]{key}[/bold]: {escape(f'{type_} = {default}')}\n    {escape(help_text)}",
                highlight=False,
                soft_wrap=True,
            )
        return 0
    config, overrides = split_config_arg(args.config, args.overrides)
    if config is None:  # say it before anything else: the demo's settings are not defaults
        console.print(
            f"no config given: building on {DEFAULT_CONFIG.name} (the CPU demo: its lr, warm "
            "start and sampling settings, not the --help-config defaults); name a config or a "
            "recipe for a real model",
            highlight=False,
            markup=False,
        )
    cfg = load_config(config or DEFAULT_CONFIG, overrides)
    if args.smoke:  # the smoke settings first, so that the command line's overrides still win
        from mmrft.smoke import smoke_data, smoke_overrides

        smoke, notes = smoke_overrides(cfg, config)
        for note in notes:
            console.print(f"--smoke: {note}", highlight=False, markup=False)
        # but data the command line names and this machine lacks: the bundled stand-in wins
        cfg = load_config(config or DEFAULT_CONFIG, [*smoke, *overrides, *smoke_data(cfg)])
    preflight(cfg)  # what needs no model fails here, before torch and transformers are imported
    from mmrft.runtime import distributed
    from mmrft.training.trainer import train

    report_native_crashes()
    if not args.smoke:
        train(cfg, console)
    else:  # scripted where the tiny model cannot go; then which stages ran
        from mmrft.rollout.collector import scripted
        from mmrft.smoke import smoke_script, stages_line

        with scripted(smoke_script(cfg)):
            result = train(cfg, console)
        console.print(
            stages_line(cfg, result.run_dir), highlight=False, markup=False, soft_wrap=True
        )
    distributed.teardown()
    return 0


def cmd_eval(args: argparse.Namespace, console: Console) -> int:
    # `model=PATH` is shorthand for `model.path=PATH`.
    overrides = [
        f"model.path={o.split('=', 1)[1]}" if o.startswith("model=") else o for o in args.overrides
    ]
    config, overrides = split_config_arg(args.config, overrides)
    cfg = load_config(config or DEFAULT_CONFIG, overrides)
    if not cfg.data.test and not cfg.eval.harness:
        raise ConfigError("data.test: evaluation needs a test file (or eval.harness=lmms_eval)")
    preflight(cfg, training=False)  # before torch and transformers are imported
    from mmrft.evaluation.evaluate import evaluate_config, print_table, write_eval
    from mmrft.training.resume import run_name

    result = evaluate_config(cfg, console)
    out = (
        Path(args.out)
        if args.out
        # not eval/step-N: the folder names of a training run's own evaluations
        else Path(cfg.output_dir) / run_name(cfg) / "eval" / f"of-{Path(cfg.model.path).name}"
    )
    write_eval(result, out, {"model": cfg.model.path, "data": cfg.data.test})
    evaluated = [cfg.data.test] if cfg.data.test else []
    if result.harness is not None:
        evaluated.append(f"lmms-eval {cfg.eval.harness_tasks}")
    on = " + ".join(evaluated)
    print_table(
        f"{result.task}: {cfg.model.path} on {on}",
        {"value": result.metrics},
        console,
        categories={"value": result.categories},
        primary=result.primary_metric,
    )
    console.print(f"wrote {out / 'results.json'} and {out / 'predictions.jsonl'}")
    if result.harness is not None:  # lmms-eval's own files, as its CLI's --output_path writes
        path = result.harness.write(out / "lmms_eval")
        console.print(f"wrote {path} and the samples beside it (lmms-eval's format)")
    return 0


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    """Score lines ``{"completion", "target", "meta"}``; print one JSON line per input.

    The verifier runs under ``reward.timeout_s`` (default as in training) and
    ``reward.on_timeout``, given among the parameters: over the budget every line scores the
    verifier's minimum with reason ``timeout`` (``zero``) or the command stops (``stop``).
    A verifier that raises or returns what its declaration rules out stops with one line
    naming it and the samples (exit status 2).
    """
    from mmrft.config import RewardConfig
    from mmrft.rewards.reward import build_reward

    load_plugins(args.plugin)
    spec = VERIFIERS.get(args.name)
    params = dict(parse_override(o) for o in args.params)
    budget = {
        "timeout_s": RewardConfig.timeout_s,
        "on_timeout": RewardConfig.on_timeout,
        "worker_memory_mb": RewardConfig.worker_memory_mb,
    }
    for key in [k for k in params if k.startswith("reward.")]:
        name, value = key.removeprefix("reward."), params.pop(key)
        if name == "timeout_s" and isinstance(value, (int, float)) and value >= 0:
            budget[name] = float(value)
        elif name == "on_timeout" and value in ("zero", "stop"):
            budget[name] = value
        else:
            raise ConfigError(
                f"{key}: mmrft verify takes reward.timeout_s (seconds ≥ 0) and "
                f"reward.on_timeout (zero | stop), got {value!r}"
            )
    reward = build_reward([{"name": spec.name, "params": params}], **budget)  # its worker pool
    completions, samples = [], []
    path = Path(args.file)
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        record = parse_json(utf8(raw, where), where)
        if not isinstance(record, dict) or "completion" not in record or "target" not in record:
            raise DataError(f"{where}: needs 'completion' and 'target'")
        if not isinstance(record.get("meta") or {}, dict):
            raise DataError(f"{where}: 'meta' must be a JSON object")
        if not isinstance(record.get("messages") or [], list):
            raise DataError(f"{where}: 'messages' must be a list of chat turns")
        completions.append(str(record["completion"]))
        samples.append(
            Sample(
                id=str(record.get("id", number)),
                messages=record.get("messages") or [],
                target=record["target"],
                meta=record.get("meta") or {},
            )
        )
    try:
        scores = reward.score_one(spec.name, completions, samples, context=f"in {path}")
    finally:
        reward.close()
    for sample, score in zip(samples, scores):
        if score is None:
            line = {"id": sample.id, "score": None, "reason": "not applicable", "parts": {}}
        else:
            line = {
                "id": sample.id,
                "score": score.value,
                "reason": score.reason,
                "parts": score.parts,
            }
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
    return 0


def package_version() -> str:
    """The installed distribution's version (``unknown`` when run from an uninstalled tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mmrft")
    except PackageNotFoundError:
        return "unknown"


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    if args.what is None:  # everything, one table each
        for what in (
            "tasks",
            "verifiers",
            "samplers",
            "models",
            "tools",
            "environments",
            "configs",
        ):
            cmd_list(argparse.Namespace(**{**vars(args), "what": what}), console)
        return 0
    load_plugins(args.plugin)
    if args.what == "configs":
        table = Table(title="configs (mmrft train NAME)")
        table.add_column("name")
        table.add_column("file", overflow="fold")
        for name, path in sorted(config_names().items()):
            where = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
            table.add_row(escape(name), escape(str(where)))
        console.print(table)
        return 0
    if args.what == "tools":
        table = Table(title="tools (multi-turn rollouts)")
        for column in ("name", "aliases", "timeout", "runs in", "example", "description"):
            table.add_column(column, overflow="fold")
        for name in TOOLS.names():
            spec = TOOLS.get(name)
            if spec.name == name:  # an alias is listed with its tool
                table.add_row(
                    escape(name),
                    escape(", ".join(spec.aliases)),
                    f"{spec.timeout_s:g} s",
                    "worker" if spec.isolate else "trainer",
                    "yes" if spec.example is not None else "no",
                    escape(spec.description),
                )
        console.print(table)
        return 0
    if args.what == "environments":
        table = Table(title="environments (rollout.tools.environment)")
        for column in ("name", "tools", "timeout", "runs in", "description"):
            table.add_column(column, overflow="fold")
        for name in ENVIRONMENTS.names():
            spec = ENVIRONMENTS.get(name)
            table.add_row(
                escape(name),
                escape(", ".join(spec.tools)),
                f"{spec.timeout_s:g} s",
                "worker" if spec.isolate else "trainer",
                escape(spec.description),
            )
        console.print(table)
        return 0
    if args.what == "samplers":
        import mmrft.rollout.sampling  # noqa: F401  (the built-in samplers register on import)
    registry = {
        "tasks": TASKS,
        "verifiers": VERIFIERS,
        "samplers": SAMPLERS,
        "models": MODEL_FAMILIES,
    }[args.what]
    table = Table(title=args.what)
    table.add_column("name")
    ranged = args.what == "verifiers"
    if ranged:
        table.add_column("range")
    table.add_column("parameters", overflow="fold")
    table.add_column("description", overflow="fold")
    for name in registry.names():
        obj = registry.get(name)
        fn = getattr(obj, "fn", obj)
        params = ", ".join(f"{k}: {t} = {d!r}" for k, (t, d) in keyword_params_doc(fn).items())
        description = first_paragraph(fn.__doc__)
        cells = [escape(name)]
        if ranged:  # the declared range, once (the docstrings' "Range [a, b]." is dropped)
            cells.append(f"[{obj.low:g}, {obj.high:g}]")
            description = re.sub(r"\s*Range \[[^\]]*\]\.?", "", description)
        # escaped: defaults and docstrings hold brackets ([a-z]+, [x1, y1, x2, y2]) that rich
        # would read as markup and drop
        table.add_row(*cells, escape(params), escape(description))
    console.print(table)
    return 0


def cmd_make_tiny(args: argparse.Namespace, console: Console) -> int:
    from mmrft.models.tiny.base import bench_model, build_all

    paths = [bench_model(Path(args.out), rebuild=True)] if args.bench else build_all(Path(args.out))
    for path in paths:
        console.print(f"wrote {path}")
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from mmrft.evaluation.report import report_runs

    for path in report_runs([Path(r) for r in args.runs], Path(args.out) if args.out else None):
        console.print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrft", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mmrft {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train from a config (default: configs/demo.yaml)")
    p.add_argument("config", nargs="?", default=None, help="config path or name under configs/")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. optim.lr=1e-5")
    p.add_argument(
        "--help-config",
        action="store_true",
        help="print every config key with its default and help",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="check the config on CPU in a minute: its family's tiny model, float32, small media, "
        "2 steps and a 2-sample evaluation; the config's data when present, else the task's "
        "bundled data (see mmrft/smoke.py)",
    )
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("eval", help="greedy evaluation of a checkpoint on the config's test split")
    p.add_argument("config", help="config path or name under configs/")
    p.add_argument(
        "overrides", nargs="*", help="key=value overrides; model=PATH picks the checkpoint"
    )
    p.add_argument("--out", help="output directory (default: <run dir>/eval/<model name>)")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("verify", help="score completions from a JSONL file with one verifier")
    p.add_argument("name", help="verifier name (`mmrft list verifiers`)")
    p.add_argument("file", help='JSONL lines {"completion", "target", "meta"}')
    p.add_argument(
        "params",
        nargs="*",
        help="verifier parameters as key=value; reward.timeout_s=S and reward.on_timeout="
        "zero|stop set the time budget (default 300 s, zero)",
    )
    p.add_argument(
        "--plugin", action="append", default=[], help="plugin file.py or module to import"
    )
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser(
        "list",
        help="list registered tasks, verifiers, model families, tools, environments or bundled configs",
    )
    p.add_argument(
        "what",
        nargs="?",
        choices=["tasks", "verifiers", "samplers", "models", "tools", "environments", "configs"],
        help="what to list (default: all of them)",
    )
    p.add_argument(
        "--plugin", action="append", default=[], help="plugin file.py or module to import"
    )
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("make-tiny", help="build the tiny test models into assets/models")
    p.add_argument("--out", default=str(REPO_ROOT / "assets"), help="assets directory")
    p.add_argument(
        "--bench",
        action="store_true",
        help="build only the ~41 M-parameter benchmark model (models/bench-qwen2_5_vl, not committed)",
    )
    p.set_defaults(fn=cmd_make_tiny)

    p = sub.add_parser(
        "report", help="plots and a markdown summary of runs; several runs are also overlaid"
    )
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument(
        "--out", help="where comparison.png / comparison.md go (default: current directory)"
    )
    p.set_defaults(fn=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may come after options (`mmrft eval demo --out d data.on_error=skip`)
    bucket = (
        "overrides" if hasattr(args, "overrides") else "params" if hasattr(args, "params") else None
    )
    if extra:
        if bucket is None or not all("=" in e and not e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        getattr(args, bucket).extend(extra)
    console = Console(stderr=args.command == "verify")
    try:
        return args.fn(args, console)
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return 130
    except USER_ERRORS as exc:
        Console(stderr=True).print(
            f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False, soft_wrap=True
        )  # escaped: a plugin's message or a sample id may hold [brackets]
        return 2


if __name__ == "__main__":
    sys.exit(main())
