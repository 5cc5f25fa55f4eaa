"""Workload drivers on the NIC: post a host's sends when their inputs have arrived (ring, flows, per-rank programs)."""
