"""One secret scrubber for everything that leaves a run for people to read: span content,
diagnostics and audit arguments.

Two rules, applied together:

- **by key**: a mapping value whose key names a credential (``password``, ``api_key``,
  ``Authorization``, ``client_secret``, ``x-api-key``, ``db_token`` ...) is replaced whole.
  Keys are split into words (snake_case, camelCase, kebab-case, dots) and matched word by
  word, so ``max_tokens`` or ``author`` are left alone; numbers and booleans are never
  credentials and are kept.
- **by shape**: inside any string, text shaped like a credential is replaced where it
  stands: bearer and basic authorization values, JSON web tokens, PEM private keys,
  well-known vendor key formats (AWS, GitHub, OpenAI/Anthropic ``sk-``, Slack, Google,
  Stripe, cortex-ray's own ``crx_`` API keys), the password in a connection string
  (``postgresql://user:…@host``) and ``password=…``/``"token": "…"`` assignments.

The scrubber never raises and never grows its input by more than the markers; what it
cannot recognise it keeps (it is a safety net under "content capture is off by default",
not a licence to capture).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "scrub", "scrub_text"]

REDACTED = "[REDACTED]"

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "secret",
        "secrets",
        "token",
        "apikey",
        "authorization",
        "cookie",
        "credential",
        "credentials",
        "bearer",
        "dsn",
    }
)
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("access", "key"),
        ("private", "key"),
        ("secret", "key"),
        ("signing", "key"),
        ("encryption", "key"),
        ("auth", "key"),
        ("set", "cookie"),
        ("connection", "string"),
        ("database", "url"),
    }
)

_KEY_NAMES = (
    r"password|passwd|passphrase|pwd|secret|client[_-]?secret|token|access[_-]?token|"
    r"refresh[_-]?token|auth[_-]?token|api[_-]?key|apikey|access[_-]?key|secret[_-]?key|"
    r"private[_-]?key"
)

# Order matters: whole blocks first, then prefixed tokens, then assignments.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)",
            re.DOTALL,
        ),
        REDACTED,
    ),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]{8,}=*"), r"\1 " + REDACTED),
    (re.compile(r"(?i)\b(basic)\s+[A-Za-z0-9+/]{16,}={0,2}"), r"\1 " + REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}"), REDACTED),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"), REDACTED),
    (re.compile(r"\b[sr]k_(?:live|test)_[0-9A-Za-z]{16,}"), REDACTED),
    (re.compile(r"\bcrx_[0-9a-f]{8}_[A-Za-z0-9_\-]{16,}"), REDACTED),
    # scheme://user:password@host → keep the user and host
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]*://[^:/\s@]*):[^@\s/]+@"), r"\1:" + REDACTED + "@"),
    # "password": "value" (JSON text) and password=value / password: value (query strings,
    # headers, logs)
    (
        re.compile(rf"""(?i)(["'](?:{_KEY_NAMES})["']\s*:\s*)(["'])(?:(?!\2).)*\2"""),
        r"\1\2" + REDACTED + r"\2",
    ),
    (
        re.compile(
            rf"""(?i)(?<![A-Za-z0-9_])((?:{_KEY_NAMES})\s*[=:]\s*)(?!\[REDACTED\])[^\s"'&,;]+"""
        ),
        r"\1" + REDACTED,
    ),
)


# Every pattern above needs one of these words in the lowercased text: one search rules
# out most strings (words, ids, numbers as text) without running the fifteen substitutions.
# Plain lowercase literals on lowercased text: ~0.6 µs for a short string, where the same
# alternation case-insensitive (and with classes) took 6-9 µs, most of the scrubber's time.
_TRIGGER = re.compile(
    "|".join(
        re.escape(word)
        for word in (
            "begin",
            "bearer",
            "basic",
            "eyj",
            "akia",
            "asia",
            "ghp_",
            "gho_",
            "ghu_",
            "ghs_",
            "ghr_",
            "github_pat_",
            "sk-",
            "xox",
            "aiza",
            "sk_",
            "rk_",
            "crx_",
            "://",
            "pass",
            "pwd",
            "secret",
            "token",
            "key",
        )
    )
)


_SCALARS = frozenset({bool, int, float})


@functools.lru_cache(maxsize=4096)
def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a credential (word by word, any naming style)."""
    words = [w.lower() for w in _WORD.findall(key)]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def scrub_text(text: str) -> str:
    """``text`` with every credential-shaped part replaced by ``[REDACTED]``."""
    if _TRIGGER.search(text.lower()) is None:
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def scrub(value: Any) -> Any:
    """A copy of ``value`` (JSON-like: mappings, sequences, strings, scalars) with
    credential-named entries and credential-shaped text replaced; anything else passes
    through unchanged (nothing is stringified)."""
    if value is None or type(value) in _SCALARS:
        return value  # before the ABC checks below, which cost more than the scrubbing
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            # numbers, booleans and None under a credential's name stay: they are counts
            # and flags (``token_count``), never the secret itself
            secret = isinstance(k, str) and is_secret_key(k)
            out[k] = REDACTED if secret and isinstance(v, (str, bytes, Mapping, list)) else scrub(v)
        return out
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [scrub(v) for v in value]
    return value
