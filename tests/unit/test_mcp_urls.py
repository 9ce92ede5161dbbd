"""The SSRF guard for HTTP MCP servers (``cortex_ray.mcp.check_mcp_url``), with a resolver of
the test's own so that no name is looked up for real."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cortex_ray import InvalidRequestError
from cortex_ray.mcp import check_mcp_url


def resolver(table: dict[str, Sequence[str]]):  # type: ignore[no-untyped-def]
    asked: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> Sequence[str]:
        asked.append((host, port))
        if host not in table:
            raise OSError(f"unknown host {host}")
        return table[host]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


PUBLIC = resolver({"mcp.example.org": ["93.184.216.34"], "api.example.org": ["93.184.216.35"]})


def test_an_ordinary_https_url_passes_and_is_resolved() -> None:
    resolve = resolver({"mcp.example.org": ["93.184.216.34", "2606:2800:220:1::1"]})
    assert check_mcp_url("https://mcp.example.org/mcp", resolve=resolve) == "mcp.example.org"
    assert resolve.asked == [("mcp.example.org", 443)]  # type: ignore[attr-defined]
    assert check_mcp_url("http://MCP.Example.org.:8080/x", resolve=resolve) == "mcp.example.org"
    assert resolve.asked[-1] == ("mcp.example.org", 8080)  # type: ignore[attr-defined]


def test_loopback_and_private_addresses_are_not_refused_by_default() -> None:
    assert check_mcp_url("http://127.0.0.1:8000/mcp") == "127.0.0.1"
    assert check_mcp_url("http://10.1.2.3/mcp") == "10.1.2.3"


@pytest.mark.parametrize(
    "url",
    ["ftp://mcp.example.org/", "file:///etc/passwd", "gopher://x/", "mcp.example.org/mcp", ""],
)
def test_only_http_and_https(url: str) -> None:
    with pytest.raises(InvalidRequestError, match=r"only http and https|names no host"):
        check_mcp_url(url, resolve=PUBLIC)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata address"),
        ("http://169.254.10.20/", "link-local"),
        ("http://[fe80::1]/mcp", "link-local"),
        ("http://[fd00:ec2::254]/", "cloud metadata address"),
        ("http://[::ffff:169.254.169.254]/", "cloud metadata address"),
        ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata service"),
        ("http://0.0.0.0:8000/", "not a host address"),
    ],
)
def test_link_local_and_metadata_addresses_are_refused(url: str, why: str) -> None:
    with pytest.raises(InvalidRequestError, match=why):
        check_mcp_url(url, resolve=PUBLIC)


def test_every_resolved_address_is_checked() -> None:
    sneaky = resolver({"innocent.example.org": ["93.184.216.34", "169.254.169.254"]})
    with pytest.raises(InvalidRequestError, match=r"resolves to 169\.254\.169\.254"):
        check_mcp_url("https://innocent.example.org/mcp", resolve=sneaky)


def test_a_name_that_does_not_resolve() -> None:
    with pytest.raises(InvalidRequestError, match="does not resolve"):
        check_mcp_url("https://nowhere.example.org/mcp", resolve=PUBLIC)


def test_the_allow_list_takes_exact_hosts_and_suffixes() -> None:
    allowed = ["api.example.org", "*.tools.example.net"]
    resolve = resolver({"api.example.org": ["93.184.216.35"], "a.tools.example.net": ["1.2.3.4"]})
    assert check_mcp_url("https://api.example.org/", allowed, resolve=resolve)
    assert check_mcp_url("https://a.tools.example.net/", allowed, resolve=resolve)
    for refused in (
        "https://mcp.example.org/",  # not listed
        "https://tools.example.net/",  # the suffix itself is not a subdomain of it
        "https://eviltools.example.net/",  # a suffix match is on a label boundary
        "https://api.example.org.evil.com/",
    ):
        with pytest.raises(InvalidRequestError, match="not in connectors"):
            check_mcp_url(refused, allowed, resolve=resolve)


def test_an_allowed_host_is_still_refused_at_a_metadata_address() -> None:
    resolve = resolver({"api.example.org": ["169.254.169.254"]})
    with pytest.raises(InvalidRequestError, match="cloud metadata address"):
        check_mcp_url("https://api.example.org/", ["api.example.org"], resolve=resolve)


def test_a_malformed_port_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequestError, match="not a valid URL"):
        check_mcp_url("http://mcp.example.org:99999/", resolve=PUBLIC)
