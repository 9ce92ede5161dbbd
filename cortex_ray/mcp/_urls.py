"""The SSRF guard for HTTP MCP servers: which URLs a connector may reach.

A registered URL is checked when it is registered and again when a session opens (a name may
resolve elsewhere later): only ``http``/``https``; never a link-local address (``169.254/16``,
``fe80::/10``) nor a cloud metadata endpoint; and, where the operator set an allow-list
(``connectors.mcp_allowed_hosts``), only its hosts. Every address the name resolves to is
checked, so a name cannot hide a metadata address behind a harmless one."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from cortex_ray._exceptions import InvalidRequestError

__all__ = ["METADATA_HOSTS", "check_mcp_url", "resolve_host"]

METADATA_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
"""Names of cloud metadata services (refused whatever they resolve to)."""

_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
    )
)

Resolver = Callable[[str, int], Sequence[str]]


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (``socket.getaddrinfo``; blocking)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _host_allowed(host: str, allowed_hosts: Sequence[str]) -> bool:
    if not allowed_hosts:
        return True
    for pattern in allowed_hosts:
        pattern = pattern.strip().lower().rstrip(".")
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        elif host == pattern:
            return True
    return False


def _refused_address(text: str) -> str | None:
    address = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in _METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified or address.is_multicast:
        return "not a host address"
    return None


def check_mcp_url(
    url: str, allowed_hosts: Sequence[str] = (), *, resolve: Resolver = resolve_host
) -> str:
    """Check that an HTTP MCP server's URL may be reached; return its host (lower case).

    Raises ``InvalidRequestError`` naming the reason: not http(s), no host, a host not on a
    non-empty ``allowed_hosts`` (exact names or ``*.suffix``; an empty list allows any host
    not refused below), a cloud metadata name, a name that does not resolve, or any resolved
    address that is link-local (``169.254/16``, ``fe80::/10``) or a metadata address."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidRequestError(f"MCP server URL {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidRequestError(
            f"MCP server URL {url!r}: only http and https are allowed, not {parts.scheme!r}"
        )
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise InvalidRequestError(f"MCP server URL {url!r} names no host")
    if host in METADATA_HOSTS:
        raise InvalidRequestError(f"MCP server URL {url!r}: {host} is a cloud metadata service")
    if not _host_allowed(host, allowed_hosts):
        raise InvalidRequestError(
            f"MCP server URL {url!r}: host {host} is not in connectors.mcp_allowed_hosts "
            f"({', '.join(allowed_hosts)})"
        )
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = list(resolve(host, port or (443 if parts.scheme == "https" else 80)))
        except OSError as exc:
            raise InvalidRequestError(
                f"MCP server URL {url!r}: host {host} does not resolve ({exc})"
            ) from None
        if not addresses:
            raise InvalidRequestError(
                f"MCP server URL {url!r}: host {host} has no address"
            ) from None
    for address in addresses:
        why = _refused_address(address)
        if why is not None:
            raise InvalidRequestError(
                f"MCP server URL {url!r}: host {host} resolves to {address}, {why} (refused)"
            )
    return host
