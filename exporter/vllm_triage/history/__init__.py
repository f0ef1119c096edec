"""What happened before now, read back: captures (the sidecar's own recordings, `record` and `replay`), Prometheus'
history (the same Readings rebuilt from what Prometheus scraped of vLLM, the sidecar and dcgm-exporter) and the
fleet view (every server of a Prometheus judged over the same span). Each feeds the same Pipeline as the live daemon."""
