"""Thin adapters over kernel interfaces that know nothing of fabrics: qdiscs over rtnetlink, bpf(2), receive packet steering, compiling C."""
