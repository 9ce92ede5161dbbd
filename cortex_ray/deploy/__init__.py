"""Deployment plans and the KubeRay manifests' fields (cluster/kuberay/, docs/deployment.md).

``load_plan`` / ``plan_gpus``: the GPUs a Serve config needs (the LLM's tensor × pipeline
parallel × replicas, the GPU embedder and reranker) plus an upgrade's surge, against the
GPU worker groups; ``cortex-ray deploy plan`` prints it and refuses a plan that does not fit.
``parse_manifest`` validates a RayService, RayJob or RayCronJob against the KubeRay v1.7
fields we use. Pure Python and pydantic: no Ray, no Kubernetes client.
"""

from cortex_ray.deploy._kuberay import (
    KubeRayManifest,
    RayCronJob,
    RayJob,
    RayService,
    parse_manifest,
)
from cortex_ray.deploy._plan import GpuDeployment, GpuGroup, GpuPlan, load_plan, plan_gpus

__all__ = [
    "GpuDeployment",
    "GpuGroup",
    "GpuPlan",
    "KubeRayManifest",
    "RayCronJob",
    "RayJob",
    "RayService",
    "load_plan",
    "parse_manifest",
    "plan_gpus",
]
