"""Grafana dashboards (classic JSON) generated from the condition table and the metric names, built with
grafana-foundation-sdk's builders for Grafana 11.6's typed models.

They work provisioned, loaded by the kube-prometheus-stack sidecar, or imported by hand:
`__inputs: []`, a `datasource` variable, stable uids, `$__rate_interval` in every rate().
"""

from __future__ import annotations

import json
from typing import Any, TypeAlias

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.builders import prometheus, statetimeline
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from vllm_triage.diagnosis.condition import RUNBOOK_URL
from vllm_triage.diagnosis.conditions import CONDITIONS, VLLM_CONDITIONS, Condition, gpu, host
from vllm_triage.sources.vllm import spellings

from .rules import SELECT, exported_reads, recording_rules

# Each condition's section (meaning, evidence, next actions): GitHub anchors are the condition ids.
CONDITIONS_URL = RUNBOOK_URL.replace("runbooks.md", "conditions.md")

DS = model.DataSourceRef(type_val="prometheus", uid="$datasource")
# `cluster` matches series without the label too (".*" matches the empty value): one Prometheus or many.
SIDECAR = 'cluster=~"$cluster",namespace=~"$namespace",pod=~"$pod"'
VLLM = 'cluster=~"$cluster",namespace=~"$namespace",pod=~"$pod",model_name=~"$model",engine=~"$engine"'
GPU = SIDECAR


def unit_of(metric: str) -> str:
    """Grafana's unit for a metric or recording rule by its name's unit suffix (Prometheus' naming rules)."""
    name = metric.split("{")[0]
    if "bytes_per_second" in name:
        return "Bps"
    if "per_second" in name or name.endswith(("_total", ":rate5m")):
        return "ops"
    if "_seconds" in name:
        return "s"
    if "_ratio" in name or "_perc" in name:
        return "percentunit"
    if "_bytes" in name:
        return "bytes"
    if "_watts" in name:
        return "watt"
    return "short"


def _q(name: str) -> str:
    """One of vLLM's metrics on the dashboard's selection, under whichever name the server's vLLM exports it."""
    return SELECT.vllm(name, VLLM)


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({_q(f'{histogram}_bucket')}[$__rate_interval])))"


Panel: TypeAlias = Any  # a panel's builder (timeseries, stat, state timeline): each its own class, one shape


class _Layout:
    """Places rows and panels on Grafana's 24-column grid, row by row, in the order they are added."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Builder[Any]]] = []
        self.y = 0
        self.x = 0
        self.next_id = 1
        self._height = 8

    def row(self, title: str) -> None:
        self._newline()
        self.items.append(("row", builders.Row(title).id(self._id()).grid_pos(model.GridPos(h=1, w=24, x=0, y=self.y))))
        self.y += 1

    def add(self, panel: Panel, width: int = 8, height: int = 8) -> None:
        if self.x + width > 24:
            self._newline()
        self.items.append(("panel", panel.id(self._id()).grid_pos(model.GridPos(h=height, w=width, x=self.x, y=self.y))))
        self.x += width
        self._height = height

    def _newline(self) -> None:
        if self.x:
            self.y += self._height
            self.x = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _panel(panel: Panel, title: str, description: str, exprs: list[tuple[str, str]], instant: bool = False) -> Panel:
    """What every panel shares: its words and its queries, on the dashboard's data source; `instant`: the value now (a
    range query reduced to its last value shows the past: what held an hour ago, and after the sidecar stopped)."""
    panel.title(title).description(description).datasource(DS)
    for i, (expr, legend) in enumerate(exprs):
        query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).datasource(DS)
        panel.with_target(query.instant() if instant else query)
    return panel


def timeseries(
    title: str, exprs: list[tuple[str, str]], unit: str = "short", description: str = "", max_value: float | None = None, no_value: str = ""
) -> Panel:
    panel = timeseries_panel.Panel().unit(unit).line_width(1).fill_opacity(10).show_points(common.VisibilityMode.NEVER)
    panel.legend(common_builders.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST).placement(common.LegendPlacement.BOTTOM))
    panel.tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.NONE))
    if no_value:
        panel.no_value(no_value)  # what an empty panel means, instead of Grafana's "No data"
    if max_value is not None:
        panel.max(max_value).min(0)
    return _panel(panel, title, description, exprs)


def stat(
    title: str, expr: str, legend: str, description: str, no_value: str, unit: str = "short", text_mode: str = "value", more: tuple[tuple[str, str], ...] = ()
) -> Panel:
    """The value now (instant queries), big; `no_value` is what a person reads when the query has no series."""
    link = builders.DashboardLink("What it means and what to do").url(CONDITIONS_URL + "#${__field.labels.condition}").target_blank(True)
    panel = stat_panel.Panel().unit(unit).no_value(no_value).color_scheme(builders.FieldColor().mode(model.FieldColorModeId.FIXED).fixed_color("text"))
    panel.data_links([link]).reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
    panel.text_mode(common.BigValueTextMode(text_mode)).color_mode(common.BigValueColorMode.VALUE)
    return _panel(panel, title, description, [(expr, legend), *more], instant=True)


def state_timeline(title: str, expr: str, legend: str, description: str = "") -> Panel:
    steps = [model.Threshold(color="transparent", value=None), model.Threshold(color="red", value=1)]
    panel = statetimeline.Panel().color_scheme(builders.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
    panel.thresholds(builders.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(steps))
    panel.mappings([_value_texts({"0": "inactive", "1": "active"})])
    panel.show_value(common.VisibilityMode.NEVER).merge_values(True).row_height(0.8)
    # Grafana's own defaults, which the builder would otherwise set otherwise (no legend, tooltips sorted)
    panel.legend(common_builders.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST).placement(common.LegendPlacement.BOTTOM))
    panel.tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE).sort(common.SortOrder.NONE))
    return _panel(panel, title, description, [(expr, legend)])


def _value_texts(texts: dict[str, str]) -> model.ValueMap:
    return model.ValueMap(options={value: model.ValueMappingResult(text=text) for value, text in texts.items()})


def _threshold(condition: str, name: str) -> tuple[str, str]:
    return (f'max(vllm_triage_condition_threshold{{{SIDECAR},condition="{condition}",threshold="{name}"}})', f"threshold {condition}.{name}")


def _variables() -> list[Builder[model.VariableModel]]:
    def query(name: str, label: str, expr: str) -> Builder[model.VariableModel]:
        current = model.VariableOption(selected=True, text=["All"], value=["$__all"])
        return (
            builders.QueryVariable(name)
            .label(label)
            .datasource(DS)
            .query({"query": expr, "refId": name})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True)
            .multi(True)
            .all_value(".*")
            .current(current)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
        )

    return [
        builders.DatasourceVariable("datasource").label("Data source").type("prometheus").hide(model.VariableHide.DONT_HIDE),
        query("cluster", "Cluster", "label_values(vllm_triage_build_info, cluster)"),
        query("namespace", "Namespace", 'label_values(vllm_triage_build_info{cluster=~"$cluster"}, namespace)'),
        query("pod", "Pod", 'label_values(vllm_triage_build_info{cluster=~"$cluster",namespace=~"$namespace"}, pod)'),
        query("model", "Model", f"label_values({SELECT.vllm('vllm:num_requests_running', SIDECAR)}, model_name)"),
        query("engine", "Engine", f"label_values({SELECT.vllm('vllm:num_requests_running', SIDECAR)}, engine)"),
    ]


def _dashboard(uid: str, title: str, layout: _Layout, description: str) -> dict[str, Any]:
    # from one dashboard to the next, the cluster, namespace, pod, model and time range stay selected
    link = builders.DashboardLink("vLLM triage").type(model.DashboardLinkType.DASHBOARDS).tags(["vllm-triage"]).as_dropdown(True)
    board = (
        builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["vllm", "vllm-triage"])
        .version(1)
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)  # shared crosshair: the layers line up on one time axis
        .timezone("")  # the viewer's own preference, not the builder's "browser"
        .time("now-1h", "now")
        .refresh("30s")
        .links([link.include_vars(True).keep_time(True)])
        .annotations([])
    )
    for variable in _variables():
        board.with_variable(variable)
    for kind, item in layout.items:
        board.with_row(item) if kind == "row" else board.with_panel(item)
    built: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return {"__inputs": [], **built}


NO_MFU = "start vLLM with --enable-mfu-metrics for its FLOPs and bytes estimates (GPM's tensor and DRAM activity need a Hopper-class GPU)"


def overview() -> dict[str, Any]:
    lay = _Layout()
    lay.row("Now: what the sidecar says")
    primary = f"max by (condition) (vllm_triage_condition_primary{{{SIDECAR}}} == 1)"
    lay.add(
        stat(
            "Primary verdict",
            primary,
            "{{condition}}",
            "The verdict the diagnosis leads with (the first active condition in the sidecar's precedence): its fix comes first. "
            'Click it for what it means and what to do; /diagnosis on the sidecar has the evidence. "no sidecar answers": its '
            "series are gone (the sidecar is down or not scraped), so nothing is known.",
            "nothing is wrong",
            text_mode="name",
            more=((f"absent(vllm_triage_build_info{{{SIDECAR}}})", "no sidecar answers"),),
        )
    )
    lay.add(
        stat(
            "Since",
            f"time() - max by (condition) (vllm_triage_condition_since_timestamp_seconds{{{SIDECAR}}} and on (namespace, pod, condition) ({primary.removeprefix('max by (condition) ')}))",
            "{{condition}}",
            "How long the primary verdict has been active.",
            "-",
            unit="s",
        )
    )
    lay.add(
        stat(
            "Active verdicts",
            f"count(max by (condition) (vllm_triage_condition_active{{{SIDECAR}}} == 1))",
            "active",
            "How many conditions are active now (the primary and the ones it explains): the verdict timeline below says which.",
            "0",
        )
    )
    starting = stat(
        "vLLM starting for",
        f"max(vllm_triage_vllm_starting_seconds{{{SIDECAR}}})",
        "starting",
        "How long vLLM has been starting: it has not answered since the sidecar started and its API server process runs (loading "
        "its model). A vLLM that never starts, crash-loops or serves another port is vllm_unreachable instead.",
        "no sidecar",
        unit="s",
    )
    starting.mappings([_value_texts({"0": "not starting"})])
    lay.add(starting)
    lay.row("Efficiency: how far from the GPU's ceiling (vLLM's --enable-mfu-metrics over the GPU's peaks, beside what GPM measured)")
    lay.add(
        timeseries(
            "Model FLOPs and bandwidth utilization",
            [
                (f"max by (engine) (vllm_triage_vllm_model_flops_utilization_ratio{{{VLLM}}})", "MFU engine {{engine}}"),
                (f"max by (engine) (vllm_triage_vllm_model_bandwidth_utilization_ratio{{{VLLM}}})", "bandwidth engine {{engine}}"),
                (f"vllm_triage_gpu_tensor_active_ratio{{{GPU}}}", "tensor active (GPM) {{gpu}}"),
                (f"vllm_triage_gpu_dram_bandwidth_utilization_ratio{{{GPU}}}", "DRAM (GPM) {{gpu}}"),
            ],
            unit="percentunit",
            max_value=1,
            description="Model FLOP/s and bytes/s (vLLM's estimates; start vLLM with --enable-mfu-metrics) over the GPU's dense bf16 "
            "and memory peaks, beside the tensor-core and DRAM activity GPM measured.",
            no_value=NO_MFU,
        )
    )
    lay.add(
        timeseries(
            "Distance to the roofline (1 = at the roof)",
            [
                (f"max by (engine) (vllm_triage_vllm_roofline_attainment_ratio{{{VLLM}}})", "attained engine {{engine}}"),
                (f"max by (engine) (vllm_triage_vllm_roofline_memory_bound{{{VLLM}}})", "under the memory roof (1) engine {{engine}}"),
            ],
            unit="percentunit",
            max_value=1,
            description="Model FLOP/s over what the roofline allows at the work's FLOPs per byte. Decode sits under the memory roof, prefill under the compute roof.",
            no_value=NO_MFU,
        )
    )
    lay.add(
        timeseries(
            "Seconds since the last token",
            [
                (f"max by (engine) (vllm_triage_vllm_seconds_stalled_with_requests_pending{{{VLLM}}})", "stalled with requests pending {{engine}}"),
                (f"max by (engine) (vllm_triage_vllm_seconds_since_last_token{{{VLLM}}})", "since the last token {{engine}}"),
                _threshold("engine_wedged", "stalled_seconds_min"),
            ],
            unit="s",
            description="A hung engine core: requests pending and no token (engine_wedged). vLLM's own /health still answers 200 then.",
        )
    )
    lay.row("Diagnosis: which condition was active when")
    lay.add(
        state_timeline(
            "Verdict timeline",
            f"max by (condition) (vllm_triage_condition_active{{{SIDECAR}}})",
            "{{condition}}",
            "Each condition's debounced state. /diagnosis on the sidecar has the evidence and next actions.",
        ),
        width=16,
        height=10,
    )
    lay.add(
        timeseries(
            "Condition scores (0.5 = at threshold)",
            [(f"max by (condition) (vllm_triage_condition_score{{{SIDECAR}}}) > 0", "{{condition}}")],
            max_value=1,
            description="How strongly each condition's evidence holds: 0.5 is its threshold, 1 far past it. A score rising toward 0.5 is a verdict coming.",
        ),
        width=8,
        height=10,
    )
    lay.row("Layer 1: vLLM load and latency")
    lay.add(
        timeseries(
            "Running vs max_num_seqs",
            [
                (f"sum({_q('vllm:num_requests_running')})", "running"),
                (f"max(vllm_triage_vllm_max_num_seqs{{{VLLM}}})", "max_num_seqs"),
            ],
            description="Requests in the engines' batches against vLLM's --max-num-seqs (read from its command line, else vLLM's default on that GPU): running pinned at the cap with requests waiting is the concurrency cap (queue_backlog, cause concurrency_cap).",
        )
    )
    lay.add(
        timeseries(
            "Waiting requests",
            [(f"sum({_q('vllm:num_requests_waiting')})", "waiting")],
            description="Requests queued for admission: sustained above 0 is a backlog (queue_backlog says what they wait for).",
        )
    )
    lay.add(
        timeseries(
            "KV cache usage",
            [
                (f"max({_q('vllm:kv_cache_usage_perc')})", "KV usage"),
                _threshold("kv_cache_saturated", "usage_min"),
            ],
            unit="percentunit",
            max_value=1,
            description=f"{' or '.join(spellings('vllm:kv_cache_usage_perc'))}, as the server's vLLM version names it. GPU memory used says "
            "nothing here: vLLM preallocates it.",
        )
    )
    lay.add(
        timeseries(
            "Preemptions per second",
            [
                (f"sum(rate({_q('vllm:num_preemptions_total')}[$__rate_interval]))", "preemptions/s"),
                _threshold("preemption_storm", "preemptions_per_second_max"),
            ],
            description="Requests vLLM evicted for lack of a free KV block, per second: each is recomputed. Above the dashed line is a preemption storm; with the KV cache full it is KV thrash.",
            unit="reqps",
        )
    )
    lay.add(
        timeseries(
            "Time to first token",
            [
                (_quantile(0.5, "vllm:time_to_first_token_seconds"), "p50"),
                (_quantile(0.95, "vllm:time_to_first_token_seconds"), "p95"),
                _threshold("ttft_high", "ttft_p95_max_seconds"),
            ],
            unit="s",
            description="p50 and p95 from vLLM's histogram over the rate interval: queueing, prefill and the API server together (ttft_high's cause splits them).",
        )
    )
    lay.add(
        timeseries(
            "Inter-token latency",
            [
                (_quantile(0.5, "vllm:inter_token_latency_seconds"), "p50"),
                (_quantile(0.95, "vllm:inter_token_latency_seconds"), "p95"),
                _threshold("itl_high", "itl_p95_max_seconds"),
            ],
            unit="s",
            description="p50 and p95 of the time between two output tokens of a request: the decode step's pace (itl_high's cause says what sets it).",
        )
    )
    lay.add(
        timeseries(
            "Tokens per second",
            [
                (f"sum(rate({_q('vllm:prompt_tokens_total')}[$__rate_interval]))", "prompt"),
                (f"sum(rate({_q('vllm:generation_tokens_total')}[$__rate_interval]))", "generated"),
            ],
            description="Prompt tokens (prefill) and generated tokens per second, summed over the selected engines: the work done.",
            unit="tps",
        )
    )
    lay.row("Layer 3: GPU (util.gpu next to SM active: the gap is time the GPU was busy but not computing)")
    lay.add(
        timeseries(
            "util.gpu vs SM active",
            [(f"vllm_triage_gpu_utilization_ratio{{{GPU}}}", "util.gpu {{gpu}}"), (f"vllm_triage_gpu_sm_active_ratio{{{GPU}}}", "SM active {{gpu}}")],
            unit="percentunit",
            max_value=1,
            description="util.gpu is the share of time any kernel ran; SM active (GPM, Hopper and newer) is the share of SMs busy. util.gpu high with SMs idle is busy but not computing (copies, a hung kernel, syncs).",
        )
    )
    lay.add(
        timeseries(
            "Tensor cores and DRAM bandwidth",
            [
                (f"vllm_triage_gpu_tensor_active_ratio{{{GPU}}}", "tensor {{gpu}}"),
                (f"vllm_triage_gpu_dram_bandwidth_utilization_ratio{{{GPU}}}", "DRAM BW {{gpu}}"),
                _threshold("memory_bandwidth_bound", "dram_min"),
            ],
            unit="percentunit",
            max_value=1,
            description="GPM's tensor-core activity and DRAM bandwidth use: near the dashed line the engine is memory-bandwidth-bound (decode), tensor high is compute-bound.",
        )
    )
    lay.add(
        timeseries(
            "PCIe vs link capacity",
            [
                (f"vllm_triage_gpu_pcie_tx_bytes_per_second{{{GPU}}}", "tx {{gpu}}"),
                (f"vllm_triage_gpu_pcie_rx_bytes_per_second{{{GPU}}}", "rx {{gpu}}"),
                (f"vllm_triage_gpu_window_pcie_link_capacity_bytes_per_second{{{GPU}}}", "capacity {{gpu}}"),
            ],
            unit="Bps",
            description="Host-device traffic against the link's capacity: high while SMs idle is copies (pageable memory, CPU offload) starving the GPU; a link trained below its generation or width is pcie_link_degraded.",
        )
    )
    lay.add(
        timeseries(
            "Power and limit",
            [(f"vllm_triage_gpu_power_watts{{{GPU}}}", "power {{gpu}}"), (f"vllm_triage_gpu_power_limit_watts{{{GPU}}}", "limit {{gpu}}")],
            unit="watt",
            description="Board power against its limit: pinned at the limit with clocks down is power capping (gpu_throttled names the reason).",
        )
    )
    lay.add(
        timeseries(
            "Clock event reasons (share of window)",
            [(f"vllm_triage_gpu_window_clock_event_ratio{{{GPU}}} > 0", "{{reason}} {{gpu}}")],
            unit="percentunit",
            max_value=1,
            description="sw_power_cap alone is normal at full load; hw_slowdown, thermal and power brake are throttling.",
        )
    )
    lay.add(
        timeseries(
            "PCIe link generation and width",
            [
                (f"vllm_triage_gpu_pcie_link_generation{{{GPU}}}", "gen {{gpu}}"),
                (f"vllm_triage_gpu_pcie_link_generation_max{{{GPU}}}", "max gen {{gpu}}"),
                (f"vllm_triage_gpu_pcie_link_width{{{GPU}}}", "width {{gpu}}"),
            ],
            description="Links downtrain at idle on purpose; below max while busy is pcie_link_degraded.",
        )
    )
    lay.row("Layer 3: the GPUs as ranks (a tensor-parallel group runs at its slowest GPU's pace)")
    pod = "cluster, namespace, pod"
    ranked = f"* on ({pod}, gpu) group_left (engine, pp_rank, tp_rank) vllm_triage_rank_info{{{SIDECAR}}}"
    lay.add(
        timeseries(
            "SM activity by rank",
            [(f"vllm_triage_gpu_window_sm_activity_ratio{{{GPU}}} {ranked} or vllm_triage_gpu_window_sm_activity_ratio{{{GPU}}}", "TP{{tp_rank}} GPU {{gpu}}")],
            unit="percentunit",
            max_value=1,
            description="Each GPU labelled with the rank that runs on it (vllm_triage_rank_info); a GPU whose rank is not known shows alone. "
            "In a group the ranks move together: one apart from the others is tp_straggler's.",
        )
    )
    lay.add(
        timeseries(
            "Skew across the GPUs",
            [
                (
                    f'min by ({pod}) (vllm_triage_gpu_window_sm_clock_hertz{{{GPU},stat="mean"}}) '
                    f'/ max by ({pod}) (vllm_triage_gpu_window_sm_clock_hertz{{{GPU},stat="mean"}})',
                    "slowest / fastest SM clock {{pod}}",
                ),
                (
                    f"max by ({pod}) (vllm_triage_gpu_window_sm_activity_ratio{{{GPU}}}) - min by ({pod}) (vllm_triage_gpu_window_sm_activity_ratio{{{GPU}}})",
                    "SM activity, busiest - idlest {{pod}}",
                ),
                _threshold("tp_straggler", "clock_to_peers_max"),
            ],
            unit="percentunit",
            description="1 and 0 when the GPUs move together (and on one GPU); a clock ratio under tp_straggler's threshold is a braked GPU.",
        )
    )
    links = f"vllm_triage_gpu_window_pcie_bytes_per_second{{{GPU}}}"
    nvlink = f"vllm_triage_gpu_window_nvlink_bytes_per_second{{{GPU}}}"
    tokens = f"sum by ({pod}) (vllm_triage_vllm_prompt_tokens_per_second{{{VLLM}}} + vllm_triage_vllm_generation_tokens_per_second{{{VLLM}}})"
    lay.add(
        timeseries(
            "Interconnect per processed token",
            [
                (f"avg by ({pod}) ({links}) / {tokens}", "PCIe per GPU per token {{pod}}"),
                (f"(avg by ({pod}) ({nvlink}) or avg by ({pod}) ({links}) * 0) / {tokens}", "NVLink per GPU per token {{pod}}"),
                _threshold("communication_bound", "bytes_per_token_min"),
            ],
            unit="bytes",
            description="Bytes each GPU moves per prompt or generated token: a tensor-parallel all-reduce moves about 4 x layers x "
            "hidden bytes per token. NVLink 0: no NVLink up (the collectives go over PCIe).",
        )
    )
    lay.row("Layer 3: host (the engine core and the API server can starve the GPU; busy workers cannot)")
    lay.add(
        timeseries(
            "CPU per role",
            [(f"sum by (role) (rate(vllm_triage_process_cpu_seconds_total{{{SIDECAR}}}[$__rate_interval]))", "{{role}}")],
            unit="short",
            description="In cores. Workers spin while they wait on the GPU: their CPU alone is no bottleneck.",
        )
    )
    lay.add(
        timeseries(
            "Busiest thread per role (1 = a saturated core)",
            [
                (f"max by (role) (vllm_triage_process_busiest_thread_cpu_ratio{{{SIDECAR}}})", "{{role}}"),
                _threshold("gpu_starved", "thread_cpu_min"),
            ],
            max_value=1.2,
            description="Each role's busiest thread as a share of one core: at 1 the engine core or the API server is CPU-bound in one thread (gpu_starved names which); more cores do not help it.",
            unit="percentunit",
        )
    )
    lay.add(
        timeseries(
            "GIL held (latest py-spy window)",
            [(f"max by (role) (vllm_triage_gil_held_ratio{{{SIDECAR}}})", "{{role}}"), _threshold("gpu_starved", "gil_held_min")],
            unit="percentunit",
            max_value=1,
            description="Share of a short py-spy window in which a thread of the engine core / API server held the GIL.",
        )
    )
    lay.add(
        timeseries(
            "Hot functions holding the GIL",
            [(f"topk(5, vllm_triage_gil_hot_function_ratio{{{SIDECAR}}})", "{{role}} {{function}} ({{file}})")],
            unit="percentunit",
            description="Where the GIL-holding time goes: the top functions of the latest py-spy window per role.",
        )
    )
    lay.add(
        timeseries(
            "Resident memory per role",
            [
                (f"sum by (role) (vllm_triage_process_resident_memory_bytes{{{SIDECAR}}})", "RSS {{role}}"),
            ],
            unit="bytes",
            description="Resident memory of vLLM's processes by role: a steady climb in the API server is a leak; GPU memory is elsewhere (NVML).",
        )
    )
    lay.row("Sidecar health")
    lay.add(
        timeseries(
            "Source up",
            [(f"vllm_triage_source_up{{{SIDECAR}}}", "{{source}} {{pod}}")],
            max_value=1,
            description="1 while the source reads: vLLM's /metrics, the GPUs (NVML), vLLM's processes, py-spy. A source down makes the conditions that need it unknown.",
        )
    )
    lay.add(
        timeseries(
            "Source errors per second",
            [(f"sum by (source, reason) (rate(vllm_triage_source_errors_total{{{SIDECAR}}}[$__rate_interval]))", "{{source}} {{reason}}")],
            description="Failed collections per second by source and reason (connect, timeout, too_large, parse, no_permission ...): /diagnosis names the last error.",
            unit="ops",
        )
    )
    lay.add(
        timeseries(
            "Collection duration",
            [(f"vllm_triage_source_collect_duration_seconds{{{SIDECAR}}}", "{{source}} {{pod}}")],
            unit="s",
            description="How long each source's last collection took: a vLLM scrape near the timeout is a slow or huge /metrics page.",
        )
    )
    return _dashboard(
        "vllm-triage-overview",
        "vLLM triage — overview",
        lay,
        "Why is vLLM slow? The sidecar's verdicts above the three layers of evidence on one time axis.",
    )


def drill_down(condition: Condition, count: int = 3) -> list[tuple[str, str, str]]:
    """(family, selector, legend) of the first `count` exported signals among those the condition
    declares it reads (most telling first): the drill-down follows the predicate, not a hand-kept list.
    Each family is filtered by the labels it has: engine signals by model and engine, GPU signals by
    pod, process signals by pod (they carry no model or engine)."""
    shown = []
    for signal_id, family, extra, scope_labels in exported_reads(condition, count):
        if "gpu" in scope_labels:
            selector, legend = GPU, f"{signal_id} {{{{gpu}}}}"
        elif scope_labels:
            selector, legend = VLLM, f"{signal_id} {{{{model_name}}}}/{{{{engine}}}}"
        else:
            selector, legend = SIDECAR, signal_id
        shown.append((family, selector + "".join(f',{k}="{v}"' for k, v in extra), legend))
    return shown


# One row per layer of the condition table, in its order: a new condition gets its panel where it is written.
# vllm_unreachable reads no windowed signal: its evidence is the overview's source health row.
FAMILIES = (
    ("vLLM: tokens, capacity, latency, errors", tuple(c.id for c in VLLM_CONDITIONS if c.id != "vllm_unreachable")),
    ("Host: vLLM's processes and ranks", tuple(c.id for c in host.CONDITIONS)),
    ("GPU", tuple(c.id for c in gpu.CONDITIONS)),
)


def conditions() -> dict[str, Any]:
    lay = _Layout()
    for family, ids in FAMILIES:
        lay.row(family)
        for cid in ids:
            condition = next(c for c in CONDITIONS if c.id == cid)
            exprs = [(f"{family_}{{{selector}}}", legend) for family_, selector, legend in drill_down(condition)]
            exprs.append((f'max(vllm_triage_condition_active{{{SIDECAR},condition="{cid}"}})', "active"))
            exprs += [_threshold(cid, t.name) for t in condition.thresholds[:2]]
            panel = timeseries(f"{cid} ({condition.severity})", exprs, unit=unit_of(exprs[0][0]), description=condition.meaning)
            # the 0/1 state on its own axis, so that it neither squashes nor borrows the signals' unit
            active = [
                model.DynamicConfigValue(id_val="unit", value="bool_on_off"),
                model.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
                model.DynamicConfigValue(id_val="max", value=1),
                model.DynamicConfigValue(id_val="min", value=0),
            ]
            panel.with_override(model.MatcherConfig(id_val="byName", options="active"), active)
            lay.add(panel)
    return _dashboard(
        "vllm-triage-conditions",
        "vLLM triage — conditions",
        lay,
        "One panel per condition: the windowed signals its predicate reads, its thresholds and its state.",
    )


def fleet() -> dict[str, Any]:
    lay = _Layout()
    lay.row("Fleet (recording rules)")
    titles = {
        "namespace_condition:vllm_triage_condition_active:sum": ("Active conditions by namespace", "{{namespace}} {{condition}}"),
        "model_name:vllm_num_requests_running:sum": ("Running requests by model", "{{namespace}} {{model_name}}"),
        "model_name:vllm_num_requests_waiting:sum": ("Waiting requests by model", "{{namespace}} {{model_name}}"),
        "model_name:vllm_kv_cache_usage_perc:max": ("Fullest KV cache by model", "{{namespace}} {{model_name}}"),
        "model_name:vllm_generation_tokens:rate5m": ("Generated tokens/s by model", "{{namespace}} {{model_name}}"),
        "model_name:vllm_prompt_tokens:rate5m": ("Prompt tokens/s by model", "{{namespace}} {{model_name}}"),
        "pod:vllm_num_requests_waiting:avg5m": ("Waiting per replica (one far above its siblings: imbalance)", "{{namespace}} {{model_name}} {{pod}}"),
        "model_name:vllm_time_to_first_token_seconds:p95_5m": ("TTFT p95 by model", "{{namespace}} {{model_name}}"),
        "namespace:vllm_triage_gpu_sm_active_ratio:avg": ("Mean GPU SM activity by namespace", "{{namespace}}"),
        "namespace_model_name:vllm_triage_replicas:count": ("Replicas by model (starting ones not counted)", "{{namespace}} {{model_name}}"),
        "namespace_model_name:vllm_triage_replicas_answering:count": ("Replicas answering by model", "{{namespace}} {{model_name}}"),
    }
    descriptions = {
        "namespace_condition:vllm_triage_condition_active:sum": "How many servers have each condition active: a condition on many servers at once "
        "is shared cause (a node, a rollout, a traffic surge), on one server a local fault.",
        "model_name:vllm_num_requests_running:sum": "Requests in the engines' batches, summed over each model's replicas.",
        "model_name:vllm_num_requests_waiting:sum": "Requests queued for admission, summed over each model's replicas: sustained above 0 means demand "
        "exceeds what the replicas admit.",
        "model_name:vllm_kv_cache_usage_perc:max": "The fullest replica's KV cache: near 1 with requests waiting is the KV-capacity limit "
        "(kv_cache_saturated on that server).",
        "model_name:vllm_generation_tokens:rate5m": "Output tokens per second over 5 minutes, summed over each model's replicas: the work done.",
        "model_name:vllm_prompt_tokens:rate5m": "Prompt tokens per second over 5 minutes (prefill work), summed over each model's replicas.",
        "pod:vllm_num_requests_waiting:avg5m": "Each replica's mean queue over 5 minutes: one far above its siblings is a routing imbalance "
        "(VllmReplicaImbalance), all of them high is capacity.",
        "model_name:vllm_time_to_first_token_seconds:p95_5m": "The 95th percentile of time to first token over 5 minutes, across each model's "
        "replicas: queueing and prefill together.",
        "namespace:vllm_triage_gpu_sm_active_ratio:avg": "Mean SM activity of the watched GPUs (GPM): low while requests wait is a starved or "
        "hung engine, not a busy GPU.",
        "namespace_model_name:vllm_triage_replicas:count": "Each model's replicas as their sidecars name the model they serve, those still "
        "starting left out: what VllmModelUnavailable divides by.",
        "namespace_model_name:vllm_triage_replicas_answering:count": "Each model's replicas whose vLLM answers its sidecar: under half of the "
        "replicas above pages (VllmModelUnavailable); one replica missing is a ticket.",
    }
    for rule in recording_rules():
        title, legend = titles[rule["record"]]
        expr = f'{rule["record"]}{{cluster=~"$cluster",namespace=~"$namespace"}}'
        lay.add(timeseries(title, [(expr, legend)], unit=unit_of(rule["record"]), description=descriptions[rule["record"]]))
    return _dashboard("vllm-triage-fleet", "vLLM triage — fleet", lay, "Every vLLM in the fleet, from the recording rules in alerts/.")


DASHBOARDS = {"vllm-triage-overview.json": overview, "vllm-triage-conditions.json": conditions, "vllm-triage-fleet.json": fleet}


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel: what the Prometheus test checks."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
