"""Snapshot -> Prometheus exposition, rendered once per snapshot in the formats scrapers ask for."""

from __future__ import annotations

import platform
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from . import __version__
from .catalog import CATALOG, EXPORTED_PREFIX, LATEST_HELP
from .cpu_account import CPU
from .diagnosis.conditions import CONDITIONS_BY_ID, ConditionSettings
from .model import SeriesKey, Snapshot

PREFIX = EXPORTED_PREFIX.removesuffix("_")
WINDOWED = "Windowed over the window_seconds before the last evaluation."


def exported_signal(signal_id: str) -> tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]] | None:
    """(family, its extra labels' values, the labels naming its scope) under which a windowed signal is
    exported (the catalog says how); None for one that is not (global signals)."""
    for spec in CATALOG:
        for signal in spec.signals:
            if signal.id == signal_id:
                return f"{PREFIX}_{spec.exported_as}{signal.family}", signal.extra_labels, spec.scope_labels
    return None


class SnapshotCollector(Collector):
    def __init__(self, settings: dict[str, ConditionSettings]) -> None:
        self.settings = settings
        self.snapshot: Snapshot | None = None

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily(f"{PREFIX}_build_info", "vllm-triage build information.", labels=["version", "python_version"])
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        snapshot = self.snapshot
        reload = GaugeMetricFamily(
            f"{PREFIX}_config_last_reload_successful", "0 when the config file changed into an invalid one (the running configuration is kept; see the log)."
        )
        reload.add_metric([], 1.0 if snapshot is None or snapshot.sidecar.config_reload_successful else 0.0)
        yield reload
        own = CounterMetricFamily(
            f"{PREFIX}_sidecar_cpu_seconds",
            "CPU time the sidecar spent, by stage (parsing vLLM's page, each source's collection, storing readings, evaluating, "
            "rendering; event_loop: its main thread's HTTP serving and I/O). py-spy's runs are its children, not counted here.",
            labels=["stage"],
        )
        for stage, seconds in sorted(CPU.totals().items()):
            own.add_metric([stage], seconds)
        yield own
        if snapshot is None:
            return
        yield from self._health(snapshot)
        yield from self._verdicts(snapshot)
        yield from self._signals(snapshot)
        for samples in snapshot.latest.values():
            yield from self._latest(samples)

    def _health(self, snapshot: Snapshot) -> Iterator[Metric]:
        up = GaugeMetricFamily(f"{PREFIX}_source_up", "1 when the source's last collection succeeded.", labels=["source"])
        duration = GaugeMetricFamily(f"{PREFIX}_source_collect_duration_seconds", "Duration of the source's last collection.", labels=["source"])
        errors = CounterMetricFamily(f"{PREFIX}_source_errors", "Failed or degraded collections by reason.", labels=["source", "reason"])
        last = GaugeMetricFamily(f"{PREFIX}_source_last_success_timestamp_seconds", "Time of the source's last successful collection.", labels=["source"])
        for health in snapshot.sources:
            up.add_metric([health.source], 1.0 if health.up else 0.0)
            duration.add_metric([health.source], health.collect_duration_seconds)
            for reason, count in sorted(health.errors_total.items()):
                errors.add_metric([health.source, reason], count)
            if health.last_success_timestamp is not None:
                last.add_metric([health.source], health.last_success_timestamp)
        yield from (up, duration, errors, last)
        evaluations = CounterMetricFamily(f"{PREFIX}_evaluations", "Condition-table evaluations since start.")
        evaluations.add_metric([], snapshot.evaluations)
        yield evaluations
        failures = CounterMetricFamily(f"{PREFIX}_evaluation_failures", "Evaluations that raised (the last good snapshot stays served; /readyz says 503).")
        failures.add_metric([], snapshot.sidecar.evaluation_failures)
        yield failures
        evaluated = GaugeMetricFamily(f"{PREFIX}_last_evaluation_timestamp_seconds", "Time of the last evaluation.")
        evaluated.add_metric([], snapshot.timestamp)
        yield evaluated
        window = GaugeMetricFamily(f"{PREFIX}_window_seconds", "Default window of the windowed signals.")
        window.add_metric([], snapshot.window_seconds)
        yield window
        starting = GaugeMetricFamily(
            f"{PREFIX}_vllm_starting",
            "1 while vLLM has not answered once since the sidecar started and the host shows a start (its API server loading, "
            "within the startup grace), not an outage: VllmTargetDown stays silent meanwhile.",
        )
        starting.add_metric([], 1.0 if snapshot.vllm_starting else 0.0)
        yield starting
        starting_for = GaugeMetricFamily(f"{PREFIX}_vllm_starting_seconds", "How long vLLM has been starting (0 when it is not).")
        starting_for.add_metric([], snapshot.vllm_starting_seconds or 0.0)
        yield starting_for
        models = GaugeMetricFamily(
            f"{PREFIX}_vllm_model_info",
            "1 for each model name the watched vLLM serves (its command line's, else its page's, else the last known, kept "
            "across its outages and the sidecar's restarts; empty while none is known): what counts this pod among its "
            "model's replicas.",
            labels=["model_name"],
        )
        for name in snapshot.discovery.served_models or ("",):
            models.add_metric([name], 1.0)
        yield models
        ranks = GaugeMetricFamily(
            f"{PREFIX}_rank_info",
            "1 for each process running the model: its engine (data-parallel rank), pipeline- and tensor-parallel rank, its role "
            "and the GPU NVML lists its memory on (gpu empty: not known); join the per-GPU series on gpu.",
            labels=["engine", "pp_rank", "tp_rank", "role", "gpu"],
        )
        for rank in snapshot.discovery.ranks:
            for gpu in [str(g) for g in rank["gpus"]] or [""]:
                ranks.add_metric([str(rank["dp_rank"]), str(rank["pp_rank"]), str(rank["tp_rank"]), str(rank["role"]), gpu], 1.0)
        yield ranks

    def _verdicts(self, snapshot: Snapshot) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            f"{PREFIX}_condition_active",
            "1 while the condition is active (debounced with its for/clear_for durations; an active condition whose "
            "inputs went missing stays 1 for its clear_for, with condition_unknown 1).",
            labels=["condition", "layer", "severity"],
        )
        unknown = GaugeMetricFamily(f"{PREFIX}_condition_unknown", "1 while the condition cannot be judged (inputs missing).", labels=["condition"])
        score = GaugeMetricFamily(
            f"{PREFIX}_condition_score",
            "How strongly the predicate holds now: 0.5 at its threshold, 1 far past it, 0 far from it.",
            labels=["condition"],
        )
        since = GaugeMetricFamily(f"{PREFIX}_condition_since_timestamp_seconds", "When the condition last changed state.", labels=["condition"])
        cause = GaugeMetricFamily(
            f"{PREFIX}_condition_cause", "1 for the cause the condition currently reports, 0 for the others.", labels=["condition", "cause"]
        )
        threshold = GaugeMetricFamily(
            f"{PREFIX}_condition_threshold",
            "Threshold in force for each condition (defaults or config).",
            labels=["condition", "threshold"],
        )
        primary = GaugeMetricFamily(
            f"{PREFIX}_condition_primary",
            "1 for the verdict the diagnosis leads with (the first active condition in the precedence order), 0 for the others.",
            labels=["condition"],
        )
        for verdict in snapshot.verdicts:
            primary.add_metric([verdict.condition], 1.0 if verdict.role == "primary" else 0.0)
            active.add_metric([verdict.condition, verdict.layer, verdict.severity], 1.0 if verdict.active else 0.0)
            unknown.add_metric([verdict.condition], 1.0 if verdict.state == "unknown" else 0.0)
            score.add_metric([verdict.condition], verdict.score)
            if verdict.since is not None:
                since.add_metric([verdict.condition], verdict.since)
            for name in verdict.causes:
                cause.add_metric([verdict.condition, name], 1.0 if verdict.active and verdict.cause == name else 0.0)
            settings = self.settings.get(verdict.condition)
            if settings is not None and verdict.condition in CONDITIONS_BY_ID:
                for name, value in sorted(settings.thresholds.items()):
                    threshold.add_metric([verdict.condition, name], value)
        yield from (active, unknown, primary, score, since, cause, threshold)

    def _signals(self, snapshot: Snapshot) -> Iterator[Metric]:
        """Windowed signals per engine (vllm_triage_vllm_*) and per GPU (vllm_triage_gpu_window_*).
        Aggregates stay in /diagnosis: exported, they would double-count in sum()."""
        families: dict[str, GaugeMetricFamily] = {}
        for spec in CATALOG:
            for signal in spec.signals:
                name = f"{PREFIX}_{spec.exported_as}{signal.family}"
                if name not in families:
                    extra = [k for k, _ in signal.extra_labels]
                    families[name] = GaugeMetricFamily(name, f"{signal.help} {WINDOWED}", labels=[*spec.scope_labels, *extra])
        for scope, values in sorted(snapshot.signals.items()):
            if scope.kind not in ("engine", "gpu", "host"):  # aggregates stay in /diagnosis
                continue
            scope_values = {"engine": [scope.engine, scope.model], "gpu": [scope.name], "host": []}[scope.kind]
            for spec in CATALOG:
                if spec.scope_kind != scope.kind:
                    continue
                for signal in spec.signals:
                    value = values.get(signal.id)
                    if value is not None:
                        families[f"{PREFIX}_{spec.exported_as}{signal.family}"].add_metric([*scope_values, *(v for _, v in signal.extra_labels)], value)
        yield from families.values()

    @staticmethod
    def _latest(samples: dict[SeriesKey, float]) -> Iterator[Metric]:
        """A source's last reading as read (like dcgm-exporter): vllm_triage_gpu_*{gpu,uuid,...},
        vllm_triage_process_*{role,index}."""
        families: dict[str, Metric] = {}
        for (name, labels), value in sorted(samples.items()):
            family = families.get(name)
            if family is None:
                keys = [k for k, _ in labels]
                help_text = LATEST_HELP.get(name, name)
                if name.endswith("_total"):
                    family = CounterMetricFamily(f"{PREFIX}_{name.removesuffix('_total')}", help_text, labels=keys)
                else:
                    family = GaugeMetricFamily(f"{PREFIX}_{name}", help_text, labels=keys)
                families[name] = family
            family.add_metric([v for _, v in labels], value)  # type: ignore[attr-defined]
        yield from families.values()


class Exposition:
    """Owns the registry and renders it on the pipeline thread, so that a scrape reads ready bytes.

    A format is rendered only once a scraper has asked for it, and then at a tick only when a scrape of it
    is due before the next tick: Prometheus scrapes every 15-60 s, several ticks apart, and rendering at every
    tick was a quarter of the sidecar's CPU (at a 2 s tick). The next scrape is expected one period after the last (for two
    scrapers at different offsets, e.g. an HA pair, after the gap seen two scrapes back). A scrape that
    finds no body for the current snapshot has it rendered then; a stale body is never served."""

    def __init__(self, settings: dict[str, ConditionSettings], tick_seconds: float) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SnapshotCollector(settings)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)  # the sidecar's own process_* (vLLM's are vllm_triage_process_*)
        PlatformCollector(registry=self.registry)
        self.tick_seconds = tick_seconds
        self._bodies: dict[bool, bytes] = {}
        self._asked_for: set[bool] = set()
        self._scraped_at: dict[bool, list[float]] = {False: [], True: []}  # the last three scrapes per format (monotonic)
        self.renders = 0

    def update(self, snapshot: Snapshot | None, now: float | None = None) -> None:
        """A new snapshot; `now` (monotonic) lets formats with no scrape due skip rendering."""
        self.collector.snapshot = snapshot
        # A new dict, so a reader on another thread sees the old bodies or the new ones, never a mix.
        self._bodies = {openmetrics: self._generate(openmetrics) for openmetrics in self._asked_for if now is None or self._due(openmetrics, now)}

    def scraped(self, openmetrics: bool, now: float) -> None:
        """A scrape of this format arrived (any thread)."""
        times = self._scraped_at[openmetrics]
        self._scraped_at[openmetrics] = [*times[-2:], now]

    def _due(self, openmetrics: bool, now: float) -> bool:
        times = self._scraped_at[openmetrics]
        if len(times) < 2:  # asked once (a person's curl): rendered when asked again, not at every tick
            return False
        gap = times[-2] - times[-3] if len(times) == 3 else times[-1] - times[-2]
        if gap <= self.tick_seconds:  # a scrape at every tick (an HA pair seconds apart is not: it comes due below)
            return True
        due = times[-1] + gap
        # The tick before the scrape is due renders; one a quarter tick after it too (a scrape a little late, or the tick's
        # own jitter); a scrape later than that has its body rendered when it comes.
        return due - self.tick_seconds < now <= due + self.tick_seconds / 4

    def rendered(self, openmetrics: bool) -> bytes | None:
        """The current snapshot's body if already rendered (safe from any thread)."""
        return self._bodies.get(openmetrics)

    def render(self, openmetrics: bool) -> bytes:
        """Render the current snapshot on the thread that calls update(), and keep this format rendered."""
        self._asked_for.add(openmetrics)
        bodies = self._bodies
        if openmetrics not in bodies:
            bodies[openmetrics] = self._generate(openmetrics)
        return bodies[openmetrics]

    def _generate(self, openmetrics: bool) -> bytes:
        self.renders += 1
        if openmetrics:
            # Every name exported is in the legacy character set, so these are the bytes of the default
            # (underscores) escaping, which walks each sample's name character by character (a third of the render).
            return generate_openmetrics(self.registry, escaping=ALLOWUTF8)  # type: ignore[no-untyped-call,no-any-return]
        return generate_latest(self.registry)
