"""A database URL that is not PostgreSQL is refused without echoing what it carries."""

from __future__ import annotations

import pytest

from cortex_ray._exceptions import ConfigurationError
from cortex_ray.storage._database import _sqlalchemy_url


def test_a_postgresql_url_becomes_psycopgs_dialect() -> None:
    assert _sqlalchemy_url("postgres://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert _sqlalchemy_url("postgresql://h/db") == "postgresql+psycopg://h/db"


@pytest.mark.parametrize(
    ("url", "scheme"),
    [("mysql://admin:hunter2@db.example/prod", "'mysql'"), ("admin:hunter2@db", "'no scheme'")],
)
def test_another_url_is_refused_naming_its_scheme_never_its_password(url: str, scheme: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _sqlalchemy_url(url)
    message = str(caught.value)
    assert scheme in message and "postgresql://" in message
    assert "hunter2" not in message and "admin" not in message
