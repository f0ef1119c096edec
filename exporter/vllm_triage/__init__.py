"""vllm-triage: a sidecar that tells why a vLLM inference server is slow."""

__version__ = "0.1.0"
