"""Workloads as pure data: collectives, pipelines and training jobs as per-rank programs, flows, and their metrics."""
