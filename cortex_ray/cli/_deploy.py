"""``cortex-ray deploy plan``: the GPUs a deployment needs against a cluster's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray.cli._common import EXIT_ERROR, EXIT_INVALID, fail, list_table, out
from cortex_ray.deploy import load_plan

__all__ = ["deploy_app"]

deploy_app = typer.Typer(
    help="Plan a deployment on a GPU cluster (docs/deployment.md).", no_args_is_help=True
)


@deploy_app.command("plan")
def deploy_plan(
    manifest: Annotated[
        Path,
        typer.Argument(help="A KubeRay RayService manifest, or a cluster launcher file."),
    ],
    serve_config: Annotated[
        Path | None,
        typer.Option(
            "--serve-config",
            help="The Serve config file (default: the RayService's serveConfigV2).",
        ),
    ] = None,
) -> None:
    """The GPUs the Serve config needs (the LLM's tensor x pipeline parallel x replicas, the
    GPU embedder and reranker, plus the upgrade's surge) against the GPU worker groups; exits
    1 when they do not fit."""
    try:
        plan = load_plan(manifest, serve_config)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        fail(f"{manifest}: {exc}", EXIT_INVALID)
    table = list_table("GPU deployments (at max replicas)")
    for column in ("app", "deployment", "GPUs/replica", "max replicas", "GPUs"):
        table.add_column(column, no_wrap=True)
    for d in plan.deployments:
        table.add_row(
            d.app, d.deployment, f"{d.gpus_per_replica:g}", str(d.max_replicas), f"{d.gpus:g}"
        )
    out.print(table)
    groups = ", ".join(f"{g.name} {g.gpus_per_node} x {g.max_nodes}" for g in plan.groups)
    surge = (
        f"{plan.upgrade}, maxSurgePercent {plan.max_surge_percent}"
        if plan.upgrade == "NewClusterWithIncrementalUpgrade"
        else ("None: in place" if plan.upgrade == "None" else plan.upgrade)
    )
    out.print(Text(f"LLM: {plan.llm_gpus:g} GPUs; all deployments: {plan.steady_gpus}"))
    out.print(Text(f"upgrade surge ({surge}): {plan.surge_gpus}; peak: {plan.peak_gpus}"))
    out.print(Text(f"GPU worker groups: {groups or 'none'} = {plan.capacity_gpus} GPUs"))
    if not plan.fits:
        fail("the plan does not fit: " + "; ".join(plan.problems), EXIT_ERROR)
    out.print(Text("fits"))
