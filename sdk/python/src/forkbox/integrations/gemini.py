"""Run Gemini's function calls for code in a forkbox sandbox and answer each with
its ``functionResponse`` part, pictures included, for Google's ``google-genai``
SDK (``pip install "forkbox[gemini]"``)::

    from google import genai
    from google.genai import types
    from forkbox import Sandbox
    from forkbox.integrations.gemini import TOOL, handle_function_call

    client = genai.Client()
    config = types.GenerateContentConfig(
        tools=[TOOL], automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    contents = [types.Content(role="user", parts=[types.Part.from_text(text="Plot sin(x) and tell me its maximum.")])]
    with Sandbox(template="python-datasci") as sb:
        while True:
            resp = client.models.generate_content(model="gemini-3.8-flash", contents=contents, config=config)
            contents.append(resp.candidates[0].content)
            if not resp.function_calls:
                break
            contents.append(types.Content(role="user", parts=[
                handle_function_call(call, sb) for call in resp.function_calls]))
    print(resp.text)

``TOOL`` declares one function, ``run_code``, with arguments ``code`` and
``language`` (``"python"`` | ``"bash"``). Pictures the code displayed go back
inside the function response (its ``parts``), the way Gemini 3 models take
images from a tool; ``with_images=False`` for models before them.

``DECLARATION`` and ``run_function_call`` need no package (plain dicts, as the
REST API takes them; ``run_function_call`` and ``forkbox_function_declaration``
are ``podflare.gemini``'s names); ``TOOL``, ``FUNCTION_DECLARATION`` and
``handle_function_call`` import google-genai when first used.
"""
from __future__ import annotations

import base64
import binascii
import copy
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .._sync import Sandbox
from ..types import Execution
from ._common import TOOL_DESCRIPTION, TOOL_NAME, SandboxSession, describe, images

if TYPE_CHECKING:  # pragma: no cover
    from google.genai import types

#: The function declaration as the Gemini API's JSON spells it: ``parameters`` in the
#: API's OpenAPI schema subset, which every Gemini model and google-genai version takes.
DECLARATION: Dict[str, Any] = {
    "name": TOOL_NAME,
    "description": TOOL_DESCRIPTION,
    "parameters": {
        "type": "OBJECT",
        "properties": {
            "code": {"type": "STRING", "description": "The code to run."},
            "language": {"type": "STRING", "enum": ["python", "bash"],
                         "description": "'python' (a persistent REPL, the default) or 'bash'."},
        },
        "required": ["code"],
    },
}
#: The image types a function response carries to Gemini (no GIF); other pictures
#: are only named in the text.
GEMINI_IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")


def _types() -> Any:
    try:
        from google.genai import types
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError('google-genai is not installed: pip install "forkbox[gemini]"') from e
    return types


def __getattr__(name: str) -> Any:
    """``FUNCTION_DECLARATION`` (a ``types.FunctionDeclaration``) and ``TOOL`` (a
    ``types.Tool`` holding it), made on first access so that importing the module
    needs no google-genai."""
    if name not in ("FUNCTION_DECLARATION", "TOOL"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    types = _types()
    declaration = types.FunctionDeclaration.model_validate(DECLARATION)
    globals().update(FUNCTION_DECLARATION=declaration, TOOL=types.Tool(function_declarations=[declaration]))
    return globals()[name]


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _run(function_call: Any, sandbox: Sandbox, timeout: Optional[float]) -> Execution:
    args = _get(function_call, "args") or {}
    code, language = str(args.get("code", "")), args.get("language") or "python"
    return SandboxSession(sandbox).run(code, language, timeout)  # the server checks the language


def _response(ex: Execution) -> Dict[str, Any]:
    # "output" is the key the API reads as a function's output.
    return {"output": describe(ex), "exit_code": ex.exit_code}


def run_function_call(function_call: Any, sandbox: Sandbox, timeout: Optional[float] = None) -> Dict[str, Any]:
    """Run a ``run_code`` call (a ``types.FunctionCall`` or a dict with ``args``) in
    ``sandbox``; returns only the ``response`` dict, ``{"output": str, "exit_code": int}``,
    without pictures: for ``types.Part.from_function_response`` or a REST request
    (podflare's ``run_function_call``). Needs no package."""
    return _response(_run(function_call, sandbox, timeout))


def handle_function_call(function_call: Any, sandbox: Sandbox, timeout: Optional[float] = None, *,
                         with_images: bool = True) -> "types.Part":
    """Run a ``run_code`` call in ``sandbox`` and answer the ``types.Part`` that goes
    back to the model: a function response with the call's ``id`` and ``name``,
    ``response={"output": <the call's text>, "exit_code": n}`` and, for each PNG,
    JPEG or WebP picture the code displayed, an inline image in its ``parts``.

    ``function_call`` is what the model sent: an item of ``response.function_calls``,
    a ``Part.function_call``, or a dict ``{"name", "args", "id"}``. An exec past
    ``timeout`` seconds answers what it printed and exit code 124.
    """
    types = _types()
    ex = _run(function_call, sandbox, timeout)
    parts: List[Any] = []
    for mime, data in images(ex, GEMINI_IMAGE_TYPES) if with_images else []:
        try:
            raw = base64.b64decode(data)
        except (binascii.Error, ValueError):
            continue  # not an image after all: the text still names the display
        parts.append(types.FunctionResponsePart(inline_data=types.FunctionResponseBlob(mime_type=mime, data=raw)))
    return types.Part(function_response=types.FunctionResponse(
        id=_get(function_call, "id"), name=_get(function_call, "name") or TOOL_NAME,
        response=_response(ex), parts=parts or None))


def forkbox_function_declaration() -> Dict[str, Any]:
    """``DECLARATION``, a copy: podflare's ``podflare_function_declaration()``."""
    return copy.deepcopy(DECLARATION)
