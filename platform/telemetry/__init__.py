"""Observability: the job-level metrics exporter, Prometheus scrape targets for a local run, and
the Grafana dashboard (its generator and `stalwart dashboards push`)."""
