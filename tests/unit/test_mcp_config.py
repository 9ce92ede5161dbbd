"""What an MCP server's configuration may hold before it is registered: a stdio server only
for the local operator; an HTTP server's URL through the guard; secrets by name only, and
no credential in the URL, the command or its arguments."""

from __future__ import annotations

from typing import Any

import pytest

from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError
from cortex_ray.mcp import McpServerConfig, McpTransport
from cortex_ray.runtime import basic_url_guard
from cortex_ray.runtime._mcp_config import check_config

STDIO = McpServerConfig(transport=McpTransport.STDIO, command="mcp-server-time")


def _http(url: str = "https://mcp.example.com/mcp", **more: Any) -> McpServerConfig:
    return McpServerConfig(transport=McpTransport.HTTP, url=url, **more)


def test_stdio_is_the_local_operators_only() -> None:
    with pytest.raises(AccessDeniedError, match="only the local operator"):
        check_config(STDIO, False, basic_url_guard)
    check_config(STDIO, True, basic_url_guard)


def test_the_url_guard_decides_an_http_server() -> None:
    seen: list[str] = []

    def guard(url: str) -> None:
        seen.append(url)
        if "internal" in url:
            raise InvalidRequestError("not an allowed host")

    check_config(_http(), False, guard)
    with pytest.raises(InvalidRequestError, match="not an allowed host"):
        check_config(_http("http://internal.local/mcp"), False, guard)
    assert seen == ["https://mcp.example.com/mcp", "http://internal.local/mcp"]


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (_http("ftp://mcp.example.com/"), "http(s)://host"),
        (_http("https://me:pw@mcp.example.com/"), "holds no credentials"),
        (_http(headers={"X-Api-Key": "sk live abc"}), "is not a secret's name"),
        (_http(bearer_secret="ghp_abcdefghijklmnopqrstuvwxyz0123456789x"), "not a secret's name"),
        (_http("https://mcp.example.com/?password=hunter2"), "holds a credential"),
        (
            McpServerConfig(
                transport=McpTransport.STDIO,
                command="mcp-server-git",
                args=["--token=ghp_abcdefghijklmnopqrstuvwxyz0123456789"],
            ),
            "holds a credential",
        ),
        (McpServerConfig(transport=McpTransport.STDIO), "needs a command"),
        (McpServerConfig(transport=McpTransport.STDIO, command="x", url="https://a/"), "no url"),
        (McpServerConfig(transport=McpTransport.HTTP), "needs a url"),
        (_http(command="sh"), "has no command"),
    ],
)
def test_what_cannot_work_or_leaks_a_credential_is_refused(
    config: McpServerConfig, why: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_config(config, True, basic_url_guard)
    assert why in str(caught.value)
