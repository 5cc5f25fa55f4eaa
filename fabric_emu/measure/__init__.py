"""Measuring the emulator and the fabric: switch counters, CPU per thread, samplers, fidelity, this machine's capacity and dilation."""
