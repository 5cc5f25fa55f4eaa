"""`fabric-emu report` on a real run, opened in a real headless Chromium: the page must load
with no exception, no console error and no blocked fetch, and show every plot of the folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.cdp import Chromium
from tests.integration.fabric_checks import REPO, fabric_emu, only_run_dir, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

# Every <img> with what a reader would see: loaded, decoded to real pixels, laid out on screen.
IMAGES = """Array.from(document.images).map(i => {
  const r = i.getBoundingClientRect();
  return {alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
          shown: r.width > 0 && r.height > 0 && getComputedStyle(i).visibility !== 'hidden',
          inline: i.src.startsWith('data:image/')};
})"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small real run: the quickstart, one iteration of 4 MB."""
    out = tmp_path_factory.mktemp("results")
    r = fabric_emu("run", str(REPO / "experiments" / "quickstart.yaml"), "--out", str(out),
                   "--set", "workload.size=4MB", "--set", "workload.iterations=1")
    assert r.returncode == 0, r.stdout + r.stderr
    return only_run_dir(out, "quickstart")


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        yield b


def plot_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".png", ".svg"))


def test_run_report_renders_cleanly_with_every_plot(run_dir: Path, browser: Chromium):
    r = fabric_emu("report", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    page = run_dir / "report.html"
    assert r.stdout.strip() == str(page)
    plots = plot_files(run_dir)
    assert plots, "the run wrote no plots to check"

    report = browser.open_page(page.as_uri(), IMAGES)
    assert report.errors == []
    images = report.value
    assert len(images) == len(plots), (images, plots)
    assert sorted(i["alt"] for i in images) == sorted(str(p.relative_to(run_dir)) for p in plots)
    for img in images:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0 and img["shown"], img
        assert img["inline"], img

    html = page.read_text()
    s = read_json(run_dir / "summary.json")
    assert ("trusted: the emulator saw nothing" in html) == s["fidelity"]["trusted"]
    for w in s["fidelity"]["warnings"]:
        assert w.split(":")[0] in html
    for name in ("ports.csv", "flows.csv", "queues.csv", "experiment.yaml", "git_commit"):
        assert name in html, name


def test_folder_of_runs_index_renders_cleanly(run_dir: Path, browser: Chromium):
    r = fabric_emu("report", str(run_dir.parent))
    assert r.returncode == 0, r.stdout + r.stderr
    report = browser.open_page((run_dir.parent / "report.html").as_uri(), "document.body.innerText")
    assert report.errors == []
    assert run_dir.name in report.value and "quickstart" in report.value


def test_the_browser_check_sees_errors(tmp_path: Path, browser: Chromium):
    """The check itself: a page that throws, logs an error and fetches what the policy
    forbids must not pass as clean."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head>"
                   "<meta http-equiv=\"Content-Security-Policy\" content=\"img-src data:\"></head><body>"
                   "<img src=\"missing.png\"><script>console.error('logged'); throw new Error('boom');</script>"
                   "</body></html>")
    report = browser.open_page(bad.as_uri(), "document.images.length")
    text = "\n".join(report.errors)
    assert "boom" in text and "logged" in text and "missing.png" in text, report.errors
    assert report.value == 1
