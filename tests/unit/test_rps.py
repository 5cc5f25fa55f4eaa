from pathlib import Path

from fabric_emu.kernel.rps import cpu_mask, steer


def test_cpu_masks_are_32_bit_hex_words_most_significant_first() -> None:
    assert cpu_mask([0, 1]) == "00000003"
    assert cpu_mask([0, 33]) == "00000002,00000001"
    assert cpu_mask([]) == "00000000"


def test_steer_writes_every_receive_queue(tmp_path: Path) -> None:
    for q in ("rx-0", "rx-1", "tx-0"):
        (tmp_path / "leaf1-eth1" / "queues" / q).mkdir(parents=True)
    steer("leaf1-eth1", "00000003", sysfs=tmp_path)
    queues = tmp_path / "leaf1-eth1" / "queues"
    assert [(queues / q / "rps_cpus").read_text() for q in ("rx-0", "rx-1")] == ["00000003"] * 2
    assert not (queues / "tx-0" / "rps_cpus").exists()

