"""Errors the command line prints as one line (exit status 2) whose own modules are heavy to
import: defined here, so that ``mmrft.cli`` can catch them without loading torch."""

from __future__ import annotations


class ServerError(RuntimeError):
    """The vLLM server of ``rollout.engine=vllm_server`` failed, stopped answering or answered
    garbage (the message names its URL; for a server mmrft started, also its exit code and the
    last lines of its log). Raised by :mod:`mmrft.rollout.served`."""
