"""Which Ray a job's driver runs on: the one every job entry point (``python -m jobs.*``)
connects through, so that they all join the same way."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from actors import local_ray_address
from cortex_ray import reclaim_signals

__all__ = ["join_or_start_ray"]


def join_or_start_ray(address: str | None, data_dir: Path, *, num_cpus: int | None = None) -> bool:
    """Connect this driver to Ray unless it already is; ``True`` when this call did (the
    caller then shuts it down).

    It joins ``address`` (``--address``), else ``RAY_ADDRESS`` (what ``ray job submit`` sets
    for its driver), else the local stack's Ray announced in ``data_dir`` (the demo,
    ``python -m serve``) if one runs on this machine, so the job's tasks and actors show in
    that Ray's dashboard beside the stack's; with none of those it starts a Ray of its own
    with ``num_cpus``. A joined Ray is named on stderr.

    The stack's Ray was started by ``ray.init()``, so it has token authentication on (Ray
    2.60's default, docs/actors.md), and Ray sends this user's token only when it found the
    cluster itself (``address="auto"``), never to an address it is given: joining the
    announced Ray enables the token mode as ``"auto"`` would (when a token is available and
    ``RAY_AUTH_MODE`` says nothing), or a shell without ``RAY_AUTH_MODE=token`` is refused.
    """
    import ray

    if ray.is_initialized():
        return False
    joined = address or os.environ.get("RAY_ADDRESS")
    if not joined and (joined := local_ray_address(data_dir)):
        _token_auth_as_auto()
    if joined:
        sys.stderr.write(f"==> joining the Ray at {joined}\n")
        ray.init(address=joined, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, log_to_driver=False)
    reclaim_signals()  # ray.init replaced SIGTERM's handler
    return True


def _token_auth_as_auto() -> None:
    try:  # Ray's own rule for a cluster it found: no public API names it
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication: nothing to enable
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
