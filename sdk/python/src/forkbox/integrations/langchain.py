"""A LangChain tool that runs code in a forkbox sandbox
(``pip install "forkbox[langchain]"``); works with any LangChain chat model::

    from forkbox.integrations.langchain import ForkboxTool
    from langgraph.prebuilt import create_react_agent

    tool = ForkboxTool(template="python-datasci")
    agent = create_react_agent(model, tools=[tool])
    ...
    tool.close()

``tool.invoke({"code": ...})`` answers the call's text; invoked with a tool
call, the ``ToolMessage``'s ``artifact`` is the whole ``Execution`` (bundles,
images, error). The REPL's state carries across calls; ``persistent_sandbox=False``
makes a fresh sandbox per call (podflare's option).
"""
from __future__ import annotations

import asyncio
from typing import Any, Literal, Optional, Tuple, Type

try:
    from langchain_core.tools import BaseTool
    from pydantic import BaseModel, Field, PrivateAttr
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('forkbox.integrations.langchain needs langchain-core: pip install "forkbox[langchain]"') from e

from .._sync import Sandbox
from ..types import Execution
from ._common import TOOL_DESCRIPTION, TOOL_NAME, SandboxSession, describe


class RunCodeInput(BaseModel):
    code: str = Field(..., description="The code to run.")
    language: Literal["python", "bash"] = Field("python", description="'python' (a persistent REPL) or 'bash'.")


class ForkboxTool(BaseTool):
    """Runs ``code`` in a forkbox sandbox. Arguments: ``sandbox`` (one you made), or
    ``Sandbox``'s (``template``, ``url``, ``api_key``...) for the one it makes on
    first use; ``persistent_sandbox``; ``timeout`` (seconds per call)."""

    name: str = TOOL_NAME
    description: str = TOOL_DESCRIPTION
    args_schema: Type[BaseModel] = RunCodeInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    timeout: Optional[float] = None
    _session: SandboxSession = PrivateAttr()

    def __init__(self, sandbox: Optional[Sandbox] = None, *, persistent_sandbox: bool = True,
                 template: Optional[str] = None, url: Optional[str] = None, api_key: Optional[str] = None,
                 host: Optional[str] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._session = SandboxSession(sandbox, reuse=persistent_sandbox, template=template, url=url,
                                       api_key=api_key, host=host)

    @property
    def sandbox(self) -> Sandbox:
        return self._session.sandbox

    def _run(self, code: str, language: Literal["python", "bash"] = "python", **_: Any) -> Tuple[str, Execution]:
        ex = self._session.run(code, language, self.timeout)
        return describe(ex), ex

    async def _arun(self, code: str, language: Literal["python", "bash"] = "python",
                    **_: Any) -> Tuple[str, Execution]:
        return await asyncio.to_thread(self._run, code, language)

    def close(self) -> None:
        """Destroy the sandbox the tool made."""
        self._session.close()


#: podflare's name for it.
PodflareTool = ForkboxTool
