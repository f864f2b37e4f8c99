"""fork(n), merge_into, diff."""
from __future__ import annotations

import pytest

import forkbox
from forkbox import Sandbox


def test_fork_children_start_from_the_parents_state_and_are_isolated(sb):
    sb.run_code("data = list(range(5))")
    sb.upload("/root/shared.txt", b"parent")
    kids = sb.fork(3)
    try:
        assert len(kids) == 3 and all(isinstance(k, Sandbox) for k in kids)
        assert len({k.id for k in kids} | {sb.id}) == 4
        for i, k in enumerate(kids):
            k.run_code(f"data.append({i})")
            assert k.download("/root/shared.txt") == b"parent"
        assert [k.run_code("data[-1]").text for k in kids] == ["0", "1", "2"]
        assert sb.run_code("len(data)").text == "5"
    finally:
        for k in kids:
            k.close()


def test_merge_into_makes_the_parent_drive_the_winner(sb, http):
    sb.run_code("score = 0")
    a, b = sb.fork(2)
    a.run_code("score = 10")
    b.run_code("score = 20")
    a.upload("/root/won.txt", b"a")
    sb.merge_into(a)
    assert sb.run_code("score").text == "10"
    assert sb.download("/root/won.txt") == b"a"
    assert http.get(f"/v1/sandboxes/{a.id}").status_code == 404
    a.close()  # merged: nothing to destroy, no error
    b.close()
    assert sb.info()["state"] == "ready"
    with pytest.raises(ValueError):
        sb.merge_into(sb)


def test_merge_into_a_stranger_is_conflict(make):
    x, y = make(), make()
    with pytest.raises(forkbox.Conflict) as info:
        x.merge_into(y)
    assert info.value.status == 409


def test_diff(sb):
    sb.upload("/root/keep.txt", b"same")
    sb.upload("/root/change.txt", b"v1")
    sb.upload("/tmp/gone.txt", b"x")
    [k] = sb.fork(1)
    try:
        k.upload("/root/change.txt", b"v2")
        k.upload("/root/new.txt", b"n")
        k.remove("/tmp/gone.txt")
        assert sb.diff(k) == {"added": ["/root/new.txt"], "removed": ["/tmp/gone.txt"],
                              "modified": ["/root/change.txt"]}
        assert sb.diff(k, paths=["/tmp"]) == {"added": [], "removed": ["/tmp/gone.txt"], "modified": []}
        with pytest.raises(forkbox.BadRequest):
            sb.diff(k, paths=["relative"])
    finally:
        k.close()


def test_fork_argument_checks(sb):
    with pytest.raises(ValueError):
        sb.fork(0)
    with pytest.raises(forkbox.BadRequest):
        sb.fork(33)
