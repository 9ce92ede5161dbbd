"""The one secret scrubber (cortex_ray.observability), fed the shapes real secrets have."""

from __future__ import annotations

import json

import pytest

from cortex_ray.observability import (
    REDACTED,
    bound_messages,
    bound_text,
    captured,
    is_secret_key,
    scrub,
    scrub_text,
)

pytestmark = pytest.mark.unit

# Real formats (made-up values of the right length and alphabet).
SECRETS = {
    "aws access key id": "AKIAIOSFODNN7EXAMPLE",
    "github token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "github fine-grained": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789AB",
    "openai key": "sk-proj-" + "Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56",
    "anthropic key": "sk-ant-api03-" + "x" * 40,
    "slack bot token": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "google api key": "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "stripe live key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "cortex-ray key": "crx_0a1b2c3d_" + "Zm9vYmFyYmF6cXV4cXV1eHF1dXhxdXV4",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_credential_shaped_values_are_redacted_where_they_stand(kind: str) -> None:
    secret = SECRETS[kind]
    text = f"the tool said: use {secret} for the call, then stop."
    out = scrub_text(text)
    assert secret not in out and REDACTED in out
    assert out.startswith("the tool said: use ") and out.endswith(" for the call, then stop.")


def test_authorization_headers_connection_strings_and_assignments() -> None:
    cases = {
        "Authorization: Bearer abc.def-ghi_jkl~mno": "Authorization: Bearer [REDACTED]",
        "authorization: basic dXNlcjpwYXNzd29yZDEyMw==": "authorization: basic [REDACTED]",
        "postgresql://app:s3cr%21t@db.internal:5432/cortex": (
            "postgresql://app:[REDACTED]@db.internal:5432/cortex"
        ),
        "redis://:hunter2@cache:6379/0": "redis://:[REDACTED]@cache:6379/0",
        "GET /hook?token=abc123&page=2": "GET /hook?token=[REDACTED]&page=2",
        "password=hunter2 user=bob": "password=[REDACTED] user=bob",
        'config {"api_key": "live-123", "region": "eu"}': (
            'config {"api_key": "[REDACTED]", "region": "eu"}'
        ),
        "CLIENT_SECRET: abcdef": "CLIENT_SECRET: [REDACTED]",
    }
    for text, expected in cases.items():
        assert scrub_text(text) == expected, text


def test_pem_private_keys_go_whole() -> None:
    pem = (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq\nZ9x0\n-----END RSA PRIVATE KEY-----"
    )
    out = scrub_text(f"key:\n{pem}\nend")
    assert "MIIE" not in out and out == f"key:\n{REDACTED}\nend"
    # a truncated block (a capped capture) still goes
    assert "MIIE" not in scrub_text(pem[:60])


def test_ordinary_text_is_left_alone() -> None:
    for text in [
        "Basic concepts of Ray: actors keep state.",
        "The author wrote 12 tokens; max_tokens is 64.",
        "see https://docs.ray.io/en/latest/serve/index.html#key-concepts",
        "skip-ahead is not a key",
        "session 4f1c2e9a-1b2c-4d5e-8f90-123456789abc finished",
    ]:
        assert scrub_text(text) == text


def test_keys_are_matched_word_by_word_in_any_naming_style() -> None:
    for key in [
        "password",
        "DB_PASSWORD",
        "apiKey",
        "x-api-key",
        "Authorization",
        "client_secret",
        "refreshToken",
        "aws.secret_access_key",
        "Set-Cookie",
        "database_url",
        "private_key",
    ]:
        assert is_secret_key(key), key
    for key in [
        "max_tokens",
        "author",
        "keyword",
        "monkey",
        "path",
        "session_id",
        "idempotency_key",
    ]:
        assert not is_secret_key(key), key


def test_nested_structures_are_scrubbed_and_counts_are_kept() -> None:
    value = {
        "tool": "http_get",
        "arguments": {
            "url": "https://api.example.com/v1?api_key=abc123",
            "headers": {"Authorization": "Bearer sk-live-value-123456", "Accept": "json"},
            "auth": {"password": "pw", "user": "bob"},
        },
        "usage": {"input_tokens": 12, "token": 5},
        "history": ["my password=hunter2", {"secret": ["a", "b"]}],
    }
    out = scrub(value)
    text = json.dumps(out)
    for leaked in ["abc123", "sk-live-value-123456", '"pw"', "hunter2", '"a"']:
        assert leaked not in text, leaked
    assert out["arguments"]["headers"]["Accept"] == "json"
    assert out["arguments"]["auth"]["user"] == "bob"
    assert out["usage"] == {"input_tokens": 12, "token": 5}  # numbers are never the secret
    assert value["arguments"]["auth"]["password"] == "pw"  # the input is not modified


def _chars(message: dict[str, object]) -> int:
    return len(json.dumps(message, ensure_ascii=False))


def test_captures_are_bounded_and_oldest_messages_drop_first() -> None:
    assert bound_text("x" * 50, 100) == "x" * 50
    cut = bound_text("x" * 500, 100)
    assert len(cut) == 100 and cut.endswith(f"[{500 - cut.index('…')} more chars]")

    messages = [{"role": "user", "content": f"message {i} " + "y" * 200} for i in range(10)]
    messages.append({"role": "user", "content": "last: password=hunter2"})
    kept = bound_messages(messages, 800)
    assert sum(_chars(m) for m in kept) <= 800
    assert kept[0] == {
        "role": "system",
        "content": f"[{11 - len(kept) + 1} earlier messages dropped]",
    }
    assert kept[-1]["content"] == "last: password=[REDACTED]"  # newest kept, scrubbed
    one = bound_messages([{"role": "user", "content": "z" * 5000}], 300)
    assert len(one) == 1 and _chars(one[0]) <= 300

    text = captured({"query": "q", "api_key": "k" * 20, "rows": list(range(1000))}, 120)
    assert len(text) <= 120 and "kkkk" not in text and '"api_key": "[REDACTED]"' in text
