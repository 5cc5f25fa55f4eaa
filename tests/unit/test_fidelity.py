from fabric_emu.measure.fidelity import verdict


def test_saturated_cpu_and_slow_agents_are_untrusted():
    assert verdict({"cpu_saturated_fraction": 0.5}, [1.0])
    assert verdict({"cpu_saturated_fraction": 0.0}, [0.95, 0.5])
    assert verdict({"cpu_saturated_fraction": 0.0}, [0.01, 0.05]) == []


def test_any_uncounted_loss_is_untrusted():
    # Every switch drop is counted where it happens, so one packet lost elsewhere is the emulator's.
    assert verdict({}, [], unexplained_loss=1)
    assert verdict({}, [], unexplained_loss=0) == []


def _cores_in_proc_stat() -> int:
    """The cores /proc/stat's first line sums over (what CpuMonitor divides by)."""
    with open("/proc/stat") as f:
        return sum(1 for line in f if line.startswith("cpu") and line[3].isdigit())


def test_cpu_monitor_samples_until_the_phase_ends():
    import time

    from fabric_emu.measure.fidelity import CpuMonitor

    with CpuMonitor(interval_s=0.05, ovs=False) as cpu:  # machine figures only
        end = time.monotonic() + 0.4
        while time.monotonic() < end:  # keep one core busy
            pass
    n = len(cpu.samples)
    assert n >= 4 and all(0.0 <= s <= 1.0 for s in cpu.samples)
    time.sleep(0.15)
    assert len(cpu.samples) == n  # the thread stopped with the block
    # One busy core of N is 1/N of the machine, whatever N is; half of it leaves room for
    # jiffy rounding and for this process being descheduled.
    assert cpu.summary()["cpu_busy_max"] > 0.5 / _cores_in_proc_stat()


def test_cpu_monitor_summary_from_samples():
    from fabric_emu.measure.fidelity import CpuMonitor

    cpu = CpuMonitor()
    assert cpu.summary()["cpu_busy_mean"] is None
    cpu.samples = [0.1, 0.5, 1.0, 1.0]  # of the whole machine, so the same on any core count
    s = cpu.summary()
    assert {k: s[k] for k in ("cpu_busy_mean", "cpu_busy_max", "cpu_saturated_fraction")} == {
        "cpu_busy_mean": 0.65, "cpu_busy_max": 1.0, "cpu_saturated_fraction": 0.5}
    assert s["threads"] == [] and s["saturated_threads"] == []  # no process watched yet
