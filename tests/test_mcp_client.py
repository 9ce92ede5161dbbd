"""The MCP client (``cortex_ray.mcp.SdkMcpClient``) against real servers, through the official
SDK on both ends and no mock of it: the PyPI servers mcp-server-time and mcp-server-git
(stdio, the current revision), a handshake-only stdio server (tests/mcp_servers/
stdio_server.py) and a streamable-HTTP server behind a bearer token that the tests start
under uvicorn (tests/mcp_servers/http_server.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from mcp_servers import SERVERS, HttpServer, free_port, wait_for

from cortex_ray import ConnectorUnavailableError
from cortex_ray._types import CapabilityTier
from cortex_ray.mcp import (
    McpCredentials,
    McpElicitation,
    McpElicitationAnswer,
    McpProgress,
    McpServerConfig,
    McpTransport,
    SdkMcpClient,
)
from cortex_ray.settings import ConnectorOptions

BIN = Path(sys.executable).parent
TOKEN = "test-token-5b1e"
NONE = McpCredentials()
MODERN = "2026-07-28"


def _alive(pid: int) -> bool:
    """The process exists (a zombie counts: it is not reaped)."""
    return Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = HttpServer(free_port(), tmp_path_factory.mktemp("mcp-http"), TOKEN)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def client() -> AsyncIterator[SdkMcpClient]:
    mcp = SdkMcpClient(ConnectorOptions(mcp_reconnect_backoff_s=0.2))
    yield mcp
    await mcp.aclose()


BEARER = McpCredentials(headers={"Authorization": f"Bearer {TOKEN}"})


def _stdio(state: Path | None = None, **kwargs: object) -> McpServerConfig:
    args = [str(SERVERS / "stdio_server.py")] + ([str(state)] if state else [])
    return McpServerConfig(
        transport=McpTransport.STDIO, command=sys.executable, args=args, **kwargs
    )  # type: ignore[arg-type]


TIME = McpServerConfig(transport=McpTransport.STDIO, command=str(BIN / "mcp-server-time"))


# --- PyPI servers ------------------------------------------------------------------------


async def test_the_time_server_tells_the_real_time(client: SdkMcpClient) -> None:
    tools = {t.name: t for t in await client.list_tools("acme/time", TIME, NONE)}
    assert {"get_current_time", "convert_time"} <= set(tools)
    clock = tools["get_current_time"]
    assert clock.annotations.read_only_hint is True
    assert clock.default_tier() is CapabilityTier.READ
    assert clock.input_schema["required"] == ["timezone"]
    assert clock.output_schema is not None
    assert client.protocol_version("acme/time") == MODERN  # mcp 2.3 servers speak it

    result = await client.call_tool(
        "acme/time", TIME, NONE, "get_current_time", {"timezone": "UTC"}, timeout_s=30
    )
    assert not result.is_error
    assert result.structured is not None
    told = datetime.fromisoformat(result.structured["datetime"])
    assert abs((datetime.now(UTC) - told).total_seconds()) < 120
    assert result.content[0].kind == "text"
    assert result.structured["datetime"] in (result.content[0].text or "")


async def test_the_time_server_over_the_initialize_handshake(client: SdkMcpClient) -> None:
    legacy = TIME.model_copy(update={"protocol": "legacy"})
    result = await client.call_tool(
        "acme/time-legacy", legacy, NONE, "convert_time",
        {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        timeout_s=30,
    )  # fmt: skip
    assert client.protocol_version("acme/time-legacy") == "2025-11-25"
    assert not result.is_error
    assert result.structured is not None
    assert result.structured["target"]["datetime"].endswith("T21:00:00+09:00")


@pytest.fixture
def git_repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository with one commit and a modified file; its HEAD."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=Test", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "notes.txt").write_text("hello\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the commit the test made"], check=True)
    (repo / "notes.txt").write_text("hello again\n")
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return repo, head


async def test_the_git_server_reads_a_real_repository(
    client: SdkMcpClient, git_repo: tuple[Path, str], tmp_path: Path
) -> None:
    repo, head = git_repo
    config = McpServerConfig(
        transport=McpTransport.STDIO,
        command=str(BIN / "mcp-server-git"),
        args=["--repository", str(repo)],
    )
    tools = {t.name: t for t in await client.list_tools("acme/git", config, NONE)}
    assert tools["git_log"].default_tier() is CapabilityTier.READ
    assert tools["git_commit"].default_tier() is CapabilityTier.WRITE  # not read-only

    status = await client.call_tool(
        "acme/git", config, NONE, "git_status", {"repo_path": str(repo)}, timeout_s=30
    )
    assert "modified:   notes.txt" in (status.content[0].text or "")
    log = await client.call_tool(
        "acme/git", config, NONE, "git_log", {"repo_path": str(repo)}, timeout_s=30
    )
    text = log.content[0].text or ""
    assert head in text
    assert "the commit the test made" in text

    outside = await client.call_tool(
        "acme/git", config, NONE, "git_log", {"repo_path": str(tmp_path)}, timeout_s=30
    )
    assert outside.is_error  # the server's own refusal is a failed result, not an exception


# --- a handshake-only stdio server -------------------------------------------------------


async def test_a_handshake_only_server_is_reached_through_the_fallback(
    client: SdkMcpClient,
) -> None:
    config = _stdio()
    names = [t.name for t in await client.list_tools("acme/old", config, NONE)]
    assert names == ["echo", "grow", "garbage", "ask", "count", "die"]
    version = client.protocol_version("acme/old")
    assert version is not None and version < "2026", version
    result = await client.call_tool("acme/old", config, NONE, "echo", {"text": "hi"}, timeout_s=10)
    assert [c.text for c in result.content] == ["hi"]


async def test_a_changed_tool_list_is_announced_and_listed(tmp_path: Path) -> None:
    """The hook lists the tools again on the very session that announced the change (what a
    pinning layer does): the announcement must not wait on it."""
    config = _stdio()
    relisted: list[list[str]] = []

    async def on_changed(key: str) -> None:
        tools = await client.list_tools(key, config, NONE)
        relisted.append([t.name for t in tools])

    client = SdkMcpClient(ConnectorOptions(mcp_call_timeout_s=5), on_tools_changed=on_changed)
    try:
        before = [t.name for t in await client.list_tools("acme/grow", config, NONE)]
        await client.call_tool("acme/grow", config, NONE, "grow", {}, timeout_s=10)
        for _ in range(200):
            if relisted:
                break
            await asyncio.sleep(0.05)
        assert relisted == [[*before, "grown_1"]]
    finally:
        await client.aclose()


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_current_server_announces_its_changes_in_either_era(protocol: str) -> None:
    """On 2026-07-28 a change arrives on the ``subscriptions/listen`` stream the client opens;
    in the handshake era as ``notifications/tools/list_changed``."""
    changed: list[str] = []

    async def on_changed(key: str) -> None:
        changed.append(key)

    client = SdkMcpClient(on_tools_changed=on_changed)
    config = McpServerConfig(
        transport=McpTransport.STDIO,
        command=sys.executable,
        args=[str(SERVERS / "modern_server.py")],
        protocol=protocol,  # type: ignore[arg-type]
    )
    try:
        before = [t.name for t in await client.list_tools("acme/modern", config, NONE)]
        assert before == ["grow"]
        version = client.protocol_version("acme/modern") or ""
        assert (version == MODERN) is (protocol == "auto")
        await client.call_tool("acme/modern", config, NONE, "grow", {}, timeout_s=10)
        for _ in range(100):
            if changed:
                break
            await asyncio.sleep(0.05)
        assert changed[:1] == ["acme/modern"]
        after = [t.name for t in await client.list_tools("acme/modern", config, NONE)]
        assert after == ["grow", "grown_1"]
    finally:
        await client.aclose()


async def test_concurrent_calls_share_one_session(client: SdkMcpClient, tmp_path: Path) -> None:
    config = _stdio(tmp_path)
    texts = [f"call {i}" for i in range(12)]
    results = await asyncio.gather(
        *(
            client.call_tool("acme/shared", config, NONE, "echo", {"text": t}, timeout_s=20)
            for t in texts
        )
    )
    assert [r.content[0].text for r in results] == texts
    assert _stdio_children() == [int((tmp_path / "pid").read_text())]  # one process, one session


def _stdio_children() -> list[int]:
    """The pids of this process's children running the stdio test server."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"stdio_server.py" in cmdline:
                pids.append(int(pid))
    return sorted(pids)


async def test_aclose_stops_the_stdio_servers(tmp_path: Path) -> None:
    client = SdkMcpClient()
    config = _stdio(tmp_path)
    await client.call_tool("acme/child", config, NONE, "echo", {"text": "x"}, timeout_s=10)
    pid = int((tmp_path / "pid").read_text())
    assert _alive(pid)
    await client.aclose()
    assert not _alive(pid), "the stdio server outlived aclose() (or is an unreaped zombie)"
    with pytest.raises(ConnectorUnavailableError, match="closed"):
        await client.list_tools("acme/child", config, NONE)


async def test_a_stdio_server_that_dies_mid_call_is_restarted_by_the_next_call(
    client: SdkMcpClient, tmp_path: Path
) -> None:
    config = _stdio(tmp_path)
    await client.call_tool("acme/dies", config, NONE, "echo", {"text": "x"}, timeout_s=10)
    first = int((tmp_path / "pid").read_text())
    with pytest.raises(ConnectorUnavailableError, match="closed the connection"):
        await client.call_tool("acme/dies", config, NONE, "die", {}, timeout_s=10)
    again = await client.call_tool("acme/dies", config, NONE, "echo", {"text": "y"}, timeout_s=10)
    assert again.content[0].text == "y"
    assert int((tmp_path / "pid").read_text()) != first


async def test_an_answer_that_is_not_mcp_is_a_clear_error(client: SdkMcpClient) -> None:
    config = _stdio()
    with pytest.raises(ConnectorUnavailableError, match="not valid MCP") as caught:
        await client.call_tool("acme/garbage", config, NONE, "garbage", {}, timeout_s=10)
    assert "not of type 'integer'" in str(caught.value)
    ok = await client.call_tool("acme/garbage", config, NONE, "echo", {"text": "z"}, timeout_s=10)
    assert ok.content[0].text == "z"


async def test_elicitation_over_the_handshake_reaches_the_call(client: SdkMcpClient) -> None:
    asked: list[McpElicitation] = []

    async def answer(request: McpElicitation) -> McpElicitationAnswer:
        asked.append(request)
        return McpElicitationAnswer(action="accept", content={"colour": "teal"})

    config = _stdio()
    result = await client.call_tool(
        "acme/ask", config, NONE, "ask", {}, timeout_s=10, on_elicit=answer
    )
    assert result.content[0].text == "accept: teal"
    assert [a.message for a in asked] == ["Which colour?"]
    assert asked[0].requested_schema["properties"] == {"colour": {"type": "string"}}
    declined = await client.call_tool("acme/ask", config, NONE, "ask", {}, timeout_s=10)
    assert declined.content[0].text == "decline: None"  # no hook: declined, never hangs


class AskAPersonLater(Exception):
    pass


async def _ask_later(request: McpElicitation) -> McpElicitationAnswer:
    raise AskAPersonLater(request.message)


async def test_a_hook_that_raises_ends_the_call_with_its_error(client: SdkMcpClient) -> None:
    config = _stdio()
    with pytest.raises(AskAPersonLater, match="Which colour"):
        await client.call_tool(
            "acme/later", config, NONE, "ask", {}, timeout_s=10, on_elicit=_ask_later
        )
    ok = await client.call_tool("acme/later", config, NONE, "echo", {"text": "on"}, timeout_s=10)
    assert ok.content[0].text == "on"  # the session is untouched


async def test_a_command_that_does_not_exist(client: SdkMcpClient) -> None:
    config = McpServerConfig(transport=McpTransport.STDIO, command="/nonexistent/mcp-server")
    with pytest.raises(ConnectorUnavailableError, match="cannot start the command"):
        await client.list_tools("acme/none", config, NONE)


async def test_a_server_that_never_answers_the_handshake_is_given_up_and_stopped(
    tmp_path: Path,
) -> None:
    client = SdkMcpClient(ConnectorOptions(mcp_connect_timeout_s=1))
    script = tmp_path / "mute.py"
    script.write_text(
        "import os, sys, time\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    config = McpServerConfig(
        transport=McpTransport.STDIO, command=sys.executable, args=[str(script)]
    )
    try:
        with pytest.raises(ConnectorUnavailableError, match="no session within 1 s"):
            await client.list_tools("acme/mute", config, NONE)
        pid = int((tmp_path / "pid").read_text())
        await asyncio.to_thread(wait_for, lambda: not _alive(pid), "the mute server to stop")
    finally:
        await client.aclose()


async def test_the_backoff_doubles_with_each_failure_up_to_its_cap() -> None:
    client = SdkMcpClient(
        ConnectorOptions(mcp_reconnect_backoff_s=1.0, mcp_reconnect_max_backoff_s=1.5)
    )
    nowhere = McpServerConfig(transport=McpTransport.HTTP, url=f"http://127.0.0.1:{free_port()}/")

    async def next_attempt_in() -> float:
        with pytest.raises(ConnectorUnavailableError, match="next attempt") as caught:
            await client.list_tools("acme/down", nowhere, NONE)
        return float(str(caught.value).rsplit(" in ", 1)[1].removesuffix(" s"))

    try:
        for expected in (1.0, 1.5, 1.5):  # 1 s, then doubled but capped at 1.5 s
            with pytest.raises(ConnectorUnavailableError, match="cannot connect"):
                await client.list_tools("acme/down", nowhere, NONE)
            wait = await next_attempt_in()
            assert expected - 0.5 < wait <= expected
            await asyncio.sleep(wait + 0.05)
    finally:
        await client.aclose()


# --- a streamable-HTTP server with a bearer token ----------------------------------------


async def test_http_lists_every_page_with_schemas_and_hints(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    tools = await client.list_tools("acme/http", http_server.config(), BEARER)
    names = [t.name for t in tools]
    assert len(names) == 13 > 4  # the server sends 4 a page: all pages were followed
    assert len(set(names)) == 13
    assert {"weather", "fail", "hang", "die", "filler_5", "whoami"} <= set(names)
    weather = next(t for t in tools if t.name == "weather")
    assert weather.output_schema is not None
    assert weather.output_schema["properties"]["celsius"]["type"] == "number"
    assert weather.default_tier() is CapabilityTier.READ
    assert next(t for t in tools if t.name == "fail").default_tier() is CapabilityTier.WRITE
    assert client.protocol_version("acme/http") == MODERN


async def test_http_with_the_wrong_token_is_refused_clearly(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    wrong = McpCredentials(headers={"Authorization": "Bearer not-the-token"})
    with pytest.raises(ConnectorUnavailableError, match=r"refused the credentials \(HTTP 401\)"):
        await client.list_tools("acme/wrong", http_server.config(), wrong)
    # within the backoff the next call fails at once, saying when it will try again
    with pytest.raises(ConnectorUnavailableError, match="next attempt to connect is in"):
        await client.list_tools("acme/wrong", http_server.config(), wrong)
    assert "HTTP 401" in (await client.health("acme/wrong", http_server.config(), wrong) or "")
    # the right secret is tried at once, backoff or not
    assert len(await client.list_tools("acme/wrong", http_server.config(), BEARER)) == 13


async def test_http_structured_content_and_is_error(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    config = http_server.config()
    weather = await client.call_tool(
        "acme/http", config, BEARER, "weather", {"city": "Oslo"}, timeout_s=20
    )
    assert weather.structured == {"city": "Oslo", "celsius": 21.5}
    assert not weather.is_error
    failed = await client.call_tool(
        "acme/http", config, BEARER, "fail", {"reason": "on purpose"}, timeout_s=20
    )
    assert failed.is_error
    assert "failed on purpose: on purpose" in (failed.content[0].text or "")


async def test_http_progress_reaches_the_hook(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    seen: list[McpProgress] = []

    async def on_progress(progress: McpProgress) -> None:
        seen.append(progress)

    result = await client.call_tool(
        "acme/http", http_server.config(), BEARER, "slow_count", {"steps": 3},
        timeout_s=20, on_progress=on_progress,
    )  # fmt: skip
    assert result.content[0].text == "counted to 3"
    assert [(p.progress, p.total, p.message) for p in seen] == [
        (1, 3, "step 1"),
        (2, 3, "step 2"),
        (3, 3, "step 3"),
    ]


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_http_elicitation_in_both_eras(
    client: SdkMcpClient, http_server: HttpServer, protocol: str
) -> None:
    config = http_server.config().model_copy(update={"protocol": protocol})
    key = f"acme/elicit-{protocol}"

    async def approve(request: McpElicitation) -> McpElicitationAnswer:
        assert request.message == "Delete report.txt?"
        assert "approve" in request.requested_schema["properties"]
        return McpElicitationAnswer(action="accept", content={"approve": True, "note": "ok"})

    async def refuse(request: McpElicitation) -> McpElicitationAnswer:
        return McpElicitationAnswer(action="decline")

    done, no = await asyncio.gather(
        client.call_tool(
            key, config, BEARER, "delete_item", {"item": "report.txt"},
            timeout_s=20, on_elicit=approve,
        ),
        client.call_tool(
            key, config, BEARER, "delete_item", {"item": "report.txt"},
            timeout_s=20, on_elicit=refuse,
        ),
    )  # fmt: skip
    assert done.content[0].text == "deleted report.txt: approve=True note=ok"
    assert no.content[0].text == "not deleted (decline)"  # each call heard its own hook
    version = client.protocol_version(key)
    assert (version == MODERN) is (protocol == "auto")
    unasked = await client.call_tool(
        key, config, BEARER, "delete_item", {"item": "report.txt"}, timeout_s=20
    )
    assert unasked.content[0].text == "not deleted (decline)"
    with pytest.raises(AskAPersonLater, match=r"Delete report\.txt"):
        await client.call_tool(
            key, config, BEARER, "delete_item", {"item": "report.txt"},
            timeout_s=20, on_elicit=_ask_later,
        )  # fmt: skip


async def test_http_a_hanging_call_times_out_and_is_cancelled_on_the_server(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    marker = http_server.state / "cancelled"
    marker.unlink(missing_ok=True)
    config = http_server.config()
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        await client.call_tool(
            "acme/http", config, BEARER, "hang", {"label": "hang-1"}, timeout_s=1
        )
    await asyncio.to_thread(wait_for, marker.exists, "the server to see the cancel")
    assert marker.read_text() == "hang-1"
    after = await client.call_tool("acme/http", config, BEARER, "whoami", {}, timeout_s=20)
    assert after.content[0].text == MODERN  # the session outlived the timeout


async def test_http_health(client: SdkMcpClient, http_server: HttpServer) -> None:
    assert await client.health("acme/http", http_server.config(), BEARER) is None
    legacy = http_server.config().model_copy(update={"protocol": "legacy"})
    assert await client.health("acme/http-legacy", legacy, BEARER) is None  # a ping
    nowhere = McpServerConfig(transport=McpTransport.HTTP, url=f"http://127.0.0.1:{free_port()}/")
    why = await client.health("acme/nowhere", nowhere, BEARER)
    assert why is not None and "cannot connect" in why


async def test_http_refused_urls_are_never_connected(client: SdkMcpClient) -> None:
    metadata = McpServerConfig(transport=McpTransport.HTTP, url="http://169.254.169.254/mcp")
    with pytest.raises(ConnectorUnavailableError, match="cloud metadata address"):
        await client.list_tools("acme/imds", metadata, NONE)
    guarded = SdkMcpClient(ConnectorOptions(mcp_allowed_hosts=["*.example.org"]))
    try:
        local = McpServerConfig(transport=McpTransport.HTTP, url="http://127.0.0.1:9/mcp")
        with pytest.raises(
            ConnectorUnavailableError, match=r"not in connectors\.mcp_allowed_hosts"
        ):
            await guarded.list_tools("acme/local", local, NONE)
    finally:
        await guarded.aclose()


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_http_a_server_that_dies_mid_call_then_comes_back(
    client: SdkMcpClient, http_server: HttpServer, protocol: str
) -> None:
    config = http_server.config().model_copy(update={"protocol": protocol})
    key = f"acme/phoenix-{protocol}"
    await client.call_tool(key, config, BEARER, "whoami", {}, timeout_s=20)
    try:
        with pytest.raises(ConnectorUnavailableError, match="the next call reconnects"):
            await client.call_tool(key, config, BEARER, "die", {}, timeout_s=20)
        assert http_server.process is not None
        assert http_server.process.wait(timeout=10) == 3  # it really died
        with pytest.raises(ConnectorUnavailableError, match="cannot connect"):
            await client.call_tool(key, config, BEARER, "whoami", {}, timeout_s=20)
    finally:
        http_server.start()  # the same port: the server is back
    await asyncio.sleep(0.3)  # past the first backoff (0.2 s in this client's options)
    back = await client.call_tool(key, config, BEARER, "whoami", {}, timeout_s=20)
    assert (back.content[0].text == MODERN) is (protocol == "auto")


async def test_http_a_handshake_session_the_restarted_server_forgot_is_reopened(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    """A stateful (handshake-era) HTTP session outlives its server's restart on the client's
    side only: the first call after it fails (the server no longer knows the session) and
    the next one opens a new session."""
    config = http_server.config().model_copy(update={"protocol": "legacy"})
    key = "acme/forgotten"
    await client.call_tool(key, config, BEARER, "whoami", {}, timeout_s=20)
    http_server.stop()
    http_server.start()
    try:
        first = await client.call_tool(key, config, BEARER, "whoami", {}, timeout_s=20)
    except ConnectorUnavailableError:
        first = await client.call_tool(key, config, BEARER, "whoami", {}, timeout_s=20)
    assert first.content[0].text is not None and first.content[0].text < "2026"


async def test_changed_credentials_open_a_new_session(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    config = http_server.config()
    await client.call_tool("acme/rotated", config, BEARER, "whoami", {}, timeout_s=20)
    revoked = McpCredentials(headers={"Authorization": "Bearer revoked"})
    with pytest.raises(ConnectorUnavailableError, match="refused the credentials"):
        await client.call_tool("acme/rotated", config, revoked, "whoami", {}, timeout_s=20)


async def test_a_cancelled_caller_cancels_the_call_on_the_server(
    client: SdkMcpClient, http_server: HttpServer
) -> None:
    marker = http_server.state / "cancelled"
    marker.unlink(missing_ok=True)
    config = http_server.config()
    call = asyncio.create_task(
        client.call_tool(
            "acme/http", config, BEARER, "hang", {"label": "run-stopped"}, timeout_s=60
        )
    )
    await asyncio.sleep(1.0)  # the call is in flight on the server
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.to_thread(wait_for, marker.exists, "the server to see the cancel")
    assert marker.read_text() == "run-stopped"
