"""What an MCP server's configuration may hold, decided before it is registered: a stdio
server only for the local operator; an HTTP server's URL through the URL guard; secrets
only by name (see ``_connectors``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError
from cortex_ray.mcp import McpServerConfig, McpTransport, check_mcp_url
from cortex_ray.observability import scrub_text

__all__ = [
    "STDIO_REFUSED",
    "UrlGuard",
    "basic_url_guard",
    "check_config",
    "settings_url_guard",
]

UrlGuard = Callable[[str], None]
"""Refuses a server URL (``InvalidRequestError`` with the reason) or lets it pass."""

_SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")
STDIO_REFUSED = (
    "a stdio MCP server is a command run on this machine: only the local operator (the "
    "CLI or Python) may register one, never an HTTP caller"
)


def basic_url_guard(url: str) -> None:
    """The guard used when the runtime is given none: an ``http``/``https`` URL with a host
    and no user or password in it (credentials are secrets, named in the config)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequestError(f"an MCP server URL is http(s)://host/...: {url[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise InvalidRequestError(
            "an MCP server URL holds no credentials: name a secret in headers/bearer_secret"
        )


def settings_url_guard(allowed_hosts: Sequence[str]) -> UrlGuard:
    """The runtime's guard: ``check_mcp_url`` (http(s) only; link-local and cloud metadata
    addresses refused, every resolved address checked) with the allowed hosts of
    ``connectors.mcp_allowed_hosts``, after :func:`basic_url_guard`."""
    allowed = tuple(allowed_hosts)

    def guard(url: str) -> None:
        basic_url_guard(url)
        check_mcp_url(url, allowed)

    return guard


def check_config(config: McpServerConfig, local_operator: bool, url_guard: UrlGuard) -> None:
    """Refuse a configuration a caller may not register (a stdio server but for the local
    operator: ``AccessDeniedError``) or that cannot work or leaks a credential
    (``InvalidRequestError``)."""
    if config.transport is McpTransport.STDIO:
        if not local_operator:
            raise AccessDeniedError(STDIO_REFUSED)
        if not config.command:
            raise InvalidRequestError("a stdio MCP server needs a command")
        if config.url is not None:
            raise InvalidRequestError("a stdio MCP server has no url")
    else:
        if not config.url:
            raise InvalidRequestError("an HTTP MCP server needs a url")
        if config.command is not None or config.args or config.env or config.cwd:
            raise InvalidRequestError("an HTTP MCP server has no command, args, env or cwd")
        url_guard(config.url)
    names = [*config.headers.values(), *config.env.values()]
    if config.bearer_secret is not None:
        names.append(config.bearer_secret)
    for name in names:
        if not _SECRET_NAME.fullmatch(name) or scrub_text(name) != name:
            raise InvalidRequestError(
                f"{name[:40]!r} is not a secret's name: headers, env and bearer_secret "
                "name secrets of the secret store, never hold their values"
            )
    for text in (config.url or "", config.command or "", *config.args):
        if scrub_text(text) != text:
            raise InvalidRequestError(
                "the configuration holds a credential: keep secrets in the secret store"
            )
