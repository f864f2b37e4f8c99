"""The framework adapters, invoked the way each framework invokes a tool (no model call)."""
from __future__ import annotations

import asyncio
import base64
import json

import pytest

from forkbox import NotFound, Sandbox

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nprint('plotted')"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_openai_agents_function_tool(url):
    from agents import FunctionTool, ToolOutputImage, ToolOutputText
    from agents.tool_context import ToolContext

    from forkbox.integrations.openai_agents import code_interpreter_tool

    tool = code_interpreter_tool(template="python-datasci", url=url)
    assert isinstance(tool, FunctionTool) and tool.name == "run_code"
    assert set(tool.params_json_schema["properties"]) == {"code", "language"}

    def ctx(args):
        return ToolContext(context=None, tool_name=tool.name, tool_call_id="call-1", tool_arguments=args)

    async def invoke(args):
        raw = json.dumps(args)
        return await tool.on_invoke_tool(ctx(raw), raw)

    async def main():
        out = await invoke({"code": "total = sum(range(10))\ntotal"})
        assert "result:\n45" in out and "exit_code: 0" in out
        out = await invoke({"code": "print(total * 2)"})  # the REPL's state carried over
        assert "stdout:\n90" in out
        out = await invoke({"code": "echo $((1+1))", "language": "bash"})
        assert "stdout:\n2" in out
        out = await invoke({"code": "1/0"})
        assert "error: ZeroDivisionError: division by zero" in out and "exit_code: 1" in out
        out = await invoke({"code": PLOT})
        assert isinstance(out, list) and isinstance(out[0], ToolOutputText) and "plotted" in out[0].text
        [img] = [o for o in out if isinstance(o, ToolOutputImage)]
        assert img.image_url.startswith("data:image/png;base64,")
        assert base64.b64decode(img.image_url.split(",", 1)[1]).startswith(PNG_MAGIC)
    try:
        asyncio.run(main())
        assert tool.forkbox.sandbox.info()["template"] == "python-datasci"
    finally:
        tool.forkbox.close()


def test_anthropic_tool_use_handler(url):
    from forkbox.integrations.anthropic import TOOL, handle_code_execution_tool_use

    assert TOOL["name"] == "code_execution" and TOOL["input_schema"]["required"] == ["code"]
    with Sandbox("python-datasci", url=url) as sb:
        block = {"type": "tool_use", "id": "toolu_01", "name": "code_execution", "input": {"code": "x = 7\nx * 6"}}
        res = handle_code_execution_tool_use(block, sb)
        assert res["type"] == "tool_result" and res["tool_use_id"] == "toolu_01" and res["is_error"] is False
        assert res["content"] == [{"type": "text", "text": "result:\n42\nexit_code: 0"}]

        res = handle_code_execution_tool_use({"id": "toolu_02", "input": {"code": PLOT}}, sb)
        text, image = res["content"]
        assert "stdout:\nplotted" in text["text"]
        assert image["type"] == "image" and image["source"]["type"] == "base64"
        assert image["source"]["media_type"] == "image/png"
        assert base64.b64decode(image["source"]["data"]).startswith(PNG_MAGIC)

        res = handle_code_execution_tool_use({"id": "toolu_03", "input": {"command": "ls /nonexistent"}}, sb)
        assert res["is_error"] is True and "No such file" in res["content"][0]["text"]

        class Block:  # an anthropic SDK object: attributes, not keys
            id = "toolu_04"
            input = {"code": "import time; time.sleep(5)"}
        res = handle_code_execution_tool_use(Block(), sb, timeout=0.5)
        assert res["is_error"] is True and "timed out" in res["content"][0]["text"]
        assert "exit_code: 124" in res["content"][0]["text"]


def test_langchain_tool(url):
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool

    from forkbox.integrations.langchain import ForkboxTool

    tool = ForkboxTool(url=url)
    try:
        assert isinstance(tool, BaseTool) and tool.name == "run_code"
        assert set(tool.args) == {"code", "language"}
        assert tool.invoke({"code": "y = 5\nprint(y)"}) == "stdout:\n5\n\nexit_code: 0"
        assert tool.invoke({"code": "y + 1"}) == "result:\n6\nexit_code: 0"  # state kept
        assert "stdout:\nsh\n" in tool.invoke({"code": "echo sh", "language": "bash"})
        msg = tool.invoke({"type": "tool_call", "id": "call-9", "name": "run_code",
                           "args": {"code": "display({'text/plain': 'pic', 'image/png': 'aGk='}, raw=True)"}})
        assert isinstance(msg, ToolMessage) and msg.tool_call_id == "call-9"
        assert msg.artifact.displays == [{"text/plain": "pic", "image/png": "aGk="}]
        assert asyncio.run(tool.ainvoke({"code": "y * 3"})) == "result:\n15\nexit_code: 0"
        sid = tool.sandbox.id
    finally:
        tool.close()
    with pytest.raises(NotFound):  # close() destroyed the sandbox it made
        Sandbox.connect(sid, url=url)

    fresh = ForkboxTool(url=url, persistent_sandbox=False)
    fresh.invoke({"code": "z = 1"})
    assert "NameError" in fresh.invoke({"code": "z"})  # a new sandbox per call


def _gemini_function_calls(*args):
    """The calls of a generateContent answer as the Gemini API sends it (JSON), one
    ``functionCall`` part per ``args``, parsed by google-genai as ``client.models`` does."""
    from google.genai import types

    parts = [{"functionCall": {"id": f"fc-{i}", "name": "run_code", "args": a}} for i, a in enumerate(args, 1)]
    parts[0]["thoughtSignature"] = base64.b64encode(b"sig").decode()  # Gemini 3 signs its first call
    answer = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Running it."}] + parts},
                              "finishReason": "STOP", "index": 0}],
              "modelVersion": "gemini-3.8-flash", "responseId": "r-1"}
    return types.GenerateContentResponse.model_validate_json(json.dumps(answer)).function_calls


def test_gemini_function_call_handler(url):
    from google.genai import types

    from forkbox.integrations.gemini import DECLARATION, TOOL, handle_function_call, run_function_call

    assert isinstance(TOOL, types.Tool) and TOOL.function_declarations[0].name == "run_code"
    params = TOOL.function_declarations[0].parameters
    assert set(params.properties) == {"code", "language"} and params.required == ["code"]
    assert params.properties["language"].enum == ["python", "bash"]
    assert types.FunctionDeclaration.model_validate(DECLARATION) == TOOL.function_declarations[0]

    def wire(part):  # the JSON the request carries, as the API's reference spells it
        assert isinstance(part, types.Part)
        out = part.model_dump(mode="json", exclude_none=True, by_alias=True)
        assert types.Part.model_validate(out) == part  # and google-genai reads it back the same
        return out

    with Sandbox("python-datasci", url=url) as sb:
        first, bash = _gemini_function_calls({"code": "x = 7\nx * 6"},
                                             {"code": "echo $((x + 1)); ls /nonexistent", "language": "bash"})
        assert wire(handle_function_call(first, sb)) == {"functionResponse": {
            "id": "fc-1", "name": "run_code", "response": {"output": "result:\n42\nexit_code: 0", "exit_code": 0}}}
        res = wire(handle_function_call(bash, sb))["functionResponse"]
        assert res["id"] == "fc-2" and res["response"]["exit_code"] == 2
        assert "stdout:\n1\n" in res["response"]["output"]  # bash: a shell, not the REPL's x
        assert "No such file" in res["response"]["output"]

        [again, err] = _gemini_function_calls({"code": "print(x + 1)"}, {"code": "1/0"})
        assert wire(handle_function_call(again, sb))["functionResponse"]["response"] == {
            "output": "stdout:\n8\n\nexit_code: 0", "exit_code": 0}  # the REPL's state carried over
        res = wire(handle_function_call(err, sb))["functionResponse"]["response"]
        assert res["exit_code"] == 1 and "error: ZeroDivisionError: division by zero" in res["output"]

        [plot] = _gemini_function_calls({"code": PLOT})
        part = handle_function_call(plot, sb)
        [image] = part.function_response.parts
        assert image.inline_data.mime_type == "image/png" and image.inline_data.data.startswith(PNG_MAGIC)
        res = wire(part)["functionResponse"]
        assert "stdout:\nplotted" in res["response"]["output"] and "display 1 (image/png" in res["response"]["output"]
        [sent] = res["parts"]
        assert set(sent) == {"inlineData"} and sent["inlineData"]["mimeType"] == "image/png"
        assert base64.urlsafe_b64decode(sent["inlineData"]["data"]).startswith(PNG_MAGIC)
        assert "parts" not in wire(handle_function_call(plot, sb, with_images=False))["functionResponse"]

        # The response alone, for a REST request (podflare's run_function_call).
        assert run_function_call({"args": {"code": "x"}}, sb) == {"output": "result:\n7\nexit_code: 0", "exit_code": 0}

        # A dict call without an id (older models send none): nothing invented.
        res = wire(handle_function_call({"name": "run_code", "args": {"code": "import time; time.sleep(5)"}},
                                        sb, timeout=0.5))["functionResponse"]
        assert "id" not in res and res["name"] == "run_code" and res["response"]["exit_code"] == 124
        assert "timed out" in res["response"]["output"]
