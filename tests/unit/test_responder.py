"""The PFC responder's messages: Python's layouts against responder.c's structs."""

from __future__ import annotations

import re

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

