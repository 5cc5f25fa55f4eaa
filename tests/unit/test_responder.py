"""The PFC responder: Python's layouts against responder.c's structs, and its rule for which gate
change a gate takes (the source built as a library)."""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest

from fabric_emu.ports import responder

SIZES = {"uint64_t": 8, "uint32_t": 4, "int32_t": 4, "uint8_t": 1}


def _struct_bytes(name: str) -> int:
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", responder.SOURCE.read_text(), re.S).group(1)
    total = 0
    for ctype, names in re.findall(r"(u?int\d+_t) ([^;]+);", body):
        total += SIZES[ctype] * len(names.split(","))
    return total


def test_command_and_report_layouts_match_the_c_structs() -> None:
    assert _struct_bytes("command") == responder.COMMAND.size
    assert _struct_bytes("report") == responder.REPORT.size


def test_a_report_reads_back_what_the_responder_packed() -> None:
    raw = responder.REPORT.pack(7, 0, responder.SRC_FAST, 1, 0, -22, 0, 100, 90, 95, 96, 99, 0)
    r = responder.Report.unpack(raw)
    assert (r.port, r.open, r.source, r.changed, r.stale, r.error) == (7, False, responder.SRC_FAST, True, False, -22)
    assert (r.cause, r.origin, r.handled, r.start_ns, r.applied_ns, r.kick_ns) == (100, 90, 95, 96, 99, 0)



@pytest.fixture(scope="module")
def admits(tmp_path_factory):
    """responder.c's rule for taking a gate change, from the source built as a library."""
    lib = tmp_path_factory.mktemp("responder") / "responder.so"
    subprocess.run(["clang", "-O2", "-Wall", "-Wno-unused-function", "-pthread", "-shared", "-fPIC",
                    "-DRESPONDER_LIB", str(responder.SOURCE), "-o", str(lib)], check=True)
    fn = ctypes.CDLL(str(lib)).responder_admits
    fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    return lambda last_cause, last_seq, source, cause, seq=0: bool(fn(last_cause, last_seq, source, cause, seq))


def test_a_fast_close_older_than_the_daemons_last_change_is_refused(admits) -> None:
    # the daemon reopened the gate having read events up to t=500: a crossing at 400 comes too late
    assert not admits(500, 7, responder.SRC_FAST, 400)
    # one at 500 too: the daemon had read it when it decided
    assert not admits(500, 7, responder.SRC_FAST, 500)
    # a crossing after everything the daemon had read closes the gate
    assert admits(500, 7, responder.SRC_FAST, 501)


def test_daemon_commands_apply_in_their_own_order(admits) -> None:
    # a command at the same cause as the last change, sent later: taken
    assert admits(500, 7, responder.SRC_DAEMON, 500, 8)
    # an earlier command read by another thread after a later one: refused
    assert not admits(500, 8, responder.SRC_DAEMON, 500, 7)
    # a command from before a fast close's crossing: refused, the crossing is news to it
    assert not admits(600, 7, responder.SRC_DAEMON, 550, 9)
