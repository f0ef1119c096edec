"""The Helm chart, rendered by Helm's own engine (helm-python-sdk) and checked against Kubernetes'
schemas (kubernetes-validate), promtool and the sidecar's own config loader."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import helm_python
import kubernetes_validate
import promql_parser
import pytest
import yaml
from vllm_triage import cli
from vllm_triage.catalog import GilOptions, GpuOptions

from mixin import rules as mixin
from mixin.dashboards import DASHBOARDS
from mixin.generate import RULES_FILE

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "vllm-triage"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
KUBERNETES = kubernetes_validate.latest_version()


def render(values: dict | None = None, chart: Path = CHART, name: str = "llm", namespace: str = "inference") -> list[dict]:
    """Every object the chart renders, hooks included, as helm template would print them."""
    manifests = helm_python.Chart.load(str(chart)).render(values or {}, name=name, namespace=namespace)
    objects = []
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def ci_values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text()) or {}


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and "helm.sh/hook" not in o["metadata"].get("annotations", {})]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def containers(deployment: dict) -> dict[str, dict]:
    pod = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def sidecar_config(container: dict, objects: list[dict], tmp_path: Path):
    """The sidecar's own parser and config loader accept what the chart passes it."""
    args = cli._parser().parse_args(container["args"])
    if args.config:
        (config_file,) = [o["data"]["config.yaml"] for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o["data"]]
        path = tmp_path / "config.yaml"
        path.write_text(config_file)
        args.config = str(path)
    return cli._config(args)


@pytest.mark.parametrize("values_file", [None, *CI_VALUES], ids=lambda p: p.stem if p else "defaults")
@pytest.mark.parametrize("kube_version", ["v1.28.0", "v1.33.0"])
def test_chart_lints_clean_in_strict_mode(values_file, kube_version):
    values = yaml.safe_load(values_file.read_text()) if values_file else None
    report = helm_python.lint(str(CHART), values, strict=True, kube_version=kube_version)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("values_file", CI_VALUES, ids=lambda p: p.stem)
def test_every_ci_value_set_renders_valid_kubernetes_objects(values_file):
    objects = render(yaml.safe_load(values_file.read_text()))
    core = [o for o in objects if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {o["kind"] for o in core} >= {"Deployment", "Service", "ServiceAccount", "Pod"}
    for manifest in core:
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)


def test_default_is_vllm_with_a_plain_sidecar_and_no_added_capability(tmp_path):
    objects = render(ci_values("default"))
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    vllm, sidecar = pod["containers"]
    assert vllm["name"] == "vllm" and vllm["args"][0] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    # CPU and memory requested (a starved engine core starves the GPU; BestEffort is evicted first); no CPU limit (throttling)
    assert vllm["resources"]["requests"].keys() >= {"cpu", "memory"} and "cpu" not in vllm["resources"]["limits"]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= vllm.keys()
    assert sidecar["name"] == "vllm-triage" and "restartPolicy" not in sidecar
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"] and security["seccompProfile"]["type"] == "RuntimeDefault"
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert pod["automountServiceAccountToken"] is False
    # The host view is on: the sidecar reads vLLM's processes in /proc, which needs the shared namespace and no capability
    assert pod["shareProcessNamespace"] is True
    assert restricted_violations(pod, only="vllm-triage") == []
    config = sidecar_config(sidecar, objects, tmp_path)
    assert config.vllm_url == "http://127.0.0.1:8000" and config.sources == ("vllm", "process", "gpu")
    assert config.max_num_seqs is None  # read from vLLM's command line, else vLLM's default on that GPU (said in the evidence)
    # A model load within the pod's startup probe budget is starting, not unreachable, whether the host view sees vLLM or not
    unreachable = config.conditions["vllm_unreachable"].thresholds
    assert config.vllm_startup_seconds == 1800 == unreachable["startup_grace_seconds"] == unreachable["startup_grace_no_process_seconds"]
    assert unreachable["not_started_seconds"] == 150  # no vLLM process at all still pages in minutes
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
        # the downward API: with gpu_source dcgm, the GPUs dcgm-exporter attributes to this pod
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }


def test_the_sidecars_security_context_is_overridable_for_openshifts_restricted_scc():
    """OpenShift's restricted SCC assigns the user: the fixed 10001 must go (null removes a default); what is set is kept,
    and the profiler still adds SYS_PTRACE to what the user wrote."""
    values = {"triage": {"securityContext": {"runAsUser": None, "runAsGroup": None, "capabilities": {"drop": ["ALL", "NET_RAW"]}}}}
    security = containers(one(render(values), "Deployment"))["vllm-triage"]["securityContext"]
    assert "runAsUser" not in security and "runAsGroup" not in security and security["runAsNonRoot"] is True
    assert security["capabilities"] == {"drop": ["ALL", "NET_RAW"]} and security["allowPrivilegeEscalation"] is False
    profiled = containers(one(render({**values, "profiler": {"enabled": True}}), "Deployment"))["vllm-triage"]["securityContext"]
    assert profiled["capabilities"] == {"drop": ["ALL", "NET_RAW"], "add": ["SYS_PTRACE"]} and profiled["allowPrivilegeEscalation"] is True


def test_profiler_adds_ptrace_and_the_shared_process_namespace_and_nothing_to_vllm(tmp_path):
    objects = render(ci_values("profiler"))
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    by_name = containers(deployment)
    assert pod["shareProcessNamespace"] is True
    assert by_name["vllm-triage"]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert "securityContext" not in by_name["vllm"]  # vLLM's container is left as the image wants it
    config = sidecar_config(by_name["vllm-triage"], objects, tmp_path)
    assert config.sources == ("vllm", "process", "gpu", "gil") and config.options(GilOptions).gil_interval_seconds == 30
    assert list(config.options(GpuOptions).gpus or ()) == ["GPU-5d3f0a8e-1c2b-4b8e-9f1a-2f6c1e7d9a01", "GPU-8b2c4d6e-3f5a-4c7b-8d9e-0a1b2c3d4e02"]
    assert config.conditions["kv_cache_saturated"].for_seconds == 60  # the ConfigMap reached the sidecar
    endpoints = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert {e["port"]: e["relabelings"][0]["replacement"] for e in endpoints} == {"http": "vllm", "triage": "vllm-triage"}


@pytest.mark.parametrize("values", [{}, ci_values("profiler"), {"triage": {"nativeSidecar": True}}], ids=["defaults", "profiler", "native"])
def test_the_sidecar_can_neither_hold_vllm_back_nor_take_its_pod_out_of_service(values):
    """No startup or readiness probe on the sidecar beside vLLM (its liveness restarts only itself), and
    a changed triage.config changes the ConfigMap only: the pod template, hence vLLM, stays as it is."""
    objects = render(values)
    sidecar = containers(one(objects, "Deployment"))["vllm-triage"]
    assert "startupProbe" not in sidecar and "readinessProbe" not in sidecar and sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    tuned = render({**values, "triage": {**values.get("triage", {}), "config": {"conditions": {"kv_cache_saturated": {"usage_min": 0.7}}}}})
    retuned = render({**values, "triage": {**values.get("triage", {}), "config": {"conditions": {"kv_cache_saturated": {"usage_min": 0.9}}}}})
    assert one(tuned, "Deployment") == one(retuned, "Deployment")
    assert [o["data"] for o in tuned if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})] != [
        o["data"] for o in retuned if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})
    ]


def test_the_memory_limit_holds_the_sidecar_at_its_engine_bound():
    """The limit covers what the sidecar was measured to use at the default max_engines (docs/measurements.md: 123 MB
    at 32 engines), with room: the bound on the page is what bounds the memory."""
    from vllm_triage.config import OPTIONS_BY_KEY

    limit = containers(one(render({}), "Deployment"))["vllm-triage"]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi") and int(limit[:-2]) * 2**20 >= 1.5 * 123e6
    assert OPTIONS_BY_KEY["max_engines"].default == 32
    assert "123 MB at 32" in (CHART / "values.yaml").read_text()


def test_standalone_the_sidecar_is_ready_only_once_it_has_judged():
    sidecar = containers(one(render(ci_values("standalone")), "Deployment"))["vllm-triage"]
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz" and "startupProbe" not in sidecar


# Pod Security Standards, "restricted" (Kubernetes 1.25+), as its admission controller applies them to a pod.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
}


def restricted_violations(pod: dict, only: str | None = None) -> list[str]:
    """What Pod Security "restricted" refuses in a pod spec: the pod's own fields, and each container's (`only`: that
    container's alone, with the pod's). shareProcessNamespace is not among them (the standard admits it)."""
    problems = [key for key in ("hostNetwork", "hostPID", "hostIPC", "hostUsers") if pod.get(key) is (key != "hostUsers")]
    problems += [f"volume {v['name']}: {sorted(set(v) - {'name'})}" for v in pod.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod_security = pod.get("securityContext", {})
    problems += [f"sysctl {s['name']}" for s in pod_security.get("sysctls", []) if s["name"] not in SAFE_SYSCTLS]
    if pod_security.get("runAsUser") == 0:
        problems.append("pod: runAsUser 0")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if only is not None and c["name"] != only:
            continue
        security = c.get("securityContext", {})
        if security.get("privileged"):
            problems.append(f"{c['name']}: privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: privilege escalation allowed")
        if not security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) or security.get("runAsUser") == 0:
            problems.append(f"{c['name']}: may run as root")
        profile = security.get("seccompProfile", pod_security.get("seccompProfile", {})).get("type")
        if profile not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{c['name']}: seccomp {profile}")
        capabilities = security.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{c['name']}: capabilities {capabilities}")
        if any("hostPort" in p for p in c.get("ports", [])):
            problems.append(f"{c['name']}: hostPort")
        if security.get("procMount", "Default") != "Default":
            problems.append(f"{c['name']}: procMount")
        if security.get("appArmorProfile", {}).get("type") == "Unconfined":
            problems.append(f"{c['name']}: AppArmor unconfined")
        if security.get("seLinuxOptions", {}).get("type") not in (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
            problems.append(f"{c['name']}: SELinux type")
    return problems


def test_the_restricted_check_refuses_what_pod_security_refuses():
    """The check above is no formality: each field the standard refuses is named."""
    pod = {
        "containers": [
            {
                "name": "c",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "runAsNonRoot": True,
                    "seccompProfile": {"type": "RuntimeDefault"},
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ]
    }
    assert restricted_violations({**pod, "shareProcessNamespace": True}) == []
    assert restricted_violations({**pod, "hostPID": True}) == ["hostPID"]
    assert restricted_violations({**pod, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}) == ["volume h: ['hostPath']"]
    ptrace = {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    container = pod["containers"][0]
    assert restricted_violations({"containers": [{**container, "securityContext": {**container["securityContext"], "capabilities": ptrace}}]}) == [
        f"c: capabilities {ptrace}"
    ]
    assert restricted_violations({"containers": [{**container, "securityContext": {**container["securityContext"], "allowPrivilegeEscalation": True}}]}) == [
        "c: privilege escalation allowed"
    ]


@pytest.mark.parametrize("values_file", [None, *CI_VALUES], ids=lambda p: p.stem if p else "defaults")
def test_the_sidecar_stays_within_pod_security_restricted_unless_the_profiler_is_on(values_file):
    """Every value set: the sidecar's container and the pod's own fields pass "restricted" (vLLM's container is as its
    image and values make it); only py-spy (SYS_PTRACE, privilege escalation for its file capability) leaves it."""
    values = yaml.safe_load(values_file.read_text()) if values_file else {}
    pod = one(render(values), "Deployment")["spec"]["template"]["spec"]
    problems = restricted_violations(pod, only="vllm-triage")
    if values.get("profiler", {}).get("enabled"):
        assert [p.split(" {")[0] for p in problems] == ["vllm-triage: privilege escalation allowed", "vllm-triage: capabilities"] and "SYS_PTRACE" in problems[
            1
        ]
    else:
        assert problems == []


def test_the_process_view_is_one_value_away_from_off(tmp_path):
    """triage.processView: false: no shared namespace, no process source; the start-up budget still reaches the sidecar."""
    objects = render({"triage": {"processView": False}})
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "shareProcessNamespace" not in pod
    config = sidecar_config(containers(one(objects, "Deployment"))["vllm-triage"], objects, tmp_path)
    assert config.sources == ("vllm", "gpu") and config.conditions["vllm_unreachable"].thresholds["startup_grace_no_process_seconds"] == 1800
    longer = render({"vllm": {"startupSeconds": 3600}})
    assert sidecar_config(containers(one(longer, "Deployment"))["vllm-triage"], longer, tmp_path).vllm_startup_seconds == 3600


@pytest.mark.parametrize("extra_args", [["--max-num-seqs=96"], ["--enforce-eager", "--max-num-seqs", "96"]])
def test_max_num_seqs_reaches_the_sidecar_without_the_profiler(extra_args, tmp_path):
    objects = render({"vllm": {"extraArgs": extra_args}})
    by_name = containers(one(objects, "Deployment"))
    assert sidecar_config(by_name["vllm-triage"], objects, tmp_path).max_num_seqs == 96
    assert by_name["vllm"]["args"][-len(extra_args) :] == extra_args


def test_standalone_watches_the_url_and_passes_restricted_pod_security(tmp_path):
    objects = render(ci_values("standalone"))
    deployment = one(objects, "Deployment")
    assert list(containers(deployment)) == ["vllm-triage"]
    assert restricted_violations(deployment["spec"]["template"]["spec"]) == []
    assert "shareProcessNamespace" not in deployment["spec"]["template"]["spec"]  # no vLLM in the pod: nothing to see
    test_pod = next(o for o in objects if o["kind"] == "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert restricted_violations(test_pod["spec"]) == []
    config = sidecar_config(containers(deployment)["vllm-triage"], objects, tmp_path)
    assert config.vllm_url == "http://vllm.inference.svc.cluster.local:8000" and config.sources == ("vllm",)
    assert [p["name"] for p in one(objects, "Service")["spec"]["ports"]] == ["triage"]
    assert [e["port"] for e in one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]] == ["triage"]
    assert all(c["metadata"]["namespace"] == "monitoring" for c in objects if c["kind"] == "ConfigMap")


def test_standalone_has_no_gpu_view_unless_asked_and_beside_vllm_it_has(tmp_path):
    """Standalone, the pod holds none of the remote vLLM's GPUs: the GPU view on by default gave a VllmTriageSourceDown
    that never cleared (or another pod's GPUs). triage.gpu.enabled: auto is on beside vLLM only."""
    url = "http://vllm.inference.svc.cluster.local:8000"
    for values, gpu in (
        ({"vllm": {"enabled": False, "url": url}}, False),
        ({"vllm": {"enabled": False, "url": url}, "triage": {"gpu": {"enabled": True}}}, True),
        ({}, True),
        ({"triage": {"gpu": {"enabled": False}}}, False),
    ):
        objects = render(values)
        sidecar = containers(one(objects, "Deployment"))["vllm-triage"]
        assert ("gpu" in sidecar_config(sidecar, objects, tmp_path).sources) is gpu, values
        assert ("NVIDIA_VISIBLE_DEVICES" in {e["name"] for e in sidecar.get("env", [])}) is gpu, values


def test_vllm_is_configurable_as_production_needs():
    """Probes, security contexts, priority, spread, envFrom, extra volumes: each value lands where Kubernetes reads it
    (ci/production-values.yaml, also linted and validated as Kubernetes objects with the other value sets)."""
    values = ci_values("production")
    pod = one(render(values), "Deployment")["spec"]["template"]["spec"]
    vllm = containers({"spec": {"template": {"spec": pod}}})["vllm"]
    assert vllm["envFrom"] == values["vllm"]["envFrom"] and vllm["securityContext"] == values["vllm"]["securityContext"]
    assert vllm["livenessProbe"] == values["vllm"]["probes"]["liveness"]
    assert vllm["startupProbe"]["failureThreshold"] == 180  # the chart's own where none is given
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in vllm["volumeMounts"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "models"}} in pod["volumes"]
    assert pod["securityContext"] == {"fsGroup": 1000} and pod["priorityClassName"] == "inference-critical"
    assert pod["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    assert pod["terminationGracePeriodSeconds"] == 600
    assert vllm["lifecycle"] == values["vllm"]["extraContainerSpec"]["lifecycle"]  # fields the chart does not set
    assert (pod["dnsPolicy"], pod["enableServiceLinks"]) == ("ClusterFirst", False)
    for extra, says in (
        ({"extraPodSpec": {"volumes": []}}, r"extraPodSpec\.volumes: the chart sets it"),
        ({"vllm": {"extraContainerSpec": {"resources": {}}}}, r"extraContainerSpec\.resources: the chart sets it"),
    ):
        with pytest.raises(helm_python.HelmError, match=says):
            render(extra)


def test_standalone_without_a_url_says_which_value_is_missing():
    with pytest.raises(helm_python.HelmError, match=r"vllm\.url is required"):
        render({"vllm": {"enabled": False}})


def test_before_kubernetes_1_29_the_sidecar_is_a_plain_container_and_no_operator_objects():
    objects = render(ci_values("plain-sidecar"))
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "initContainers" not in pod and [c["name"] for c in pod["containers"]] == ["vllm", "vllm-triage"]
    assert "restartPolicy" not in pod["containers"][1]
    assert not [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com/")]


def selectors_of(expr: str) -> list[promql_parser.VectorSelector]:
    """Every series selector of a PromQL expression, as Prometheus' parser reads it."""
    found: list[promql_parser.VectorSelector] = []
    promql_parser.walk(promql_parser.parse(expr), lambda node: found.append(node) if isinstance(node, promql_parser.VectorSelector) else None)
    return found


def test_monitoring_scrapes_both_under_the_job_names_the_alerts_use_and_ships_the_generated_rules(tmp_path):
    objects = render(ci_values("default"))
    monitor = one(objects, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    jobs = {e["port"]: e["relabelings"][0]["replacement"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert jobs == {"http": "vllm", "triage": "vllm-triage"}
    assert f'job="{jobs["http"]}"' == mixin.VLLM_JOB and f'job="{jobs["triage"]}"' == mixin.SIDECAR_JOB
    assert {e["relabelings"][1]["targetLabel"]: e["relabelings"][1]["replacement"] for e in monitor["spec"]["podMetricsEndpoints"]} == {
        "vllm_triage_release": "inference/llm"
    }
    rule = one(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    cluster = one(render({**ci_values("default"), "monitoring": {"prometheusRule": {"scope": "cluster"}}}), "PrometheusRule")
    assert cluster["spec"] == yaml.safe_load((ROOT / "alerts" / RULES_FILE).read_text())
    scoped = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    # every selector of every rule, as a PromQL parser reads it, asks for the release's own series: a rule that missed
    # one would judge another release's pods beside its own
    for r in scoped:
        selectors = selectors_of(r["expr"])
        assert selectors and all(("vllm_triage_release", "inference/llm") in {(m.name, m.value) for m in s.matchers.matchers} for s in selectors), r
    assert all(r["labels"] == {"vllm_triage_release": "inference/llm"} for r in scoped if "record" in r)
    if shutil.which("promtool"):
        for spec in (rule["spec"], cluster["spec"]):
            path = tmp_path / "rules.yml"
            path.write_text(yaml.safe_dump(spec))
            subprocess.run(["promtool", "check", "rules", str(path)], check=True, capture_output=True)


TUNED = {
    "monitoring": {
        "jobs": {"vllm": "inference/vllm", "triage": "inference/vllm-triage"},
        "prometheusRule": {
            "additionalRuleLabels": {"team": "inference"},
            "runbookUrlBase": "https://wiki.example.com/runbooks/vllm-triage/",
            "grafanaUrl": "https://grafana.example.com/",
            "disabledAlerts": ["VllmTriageGpuThrottled"],
            "for": {"VllmTriageTtftHigh": "10m"},
            "keepFiringFor": {"VllmTriageEngineWedged": "15m"},
            "severity": {"VllmTriageKvCacheSaturated": "critical"},
            "vllmThresholds": {"kvCacheUsageMean": 0.9, "ttftTargetSeconds": 1, "ttftObjective": 0.995},
        },
    }
}


def tuned_rule_tests(tests: dict, jobs: dict[str, str], tune: dict, release: str = "inference/llm") -> dict:
    """The generated promtool tests as the tuned rules of `release` must pass them: job names, the extra label, the
    runbook and dashboard URLs; the disabled alert's and the re-timed alert's cases left out. Every input series is
    this release's, and once more another release's (its pods named other-*): the alerts are this release's
    only, once each."""
    # per model, as the SLO burn alerts: aggregated by namespace and model, they carry no release label to expect
    left_out = {
        *tune["disabledAlerts"],
        *tune["for"],
        *tune["keepFiringFor"],
        *tune["severity"],
        "VllmTtftSloBurnFast",
        "VllmTtftSloBurnSlow",
        "VllmFleetSaturated",
    }
    groups = []
    for group in tests["tests"]:
        series = [
            {**s, "series": re.sub(r"^([^{]*)\{?", lambda m: f'{m.group(1)}{{vllm_triage_release="{release}",', s["series"], count=1).replace(",}", "}")}
            for s in group["input_series"]
        ] + [  # the other release's pods (other addresses)
            {
                **s,
                "series": re.sub(r"^([^{]*)\{?", lambda m: f'{m.group(1)}{{vllm_triage_release="inference/other",', s["series"], count=1)
                .replace(",}", "}")
                .replace('pod="', 'pod="other-')
                .replace('instance="10.0.', 'instance="10.9.'),
            }
            for s in group["input_series"]
        ]
        text = yaml.safe_dump(series)
        for default, job in (("vllm-triage", jobs["triage"]), ("vllm", jobs["vllm"])):
            text = text.replace(f'job=\\"{default}\\"', f'job=\\"{job}\\"').replace(f'job="{default}"', f'job="{job}"')
        cases = [case for case in group.get("alert_rule_test", []) if case["alertname"] not in left_out]
        for case in cases:
            for alert in case["exp_alerts"]:
                labels = alert["exp_labels"]
                if "job" in labels:
                    labels["job"] = {"vllm": jobs["vllm"], "vllm-triage": jobs["triage"]}[labels["job"]]
                labels.update(tune["additionalRuleLabels"], vllm_triage_release=release)
                annotations = alert["exp_annotations"]
                annotations["runbook_url"] = tune["runbookUrlBase"].rstrip("/") + "#" + annotations["runbook_url"].split("#")[1]
                where = f"var-namespace={labels.get('namespace', '')}&var-pod={labels.get('pod', '')}"
                annotations["dashboard_url"] = f"{tune['grafanaUrl'].rstrip('/')}/d/{release_uid('vllm-triage-overview')}?{where}"
        if cases:
            groups.append({**group, "input_series": yaml.safe_load(text), "alert_rule_test": cases})
    return {**tests, "tests": groups}


def test_an_sre_tunes_jobs_labels_urls_and_alerts_per_install_and_promtool_still_passes(tmp_path):
    objects = render(TUNED)
    tune, jobs = TUNED["monitoring"]["prometheusRule"], TUNED["monitoring"]["jobs"]
    endpoints = one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert {e["port"]: e["relabelings"][0]["replacement"] for e in endpoints} == {"http": jobs["vllm"], "triage": jobs["triage"]}
    spec = one(objects, "PrometheusRule")["spec"]
    alerts = {r["alert"]: r for g in spec["groups"] for r in g["rules"] if "alert" in r}
    default_spec = one(render({"monitoring": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")["spec"]
    default_alerts = {r["alert"] for g in default_spec["groups"] for r in g["rules"] if "alert" in r}
    assert "VllmTriageGpuThrottled" not in alerts and set(alerts) == default_alerts - {"VllmTriageGpuThrottled"}
    assert alerts["VllmTriageTtftHigh"]["for"] == "10m"
    kv = alerts["VllmKvCacheFull"]["expr"]
    assert ">= 0.9 and" in kv and ">= 0.8 and" not in kv and ">= 0.99 and" in kv  # the mean tuned, the peak as generated
    assert alerts["VllmTriageEngineWedged"]["keep_firing_for"] == "15m" and alerts["VllmTriageKvCacheSaturated"]["labels"]["severity"] == "critical"
    # the TTFT SLO tuned: its target bucket in every recorded window, its objective in both burn alerts; ITL's untouched
    records = {r["record"]: r["expr"] for g in spec["groups"] for r in g["rules"] if "record" in r}
    ttft = [expr for name, expr in records.items() if "_ttft_slo_" in name]
    assert len(ttft) == 7 and all('le=~"1([.]0)?"' in expr and "2.5" not in expr for expr in ttft)
    assert all("(1 - 0.995)" in alerts[a]["expr"] and "(1 - 0.99)" not in alerts[a]["expr"] for a in ("VllmTtftSloBurnFast", "VllmTtftSloBurnSlow"))
    assert "(1 - 0.99)" in alerts["VllmItlSloBurnFast"]["expr"]
    assert all(a["labels"]["team"] == "inference" for a in alerts.values())
    assert all(a["annotations"]["runbook_url"].startswith("https://wiki.example.com/runbooks/vllm-triage#vllm") for a in alerts.values())
    mine = 'vllm_triage_release="inference/llm"'
    assert alerts["VllmTargetDown"]["expr"] == (
        f'up{{{mine}, job="inference/vllm"}} == 0 and on (namespace, pod) (vllm_triage_vllm_starting{{{mine}}} == 0 or '
        f'max_over_time(up{{{mine}, job="inference/vllm"}}[1h]) == 1 unless on (namespace, pod) vllm_triage_vllm_starting{{{mine}}})'
    )
    assert alerts["VllmTriageDown"]["expr"] == f'up{{{mine}, job="inference/vllm-triage"}} == 0'
    overview = release_uid("vllm-triage-overview")
    assert f"{overview}.json" in shipped_dashboards(objects)  # the alert links to this release's own dashboard
    shown = f"https://grafana.example.com/d/{overview}?var-namespace={{{{ $labels.namespace }}}}&var-pod={{{{ $labels.pod }}}}"
    assert alerts["VllmTriageKvCacheSaturated"]["annotations"]["dashboard_url"] == shown
    if not shutil.which("promtool"):
        pytest.skip("promtool not installed (make prometheus-tools)")
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(spec))
    tests = yaml.safe_load((ROOT / "alerts" / "vllm-triage.rules.test.yml").read_text())
    (tmp_path / "tuned.test.yml").write_text(yaml.safe_dump(tuned_rule_tests(tests, jobs, tune)))
    subprocess.run(["promtool", "check", "rules", str(tmp_path / RULES_FILE)], check=True, capture_output=True)
    result = subprocess.run(["promtool", "test", "rules", "tuned.test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def release_uid(uid: str, release: str = "inference/llm") -> str:
    return f"{uid}-{hashlib.sha256(release.encode()).hexdigest()[:8]}"


def shipped_dashboards(objects: list[dict]) -> dict[str, dict]:
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    return {key: json.loads(text) for m in maps for key, text in m["data"].items()}


def test_tls_basic_auth_and_a_network_policy_that_admits_only_prometheus_and_the_helm_test(tmp_path):
    values = {
        "triage": {"webConfig": {"secretName": "triage-web", "tls": True}},
        "monitoring": {"triageEndpoint": {"scheme": "https", "tlsConfig": {"ca": {"secret": {"name": "triage-web", "key": "ca.crt"}}}}},
        "networkPolicy": {"enabled": True, "prometheusNamespace": "observability"},
    }
    objects = render(values)
    for manifest in objects:
        if not manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    deployment = one(objects, "Deployment")
    sidecar = containers(deployment)["vllm-triage"]
    assert sidecar_config(sidecar, objects, tmp_path).web_config_file == "/etc/vllm-triage-web/web.yml"
    assert {"name": "vllm-triage-web", "mountPath": "/etc/vllm-triage-web", "readOnly": True} in sidecar["volumeMounts"]
    assert {"name": "vllm-triage-web", "secret": {"secretName": "triage-web"}} in deployment["spec"]["template"]["spec"]["volumes"]
    assert sidecar["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    endpoints = {e["port"]: e for e in one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]}
    assert endpoints["triage"]["scheme"] == "https" and "scheme" not in endpoints["http"]
    ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
    by_port = {rule["ports"][0]["port"]: rule for rule in ingress}
    assert by_port["triage"]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}},
        {"podSelector": {"matchLabels": {"vllm-triage.io/helm-test": "true"}}},  # this chart's `helm test` pod
    ]
    assert "from" not in by_port["http"]  # vLLM's clients are not cut off
    assert not [o for o in render({}) if o["kind"] == "NetworkPolicy"]


def test_dashboards_ship_as_configmaps_grafana_picks_up_under_this_releases_uids():
    """The generated dashboards, each under a uid, title and file name of its own release."""
    shipped = shipped_dashboards(render(ci_values("default")))
    expected = {}
    for name in DASHBOARDS:
        text = (ROOT / "dashboards" / name).read_text()
        text = text.replace('cluster=~\\"$cluster\\"', 'cluster=~\\"$cluster\\",vllm_triage_release=\\"inference/llm\\"')
        text = text.replace(
            "label_values(vllm_triage_build_info, cluster)", 'label_values(vllm_triage_build_info{vllm_triage_release=\\"inference/llm\\"}, cluster)'
        )
        dashboard = json.loads(text)
        uid = release_uid(dashboard["uid"])
        expected[f"{uid}.json"] = {**dashboard, "uid": uid, "title": f"{dashboard['title']} (inference/llm)"}
    assert shipped == expected


def dashboard_selectors(dashboard: dict) -> list[str]:
    """Every series selector of a dashboard's queries and variables."""
    queries: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    queries.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return [selector for query in queries if query != "prometheus" for selector in re.findall(r"\{[^{}]*\}", query) or [query]]


def test_each_release_s_dashboards_select_only_its_own_pods():
    """Per-release dashboards once showed every release's pods: in release scope every selector asks for the release's
    label (the one its scrape object puts on every series, and its recording rules write); in cluster scope none does."""
    for name in ("llm-a", "llm-b"):
        for dashboard in shipped_dashboards(render(name=name)).values():
            selectors = dashboard_selectors(dashboard)
            assert selectors and all(f'vllm_triage_release="inference/{name}"' in s for s in selectors), dashboard["title"]
    cluster = {"monitoring": {"prometheusRule": {"scope": "cluster"}}}
    for dashboard in shipped_dashboards(render(cluster)).values():
        assert not [s for s in dashboard_selectors(dashboard) if "vllm_triage_release" in s]


def test_two_releases_share_no_dashboard_so_uninstalling_one_removes_nothing_the_other_shows():
    first = [o for o in render(name="llm-a") if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]]
    second = [o for o in render(name="llm-b") if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]]
    assert len(first) == len(second) == len(DASHBOARDS)
    assert not {o["metadata"]["name"] for o in first} & {o["metadata"]["name"] for o in second}
    assert not {key for o in first for key in o["data"]} & {key for o in second for key in o["data"]}  # Grafana's sidecar's file names
    uids = [{json.loads(text)["uid"] for o in objects for text in o["data"].values()} for objects in (first, second)]
    assert not uids[0] & uids[1]


def test_incident_bundles_go_on_a_volume_of_their_own_an_emptydir_unless_a_claim_is_given():
    """The sidecar writes a critical verdict's bundle under /var/lib/vllm-triage/bundles (--bundle-dir): on an
    emptyDir by default (96Mi), which outlives a restart of a container; on a PVC by value; nowhere when turned off."""

    def bundles(values: dict) -> tuple[list[str], list[dict], list[dict]]:
        deployment = next(o for o in render(values) if o["kind"] == "Deployment")
        sidecar = containers(deployment)["vllm-triage"]
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        mounts = [m for m in sidecar["volumeMounts"] if m["name"] == "vllm-triage-bundles"]
        return [a for a in sidecar["args"] if a.startswith("--bundle-dir")], mounts, [v for v in volumes if v["name"] == "vllm-triage-bundles"]

    assert bundles({}) == (
        ["--bundle-dir=/var/lib/vllm-triage/bundles"],
        [{"name": "vllm-triage-bundles", "mountPath": "/var/lib/vllm-triage/bundles"}],
        [{"name": "vllm-triage-bundles", "emptyDir": {"sizeLimit": "96Mi"}}],
    )
    # the kubelet evicts the whole pod, vLLM included, past an emptyDir's limit: it holds every kept bundle, the one being
    # written and the envelope file at their bounds
    from vllm_triage import bundle, envelope

    assert (bundle.KEEP_BUNDLES + 1) * bundle.MAX_BUNDLE_BYTES + envelope.STATE_BYTES_MAX <= 96 * 2**20
    claim = {"triage": {"bundles": {"volume": {"persistentVolumeClaim": {"claimName": "vllm-incidents"}}}}}
    assert bundles(claim)[2] == [{"name": "vllm-triage-bundles", "persistentVolumeClaim": {"claimName": "vllm-incidents"}}]
    assert bundles({"triage": {"bundles": {"enabled": False}}}) == ([], [], [])
    with pytest.raises(helm_python.HelmError, match="volume"):
        render({"triage": {"bundles": {"volume": {"emptyDir": {}, "hostPath": {"path": "/x"}}}}})


def test_the_fleet_dashboard_is_rendered_once_for_the_cluster_by_the_release_that_asks():
    """Every release rendered its own fleet board, one per release in Grafana's list: with `fleet: cluster` one release
    renders it over every release's pods under the generated uid and name; the others set `none`."""
    fleet = json.loads((ROOT / "dashboards" / "vllm-triage-fleet.json").read_text())
    owner = shipped_dashboards(render({"monitoring": {"dashboards": {"fleet": "cluster"}}}, name="llm-a"))
    others = shipped_dashboards(render({"monitoring": {"dashboards": {"fleet": "none"}}}, name="llm-b"))
    boards = [d for d in [*owner.values(), *others.values()] if d["title"].startswith(fleet["title"])]
    assert boards == [fleet]  # once, as generated: its uid and title, and no release in any selector
    assert not [s for s in dashboard_selectors(boards[0]) if "vllm_triage_release" in s]
    assert owner["vllm-triage-fleet.json"] == fleet
    assert len(owner) == len(DASHBOARDS) and len(others) == len(DASHBOARDS) - 1  # the other boards stay per release
    assert all("vllm_triage_release" in s for d in others.values() for s in dashboard_selectors(d))
    names = [o["metadata"]["name"] for o in render({"monitoring": {"dashboards": {"fleet": "cluster"}}}, name="llm-a") if o["kind"] == "ConfigMap"]
    assert "vllm-triage-fleet" in names  # a second release asking for it fails to install: the object is the first's
    with pytest.raises(helm_python.HelmError, match="fleet"):
        render({"monitoring": {"dashboards": {"fleet": "everywhere"}}})


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"vllm": {"enabeld": False}}, "enabeld"),
        ({"triage": {"nativeSidecar": "yes"}}, "nativeSidecar"),
        ({"profiler": {"rate": 0}}, "rate"),
        # the sidecar's own config, checked by its schema (generated from the options table) at helm install
        ({"triage": {"config": {"scrape_intervall_seconds": 1}}}, "scrape_intervall_seconds"),
        ({"triage": {"config": {"scrape_interval_seconds": "fast"}}}, "scrape_interval_seconds"),
        ({"triage": {"config": {"log_level": "verbose"}}}, "log_level"),
        ({"triage": {"config": {"conditions": {"kv_cache_saturatd": {"usage_min": 0.7}}}}}, "kv_cache_saturatd"),
        ({"triage": {"config": {"conditions": {"kv_cache_saturated": {"usage_mni": 0.7}}}}}, "usage_mni"),
        ({"triage": {"config": {"conditions": {"kv_cache_saturated": {"usage_min": 1.7}}}}}, "usage_min"),
        # alert tuning names alerts that exist: a typo would render and do nothing
        ({"monitoring": {"prometheusRule": {"for": {"VllmTriageTypo": "10m"}}}}, "VllmTriageTypo"),
        ({"monitoring": {"prometheusRule": {"disabledAlerts": ["VllmKvCacheFul"]}}}, "disabledAlerts"),
        ({"monitoring": {"prometheusRule": {"vllmThresholds": {"kvCacheUsage": 0.9}}}}, "kvCacheUsage"),
        ({"monitoring": {"prometheusRule": {"vllmThresholds": {"kvCacheUsageMean": 90}}}}, "kvCacheUsageMean"),
    ],
)
def test_schema_rejects_typos_and_bad_values_naming_the_key(values, names):
    with pytest.raises(helm_python.HelmError, match=names):
        render(values)


def test_the_alertmanager_config_carries_the_examples_inhibit_rules():
    """One page per incident in a cluster run by prometheus-operator: the same inhibit rules as the Alertmanager example,
    on by default as the chart's PodMonitor and PrometheusRule, and off on request."""
    assert one(render(), "AlertmanagerConfig")["spec"]["inhibitRules"]
    assert not [o for o in render({"monitoring": {"alertmanagerConfig": {"enabled": False}}}) if o["kind"] == "AlertmanagerConfig"]
    config = one(render({"monitoring": {"alertmanagerConfig": {"enabled": True, "labels": {"alertmanager": "main"}}}}), "AlertmanagerConfig")
    assert config["apiVersion"] == "monitoring.coreos.com/v1alpha1" and config["metadata"]["labels"]["alertmanager"] == "main"
    example = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yml").read_text())["inhibit_rules"]

    def as_strings(matchers: list[dict]) -> list[str]:
        return [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in matchers]

    rendered = [
        {"source_matchers": as_strings(r["sourceMatch"]), "target_matchers": as_strings(r["targetMatch"]), "equal": r["equal"]}
        for r in config["spec"]["inhibitRules"]
    ]
    assert rendered == example


def test_one_scrape_object_at_a_time():
    """A PodMonitor and a ServiceMonitor together scrape everything twice and double every alert: refused, saying which to turn off."""
    with pytest.raises(helm_python.HelmError, match="both enabled"):
        render({"monitoring": {"serviceMonitor": {"enabled": True}}})
    assert one(render({"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": False}}}), "ServiceMonitor")


def test_two_releases_judge_their_own_pods_and_rules_without_the_charts_scrape_objects_must_say_cluster():
    """Release-scoped rules select the label only this chart's scrape objects put on the series: without them the rules
    would judge nothing, silently; refused, saying what to do. With scope cluster they render (for scrape configs of
    one's own). The promtool side (another release's pods fire nothing here) is in the tuning test above."""
    no_monitor = {"monitoring": {"podMonitor": {"enabled": False}}}
    with pytest.raises(helm_python.HelmError, match="set scope: cluster"):
        render(no_monitor)
    cluster = one(render({"monitoring": {"podMonitor": {"enabled": False}, "prometheusRule": {"scope": "cluster"}}}), "PrometheusRule")
    assert not any(
        "vllm_triage_release" in r["expr"] or ("labels" in r and "vllm_triage_release" in r["labels"]) for g in cluster["spec"]["groups"] for r in g["rules"]
    )
    first, second = (one(render(name=name), "PrometheusRule")["spec"] for name in ("llm", "chat"))
    assert first != second and 'vllm_triage_release="inference/chat"' in yaml.safe_dump(second) and "inference/llm" not in yaml.safe_dump(second)


def test_the_documented_snippet_adds_the_sidecar_to_another_chart(tmp_path):
    """The chart README's snippet, pasted into a parent chart that lists this one as a dependency: with a config and the
    GPUs file, every mount has its volume, the config reaches the sidecar, and vLLM's container lists its GPUs."""
    readme = (CHART / "README.md").read_text()
    chart_yaml, deployment_part, config_part = re.findall(r"```yaml\n(.*?)```", readme, re.S)[-3:]
    parent = tmp_path / "my-vllm"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "vllm-triage")
    meta, values = chart_yaml.split("# values.yaml\n")
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: my-vllm\nversion: 1.0.0\n" + meta.replace("file://../vllm-triage", "file://charts/vllm-triage"))
    (parent / "values.yaml").write_text(values)
    pod = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: mine}\nspec:\n  selector: {matchLabels: {app: mine}}\n  template:\n"
    pod += "    metadata: {labels: {app: mine}}\n    spec:\n"
    body = deployment_part.split("\n", 1)[1].replace("          # ... your vLLM container, serving on port 8000\n", "          image: vllm/vllm-openai\n")
    (parent / "templates" / "deployment.yaml").write_text(pod + body)
    (parent / "templates" / "vllm-triage-config.yaml").write_text(config_part.split("\n", 1)[1])
    objects = render({}, chart=parent, name="mine")
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "Deployment"]  # templatesOnly: none of the chart's own objects
    deployment = one(objects, "Deployment")
    kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
    by_name = containers(deployment)
    assert by_name["vllm-triage"]["image"] == "ghcr.io/vllm-triage/vllm-triage:0.1.0"
    assert "--vllm-url=http://127.0.0.1:8000" in by_name["vllm-triage"]["args"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"] for c in by_name.values() for m in c.get("volumeMounts", [])}
    assert mounts <= volumes.keys(), mounts - volumes.keys()  # every mount has its volume
    assert volumes["vllm-triage-config"]["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"] == "mine-vllm-triage"
    config = sidecar_config(by_name["vllm-triage"], objects, tmp_path)
    assert config.conditions["kv_cache_saturated"].for_seconds == 60 and config.options(GpuOptions).gpus_file == "/run/vllm-triage/gpus"
    # the host view, as in this chart's own pods: the shared namespace, the process source, the start-up budget
    assert deployment["spec"]["template"]["spec"]["shareProcessNamespace"] is True and "process" in config.sources
    assert config.vllm_startup_seconds == 1800 and restricted_violations(deployment["spec"]["template"]["spec"], only="vllm-triage") == []
    assert by_name["vllm"]["command"][:2] == ["/bin/sh", "-c"] and by_name["vllm"]["command"][-2:] == ["vllm", "serve"]
    # with monitoringOnly in place of templatesOnly (the paragraph after the snippet), the parent gets scraping, rules and
    # dashboards over its own pods, and still no workload of this chart's
    watched = {"vllm-triage": {"templatesOnly": False, "monitoringOnly": {"enabled": True, "podSelector": {"app": "mine"}}}}
    objects = render(watched, chart=parent, name="mine")
    assert {o["kind"] for o in objects} == {"Deployment", "ConfigMap", "PodMonitor", "PrometheusRule", "AlertmanagerConfig"}
    assert one(objects, "Deployment")["metadata"]["name"] == "mine"
    monitor = one(objects, "PodMonitor")["spec"]
    assert monitor["selector"] == {"matchLabels": {"app": "mine"}} and [e["port"] for e in monitor["podMetricsEndpoints"]] == ["http", "triage"]
    # a config without its ConfigMap fails the install with the advice, not an invalid pod
    (parent / "templates" / "vllm-triage-config.yaml").unlink()
    (parent / "templates" / "deployment.yaml").write_text(pod + body.replace(' "configMap" (printf "%s-vllm-triage" .Release.Name)', ""))
    with pytest.raises(helm_python.HelmError, match=r"pass .configMap. \(a name\)"):
        render({}, chart=parent, name="mine")


def test_vllms_container_tells_the_sidecar_its_gpus_through_a_shared_file(tmp_path):
    objects = render({"vllm": {"command": ["echo", "serve"]}})
    by_name = containers(one(objects, "Deployment"))
    vllm, sidecar = by_name["vllm"], by_name["vllm-triage"]
    config = sidecar_config(sidecar, objects, tmp_path)
    assert config.options(GpuOptions).gpus_file == "/run/vllm-triage/gpus" and config.options(GpuOptions).gpus is None
    mounts = {c: {m["name"]: m for m in by_name[c]["volumeMounts"]} for c in by_name}
    assert mounts["vllm"]["vllm-triage-run"]["mountPath"] == mounts["vllm-triage"]["vllm-triage-run"]["mountPath"] == "/run/vllm-triage"
    assert mounts["vllm-triage"]["vllm-triage-run"]["readOnly"] is True
    # Run the container's command line with sh, as the container would: the GPU list lands in the file
    # (a stand-in nvidia-smi prints what the real one prints), then the image's command runs with its args.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\nprintf 'GPU-5d3f0a8e-1c2b\\nGPU-8b2c4d6e-3f5a\\n'\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    command = [part.replace("/run/vllm-triage", str(tmp_path)) for part in vllm["command"] + vllm["args"]]
    result = subprocess.run(command, capture_output=True, text=True, env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, check=True)
    assert result.stdout.split() == ["serve", *vllm["args"]]
    assert (tmp_path / "gpus").read_text().split() == ["GPU-5d3f0a8e-1c2b", "GPU-8b2c4d6e-3f5a"]
    without_smi = subprocess.run(command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert without_smi.returncode == 0 and without_smi.stdout.split()[0] == "serve"  # vLLM starts regardless


@pytest.mark.parametrize("gpu", [{"devices": ["GPU-5d3f0a8e"]}, {"enabled": False}, {"fromVllmContainer": False}])
def test_no_gpu_file_when_the_gpus_are_listed_or_the_view_is_off(gpu, tmp_path):
    objects = render({"triage": {"gpu": gpu}})
    by_name = containers(one(objects, "Deployment"))
    assert by_name["vllm"]["command"] == ["vllm", "serve"]
    assert sidecar_config(by_name["vllm-triage"], objects, tmp_path).options(GpuOptions).gpus_file is None


def test_keda_scales_vllm_on_the_sidecars_headroom_only_when_asked():
    assert not [o for o in render() if o["kind"] == "ScaledObject"]  # off by default
    objects = render({"autoscaling": {"keda": {"enabled": True, "prometheusUrl": "http://prometheus.monitoring:9090", "maxReplicas": 6}}})
    scaled = one(objects, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(objects, "Deployment")["metadata"]["name"]
    assert "replicas" not in one(objects, "Deployment")["spec"] and one(render(), "Deployment")["spec"]["replicas"] == 1  # the HPA owns it
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 6)
    assert scaled["spec"]["cooldownPeriod"] >= 300  # a model loads for minutes: no flapping scale-down
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    # the query reads a family the sidecar exports, from the sidecar's job, in this release's pods
    golden = (Path(__file__).resolve().parents[1] / "data" / "exposition.golden.txt").read_text()
    assert re.search(r"^# TYPE vllm_triage_vllm_headroom_ratio gauge$", golden, re.MULTILINE)
    assert "vllm_triage_vllm_headroom_ratio{" in query and 'job="vllm-triage"' in query and 'namespace="inference"' in query
    assert float(trigger["metadata"]["threshold"]) == 0.8 and trigger["metricType"] == "AverageValue"
    # fails safe: blind (no answer, or an empty one) holds the most replicas instead of scaling to the minimum, and a
    # replica goes after the documented 10 minutes (cooldownPeriod alone acts only on the way to 0 replicas)
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    assert scaled["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 6}
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == scaled["spec"]["cooldownPeriod"] == 600
    keda = {"enabled": True, "prometheusUrl": "http://p:9090", "fallbackReplicas": 2}
    assert one(render({"autoscaling": {"keda": keda}}), "ScaledObject")["spec"]["fallback"]["replicas"] == 2


def test_the_chart_profiles_at_the_sidecars_own_py_spy_defaults():
    """What the chart ships costs what the sidecar's defaults were measured to cost: py-spy's CPU is its start, so a
    chart that ran it five times as often as the sidecar would cost five times the measured figure."""
    profiler = yaml.safe_load((CHART / "values.yaml").read_text())["profiler"]
    defaults = GilOptions()
    assert (profiler["intervalSeconds"], profiler["windowSeconds"], profiler["rate"]) == (
        defaults.gil_interval_seconds,
        defaults.gil_window_seconds,
        defaults.gil_rate,
    )


@pytest.mark.parametrize("readme", [CHART / "README.md", ROOT / "README.md"])
def test_the_readmes_quote_the_profiler_defaults_the_chart_ships(readme):
    profiler = yaml.safe_load((CHART / "values.yaml").read_text())["profiler"]
    text = " ".join(readme.read_text().split())
    quoted = (
        f"`profiler.windowSeconds` ({profiler['windowSeconds']} s) at `profiler.rate` ({profiler['rate']} Hz) per "
        f"process every `profiler.intervalSeconds` ({profiler['intervalSeconds']} s)"
    )
    assert quoted in text
    assert "pauses vLLM" not in text and "pauses the engine core" not in text  # py-spy's default mode (nonblocking) pauses nothing


def test_a_rollout_keeps_serving_waits_out_the_model_load_and_lets_generations_finish():
    """A sidecar image bump or a log level change must not take vLLM down for a model load: by default a new pod starts
    beside the old ones, which serve until it is ready; the rollout is not failed while the startup probe still allows
    the load (the 600 s default deadline was under the 1800 s it allows); a stopping pod's generations get 120 s. In
    place, one at a time, where there is no room to surge."""
    objects = render({"replicaCount": 3, "podDisruptionBudget": {"enabled": True}})
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert deployment["spec"]["progressDeadlineSeconds"] == 1800 + 600
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    in_place = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    tuned = one(render({"vllm": {"strategy": in_place, "startupSeconds": 3600, "terminationGracePeriodSeconds": 600}}), "Deployment")
    assert tuned["spec"]["strategy"] == in_place and tuned["spec"]["progressDeadlineSeconds"] == 4200
    assert tuned["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 600
    budget = next(o for o in objects if o["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert not [o for o in render() if o["kind"] == "PodDisruptionBudget"]  # off by default


def helm_test_passes(values: dict, base: str) -> str:
    """Runs the rendered `helm test` pod's check against a sidecar at `base`: its output (an AssertionError fails it)."""
    pod = next(o for o in render(values) if o["kind"] == "Pod" and o["metadata"]["annotations"].get("helm.sh/hook") == "test")
    script = pod["spec"]["containers"][0]["command"][-1]
    script = re.sub(r'^base = ".*"$', f"base = {base!r}", script, count=1, flags=re.MULTILINE)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_helm_test_passes_under_the_network_policy_and_with_tls_and_basic_auth(tmp_path):
    """`helm test` was refused by the chart's own NetworkPolicy, and read plain HTTP without credentials: it is admitted
    now (its pod's label), and its check passes against a real sidecar, plain and behind TLS with basic auth."""
    from harness.components import start_sidecar

    from .test_webconfig import HASH, TLS, start_tls_sidecar

    policy = one(render({"networkPolicy": {"enabled": True}}), "NetworkPolicy")
    test_pod = next(o for o in render({}) if o["kind"] == "Pod")
    (triage,) = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "triage"]
    assert any(set(p.get("podSelector", {}).get("matchLabels", {}).items()) <= set(test_pod["metadata"]["labels"].items()) for p in triage["from"])
    (tmp_path / "plain").mkdir()
    plain = start_sidecar(tmp_path / "plain", "http://127.0.0.1:9", "", "--demo")
    try:
        assert "conditions active" in helm_test_passes({}, plain.url)
    finally:
        plain.process.kill()
    (tmp_path / "tls").mkdir()
    process, url, _ = start_tls_sidecar(tmp_path / "tls", f"{TLS}basic_auth_users:\n  prometheus: '{HASH}'\n")
    try:
        said = helm_test_passes({"triage": {"webConfig": {"secretName": "web", "tls": True}}}, url)
        assert "asks for credentials" in said, said
    finally:
        process.kill()


def test_monitoring_only_scrapes_and_judges_pods_the_chart_did_not_create():
    """The sidecar added to another chart's vLLM pods got no scraping, rules or dashboards: monitoringOnly renders only
    the PodMonitor over those pods (their sidecar's port and vLLM's), the release-scoped rules, the dashboards and the
    AlertmanagerConfig."""
    values = {"monitoringOnly": {"enabled": True, "podSelector": {"app.kubernetes.io/name": "my-vllm"}, "vllmPort": "api"}}
    objects = render(values)
    assert {o["kind"] for o in objects} == {"PodMonitor", "PrometheusRule", "ConfigMap", "AlertmanagerConfig"}
    assert all("grafana_dashboard" in o["metadata"]["labels"] for o in objects if o["kind"] == "ConfigMap")
    monitor = one(objects, "PodMonitor")["spec"]
    assert monitor["selector"] == {"matchLabels": {"app.kubernetes.io/name": "my-vllm"}}
    jobs = {e["port"]: next(r["replacement"] for r in e["relabelings"] if r["targetLabel"] == "job") for e in monitor["podMetricsEndpoints"]}
    assert jobs == {"api": "vllm", "triage": "vllm-triage"}  # the job names the alerts use
    rules = json.dumps(one(objects, "PrometheusRule")["spec"])
    assert 'vllm_triage_release=\\"inference/llm\\"' in rules
    for manifest in objects:
        if not manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    with pytest.raises(helm_python.HelmError, match=r"monitoringOnly\.podSelector is required"):
        render({"monitoringOnly": {"enabled": True}})


def test_a_change_to_the_sidecars_config_alone_leaves_vllms_pod_template_as_it_was():
    """The sidecar reloads its config file in place: a threshold changed through triage.config must not recreate the pod
    (vLLM would load its model again). Only the ConfigMap differs."""
    before = render({"triage": {"config": {"conditions": {"kv_cache_saturated": {"for_seconds": 60}}}}})
    after = render({"triage": {"config": {"conditions": {"kv_cache_saturated": {"for_seconds": 120}}, "window_seconds": 30}}})
    assert one(before, "Deployment")["spec"]["template"] == one(after, "Deployment")["spec"]["template"]
    config = [o for o in before if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})]
    assert config and config != [o for o in after if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})]


def test_a_guessed_latency_objective_opens_a_ticket_and_one_the_team_sets_pages():
    """The TTFT and ITL objectives are the project's guesses (a chat service's): their fast burn is a warning until an
    install sets the target or the objective; the error burn pages as it is. A target that is no bucket bound of vLLM's
    histogram is refused naming the nearest (it would leave the SLO's rules empty), unless vLLM's own buckets list it."""

    def alerts(values: dict) -> dict[str, dict]:
        rule = one(render({"monitoring": {"prometheusRule": values}}), "PrometheusRule")
        return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}

    default = alerts({})
    assert [default[a]["labels"]["severity"] for a in ("VllmTtftSloBurnFast", "VllmItlSloBurnFast", "VllmErrorsSloBurnFast")] == [
        "warning",
        "warning",
        "critical",
    ]
    set_ttft = alerts({"vllmThresholds": {"ttftTargetSeconds": 1}})
    assert (set_ttft["VllmTtftSloBurnFast"]["labels"]["severity"], set_ttft["VllmItlSloBurnFast"]["labels"]["severity"]) == ("critical", "warning")
    assert alerts({"vllmThresholds": {"itlObjective": 0.995}})["VllmItlSloBurnFast"]["labels"]["severity"] == "critical"
    # the install's own word on severity still wins
    assert (
        alerts({"vllmThresholds": {"ttftTargetSeconds": 1}, "severity": {"VllmTtftSloBurnFast": "warning"}})["VllmTtftSloBurnFast"]["labels"]["severity"]
        == "warning"
    )
    with pytest.raises(helm_python.HelmError, match=r"ttftTargetSeconds: 3 is not one of vLLM's ttft bucket bounds.*nearest are 2.5 and 5"):
        render({"monitoring": {"prometheusRule": {"vllmThresholds": {"ttftTargetSeconds": 3}}}})
    with pytest.raises(helm_python.HelmError, match=r"itlTargetSeconds: 0.09 .*nearest are 0.075 and 0.1"):
        render({"monitoring": {"prometheusRule": {"vllmThresholds": {"itlTargetSeconds": 0.09}}}})
    custom = one(
        render({"monitoring": {"prometheusRule": {"vllmThresholds": {"ttftTargetSeconds": 3}, "sloBuckets": {"ttft": [0.5, 1, 3, 10]}}}}), "PrometheusRule"
    )
    records = [r["expr"] for g in custom["spec"]["groups"] for r in g["rules"] if r.get("record", "").startswith("model_name:vllm_ttft_slo")]
    assert records and all('le=~"3([.]0)?"' in expr for expr in records)


def test_one_replica_down_pages_only_past_the_pods_start_up_budget():
    def long_for(values: dict) -> str:
        rule = one(render(values), "PrometheusRule")
        return next(r["for"] for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "VllmTriageVllmUnreachableLong")

    assert long_for({}) == "30m" and long_for({"vllm": {"startupSeconds": 3600}}) == "60m" and long_for({"vllm": {"startupSeconds": 1000}}) == "1000s"
    assert long_for({"monitoring": {"prometheusRule": {"for": {"VllmTriageVllmUnreachableLong": "1h"}}}}) == "1h"
