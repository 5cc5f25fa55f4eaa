"""The controller's REST API: read the fabric's load-balancing state and change it during a run.

    GET  /lb   -> 200 {"mode", "modes", "spray_entropies", "uplinks": {leaf: {spine: {...}}},
                       "changes": [...]}
    GET  /lb?ttl_expired  -> the same and "ttl_expired": {switch: {port: packets}}, asked of
                             every switch now (OpenFlow round trips: only when asked)
    PUT  /lb   {"mode": "spray", "params": {...}}  -> 200 {"mode", "applied_s", ...}
                                                    -> 400 bad request, 409 not possible now

A plain WSGI application over a `LiveControl` (the os-ken app implements it), served by os-ken's
hub.WSGIServer on loopback: no framework, nothing here imports os-ken, so it is unit-tested with
a fake. `fabric-emu lb` is its client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Protocol

from controller.core import Conflict

__all__ = ["Conflict", "LiveControl", "make_app"]
MAX_BODY = 64 * 1024


class LiveControl(Protocol):
    def state(self) -> dict: ...

    def ttl_expired(self) -> dict: ...

    def set_mode(self, mode: str, params: dict) -> dict:
        """Apply; the result to report. ValueError: bad input; Conflict: not possible now."""
        ...


StartResponse = Callable[[str, list[tuple[str, str]]], object]


def _reply(start: StartResponse, status: str, body: dict) -> list[bytes]:
    data = (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def make_app(control: LiveControl) -> Callable[[dict, StartResponse], Iterable[bytes]]:
    def app(environ: dict, start: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path.rstrip("/") != "/lb":
            return _reply(start, "404 Not Found", {"error": f"no resource {path}; try /lb"})
        if method == "GET":
            if "ttl_expired" in environ.get("QUERY_STRING", "").split("&"):
                return _reply(start, "200 OK", {**control.state(), "ttl_expired": control.ttl_expired()})
            return _reply(start, "200 OK", control.state())
        if method not in ("PUT", "POST"):
            return _reply(start, "405 Method Not Allowed", {"error": "GET or PUT /lb"})
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            return _reply(start, "400 Bad Request", {"error": f"a JSON body of 1..{MAX_BODY} bytes is needed"})
        try:
            body = json.loads(environ["wsgi.input"].read(length))
        except (ValueError, UnicodeDecodeError) as e:
            return _reply(start, "400 Bad Request", {"error": f"body is not JSON: {e}"})
        if not isinstance(body, dict) or not isinstance(body.get("mode"), str):
            return _reply(start, "400 Bad Request", {"error": 'expected {"mode": "...", "params": {...}}'})
        params = body.get("params") or {}
        if not isinstance(params, dict):
            return _reply(start, "400 Bad Request", {"error": "params: expected an object"})
        try:
            return _reply(start, "200 OK", control.set_mode(body["mode"], params))
        except ValueError as e:
            return _reply(start, "400 Bad Request", {"error": str(e)})
        except Conflict as e:
            return _reply(start, "409 Conflict", {"error": str(e)})

    return app
