"""The NIC's receive accounting (loss vs reordering, rx_series) and its send-retry backoff."""

from __future__ import annotations

import errno

import pytest

from fabric_emu import roce
from fabric_emu.agent import nic as nic_module
from fabric_emu.agent.nic import (
    MAX_RETRY_DELAY_S,
    MAX_TRACKED_GAP,
    RETRY_DELAY_S,
    RX_SERIES_INTERVAL_S,
    Nic,
    RecvQp,
)
from fabric_emu.agent.qps import QueuePair

START = roce.PSN_MASK - 1  # PSNs wrap around during the tests
QP = QueuePair("h2", "h1", 0, src_qpn=100, dst_qpn=200, start_psn=START, udp_sport=0xC000)
MIDDLE = roce.RC_RDMA_WRITE_MIDDLE


def receive(psns: list[int], times: list[float] | None = None, size: int = 100) -> RecvQp:
    rq = RecvQp(QP)
    for i, off in enumerate(psns):
        rq.on_packet(MIDDLE, (START + off) & roce.PSN_MASK, size, False, times[i] if times else 1.0)
    return rq


def test_a_late_packet_is_out_of_order_not_missing():
    rq = receive([0, 1, 3, 4, 2, 5])
    assert (rq.missing, rq.out_of_order, rq.duplicates, rq.packets) == (0, 1, 0, 6)
    assert rq.stats()["missing"] == 0


def test_missing_counts_the_psns_that_never_arrived():
    rq = receive([0, 1, 4, 6, 2])  # 3 and 5 never came; 2 came late
    assert (rq.missing, rq.out_of_order) == (2, 1)
    assert rq.stats()["missing"] == 2


def test_a_duplicate_is_neither():
    rq = receive([0, 1, 1, 2])
    assert (rq.missing, rq.out_of_order, rq.duplicates, rq.packets) == (0, 0, 1, 3)


def test_a_gap_too_large_to_track_stays_missing():
    rq = receive([0, MAX_TRACKED_GAP + 2, 1])  # 1 is in the untracked gap: it stays missing
    assert rq.missing == MAX_TRACKED_GAP + 1
    assert rq.stats()["missing"] == MAX_TRACKED_GAP + 1


def test_rx_series_has_a_point_at_most_every_interval_and_a_final_one():
    dt = RX_SERIES_INTERVAL_S
    times = [10.0, 10.0 + dt / 3, 10.0 + dt / 2, 10.0 + dt * 1.2, 10.0 + dt * 1.5, 10.0 + dt * 1.6]
    rq = receive(list(range(6)), times)
    # each point: [time, bytes received before that packet]; the last: [last packet, all bytes]
    assert rq.stats()["rx_series"] == [[10.0, 0], [10.0 + dt * 1.2, 300], [10.0 + dt * 1.6, 600]]
    assert RecvQp(QP).stats()["rx_series"] == []
    one = receive([0], [5.0])
    assert one.stats()["rx_series"] == [[5.0, 0], [5.0, 100]]


class RefusingSocket:
    """A send socket whose kernel queue is full for the first `refusals` packets."""

    def __init__(self, refusals: int):
        self.refusals = refusals
        self.sent = 0

    def sendto(self, packet, addr) -> int:
        if self.refusals:
            self.refusals -= 1
            raise OSError(errno.ENOBUFS, "No buffer space available")
        self.sent += 1
        return len(packet)

    def close(self) -> None:
        pass


@pytest.fixture
def nic(monkeypatch) -> Nic:
    monkeypatch.setattr(nic_module, "_receive_socket", lambda ip: RefusingSocket(0))
    monkeypatch.setattr(nic_module, "_send_socket", lambda ip, sport: RefusingSocket(0))
    qp = QueuePair("h1", "h2", 0, src_qpn=300, dst_qpn=400, start_psn=0, udp_sport=0xC001)
    return Nic("10.0.1.1", 1e12, 1024, [qp], [], {"h2": "10.0.1.2"}, 0.0)


def test_refused_sends_back_off_exponentially_and_reset_on_success(nic: Nic):
    sock = nic.send_qps[0].sock = RefusingSocket(7)
    nic.post_write(0, 3 * 1024, 0.0)
    now, waits = 1.0, []
    while sock.refusals:
        wake = nic.transmit(now)
        waits.append(wake - now)
        now = wake
    assert waits == pytest.approx([RETRY_DELAY_S * 2**i for i in range(5)] + [MAX_RETRY_DELAY_S] * 2)
    assert MAX_RETRY_DELAY_S == pytest.approx(2e-3) and RETRY_DELAY_S == pytest.approx(100e-6)
    while (wake := nic.transmit(now)) is not None:  # the kernel takes packets again
        now = max(now, wake)
    assert sock.sent == 3 and nic.eagain_retries == 7 and nic.idle
    sock.refusals = 1
    now += 1.0  # the pacer's tokens are back
    nic.post_write(0, 100, now)
    assert nic.transmit(now) - now == pytest.approx(RETRY_DELAY_S)  # reset by the success
