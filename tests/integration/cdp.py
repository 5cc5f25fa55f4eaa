"""A headless Chromium driven over the Chrome DevTools Protocol, for tests of HTML pages.

`Chromium` starts Debian's `chromium` in its own process group with a throw-away profile,
asks for a debugging port chosen by the kernel (`--remote-debugging-port=0`, loopback only),
reads that port from the profile's DevToolsActivePort file and speaks CDP over one websocket
(websocket-client). `open_page` loads a URL and reports what a reader would see go wrong:
uncaught exceptions, console errors and the browser's own error log (blocked fetches, CSP
violations, missing files). On exit it ends only the process group it started and removes
the profile.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket

START_TIMEOUT_S = 30.0


class CdpError(RuntimeError):
    pass


@dataclass
class PageReport:
    """What loading a page produced: errors seen, and the value of the expression asked for."""
    errors: list[str] = field(default_factory=list)
    value: Any = None


class Chromium:
    """`with Chromium() as browser: report = browser.open_page(url, expression)`."""

    def __init__(self, binary: str | None = None) -> None:
        # Debian's package is `chromium`, Ubuntu's `chromium-browser` (scripts/setup.sh)
        self.binary = binary or shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
        self.profile: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.ws: websocket.WebSocket | None = None
        self._next_id = 0

    # -------------------------------------------------------------------- life cycle
    def __enter__(self) -> Chromium:
        self.profile = Path(tempfile.mkdtemp(prefix="fabric-emu-chromium-"))
        log = open(self.profile.parent / f"{self.profile.name}.log", "wb")
        self._log_path = Path(log.name)
        try:
            self.proc = subprocess.Popen(
                [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--no-default-browser-check", "--disable-extensions", "--remote-debugging-port=0",
                 f"--user-data-dir={self.profile}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()
        try:
            port, path = self._devtools_address()
            # Chromium refuses websocket clients that send an Origin it was not told to allow.
            self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=30,
                                                  suppress_origin=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _devtools_address(self) -> tuple[int, str]:
        """The port and browser path Chromium writes once it listens."""
        assert self.profile is not None and self.proc is not None
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CdpError(f"chromium exited with {self.proc.returncode}: {self._log_tail()}")
            lines = active.read_text().split() if active.is_file() else []
            if len(lines) >= 2:
                return int(lines[0]), lines[1]
            time.sleep(0.1)
        raise CdpError(f"chromium did not open its debugging port in {START_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return " | ".join(self._log_path.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def __exit__(self, *exc: object) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None and self.proc.poll() is None:
            # The browser and its helpers (renderer, GPU, zygote) share the group started above.
            for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            try:  # a helper that outlived the browser (zombies are the init process's to reap)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.profile is not None:
            shutil.rmtree(self.profile, ignore_errors=True)
            self._log_path.unlink(missing_ok=True)

    # -------------------------------------------------------------------- protocol
    def _send(self, method: str, session: str | None = None, **params: Any) -> int:
        assert self.ws is not None
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        return self._next_id

    def _recv(self, deadline: float) -> dict:
        assert self.ws is not None
        self.ws.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            return json.loads(self.ws.recv())
        except websocket.WebSocketTimeoutException:
            raise CdpError("chromium did not answer in time") from None

    def call(self, method: str, session: str | None = None, events: list[dict] | None = None,
             timeout_s: float = 30.0, **params: Any) -> dict:
        """Send a command and wait for its answer; events that arrive meanwhile go to `events`."""
        want = self._send(method, session, **params)
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._recv(deadline)
            if msg.get("id") == want:
                if "error" in msg:
                    raise CdpError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if events is not None and "method" in msg:
                events.append(msg)

    def wait_event(self, name: str, session: str, events: list[dict], timeout_s: float = 30.0) -> dict:
        """Wait for an event of this page (it may already be in `events`)."""
        for e in events:
            if e["method"] == name and e.get("sessionId") == session:
                return e
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._recv(deadline)
            if "method" in msg:
                events.append(msg)
                if msg["method"] == name and msg.get("sessionId") == session:
                    return msg

    # -------------------------------------------------------------------- pages
    def open_page(self, url: str, expression: str, settle_s: float = 0.5) -> PageReport:
        """Load `url` in a new tab, wait for its load event (and a moment for late errors),
        then evaluate `expression` (JSON-able result) in it."""
        events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        try:
            for domain in ("Runtime", "Log", "Page"):
                self.call(f"{domain}.enable", session, events)
            self.call("Page.navigate", session, events, url=url)
            self.wait_event("Page.loadEventFired", session, events)
            # Errors after load (a late image decode, a timer) still count: drain for a moment.
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline:
                try:
                    msg = self._recv(deadline)
                except CdpError:
                    break
                if "method" in msg:
                    events.append(msg)
            result = self.call("Runtime.evaluate", session, events, expression=expression,
                               returnByValue=True, awaitPromise=True)
            if "exceptionDetails" in result:
                raise CdpError(f"evaluating the check failed: {result['exceptionDetails']}")
            value = result["result"].get("value")
        finally:
            self.call("Target.closeTarget", targetId=target)
        return PageReport(page_errors([e for e in events if e.get("sessionId") == session]), value)


def page_errors(events: list[dict]) -> list[str]:
    """The events a reader would call errors, as one line each."""
    errors = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            errors.append(f"console.{p['type']}: {args}")
        elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".rstrip())
    return errors
