from fabric_emu.fidelity import loss_note, verdict


def test_saturated_cpu_and_slow_agents_are_untrusted():
    assert verdict({"cpu_saturated_fraction": 0.5}, [1.0])
    assert verdict({"cpu_saturated_fraction": 0.0}, [0.95, 0.5])
    assert verdict({"cpu_saturated_fraction": 0.0}, [0.99]) == []


def test_loss_without_counted_drops_is_untrusted():
    # With no congestion drops, OVS's batch discard cannot explain even one lost packet.
    assert verdict({}, [], unexplained_loss=1, counted_drops=0)
    assert loss_note(1, 0) is None


def test_small_loss_beside_counted_drops_is_a_note_not_a_warning():
    assert verdict({}, [], unexplained_loss=5, counted_drops=2000) == []
    assert "batch" in loss_note(5, 2000)
    assert verdict({}, [], unexplained_loss=500, counted_drops=2000)


def test_cpu_monitor_samples_until_the_phase_ends():
    import time

    from fabric_emu.fidelity import CpuMonitor

    with CpuMonitor(interval_s=0.02) as cpu:
        end = time.monotonic() + 0.2
        while time.monotonic() < end:  # keep one core busy
            pass
    n = len(cpu.samples)
    assert n >= 4 and all(0.0 <= s <= 1.0 for s in cpu.samples)
    time.sleep(0.1)
    assert len(cpu.samples) == n  # the thread stopped with the block
    assert cpu.summary()["cpu_busy_max"] > 0.3
