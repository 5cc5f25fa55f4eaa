"""Each lab handout's steps (docs/labs/*.lab) run end to end through `fabric-emu lab --script`;
the script's `expect` lines are the observations the handout promises, and the lab exits 1 at
the first that does not hold."""

from __future__ import annotations

import pytest

from fabric_emu.run.prepare import load_checked
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers

pytestmark = [pytest.mark.root, pytest.mark.slow]

HANDOUTS = [("ecmp-collisions", "ecmp-collision"), ("pfc-incast", "victim-flow"),
            ("dcqcn-convergence", "convergence"), ("pfc-storm", "pfc-storm")]


@pytest.mark.parametrize("handout, experiment", HANDOUTS)
def test_handout_script_shows_what_the_handout_promises(tmp_path, handout, experiment):
    exp = REPO / "experiments" / f"{experiment}.yaml"
    script = REPO / "docs" / "labs" / f"{handout}.lab"
    doc = (REPO / "docs" / "labs" / f"{handout}.md").read_text()
    assert f"docs/labs/{handout}.lab" in doc and f"experiments/{experiment}.yaml" in doc
    _, plan, _ = load_checked(exp, [])
    r = fabric_emu("lab", str(exp), "--out", str(tmp_path), "--script", str(script), timeout=900)
    expects = [ln for ln in script.read_text().splitlines() if ln.startswith("expect ")]
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr
    assert r.stdout.count("\nok: ") + r.stdout.startswith("ok: ") == len(expects), r.stdout[-4000:]
    assert "Traceback" not in r.stdout + r.stderr
    assert leftovers(plan) == []
