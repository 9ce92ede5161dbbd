"""The reference tables of docs/operations.md, generated from the code."""

from __future__ import annotations

from enum import StrEnum

from pydantic.fields import FieldInfo

from cortex_ray.settings._settings import alias_variables, walk

__all__ = ["alias_table", "settings_table"]


def _shown(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(computed)"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, StrEnum):
        return f"`{value.value}`"
    if isinstance(value, int) and value >= 10_000:
        return f"`{value:_}`"
    return f"`{value}`"


def _text(doc: str) -> str:
    return " ".join(doc.replace("``", "`").split())


def settings_table() -> str:
    """The Markdown table of every variable (docs/operations.md holds it verbatim):
    ``python -c "from cortex_ray.settings import settings_table; print(settings_table())"``.
    """
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for variable, field, group in walk():
        if group is not None:
            # the group's docstring up to its first colon: what the group is about
            about = (group.__doc__ or "").split(":")[0]
            rows.append(
                f"| **`{variable}__*`** | | {_text(about)} (`Settings.{variable[7:].lower()}`) |"
            )
            continue
        rows.append(f"| `{variable}` | {_shown(field)} | {_text(field.description or '')} |")
    return "\n".join(rows) + "\n"


def alias_table() -> str:
    """The Markdown table of the old flat variables that still work, and their names now
    (docs/operations.md, "Settings that moved"):
    ``python -c "from cortex_ray.settings import alias_table; print(alias_table())"``."""
    rows = ["| old variable (deprecated) | now | attribute now |", "| --- | --- | --- |"]
    for old, new in alias_variables().items():
        attribute = new[7:].lower().replace("__", ".")
        rows.append(f"| `{old}` | `{new}` | `Settings.{attribute}` |")
    return "\n".join(rows) + "\n"
