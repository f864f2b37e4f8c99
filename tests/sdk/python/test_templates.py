"""Custom templates (docs/templates.md) through the SDK: a sandbox saved as a
template, a recipe built with its event stream, list/get/delete; sync and asyncio."""
from __future__ import annotations

import asyncio
import base64
import uuid

import pytest

import forkbox
from forkbox import AsyncClient, AsyncSandbox


def unique(prefix: str) -> str:
    return f"sdk-{prefix}-{uuid.uuid4().hex[:8]}"


def tiny_recipe(name: str) -> dict:
    """A recipe that builds in a second: two files (one given as text, one as the
    server's base64 with a mode) and a command that uses them."""
    return {
        "name": name,
        "description": "two files and a command",
        "files": [
            {"path": "/opt/tiny/hello.txt", "content": "hello from the recipe\n"},
            {"path": "/opt/tiny/run.sh", "content_b64": base64.b64encode(b"#!/bin/sh\necho ran\n").decode(),
             "mode": 0o755},
        ],
        "commands": ["echo building; /opt/tiny/run.sh > /opt/tiny/out.txt"],
    }


@pytest.fixture
def template_names(client):
    """Names of templates a test makes: deleted (forced) at its end, whatever happened."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            client.delete_template(name, force=True)
        except forkbox.NotFound:
            pass


def test_save_template_and_create_from_it(client, make, template_names):
    src = make()
    src.run_code("answer = 41\nwith open('/root/notes.txt', 'w') as f:\n    f.write('from the source')")
    name = unique("saved")
    template_names.append(name)
    info = src.save_template(name, description="the answer, loaded")
    assert (info["name"], info["kind"], info["state"]) == (name, "saved", "ready")
    assert info["saved_from"] == src.id and info["base"] == "default"
    assert info["description"] == "the answer, loaded"
    assert src.run_code("answer").text == "41"  # the source goes on as it was

    new = make(template=name)
    assert new.info()["template"] == name
    assert new.run_code("answer + 1").text == "42"
    assert new.download("/root/notes.txt") == b"from the source"

    got = client.get_template(name)
    assert got["kind"] == "saved" and got["in_use"]["sandboxes"] == [new.id]
    assert name in [t["name"] for t in client.list_templates()]

    with pytest.raises(forkbox.Conflict) as refused:
        client.delete_template(name)
    assert "in use" in refused.value.message and "force" in refused.value.message
    client.delete_template(name, force=True)
    with pytest.raises(forkbox.NotFound):
        client.get_template(name)
    assert name not in [t["name"] for t in client.list_templates()]
    assert new.download("/root/notes.txt") == b"from the source"  # its live sandboxes keep their files
    with pytest.raises(forkbox.NotFound):
        make(template=name)


def test_build_template_streams_events(client, make, template_names):
    name = unique("built")
    template_names.append(name)
    recipe = tiny_recipe(name)
    events: list = []
    info = client.build_template(recipe, on_event=events.append)

    assert [e["type"] for e in events if e["type"] != "log"] == ["step", "step", "done"]
    steps = [e for e in events if e["type"] == "step"]
    assert [(s["index"], s["total"], s["cached"]) for s in steps] == [(1, 2, False), (2, 2, False)]
    assert "echo building" in steps[1]["step"]
    assert any(e["type"] == "log" and e["text"] == "building\n" for e in events), events
    assert events[-1]["template"] == info
    assert (info["name"], info["kind"], info["state"], info["base"]) == (name, "recipe", "ready", "default")
    assert info["recipe"]["commands"] == recipe["commands"]
    assert [f["path"] for f in info["recipe"]["files"]] == ["/opt/tiny/hello.txt", "/opt/tiny/run.sh"]

    sb = make(template=name)
    assert sb.download("/opt/tiny/hello.txt") == b"hello from the recipe\n"
    assert sb.download("/opt/tiny/out.txt") == b"ran\n"
    assert sb.stat("/opt/tiny/run.sh")["mode"] & 0o777 == 0o755

    again: list = []  # an unchanged recipe runs nothing
    same = client.build_template(recipe, on_event=again.append)
    assert [e["cached"] for e in again if e["type"] == "step"] == [True, True]
    assert not [e for e in again if e["type"] == "log"]
    assert same["created_at"] == info["created_at"]

    assert client.get_template(name)["in_use"]["sandboxes"] == [sb.id]
    assert {t["name"]: t["kind"] for t in client.list_templates()}[name] == "recipe"
    sb.close()
    client.delete_template(name)  # nothing uses it any more: no force needed
    with pytest.raises(forkbox.NotFound):
        client.delete_template(name)


def test_build_template_errors(client):
    name = unique("fails")
    events: list = []
    with pytest.raises(forkbox.SandboxError) as failed:
        client.build_template({"name": name, "commands": ["echo about to fail; exit 3"]}, on_event=events.append)
    assert failed.value.message == "step 1 (run echo about to fail; exit 3): exited with 3"
    assert failed.value.status is None
    assert events[-1] == {"type": "error", "error": failed.value.message}
    assert {"type": "log", "stream": "stdout", "text": "about to fail\n"} in events
    with pytest.raises(forkbox.NotFound):  # a failed build registers nothing
        client.get_template(name)

    # A bad recipe is an HTTP error before anything runs.
    with pytest.raises(forkbox.BadRequest) as bad:
        client.build_template({"name": "Not A Name"}, on_event=events.append)
    assert "lower-case" in bad.value.message
    with pytest.raises(forkbox.NotFound):
        client.build_template({"name": name, "base": unique("no-such-base")})
    with pytest.raises(forkbox.Conflict):
        client.build_template({"name": "default"})
    with pytest.raises(forkbox.Conflict):
        client.delete_template("default")
    assert {t["name"]: t["kind"] for t in client.templates()}["default"] == "builtin"


def test_async_save_build_list_delete(url):
    async def main():
        saved, built = unique("asaved"), unique("abuilt")
        async with AsyncClient(url) as c:
            try:
                async with AsyncSandbox(url=url) as src:
                    await src.run_code("greeting = 'saved asynchronously'")
                    await src.upload("/root/a.txt", b"async file")
                    info = await src.save_template(saved)
                    assert (info["name"], info["kind"], info["saved_from"]) == (saved, "saved", src.id)

                events: list = []
                binfo = await c.build_template(tiny_recipe(built), on_event=events.append)
                assert binfo["kind"] == "recipe" and events[-1] == {"type": "done", "template": binfo}
                assert [e["index"] for e in events if e["type"] == "step"] == [1, 2]

                names = {t["name"] for t in await c.list_templates()}
                assert {saved, built, "default"} <= names
                assert (await c.get_template(built))["recipe"]["name"] == built

                async with AsyncSandbox(saved, client=c) as a, AsyncSandbox(built, client=c) as b:
                    assert (await a.run_code("greeting")).text == "'saved asynchronously'"
                    assert await a.download("/root/a.txt") == b"async file"
                    assert await b.download("/opt/tiny/out.txt") == b"ran\n"
                    with pytest.raises(forkbox.Conflict):
                        await c.delete_template(saved)
                    await c.delete_template(saved, force=True)
                await c.delete_template(built)
                with pytest.raises(forkbox.NotFound):
                    await c.get_template(saved)
                with pytest.raises(forkbox.SandboxError, match="exited with 1"):
                    await c.build_template({"name": built, "commands": ["false"]})
            finally:
                for name in (saved, built):
                    try:
                        await c.delete_template(name, force=True)
                    except forkbox.NotFound:
                        pass
    asyncio.run(main())
