"""Run Claude's ``tool_use`` blocks for code in a forkbox sandbox and answer with
the matching ``tool_result`` block, images included. Needs no package::

    import anthropic
    from forkbox import Sandbox
    from forkbox.integrations.anthropic import TOOL, handle_code_execution_tool_use

    client = anthropic.Anthropic()
    with Sandbox(template="python-datasci") as sb:
        messages = [{"role": "user", "content": "Plot sin(x) and tell me its maximum."}]
        while True:
            resp = client.messages.create(model="claude-sonnet-4-5", max_tokens=2048,
                                          tools=[TOOL], messages=messages)
            messages.append({"role": "assistant", "content": resp.content})
            if resp.stop_reason != "tool_use":
                break
            messages.append({"role": "user", "content": [
                handle_code_execution_tool_use(b, sb) for b in resp.content if b.type == "tool_use"]})

``TOOL`` is a client tool named ``code_execution`` whose input is
``{"code": str, "language": "python" | "bash"}``; the handler also takes
``{"command": str}`` (bash), the shape of Anthropic's own bash code execution.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .._sync import Sandbox
from ._common import TOOL_DESCRIPTION, SandboxSession, describe, images

TOOL: Dict[str, Any] = {
    "name": "code_execution",
    "description": TOOL_DESCRIPTION,
    "input_schema": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "The code to run."},
            "language": {"type": "string", "enum": ["python", "bash"], "default": "python"},
        },
        "required": ["code"],
    },
}


def _get(obj: Any, key: str, default: Any = None) -> Any:
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def handle_code_execution_tool_use(tool_use_block: Any, sandbox: Sandbox,
                                   timeout: Optional[float] = None) -> Dict[str, Any]:
    """Run a ``tool_use`` block (a dict or an ``anthropic`` SDK object) in ``sandbox``;
    returns its ``tool_result`` block: the text of the call, then one image block
    per displayed picture; ``is_error`` unless the exit code is 0."""
    tool_input = _get(tool_use_block, "input", {}) or {}
    if "command" in tool_input and "code" not in tool_input:
        code, language = str(tool_input["command"]), "bash"
    else:
        code, language = str(tool_input.get("code", "")), tool_input.get("language") or "python"
    ex = SandboxSession(sandbox).run(code, language, timeout)  # type: ignore[arg-type]  # the server checks it
    content: List[Dict[str, Any]] = [{"type": "text", "text": describe(ex)}]
    content += [{"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}
                for mime, data in images(ex)]
    return {"type": "tool_result", "tool_use_id": _get(tool_use_block, "id"), "content": content,
            "is_error": ex.exit_code != 0}
