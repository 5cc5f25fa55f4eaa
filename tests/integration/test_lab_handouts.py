"""Each lab handout's steps (docs/labs/*.lab) run end to end through `fabric-emu lab --script`;
the script's `expect` lines are the observations the handout promises, and the lab exits 1 at
the first that does not hold."""

from __future__ import annotations

import pytest

from fabric_emu.run.prepare import load_checked
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers

pytestmark = [pytest.mark.root, pytest.mark.slow]

HANDOUTS = [("ecmp-collisions", "ecmp-collision"), ("pfc-incast", "victim-flow"),
            ("dcqcn-convergence", "convergence"), ("pfc-storm", "pfc-storm"), ("pfc-deadlock", "deadlock-ring")]
# Steps a handout takes in a second lab, started with --set (what the lab cannot change with the
# fabric up: pinned paths, link rates): (handout, script, experiment, sets).
CCW = ("paths=[{src: h1, dst: h3, via: [r1, r2, r3]}, {src: h2, dst: h4, via: [r2, r1, r4]}, "
       "{src: h3, dst: h1, via: [r3, r4, r1]}, {src: h4, dst: h2, via: [r4, r3, r2]}]")
SECOND_LABS = [("pfc-deadlock", "pfc-deadlock-control", "deadlock-ring", [CCW]),
               ("pfc-deadlock", "pfc-deadlock-control", "deadlock-ring", ["topology.host_link.gbps=45"])]


@pytest.mark.parametrize("handout, experiment", HANDOUTS)
def test_handout_script_shows_what_the_handout_promises(tmp_path, handout, experiment):
    _lab(tmp_path, handout, handout, experiment, [])


@pytest.mark.parametrize("handout, script, experiment, sets", SECOND_LABS,
                         ids=[f"{h}-{'+'.join(s.split('=')[0] for s in sets)}" for h, _, _, sets in SECOND_LABS])
def test_handout_second_labs_show_what_the_handout_promises(tmp_path, handout, script, experiment, sets):
    doc = (REPO / "docs" / "labs" / f"{handout}.md").read_text()
    assert all(s in doc for s in sets), "the handout gives the --set of each second lab"
    _lab(tmp_path, handout, script, experiment, sets)


def _lab(tmp_path, handout: str, name: str, experiment: str, sets: list[str]) -> None:
    exp = REPO / "experiments" / f"{experiment}.yaml"
    script = REPO / "docs" / "labs" / f"{name}.lab"
    doc = (REPO / "docs" / "labs" / f"{handout}.md").read_text()
    assert f"docs/labs/{name}.lab" in doc and f"experiments/{experiment}.yaml" in doc
    _, plan, _ = load_checked(exp, sets)
    args = [a for s in sets for a in ("--set", s)]
    r = fabric_emu("lab", str(exp), *args, "--out", str(tmp_path), "--script", str(script), timeout=900)
    expects = [ln for ln in script.read_text().splitlines() if ln.startswith("expect ")]
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr
    assert r.stdout.count("\nok: ") + r.stdout.startswith("ok: ") == len(expects), r.stdout[-4000:]
    assert "Traceback" not in r.stdout + r.stderr
    assert leftovers(plan) == []
