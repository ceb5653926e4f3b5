"""Several training processes in one test: gloo ranks started with ``torch.multiprocessing``.

:func:`run_ranks` starts ``world`` processes (spawned: a fresh interpreter each), joins them in a
gloo process group as torchrun would (the environment variables DeepSpeed and accelerate read
included) and runs ``worker(rank, world, *args)`` in each. A worker that raises fails the test
with its traceback (the other ranks are stopped); one that returns leaves through a barrier, the
group's destruction and ``os._exit(0)``.

Why ``os._exit``: once FSDP2 / DTensor is imported, torch keeps the gloo group's threads
(``gloo_tcp_loop``, ``pt_gloo_runloop``) running after ``destroy_process_group`` (seen in
``/proc/self/task`` with torch 2.14; not so without that import), so they meet the interpreter's
shutdown. About once in two full test runs an FSDP2 + LoRA rank died with "terminate called
without an active exception" (C++'s word for a thread unwound or dropped at exit) and SIGABRT,
never when the case ran alone; skipping the interpreter's teardown, where nothing a test reads
is left to do, takes that chance away.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: Callable[..., None], *args: Any, world: int = 2) -> None:
    """Run ``worker(rank, world, *args)`` on ``world`` gloo ranks and wait for all of them;
    ``worker`` must be a module-level function (it is pickled by name)."""
    mp.start_processes(
        _rank, args=(worker, world, free_port(), args), nprocs=world, start_method="spawn"
    )


def _rank(rank: int, worker: Callable[..., None], world: int, port: int, args: tuple) -> None:
    faulthandler.enable(all_threads=True)  # a rank's abort prints where every thread was
    os.environ.update(  # what torchrun sets (DeepSpeed reads LOCAL_RANK)
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    # a collective that has no partner (a hang) fails within five minutes instead of hanging
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300)
    )
    worker(rank, world, *args)
    dist.barrier()  # every rank is past its last collective
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
