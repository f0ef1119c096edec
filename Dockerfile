# vllm-triage sidecar image: `docker build -t vllm-triage:0.1.0 .`
# Runs as uid 10001; py-spy carries the cap_sys_ptrace file capability so that this non-root user can
# sample vLLM's GIL when (and only when) the pod or compose service grants SYS_PTRACE. Without that
# grant the kernel refuses to start py-spy and the sidecar reports the GIL source down with the fix.
# BASE: any Debian-based image with python3 (>= 3.10) and its venv module; the published image uses
# python:3.12-slim, the tests a Debian root filesystem made locally (no registry is reachable there).
ARG BASE=python:3.12-slim
FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN python3 -m venv /opt/vllm-triage \
 && /opt/vllm-triage/bin/pip install --no-cache-dir --quiet . \
 && rm -rf /opt/vllm-triage/lib/python3*/site-packages/pip*

FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/vllm-triage /opt/vllm-triage
RUN setcap cap_sys_ptrace+ep /opt/vllm-triage/bin/py-spy \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin vllm-triage
USER 10001:10001
# NVML comes from the host driver, mounted by the NVIDIA container runtime when asked for (utility only).
ENV PATH=/opt/vllm-triage/bin:$PATH \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    PYTHONUNBUFFERED=1
EXPOSE 10290
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:10290/healthz', timeout=2)"]
ENTRYPOINT ["vllm-triage"]
CMD ["serve"]
