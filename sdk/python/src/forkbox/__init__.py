"""forkbox: Python SDK for the forkbox sandbox server.

    from forkbox import Sandbox

    with Sandbox() as sb:
        sb.run_code("import pandas as pd; df = pd.DataFrame({'a': [1, 2, 3]})")
        print(sb.run_code("df.a.sum()").text)   # 6

Code written for the ``podflare`` SDK runs after changing its import
(docs/sdk-python.md#porting-from-podflare).
"""
from ._async import AsyncClient, AsyncPtyHandle, AsyncPtyNamespace, AsyncSandbox
from ._core import DEFAULT_URL, Ports
from ._sync import Client, PtyHandle, PtyNamespace, Sandbox
from .errors import (BadRequest, Conflict, ForkboxError, NotFound, PayloadTooLarge, RateLimited, SandboxError,
                     ServerError, Timeout, Unauthorized)
from .types import (BuildEvent, Bundle, Checkpoint, EgressPolicy, Event, ExecResult, Execution, ExecutionError,
                    FileInfo, Language, Listing, PtyRead, PtySessionInfo, SandboxInfo, Space, TemplateFile,
                    TemplateInfo, TemplateLimits, TemplateRecipe, TemplateUse, WatchEvent)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "AsyncPtyHandle", "AsyncPtyNamespace", "AsyncSandbox", "BadRequest", "BuildEvent", "Bundle",
    "Checkpoint",
    "Client", "Conflict", "DEFAULT_URL", "EgressPolicy", "Event", "ExecResult", "Execution", "ExecutionError",
    "FileInfo", "ForkboxError", "Language", "Listing", "NotFound", "PayloadTooLarge", "Ports", "PtyHandle",
    "PtyNamespace", "PtyRead", "PtySessionInfo", "RateLimited", "Sandbox", "SandboxError", "SandboxInfo",
    "ServerError", "Space", "TemplateFile", "TemplateInfo", "TemplateLimits", "TemplateRecipe", "TemplateUse",
    "Timeout", "Unauthorized", "WatchEvent",
]
