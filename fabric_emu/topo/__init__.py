"""Fabric plans: the pure description (graph, names, addresses, ports, paths) of every topology kind."""
