"""Bad requests get the right status and a JSON `{"error": ...}` body, and
none of them hurts the server."""
from __future__ import annotations

import pytest

from helpers import MAX_CODE_BYTES, assert_json_error, create_raw, delete_raw, exec_raw

MAX_RAM_MIB = 16384  # the server's default --max-ram-mib


@pytest.fixture(scope="module")
def sid(http):
    s = create_raw(http)
    yield s
    delete_raw(http, s)


def test_malformed_json(http, sid):
    hdr = {"content-type": "application/json"}
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", content=b'{"code": ', headers=hdr), 400)
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", content=b"not json", headers=hdr), 400)
    assert_json_error(http.post("/v1/sandboxes", content=b'{"template": ', headers=hdr), 400)
    assert_json_error(http.post("/v1/sandboxes", content=b'{"ram_mib": "lots"}', headers=hdr), 400)


def test_bodies_must_be_json_objects(http, sid):
    # serde would read a struct from an array (`["print(1)"]` → code); the API takes objects only
    hdr = {"content-type": "application/json"}
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", content=b'["print(1)"]', headers=hdr), 400)
    assert_json_error(http.post("/v1/sandboxes", content=b'["default"]', headers=hdr), 400)


def test_exec_body_problems(http, sid):
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", json={}), 400)  # no code
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", json={"code": 1}), 400)
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "1", "bogus": True}), 400)
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "1", "timeout_ms": 0}), 400)
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", content=b'{"code": "1"}'), 400)  # no content type


def test_unknown_language(http, sid):
    body = assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "1", "language": "ruby"}), 400)
    assert "ruby" in body["error"]


def test_unknown_template(http):
    assert_json_error(http.post("/v1/sandboxes", json={"template": "no-such-template"}), 404)


@pytest.mark.parametrize("bad_id", ["has%20space", "a" * 100, "semi;colon", "dot.dot"])
def test_invalid_id(http, bad_id):
    assert_json_error(http.post(f"/v1/sandboxes/{bad_id}/exec", json={"code": "1"}), 400)
    assert_json_error(http.get(f"/v1/sandboxes/{bad_id}"), 400)
    assert_json_error(http.delete(f"/v1/sandboxes/{bad_id}"), 400)
    assert_json_error(http.get(f"/v1/sandboxes/{bad_id}/replay"), 400)


def test_unknown_id(http):
    ghost = "sb-doesnotexist234567ab"
    assert_json_error(http.post(f"/v1/sandboxes/{ghost}/exec", json={"code": "1"}), 404)
    assert_json_error(http.get(f"/v1/sandboxes/{ghost}"), 404)
    assert_json_error(http.delete(f"/v1/sandboxes/{ghost}"), 404)
    assert_json_error(http.get(f"/v1/sandboxes/{ghost}/replay"), 404)
    assert_json_error(http.post(f"/v1/sandboxes/{ghost}/fork", json={"n": 1}), 404)


def test_code_size_limit(http, sid):
    # exactly the limit is accepted and runs (a comment)
    code = "#" + "x" * (MAX_CODE_BYTES - 1)
    assert len(code.encode()) == MAX_CODE_BYTES
    e = exec_raw(http, sid, code)
    assert e.status == 200 and e.exit_code == 0, e
    # one byte more is refused with 413
    r = http.post(f"/v1/sandboxes/{sid}/exec", json={"code": code + "x"})
    assert_json_error(r, 413)
    # a body far over the limit too
    r = http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "#" * (3 * MAX_CODE_BYTES)})
    assert_json_error(r, 413)
    # the sandbox is fine
    e = exec_raw(http, sid, "print('still ok')")
    assert e.exit_code == 0 and e.stdout == "still ok\n"


def test_ram_limits(http):
    assert_json_error(http.post("/v1/sandboxes", json={"ram_mib": 63}), 400)
    assert_json_error(http.post("/v1/sandboxes", json={"ram_mib": MAX_RAM_MIB + 1}), 400)
    assert_json_error(http.post("/v1/sandboxes", json={"ram_mib": 0}), 400)
    assert_json_error(http.post("/v1/sandboxes", json={"ram_mib": -1}), 400)
    s = create_raw(http, ram_mib=64)
    try:
        e = exec_raw(http, s, "print('small but alive')")
        assert e.exit_code == 0 and e.stdout == "small but alive\n", e
        assert http.get(f"/v1/sandboxes/{s}").json()["ram_mib"] == 64
    finally:
        assert delete_raw(http, s) == 204


def test_unknown_create_field(http):
    body = assert_json_error(http.post("/v1/sandboxes", json={"bogus": 1}), 400)
    assert "bogus" in body["error"]


def test_explicit_false_flags_and_empty_body_are_fine(http):
    for kwargs in ({"egress": False, "persistent": False}, {"persistent": True}, {}):
        s = create_raw(http, **kwargs)
        assert delete_raw(http, s) == 204
    r = http.post("/v1/sandboxes", content=b"")
    assert r.status_code == 200, r.text
    assert delete_raw(http, r.json()["id"]) == 204


def test_unknown_route_and_method(http):
    assert_json_error(http.get("/v1/nope"), 404)
    assert_json_error(http.get("/"), 404)
    assert_json_error(http.put("/v1/sandboxes"), 405)


def test_openapi_lists_every_route(http):
    r = http.get("/v1/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert "openapi" in doc
    paths = doc["paths"]
    for p in ["/v1/healthz", "/v1/sandboxes", "/v1/sandboxes/{id}", "/v1/sandboxes/{id}/exec",
              "/v1/sandboxes/{id}/replay", "/v1/sandboxes/{id}/fork", "/v1/sandboxes/{id}/merge_into/{winner}"]:
        assert p in paths, (p, sorted(paths))
    assert "post" in paths["/v1/sandboxes"] and "get" in paths["/v1/sandboxes"]
    assert "delete" in paths["/v1/sandboxes/{id}"] and "get" in paths["/v1/sandboxes/{id}"]


def test_everything_is_404_after_delete(http):
    s = create_raw(http)
    assert delete_raw(http, s) == 204
    assert_json_error(http.delete(f"/v1/sandboxes/{s}"), 404)
    assert_json_error(http.get(f"/v1/sandboxes/{s}"), 404)
    assert_json_error(http.post(f"/v1/sandboxes/{s}/exec", json={"code": "1"}), 404)
    assert_json_error(http.get(f"/v1/sandboxes/{s}/replay"), 404)
    assert s not in [x["id"] for x in http.get("/v1/sandboxes").json()["sandboxes"]]


def test_server_still_serves_after_all_that(http, sid):
    r = http.get("/v1/healthz")
    assert r.status_code == 200 and r.text == "ok"
    e = exec_raw(http, sid, "print(6 * 7)")
    assert e.exit_code == 0 and e.stdout == "42\n"
