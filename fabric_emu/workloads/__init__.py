"""Workloads as pure data: collectives, pipelines and training jobs as per-rank programs, flows, and their metrics.

The general Program, one module per kind (how it is built and how it is measured), and what
every job has in common:

    program      the general shape: per-rank sends, receives and compute with dependencies
    collectives  ring and halving-doubling all-reduce, reduce-scatter, all-gather, all-to-all,
                 sendrecv; algbw and busbw
    training     pipelines (gpipe, 1f1b) and 3D-parallel steps, placement, step split, bubble
    flows        flows and incast: their flows, the hosts that run an agent, line-rate time
    jobs         an experiment's jobs as one Program and each job's results (calls the kinds)
"""
