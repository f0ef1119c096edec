# vllm-triage sidecar image: `docker build -t vllm-triage:0.1.0 .`
# Runs as uid 10001; py-spy carries the cap_sys_ptrace file capability so that this non-root user can
# sample vLLM's GIL when (and only when) the pod or compose service grants SYS_PTRACE. Without that
# grant the kernel refuses to start py-spy and the sidecar reports the GIL source down with the fix.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
 && rm -rf /wheels \
 && setcap cap_sys_ptrace+ep "$(command -v py-spy)" \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin vllm-triage
USER 10001:10001
# NVML comes from the host driver, mounted by the NVIDIA container runtime when asked for (utility only).
ENV NVIDIA_DRIVER_CAPABILITIES=utility \
    PYTHONUNBUFFERED=1
EXPOSE 10290
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:10290/healthz', timeout=2)"]
ENTRYPOINT ["vllm-triage"]
CMD ["serve"]
