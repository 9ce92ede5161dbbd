"""An import-linter contract type the library does not ship: no package imports another
package's private module.

A module is private when a segment of its dotted name starts with one underscore
(``cortex_ray.memory._service``, ``serve._deps``); its owner is the package above that
segment (``cortex_ray.memory``, ``serve``). Only the owner and what lies inside it may import
it; everyone else goes through the owner's public names (its ``__init__`` and ``__all__``).
``pyproject.toml`` registers this type (``[tool.importlinter] contract_types``), so
``lint-imports`` (``./dev check``) enforces it with the other contracts.
"""

from __future__ import annotations

from typing import Any

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


def owner_of(module: str) -> str | None:
    """The package a private module belongs to, or ``None`` for a public module."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


class PrivateModulesContract(Contract):
    """Options: ``root_packages``: the packages whose imports are checked."""

    type_name = "private_modules"

    root_packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        roots: list[str] = list(self.root_packages)  # type: ignore[call-overload]
        ours = [m for m in graph.modules if m.split(".")[0] in roots]
        offences: list[dict[str, Any]] = []
        for importer in sorted(ours):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                owner = owner_of(imported)
                if owner is None or importer == owner or importer.startswith(owner + "."):
                    continue
                details = graph.get_import_details(importer=importer, imported=imported)
                lines = sorted({d["line_number"] for d in details})
                offences.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not offences, metadata={"offences": offences})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for offence in check.metadata["offences"]:
            lines = ", ".join(f"l.{n}" for n in offence["lines"])
            output.print_error(
                f"{offence['importer']} imports the private {offence['imported']} ({lines}): "
                f"use what {owner_of(offence['imported'])} exports",
                bold=False,
            )
        output.new_line()
