"""The condition table (docs/guide.md describes each). The engine, /diagnosis, the CLI report, the alert rules,
dashboards and runbooks all derive from CONDITIONS. Thresholds, windows and `for`/`clear_for` durations are defaults
that the config file overrides per condition.

Where a condition goes: its entry beside its predicate, in the module of the regime it judges.
- liveness.py: is vLLM answering, is its engine stepping (vllm_unreachable, engine_wedged);
- capacity.py: its KV cache full, preempting or fragmented;
- queueing.py: requests waiting and why, or too few sent;
- latency.py: what users wait for (TTFT, ITL) and requests that fail;
- features.py: features vLLM runs with that do not pay or have no effect;
- changes.py: what a change of vLLM's configuration did (its envelope before and after);
- host.py: vLLM's processes, ranks and CPU (psutil, py-spy) where they decide the verdict;
- gpu.py: the GPUs (NVML, GPM) where they decide it.
A condition read on vLLM's /metrics goes in the first six whatever other layer names its cause; it is listed in
VLLM_CONDITIONS, host.py's and gpu.py's in their module's CONDITIONS. The table's order is the order verdicts are
listed in (/diagnosis, /metrics, the docs); a new one goes at the end of its layer's list.

Precedence, the one story a server tells (the primary verdict is the active one of lowest precedence), in bands:
-   1- 29  the server is down or stuck: nothing after it can be trusted (unreachable, a rank lost, wedged);
-  30- 69  users are failed or capacity is exhausted or taken (errors, KV cache full, GPU starved, preemption, another
           program on vLLM's GPU; a queue whose cause is a cap or a budget moves here, 45-46);
-  70-119  why requests queue or the GPU is slowed (queue backlog, a change that made vLLM slower, straggler, throttling,
           PCIe, collectives);
- 120-169  latency symptoms and the GPU's own limits (fragmentation, TTFT, ITL, bandwidth- or compute-bound);
- 170-199  waste that harms nobody yet (client underload, features that do not pay).
"""

from __future__ import annotations

from ..condition import Condition, ConditionSettings, Threshold, default_settings
from . import capacity, changes, features, gpu, host, latency, liveness, queueing

__all__ = ["CONDITIONS", "CONDITIONS_BY_ID", "PRECEDENCE", "VLLM_CONDITIONS", "Condition", "ConditionSettings", "Threshold", "default_settings"]

VLLM_CONDITIONS: tuple[Condition, ...] = (
    liveness.VLLM_UNREACHABLE,
    liveness.ENGINE_WEDGED,
    capacity.KV_CACHE_SATURATED,
    queueing.QUEUE_BACKLOG,
    capacity.PREEMPTION_STORM,
    queueing.CLIENT_UNDERLOAD,
    latency.TTFT_HIGH,
    latency.ITL_HIGH,
    latency.REQUEST_ERRORS,
    features.PREFIX_CACHE_INEFFECTIVE,
    capacity.KV_FRAGMENTATION_SUSPECTED,
    features.SPEC_DECODE_INEFFECTIVE,
    changes.REGRESSION_AFTER_CHANGE,
    features.FEATURE_INEFFECTIVE,
)
CONDITIONS: tuple[Condition, ...] = VLLM_CONDITIONS + host.CONDITIONS + gpu.CONDITIONS
CONDITIONS_BY_ID = {c.id: c for c in CONDITIONS}
# One story per server: the primary verdict is the first active one in this order.
PRECEDENCE: tuple[str, ...] = tuple(c.id for c in sorted(CONDITIONS, key=lambda c: c.precedence))
