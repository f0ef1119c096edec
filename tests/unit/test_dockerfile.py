"""The container image recipe, checked statically (parsed by dockerfile-parse); tests/integration/test_image.py
builds and runs it."""

from __future__ import annotations

import re
from pathlib import Path

from dockerfile_parse import DockerfileParser
from vllm_triage.config import DEFAULT_PORT

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    return [(i["instruction"], i["value"]) for i in parser.structure]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (name, _) in enumerate(steps) if name == "FROM")
    return steps[last_from:]


def test_the_published_image_is_slim_python_running_as_a_numeric_non_root_user():
    """The base is an ARG (tests/integration/test_image.py builds on a locally made Debian); its default is
    the published image's base."""
    base = next(value for name, value in instructions() if name == "ARG" and value.startswith("BASE="))
    assert re.fullmatch(r"BASE=python:3\.\d+-slim", base)
    stage = final_stage()
    assert stage[0][1] == "${BASE}"
    users = [value for name, value in stage if name == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*:[1-9]\d*", users[-1])  # numeric: runAsNonRoot can verify it


def test_py_spy_gets_the_ptrace_file_capability_and_the_package_is_installed():
    built = " ".join(value for name, value in instructions() if name == "RUN")
    final = " ".join(value for name, value in final_stage() if name == "RUN")
    assert "pip install" in built and "setcap cap_sys_ptrace+ep /opt/vllm-triage/bin/py-spy" in final


def test_healthcheck_and_port_match_the_sidecar_defaults():
    stage = dict((name, value) for name, value in final_stage() if name in ("EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD"))
    assert stage["EXPOSE"] == str(DEFAULT_PORT)
    assert f"127.0.0.1:{DEFAULT_PORT}/healthz" in stage["HEALTHCHECK"]
    assert stage["ENTRYPOINT"] == '["vllm-triage"]' and stage["CMD"] == '["serve"]'


def test_everything_copied_into_the_build_exists_and_passes_dockerignore():
    ignore = (ROOT / ".dockerignore").read_text().split()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for name, value in instructions():
        if name == "COPY" and "--from" not in value:
            *sources, _ = value.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") in allowed, f"{source} is excluded by .dockerignore"


def test_the_release_workflow_publishes_the_image_the_chart_points_at_for_two_architectures():
    """.github/workflows/release.yml, checked statically (no runner here): on a version tag, after the
    tests, a linux/amd64 + linux/arm64 image and the chart as an OCI artifact, both at the tag's version."""
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    assert workflow[True]["push"]["tags"] == ["v*.*.*"]  # YAML 1.1 reads the key `on` as true
    publish = workflow["jobs"]["publish"]
    assert publish["needs"] == "test" and "make test" in workflow["jobs"]["test"]["steps"][-1]["run"]
    steps = {step.get("uses", "").split("@")[0]: step for step in publish["steps"]}
    build = steps["docker/build-push-action"]["with"]
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"} and build["push"] is True
    values = yaml.safe_load((ROOT / "helm" / "vllm-triage" / "values.yaml").read_text())
    registry, _, path = values["image"]["repository"].partition("/")
    assert build["tags"].startswith("${{ env.REGISTRY }}/") and publish["env"]["REGISTRY"] == registry and build["tags"].split(":")[0].endswith("/vllm-triage")
    assert path.endswith("/vllm-triage")
    chart = next(step["run"] for step in publish["steps"] if "helm push" in step.get("run", ""))
    assert "--app-version" in chart and "oci://" in chart
