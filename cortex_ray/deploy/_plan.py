"""The GPU plan of a deployment: what a Serve config needs against what a cluster has.

``plan_gpus`` reads the GPU deployments of a Serve config file (the model-serving app's
embedder, reranker and LLM, and any ``deployments:`` override asking for GPUs), sizes each at
its maximum replicas (the LLM: tensor × pipeline parallel GPUs per replica), adds the GPUs an
upgrade needs on top (its surge) and sets the total against the cluster's GPU worker groups.
``load_plan`` takes a KubeRay RayService manifest (its ``serveConfigV2``, worker groups and
upgrade strategy) or a cluster launcher file with a Serve config beside it.

Surge by upgrade: ``NewCluster`` starts a whole second cluster (every GPU twice);
``NewClusterWithIncrementalUpgrade`` scales the new cluster up by ``maxSurgePercent`` of each
deployment's replicas (rounded up) while the old one scales down; an in-place Serve update
(``None``, or ``serve deploy`` on a launcher cluster) replaces replicas in place, no surge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from cortex_ray.deploy._kuberay import RayService, parse_manifest

__all__ = ["GpuDeployment", "GpuGroup", "GpuPlan", "load_plan", "plan_gpus"]

Upgrade = Literal["NewCluster", "NewClusterWithIncrementalUpgrade", "None"]


class GpuDeployment(BaseModel):
    """One deployment that asks for GPUs."""

    model_config = ConfigDict(frozen=True)

    app: str
    deployment: str
    gpus_per_replica: float = Field(gt=0)
    max_replicas: int = Field(ge=0)
    llm: bool = False

    @property
    def gpus(self) -> float:
        return self.gpus_per_replica * self.max_replicas


class GpuGroup(BaseModel):
    """A worker group (node type) with GPUs."""

    model_config = ConfigDict(frozen=True)

    name: str
    gpus_per_node: int = Field(ge=0)
    max_nodes: int = Field(ge=0)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.max_nodes


class GpuPlan(BaseModel):
    """What the config needs, what an upgrade adds, what the cluster has, and why it does
    not fit (``problems``; empty: it fits)."""

    deployments: list[GpuDeployment]
    groups: list[GpuGroup]
    upgrade: Upgrade
    max_surge_percent: int = 100
    steady_gpus: int
    surge_gpus: int
    capacity_gpus: int
    problems: list[str]

    @property
    def llm_gpus(self) -> float:
        return sum(d.gpus for d in self.deployments if d.llm)

    @property
    def peak_gpus(self) -> int:
        return self.steady_gpus + self.surge_gpus

    @property
    def fits(self) -> bool:
        return not self.problems


def _max_replicas(options: Mapping[str, Any]) -> int:
    scaling = options.get("autoscaling_config")
    if scaling:
        return int(scaling.get("max_replicas", 1))
    return int(options.get("num_replicas") or 1)


def _deployments(serve_config: Mapping[str, Any]) -> list[GpuDeployment]:
    found: list[GpuDeployment] = []
    for app in serve_config.get("applications") or []:
        name = str(app.get("name", "default"))
        if app.get("import_path") == "serve.models:build_app":
            args = app.get("args") or {}
            for part, deployment in (("embedder", "Embedder"), ("reranker", "Reranker")):
                options = (args.get(part) or {}).get("deployment") or {}
                gpus = float((options.get("ray_actor_options") or {}).get("num_gpus") or 0)
                if gpus > 0:
                    found.append(GpuDeployment(app=name, deployment=deployment,
                                               gpus_per_replica=gpus,
                                               max_replicas=_max_replicas(options)))  # fmt: skip
            llm = args.get("llm") or {}
            if llm.get("backend") == "vllm":
                vllm = llm.get("vllm") or {}
                engine = vllm.get("engine_kwargs") or {}
                per_replica = int(engine.get("tensor_parallel_size", 1)) * int(
                    engine.get("pipeline_parallel_size", 1)
                )
                found.append(GpuDeployment(app=name, deployment="LLM", llm=True,
                                           gpus_per_replica=per_replica,
                                           max_replicas=_max_replicas(
                                               vllm.get("deployment_config") or {})))  # fmt: skip
            elif llm:
                options = llm.get("deployment") or {}
                gpus = float((options.get("ray_actor_options") or {}).get("num_gpus") or 0)
                if gpus > 0:
                    found.append(GpuDeployment(app=name, deployment="LLM", llm=True,
                                               gpus_per_replica=gpus,
                                               max_replicas=_max_replicas(options)))  # fmt: skip
        for override in app.get("deployments") or []:
            gpus = float((override.get("ray_actor_options") or {}).get("num_gpus") or 0)
            if gpus > 0:
                found.append(GpuDeployment(app=name, deployment=str(override["name"]),
                                           gpus_per_replica=gpus,
                                           max_replicas=_max_replicas(override)))  # fmt: skip
    return found


def plan_gpus(
    serve_config: Mapping[str, Any],
    groups: list[GpuGroup],
    *,
    upgrade: Upgrade = "None",
    max_surge_percent: int = 100,
) -> GpuPlan:
    """The plan of ``serve_config`` on ``groups`` under ``upgrade`` (see the module)."""
    deployments = _deployments(serve_config)
    # Fractions of a GPU share whole GPUs; a replica never spans two.
    steady = math.ceil(sum(d.gpus for d in deployments) - 1e-9)
    if upgrade == "NewCluster":
        surge = steady
    elif upgrade == "NewClusterWithIncrementalUpgrade":
        surge = math.ceil(
            sum(
                math.ceil(d.max_replicas * max_surge_percent / 100) * d.gpus_per_replica
                for d in deployments
            )
            - 1e-9
        )
    else:
        surge = 0
    capacity = sum(g.gpus for g in groups)
    problems: list[str] = []
    largest = max((g.gpus_per_node for g in groups), default=0)
    for d in deployments:
        if d.gpus_per_replica > largest:
            problems.append(
                f"{d.app}/{d.deployment} needs {d.gpus_per_replica:g} GPUs on one node "
                f"(tensor x pipeline parallel); the largest GPU node has {largest}"
            )
    if steady + surge > capacity:
        problems.append(
            f"needs {steady + surge} GPUs ({steady} at max replicas + {surge} upgrade surge, "
            f"{upgrade}) but the worker groups have {capacity}"
        )
    return GpuPlan(
        deployments=deployments,
        groups=groups,
        upgrade=upgrade,
        max_surge_percent=max_surge_percent,
        steady_gpus=steady,
        surge_gpus=surge,
        capacity_gpus=capacity,
        problems=problems,
    )


def _launcher_groups(launcher: Mapping[str, Any]) -> list[GpuGroup]:
    groups = []
    for name, node in (launcher.get("available_node_types") or {}).items():
        gpus = int((node.get("resources") or {}).get("GPU", 0))
        if gpus:
            groups.append(GpuGroup(name=name, gpus_per_node=gpus,
                                   max_nodes=int(node.get("max_workers", 0))))  # fmt: skip
    return groups


def load_plan(path: Path, serve_config: Path | None = None) -> GpuPlan:
    """The plan for a RayService manifest (its own ``serveConfigV2``, unless
    ``serve_config`` is given) or a cluster launcher file (``serve_config`` required).

    Raises:
        ValueError: The file is neither, or a launcher file came without a Serve config;
            the message names the file.
    """
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read it as YAML: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    config = yaml.safe_load(serve_config.read_text()) if serve_config is not None else None
    if document.get("kind") == "RayService":
        service = parse_manifest(document)
        assert isinstance(service, RayService)
        spec = service.spec
        groups = [
            GpuGroup(name=g.group_name, gpus_per_node=g.gpus_per_node, max_nodes=g.max_replicas)
            for g in spec.ray_cluster_config.worker_group_specs
            if g.gpus_per_node
        ]
        strategy = spec.upgrade_strategy
        upgrade: Upgrade = strategy.type if strategy and strategy.type else "NewCluster"
        options = strategy.cluster_upgrade_options if strategy else None
        surge = options.max_surge_percent if options is not None else 100
        return plan_gpus(
            config or yaml.safe_load(spec.serve_config_v2),
            groups,
            upgrade=upgrade,
            max_surge_percent=surge,
        )
    if "available_node_types" in document:
        if config is None:
            raise ValueError(f"{path}: a cluster launcher file needs --serve-config")
        return plan_gpus(config, _launcher_groups(document))
    raise ValueError(f"{path}: neither a KubeRay RayService nor a cluster launcher file")
