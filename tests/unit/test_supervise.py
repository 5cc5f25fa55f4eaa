"""The supervisor's decisions: which part died, how it is named, restart or end the run."""

from __future__ import annotations

import pytest

from fabric_emu.nic.launch import engine_name
from fabric_emu.results.trust import restart_warnings, trust_section
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.state.supervise import (Component, ComponentFailed, Supervisor, decide, death_message,
                                        describe_exit)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_exit_status_in_words():
    assert describe_exit(None) is None
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(-15) == "was killed by signal 15 (SIGTERM)"
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(0) == "exited with code 0"  # before DONE, a clean exit is still a death


def test_engine_names_say_which_hosts():
    assert engine_name(2, ["h3", "h7"]) == "NIC engine 2 (hosts h3, h7)"
    assert engine_name(0, ["h1"]) == "NIC engine 0 (host h1)"
    assert engine_name(1, [f"h{i}" for i in range(10)]) == "NIC engine 1 (hosts h0, h1, h2, h3, h4, h5 and 4 more)"


def test_message_names_the_part_and_the_time():
    msg = death_message("NIC engine 2 (hosts h3, h7)", "was killed by signal 9 (SIGKILL)", 1.84)
    assert msg.startswith("NIC engine 2 (hosts h3, h7) was killed by signal 9 (SIGKILL) 1.8 s after traffic started")
    assert "before traffic started" in death_message("x", "stopped", None)


@pytest.mark.parametrize("policy, done, expect", [("restart", 0, "restart"), ("restart", 2, "restart"),
                                                  ("restart", 3, "fail"), ("fail", 0, "fail")])
def test_decide_restarts_until_the_limit(policy, done, expect):
    assert decide(policy, done, max_restarts=3) == expect


def test_a_failing_part_ends_the_run_with_its_time():
    clock = Clock()
    sup = Supervisor(clock=clock)
    state = {"engine": None}
    sup.add(Component("NIC engine 1 (hosts h2)", "nic", "fail", probe=lambda: state["engine"]))
    sup.traffic_started()
    sup.check()
    clock.t += 2.5
    state["engine"] = "was killed by signal 9 (SIGKILL)"
    with pytest.raises(ComponentFailed) as e:
        sup.check()
    assert e.value.kind == "nic" and e.value.at_s == pytest.approx(2.5)
    assert "NIC engine 1 (hosts h2) was killed by signal 9 (SIGKILL) 2.5 s after" in str(e.value)


def test_checks_are_rate_limited_unless_forced():
    clock = Clock()
    sup = Supervisor(clock=clock, interval_s=0.2)
    calls = []
    sup.add(Component("p", "nic", "fail", probe=lambda: calls.append(1)))
    sup.check()
    sup.check()  # same instant: no probe
    assert len(calls) == 1
    clock.t += 0.05
    sup.check(force=True)
    clock.t += 0.25
    sup.check()
    assert len(calls) == 3


def test_a_restarted_part_is_logged_and_a_crash_loop_fails():
    clock = Clock()
    sup = Supervisor(clock=clock, interval_s=0.0)
    dead = {"now": False}

    def restart() -> dict:
        dead["now"] = False
        clock.t += 0.3  # the restart takes time
        return {"gates_reopened": ["leaf1-eth3"]}

    sup.add(Component("the PFC daemon", "pfc-daemon", "restart",
                      probe=lambda: "was killed by signal 9 (SIGKILL)" if dead["now"] else None, restart=restart))
    sup.traffic_started()
    for i in range(3):
        clock.t += 1.0
        dead["now"] = True
        sup.check()
    assert [r["restarted_in_s"] for r in sup.restarts] == [0.3, 0.3, 0.3]
    assert sup.restarts[0]["at_s"] == pytest.approx(1.0)
    assert sup.restarts[0]["gates_reopened"] == ["leaf1-eth3"]
    dead["now"] = True
    with pytest.raises(ComponentFailed, match="restarted 3 time"):
        sup.check()


def test_removed_parts_are_not_probed():
    sup = Supervisor(interval_s=0.0)
    sup.add(Component("NIC engine 0 (host h1)", "nic", "fail", probe=lambda: "exited with code 0"))
    sup.add(Component("exporter", "exporter", "fail", probe=lambda: None))
    sup.remove_kind("nic")
    sup.check()  # the engine that finished and exited is no death


def test_restart_warning_names_the_daemon_and_its_gates():
    (line,) = restart_warnings([{"component": "the PFC daemon", "kind": "pfc-daemon",
                                 "how": "was killed by signal 9 (SIGKILL)", "at_s": 3.21,
                                 "restarted_in_s": 0.31, "gates_reopened": ["spine1-eth1", "leaf2-eth3"]}])
    assert line.startswith("the PFC daemon was killed by signal 9 (SIGKILL) 3.2 s after traffic started"
                           " and was restarted in 0.31 s")
    assert "2 gate(s)" in line


def test_a_dead_part_is_not_blamed_on_the_dilation():
    spec = ExperimentSpec.model_validate({"name": "x", "topology": {"name": "t", "kind": "leaf-spine", "spines": 1,
                                                                    "leaves": 2, "hosts_per_leaf": 1},
                                          "workload": {"type": "allreduce", "size": "1MB"}})
    blamed = trust_section(spec, {}, {}, [], [], {}, None, 710)["fidelity"]
    assert any("raise the dilation" in w for w in blamed["warnings"])
    fault = "NIC engine 1 (hosts h2) was killed by signal 9 (SIGKILL) 2.0 s after traffic started; the run was ended"
    told = trust_section(spec, {}, {}, [], [], {}, None, 710, fault=fault)["fidelity"]
    assert not any("raise the dilation" in w for w in told["warnings"])
    assert told["notes"] == [f"710 packet(s) sent were not delivered: the run was cut short ({fault})"]


def test_a_restarted_part_s_new_process_is_handed_on():
    """The CPU monitor must sample a restarted daemon, not only its dead predecessor."""
    pids = iter([4101, 4102])
    dead = {"now": False}
    watched: list[tuple[int, str]] = []

    def restart() -> dict:
        dead["now"] = False
        return {"pid": next(pids)}

    sup = Supervisor(interval_s=0.0, on_new_pid=lambda pid, kind: watched.append((pid, kind)))
    sup.add(Component("the PFC daemon", "pfc-daemon", "restart", probe=lambda: "stopped" if dead["now"] else None,
                      restart=restart))
    sup.add(Component("the exporter", "exporter", "fail", probe=lambda: None))
    for _ in range(2):
        dead["now"] = True
        sup.check()
    sup.check()
    assert watched == [(4101, "pfc-daemon"), (4102, "pfc-daemon")]
