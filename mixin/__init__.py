"""The artifacts derived from the condition table, apart from the runtime package (as Prometheus mixins
live beside their exporter): alert and recording rules with their promtool tests (rules.py), Grafana
dashboards (dashboards.py), and the generator that writes them with the docs (generate.py, `make generate`)."""
