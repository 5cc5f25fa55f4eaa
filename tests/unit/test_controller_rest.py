"""The controller's REST API as a WSGI app over a fake LiveControl (controller/rest.py)."""

from __future__ import annotations

import io
import json

import pytest

from controller.rest import Conflict, make_app


class FakeControl:
    def __init__(self):
        self.mode, self.calls = "ecmp", []

    def state(self) -> dict:
        return {"mode": self.mode}

    def ttl_expired(self) -> dict:
        self.calls.append("ttl_expired")
        return {"spine1": {"2": 7}}

    def set_mode(self, mode: str, params: dict) -> dict:
        self.calls.append((mode, params))
        if mode == "nope":
            raise ValueError("unknown load balancing 'nope'")
        if mode == "spray" and params.get("entropies") == 0:
            raise Conflict("no entropy")
        self.mode = mode
        return {"mode": mode, "applied_s": 0.001}


def call(app, method: str, path: str = "/lb", body: bytes | None = None, query: str = "") -> tuple[str, dict]:
    got = {}
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
               "CONTENT_LENGTH": str(len(body)) if body is not None else "",
               "wsgi.input": io.BytesIO(body or b"")}
    out = b"".join(app(environ, lambda status, headers: got.update(status=status)))
    return got["status"], json.loads(out)


@pytest.fixture
def control():
    return FakeControl()


def test_get_returns_the_state(control):
    assert call(make_app(control), "GET") == ("200 OK", {"mode": "ecmp"})


def test_ttl_counts_are_asked_of_the_switches_only_when_wanted(control):
    assert call(make_app(control), "GET") == ("200 OK", {"mode": "ecmp"}) and control.calls == []
    assert call(make_app(control), "GET", query="ttl_expired") == (
        "200 OK", {"mode": "ecmp", "ttl_expired": {"spine1": {"2": 7}}})
    assert control.calls == ["ttl_expired"]


def test_put_changes_the_mode(control):
    status, body = call(make_app(control), "PUT", body=b'{"mode": "spray", "params": {"entropies": 4}}')
    assert status == "200 OK" and body["mode"] == "spray"
    assert control.calls == [("spray", {"entropies": 4})]


@pytest.mark.parametrize("body,status", [
    (b"", "400 Bad Request"),
    (b"not json", "400 Bad Request"),
    (b'["spray"]', "400 Bad Request"),
    (b'{"mode": "spray", "params": 3}', "400 Bad Request"),
    (b'{"mode": "nope"}', "400 Bad Request"),
    (b'{"mode": "spray", "params": {"entropies": 0}}', "409 Conflict"),
])
def test_bad_requests_say_why(control, body, status):
    got, reply = call(make_app(control), "PUT", body=body)
    assert got == status and reply["error"]
    assert control.mode == "ecmp"


def test_unknown_paths_and_methods(control):
    assert call(make_app(control), "GET", "/flows")[0] == "404 Not Found"
    assert call(make_app(control), "DELETE")[0] == "405 Method Not Allowed"
