"""``cortex-ray eval ...``: runs as regression cases, versioned suites, replays and their
comparison."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pydantic
import typer
from rich.text import Text

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray.cli._common import (
    EXIT_EVAL_FAILED,
    EXIT_INVALID,
    as_operator,
    err,
    execute,
    fail,
    list_table,
    open_runtime,
    org_of,
    out,
    parse_uuid,
    shorten,
    validation_message,
)
from cortex_ray.evals import Check, EvalMode, EvalRun, EvalSuite

__all__ = ["eval_app"]

eval_app = typer.Typer(
    help="Evaluation: runs as regression cases, versioned suites, replays, comparisons.",
    no_args_is_help=True,
)


def _read_suite_file(path: Path) -> EvalSuite:
    """A suite from a JSON file; a bad file names itself, and the line or the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequestError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    try:
        return EvalSuite.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise InvalidRequestError(validation_message(exc, f"{path}: ")) from None


def _checks_from(values: list[str]) -> list[Check] | None:
    if not values:
        return None
    adapter: pydantic.TypeAdapter[Check] = pydantic.TypeAdapter(Check)
    checks = []
    for i, value in enumerate(values, 1):
        try:
            checks.append(adapter.validate_json(value))
        except pydantic.ValidationError as exc:
            raise InvalidRequestError(validation_message(exc, f"--check {i}: ")) from None
    return checks


def _print_eval_run(ran: EvalRun) -> None:
    table = list_table(
        f"eval run {ran.id}: {ran.suite} v{ran.suite_version}, {ran.mode.value}"
        + (f", {ran.model}" if ran.model else "")
        + "".join(f", {k}={v}" for k, v in ran.overrides.items())
    )
    table.add_column("case", overflow="fold")
    table.add_column("result", no_wrap=True)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("tools", justify="right", no_wrap=True)
    table.add_column("why", min_width=20, overflow="fold")
    for r in ran.results:
        failed = [v for v in r.verdicts if v.passed is False]
        skipped = [v for v in r.verdicts if v.passed is None]
        why = "; ".join(f"{v.kind}: {v.detail}" for v in failed) or r.error or ""
        if not why and skipped:
            why = "; ".join(f"{v.kind}: {v.detail}" for v in skipped)
        m = r.outcome.metrics
        table.add_row(
            Text(r.case),
            Text("pass" if r.passed else "FAIL", style="green" if r.passed else "red"),
            str(m.steps),
            f"{m.tool_correctness:.2f}",
            Text(shorten(why, 240)),
        )
    out.print(table)
    t = ran.metrics
    out.print(
        Text(
            f"passed {ran.passed}/{ran.total} ({t.success_rate:.0%}); tool correctness "
            f"{t.tool_correctness:.2f}; mean steps {t.mean_steps:g}; model calls "
            f"{t.model_calls}; tokens {t.prompt_tokens}+{t.completion_tokens}; decide "
            f"p50 {t.decide_ms_p50:g} ms, p95 {t.decide_ms_p95:g} ms; diverged {t.diverged}; "
            f"prompts changed {t.prompt_changes}"
        )
    )
    out.print(Text(f"eval run id: {ran.id}"))


@eval_app.command("add")
def eval_add(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="An ended run's id.")],
    suite: Annotated[str, typer.Option("--suite", help="The suite to add the case to.")],
    name: Annotated[
        str | None, typer.Option("--name", help="The case's name (default: run-<id>).")
    ] = None,
    check: Annotated[
        list[str] | None,
        typer.Option(
            "--check",
            help='A check as JSON, e.g. \'{"kind": "result_contains", "values": ["Paris"]}\' '
            "(repeat; default: the run's status and every decision as recorded).",
        ),
    ] = None,
) -> None:
    """Turn a run into a regression case: the suite's next version holds it."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        checks = _checks_from(check or [])
        operator = as_operator(org)
        async with open_runtime(with_models=False) as runtime:
            case = await runtime.eval_case_from_run(
                org, key, name=name, checks=checks, principal=operator
            )
            saved = await runtime.add_eval_case(org, suite, case, principal=operator)
        out.print(
            Text(
                f"case {case.name} ({len(case.cassette.steps)} steps, {len(case.checks)} "
                f"checks) → suite {saved.name} version {saved.version}, {len(saved.cases)} cases"
            )
        )
        return 0

    execute(work())


@eval_app.command("import")
def eval_import(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="A suite as JSON (what `eval export` writes).")],
) -> None:
    """Save a suite file as the suite's next version (the same cases: the same version)."""
    org = org_of(ctx)

    async def work() -> int:
        suite = _read_suite_file(path)
        async with open_runtime(with_models=False) as runtime:
            saved = await runtime.save_eval_suite(org, suite, principal=as_operator(org))
        out.print(Text(f"suite {saved.name} version {saved.version}, {len(saved.cases)} cases"))
        return 0

    execute(work())


@eval_app.command("export")
def eval_export(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The suite's name.")],
    version: Annotated[int | None, typer.Option("--version", help="Default: latest.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default: stdout).")
    ] = None,
) -> None:
    """Write a suite version as JSON (to keep it in a repository, or import it elsewhere)."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            suite = await runtime.get_eval_suite(
                org, name, version=version, principal=as_operator(org)
            )
        body = suite.model_dump(mode="json", include={"name", "description", "cases"})
        text = json.dumps(body, indent=1, ensure_ascii=False) + "\n"
        if output is None:
            sys.stdout.write(text)
        else:
            output.write_text(text, encoding="utf-8")
            err.print(Text(f"wrote {output}: {suite.name} version {suite.version}"))
        return 0

    execute(work())


class EvalModeChoice(StrEnum):
    replay = "replay"
    live = "live"


@eval_app.command("run")
def eval_run(
    ctx: typer.Context,
    suite: Annotated[
        str, typer.Argument(help="A saved suite's name, or a suite file (.json) to import first.")
    ],
    version: Annotated[int | None, typer.Option("--version", help="Default: latest.")] = None,
    mode: Annotated[
        EvalModeChoice,
        typer.Option(
            "--mode",
            help="replay: the recorded model outputs answer (no model, deterministic); "
            "live: the configured model answers, the recorded results answer the tools.",
        ),
    ] = EvalModeChoice.replay,
    judge: Annotated[
        bool, typer.Option("--judge", help="Ask the configured model the model-scored checks.")
    ] = False,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE: replay with this DECIDE setting changed (candidates, evaluation, "
            "structured_retries, show_action_space, progress_earlier_chars); each case "
            "otherwise uses the settings it was recorded with. Repeatable.",
        ),
    ] = None,
) -> None:
    """Run a suite: each case replayed and checked; results stored. Exit 4 if a case fails."""
    org = org_of(ctx)
    overrides: dict[str, Any] = {}
    for item in sets or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            fail(f"--set {item!r}: expected KEY=VALUE", EXIT_INVALID)
        overrides[key.strip()] = value.strip()

    as_file = Path(suite)
    from_file = suite.endswith(".json") or as_file.is_file()

    async def work() -> int:
        loaded = _read_suite_file(as_file) if from_file else None
        operator = as_operator(org)
        live = EvalMode(mode.value) is EvalMode.LIVE
        async with open_runtime(with_models=live or judge) as runtime:
            name, which = suite, version
            if loaded is not None:
                saved = await runtime.save_eval_suite(org, loaded, principal=operator)
                name, which = saved.name, saved.version
            with err.status(f"running {name}…"):
                ran = await runtime.run_eval_suite(
                    org, name, version=which, mode=EvalMode(mode.value), judge=judge,
                    overrides=overrides or None, principal=operator,
                )  # fmt: skip
        _print_eval_run(ran)
        return 0 if ran.passed == ran.total else EXIT_EVAL_FAILED

    execute(work())


@eval_app.command("show")
def eval_show(
    ctx: typer.Context, eval_run_id: Annotated[str, typer.Argument(help="The eval run's id.")]
) -> None:
    """Show a stored eval run, case by case."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(eval_run_id, "eval run")
        async with open_runtime(with_models=False) as runtime:
            ran = await runtime.get_eval_run(org, key, principal=as_operator(org))
        _print_eval_run(ran)
        return 0

    execute(work())


@eval_app.command("list")
def eval_list(
    ctx: typer.Context,
    suite: Annotated[str | None, typer.Option("--suite", help="Only this suite's runs.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many, newest first.")] = 50,
) -> None:
    """List the suites (latest versions) and recent eval runs."""
    org = org_of(ctx)

    async def work() -> int:
        operator = as_operator(org)
        async with open_runtime(with_models=False) as runtime:
            suites = await runtime.list_eval_suites(org, principal=operator)
            runs = await runtime.list_eval_runs(org, suite=suite, limit=limit, principal=operator)
        table = list_table(f"eval suites in {org}")
        for column in ("suite", "version", "cases", "saved"):
            table.add_column(column, no_wrap=True)
        for s in suites:
            table.add_row(
                s.name, str(s.version), str(s.cases), s.created_at.strftime("%m-%d %H:%M")
            )
        out.print(table)
        runs_table = list_table("eval runs")
        for column in ("id", "suite", "mode", "passed", "started"):
            runs_table.add_column(column, no_wrap=True)
        for r in runs:
            runs_table.add_row(
                str(r.id),
                f"{r.suite} v{r.suite_version}",
                r.mode.value + (f" ({r.model})" if r.model else ""),
                f"{r.passed}/{r.total}",
                r.started_at.strftime("%m-%d %H:%M"),
            )
        out.print(runs_table)
        return 0

    execute(work())


@eval_app.command("compare")
def eval_compare(
    ctx: typer.Context,
    run_a: Annotated[str, typer.Argument(help="The earlier eval run's id (the baseline).")],
    run_b: Annotated[str, typer.Argument(help="The later eval run's id.")],
) -> None:
    """Compare two eval runs case by case: fixed, broken, changed; metric deltas (b − a)."""
    org = org_of(ctx)

    async def work() -> int:
        a, b = parse_uuid(run_a, "eval run"), parse_uuid(run_b, "eval run")
        async with open_runtime(with_models=False) as runtime:
            cmp = await runtime.compare_eval_runs(org, a, b, principal=as_operator(org))
        out.print(
            Text(
                f"a: {cmp.a.suite} v{cmp.a.suite_version} {cmp.a.mode.value} "
                f"{cmp.a.passed}/{cmp.a.total}   b: {cmp.b.suite} v{cmp.b.suite_version} "
                f"{cmp.b.mode.value} {cmp.b.passed}/{cmp.b.total}"
            )
        )
        out.print(Text(f"fixed: {', '.join(cmp.fixed) or '-'}"))
        out.print(Text(f"broken: {', '.join(cmp.broken) or '-'}"))
        table = list_table("changed cases (a → b)")
        for column in ("case", "passed", "steps", "tools", "diverged at"):
            table.add_column(column, no_wrap=True)
        for c in cmp.changed:
            table.add_row(
                Text(str(c["case"])),
                " → ".join("pass" if p else "FAIL" for p in c["passed"]),
                " → ".join(str(x) for x in c["steps"]),
                " → ".join(f"{x:.2f}" for x in c["tool_correctness"]),
                " → ".join("-" if d is None else f"step {d + 1}" for d in c["divergence"]),
            )
        out.print(table)
        deltas = ", ".join(f"{k} {v:+g}" for k, v in cmp.deltas.items())
        out.print(Text(f"b − a: {deltas}"))
        if cmp.only_a or cmp.only_b:
            only_a, only_b = ", ".join(cmp.only_a) or "-", ", ".join(cmp.only_b) or "-"
            out.print(Text(f"only in a: {only_a}; only in b: {only_b}"))
        return 0

    execute(work())
