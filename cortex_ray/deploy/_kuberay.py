"""Pydantic models of the KubeRay v1.7 fields cortex-ray's manifests use (cluster/kuberay/).

The field names, types and rules come from KubeRay v1.7.0's Go API types
(``ray-operator/apis/ray/v1/{rayservice,raycluster,rayjob,raycronjob}_types.go``) and its
webhook-free validation (``ray-operator/controllers/ray/utils/validation.go``: upgrade
options, deletion settings). Only what we write is modelled, and every model forbids other
fields, so a misspelt or unknown field in a manifest fails here instead of being dropped by
the API server. The Kubernetes pod template is modelled as far as we use it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "Container",
    "GroupSpec",
    "KubeRayManifest",
    "RayClusterSpec",
    "RayCronJob",
    "RayJob",
    "RayService",
    "WorkerGroupSpec",
    "parse_manifest",
]


class _K8s(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Metadata(_K8s):
    name: str = Field(min_length=1, max_length=63)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class SecretKeyRef(_K8s):
    name: str
    key: str
    optional: bool | None = None


class EnvVarSource(_K8s):
    secret_key_ref: SecretKeyRef | None = Field(default=None, alias="secretKeyRef")
    config_map_key_ref: SecretKeyRef | None = Field(default=None, alias="configMapKeyRef")


class EnvVar(_K8s):
    name: str
    value: str | None = None
    value_from: EnvVarSource | None = Field(default=None, alias="valueFrom")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: set value or valueFrom, exactly one")
        return self


class NamedRef(_K8s):
    name: str


class EnvFromSource(_K8s):
    secret_ref: NamedRef | None = Field(default=None, alias="secretRef")
    config_map_ref: NamedRef | None = Field(default=None, alias="configMapRef")


class ContainerPort(_K8s):
    name: str | None = None
    container_port: int = Field(alias="containerPort", ge=1, le=65535)


class Resources(_K8s):
    limits: dict[str, str | int] = Field(default_factory=dict)
    requests: dict[str, str | int] = Field(default_factory=dict)


class ExecAction(_K8s):
    command: list[str]


class HttpGet(_K8s):
    path: str
    port: int | str


class Probe(_K8s):
    exec: ExecAction | None = None
    http_get: HttpGet | None = Field(default=None, alias="httpGet")
    initial_delay_seconds: int | None = Field(default=None, alias="initialDelaySeconds", ge=0)
    period_seconds: int | None = Field(default=None, alias="periodSeconds", ge=1)
    timeout_seconds: int | None = Field(default=None, alias="timeoutSeconds", ge=1)
    failure_threshold: int | None = Field(default=None, alias="failureThreshold", ge=1)


class VolumeMount(_K8s):
    name: str
    mount_path: str = Field(alias="mountPath")
    read_only: bool | None = Field(default=None, alias="readOnly")


class Container(_K8s):
    name: str
    image: str
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, alias="imagePullPolicy"
    )
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] = Field(default_factory=list)
    env_from: list[EnvFromSource] = Field(default_factory=list, alias="envFrom")
    ports: list[ContainerPort] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    readiness_probe: Probe | None = Field(default=None, alias="readinessProbe")
    liveness_probe: Probe | None = Field(default=None, alias="livenessProbe")
    volume_mounts: list[VolumeMount] = Field(default_factory=list, alias="volumeMounts")


class PodSpec(_K8s):
    containers: list[Container] = Field(min_length=1)
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    restart_policy: Literal["Always", "OnFailure", "Never"] | None = Field(
        default=None, alias="restartPolicy"
    )


class PodTemplate(_K8s):
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: PodSpec


class GroupSpec(_K8s):
    """What a head and a worker group share (``HeadGroupSpec`` / ``WorkerGroupSpec``)."""

    ray_start_params: dict[str, str] = Field(alias="rayStartParams")
    labels: dict[str, str] = Field(default_factory=dict, description="Ray node labels")
    resources: dict[str, str] = Field(default_factory=dict, description="Ray resources")
    template: PodTemplate

    @property
    def ray_container(self) -> Container:
        return self.template.spec.containers[0]  # KubeRay's Ray container is the first


class HeadGroupSpec(GroupSpec):
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = Field(
        default=None, alias="serviceType"
    )


class WorkerGroupSpec(GroupSpec):
    group_name: str = Field(alias="groupName")
    replicas: int | None = Field(default=None, ge=0)
    min_replicas: int = Field(alias="minReplicas", ge=0)
    max_replicas: int = Field(alias="maxReplicas", ge=0)
    idle_timeout_seconds: int | None = Field(default=None, alias="idleTimeoutSeconds", ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> WorkerGroupSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"{self.group_name}: minReplicas > maxReplicas")
        return self

    @property
    def gpus_per_node(self) -> int:
        """``nvidia.com/gpu`` of the Ray container's limits (what KubeRay gives Ray as
        ``num-gpus`` unless ``rayStartParams`` says otherwise)."""
        given = self.ray_start_params.get("num-gpus")
        if given is not None:
            return int(float(given))
        return int(self.ray_container.resources.limits.get("nvidia.com/gpu", 0))


class AutoscalerOptions(_K8s):
    idle_timeout_seconds: int | None = Field(default=None, alias="idleTimeoutSeconds", ge=0)
    upscaling_mode: Literal["Conservative", "Default", "Aggressive"] | None = Field(
        default=None, alias="upscalingMode"
    )
    version: Literal["v1", "v2"] | None = None
    resources: Resources | None = None


class AuthOptions(_K8s):
    mode: Literal["disabled", "token"] | None = None


class RayClusterSpec(_K8s):
    ray_version: str | None = Field(default=None, alias="rayVersion")
    enable_in_tree_autoscaling: bool | None = Field(default=None, alias="enableInTreeAutoscaling")
    autoscaler_options: AutoscalerOptions | None = Field(default=None, alias="autoscalerOptions")
    auth_options: AuthOptions | None = Field(default=None, alias="authOptions")
    head_group_spec: HeadGroupSpec = Field(alias="headGroupSpec")
    worker_group_specs: list[WorkerGroupSpec] = Field(
        default_factory=list, alias="workerGroupSpecs"
    )


class ClusterUpgradeOptions(_K8s):
    max_surge_percent: int = Field(default=100, alias="maxSurgePercent", ge=0, le=100)
    step_size_percent: int = Field(alias="stepSizePercent", ge=0, le=100)
    interval_seconds: int = Field(alias="intervalSeconds", gt=0)
    gateway_class_name: str = Field(alias="gatewayClassName", min_length=1)

    @model_validator(mode="after")
    def _step_within_surge(self) -> ClusterUpgradeOptions:
        if self.step_size_percent > self.max_surge_percent:
            raise ValueError("stepSizePercent must be less than or equal to maxSurgePercent")
        return self


UpgradeType = Literal["NewClusterWithIncrementalUpgrade", "NewCluster", "None"]


class UpgradeStrategy(_K8s):
    type: UpgradeType | None = None
    cluster_upgrade_options: ClusterUpgradeOptions | None = Field(
        default=None, alias="clusterUpgradeOptions"
    )


class RayServiceSpec(_K8s):
    serve_config_v2: str = Field(alias="serveConfigV2", min_length=1)
    ray_cluster_config: RayClusterSpec = Field(alias="rayClusterConfig")
    upgrade_strategy: UpgradeStrategy | None = Field(default=None, alias="upgradeStrategy")
    service_unhealthy_second_threshold: int | None = Field(
        default=None, alias="serviceUnhealthySecondThreshold", ge=0
    )
    deployment_unhealthy_second_threshold: int | None = Field(
        default=None, alias="deploymentUnhealthySecondThreshold", ge=0
    )
    exclude_head_pod_from_serve_svc: bool | None = Field(
        default=None, alias="excludeHeadPodFromServeSvc"
    )

    @model_validator(mode="after")
    def _incremental_needs_its_options(self) -> RayServiceSpec:
        strategy = self.upgrade_strategy
        if strategy is not None and strategy.type == "NewClusterWithIncrementalUpgrade":
            if not self.ray_cluster_config.enable_in_tree_autoscaling:
                raise ValueError("Ray Autoscaler is required for NewClusterWithIncrementalUpgrade")
            if strategy.cluster_upgrade_options is None:
                raise ValueError(
                    "ClusterUpgradeOptions are required for NewClusterWithIncrementalUpgrade"
                )
        return self


class RayJobSpec(_K8s):
    entrypoint: str = Field(min_length=1)
    runtime_env_yaml: str | None = Field(default=None, alias="runtimeEnvYAML")
    submission_mode: Literal["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"] | None = (
        Field(default=None, alias="submissionMode")
    )
    shutdown_after_job_finishes: bool = Field(default=False, alias="shutdownAfterJobFinishes")
    ttl_seconds_after_finished: int = Field(default=0, alias="ttlSecondsAfterFinished", ge=0)
    active_deadline_seconds: int | None = Field(default=None, alias="activeDeadlineSeconds", gt=0)
    backoff_limit: int | None = Field(default=None, alias="backoffLimit", ge=0)
    entrypoint_num_cpus: float | None = Field(default=None, alias="entrypointNumCpus", ge=0)
    ray_cluster_spec: RayClusterSpec | None = Field(default=None, alias="rayClusterSpec")
    cluster_selector: dict[str, str] = Field(default_factory=dict, alias="clusterSelector")

    @model_validator(mode="after")
    def _deletion(self) -> RayJobSpec:
        if not self.shutdown_after_job_finishes and self.ttl_seconds_after_finished > 0:
            raise ValueError(
                "ttlSecondsAfterFinished needs shutdownAfterJobFinishes (KubeRay ignores it)"
            )
        if (self.ray_cluster_spec is None) == (not self.cluster_selector):
            raise ValueError("set rayClusterSpec or clusterSelector, exactly one")
        return self


class RayCronJobSpec(_K8s):
    job_template: RayJobSpec = Field(alias="jobTemplate")
    schedule: str = Field(pattern=r"^(\S+\s+){4}\S+$", description="cron, five fields")
    time_zone: str | None = Field(default=None, alias="timeZone")
    suspend: bool | None = None


class _Object(_K8s):
    api_version: Literal["ray.io/v1"] = Field(alias="apiVersion")
    metadata: Metadata


class RayService(_Object):
    kind: Literal["RayService"]
    spec: RayServiceSpec


class RayJob(_Object):
    kind: Literal["RayJob"]
    spec: RayJobSpec


class RayCronJob(_Object):
    kind: Literal["RayCronJob"]
    spec: RayCronJobSpec


KubeRayManifest = RayService | RayJob | RayCronJob

_KINDS: dict[str, type[RayService] | type[RayJob] | type[RayCronJob]] = {
    "RayService": RayService,
    "RayJob": RayJob,
    "RayCronJob": RayCronJob,
}


def parse_manifest(document: dict[str, Any]) -> KubeRayManifest:
    """One KubeRay object (a parsed YAML document), validated by its kind.

    Raises:
        ValueError: Not a KubeRay object we model, or a field that v1.7 does not have.
    """
    kind = document.get("kind")
    model = _KINDS.get(str(kind))
    if model is None:
        raise ValueError(f"not a KubeRay RayService, RayJob or RayCronJob: kind {kind!r}")
    return model.model_validate(document)
