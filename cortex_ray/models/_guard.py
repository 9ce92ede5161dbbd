"""One switch that says whether model clients may talk to a server off this machine.

Modelled on pydantic-ai's ``ALLOW_MODEL_REQUESTS``: the test suite turns it off, so a test
that would reach a hosted model by accident fails at once with an error that says how to
opt in, instead of spending money, leaking prompts or hanging on a network that is not
there. Servers on this machine stay reachable with the switch off: the packaged models
served by Ray Serve on 127.0.0.1 are what the tests are meant to use.

The switch lives in this module and is read at every request (not when a client is
built), so a client made before the switch changed obeys the current value. It is
process-wide: Ray workers start with it on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from cortex_ray._exceptions import ModelError

__all__ = [
    "check_model_request",
    "is_local_model_url",
    "model_requests_allowed",
    "override_allow_model_requests",
    "set_allow_model_requests",
]

# On by default: a deployment must reach its hosted model. Only tests turn it off.
ALLOW_MODEL_REQUESTS: bool = True

_OPT_IN_HINT = (
    "model requests to servers off this machine are blocked "
    "(cortex_ray.models.set_allow_model_requests(False), as the tests set it); "
    "a test opts in with @pytest.mark.allow_model_requests or "
    "`with cortex_ray.models.override_allow_model_requests(True):`"
)


def model_requests_allowed() -> bool:
    """Whether model clients may send requests to hosts that are not loopback."""
    return ALLOW_MODEL_REQUESTS


def set_allow_model_requests(allow: bool) -> None:
    """Turn requests to non-loopback model servers on or off for this process."""
    global ALLOW_MODEL_REQUESTS
    ALLOW_MODEL_REQUESTS = allow


@contextmanager
def override_allow_model_requests(allow: bool) -> Iterator[None]:
    """Set the switch for the duration of a ``with`` block, then restore the old value.

    Args:
        allow: the value inside the block.
    """
    previous = ALLOW_MODEL_REQUESTS
    set_allow_model_requests(allow)
    try:
        yield
    finally:
        set_allow_model_requests(previous)


def is_local_model_url(url: str) -> bool:
    """Whether ``url`` names a server on this machine.

    Local means a loopback address (127.0.0.0/8, ``::1``, an IPv4-mapped loopback), the
    name ``localhost`` (or a name under ``.localhost``, which RFC 6761 reserves for
    loopback), or no host at all. A server on a Unix socket is reached through an
    ``http_client`` whose transport has ``uds=``; its base URL then names ``localhost``.

    Args:
        url: a base URL or request URL, e.g. ``http://127.0.0.1:8000/v1``.
    """
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if not host or host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        # A name other than localhost: resolving it here would itself be network traffic,
        # and a name can point anywhere, so it counts as remote.
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_model_request(url: str, *, model: str) -> None:
    """Raise unless a request to ``url`` is allowed now; call it before sending one.

    Args:
        url: where the request would go.
        model: the model's name, for the error message.

    Raises:
        ModelError: the switch is off and ``url`` is not on this machine.
    """
    if ALLOW_MODEL_REQUESTS or is_local_model_url(url):
        return
    raise ModelError(f"{model}: request to {url} refused: {_OPT_IN_HINT}")
