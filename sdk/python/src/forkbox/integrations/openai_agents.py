"""An OpenAI Agents SDK tool that runs code in a forkbox sandbox
(``pip install "forkbox[openai-agents]"``)::

    from agents import Agent, Runner
    from forkbox.integrations.openai_agents import code_interpreter_tool

    tool = code_interpreter_tool(template="python-datasci")
    agent = Agent(name="analyst", instructions="Use run_code for any computation.", tools=[tool])
    print((await Runner.run(agent, "What is the 100th prime?")).final_output)
    tool.forkbox.close()                  # destroy the sandbox

The sandbox is made on the first call and kept, so the REPL's state carries
from call to call; pass ``sandbox=`` to use one you made. Pictures the code
displays (matplotlib figures) come back to the model as images.
"""
from __future__ import annotations

import asyncio
from typing import Any, List, Literal, Optional, Union

from .._sync import Sandbox
from ._common import TOOL_DESCRIPTION, TOOL_NAME, SandboxSession, describe, images


def code_interpreter_tool(sandbox: Optional[Sandbox] = None, *, name: str = TOOL_NAME,
                          timeout: Optional[float] = None, with_images: bool = True, **create_kwargs: Any) -> Any:
    """A ``FunctionTool`` with arguments ``code`` and ``language`` (``python`` | ``bash``).

    ``create_kwargs`` are ``Sandbox``'s (``template``, ``url``, ``api_key``, ``egress``...),
    used when no ``sandbox`` is given. The tool's ``forkbox`` attribute is the
    session: ``tool.forkbox.sandbox``, ``tool.forkbox.close()``.
    """
    try:
        from agents import ToolOutputImage, ToolOutputText, function_tool
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError('the OpenAI Agents SDK is not installed: pip install "forkbox[openai-agents]"') from e

    session = SandboxSession(sandbox, **create_kwargs)

    async def run_code(code: str, language: Literal["python", "bash"] = "python") -> Union[str, List[Any]]:
        """Run code in the sandbox.

        Args:
            code: The code to run.
            language: "python" (a persistent REPL) or "bash".
        """
        # The sync client in a worker thread: safe whichever event loop calls the tool.
        ex = await asyncio.to_thread(session.run, code, language, timeout)
        text = describe(ex)
        pictures = images(ex) if with_images else []
        if not pictures:
            return text
        return [ToolOutputText(text=text)] + [ToolOutputImage(image_url=f"data:{mime};base64,{data}")
                                              for mime, data in pictures]

    tool = function_tool(run_code, name_override=name, description_override=TOOL_DESCRIPTION)
    tool.forkbox = session  # type: ignore[attr-defined]
    return tool


#: podflare's name for it.
forkbox_code_interpreter = code_interpreter_tool
