"""Live views of a running fabric: the manifest a run publishes, cheap snapshots read from it,
`fabric-emu top` and the Prometheus exporter."""
