"""Adapters for agent frameworks. Each module imports its framework only when
used, so ``import forkbox`` needs none of them:

- ``forkbox.integrations.openai_agents``: an OpenAI Agents SDK ``FunctionTool``
- ``forkbox.integrations.anthropic``: a ``tool_use`` → ``tool_result`` handler
- ``forkbox.integrations.langchain``: a LangChain ``BaseTool``
- ``forkbox.integrations.gemini``: a google-genai function declaration and a
  ``function_call`` → ``functionResponse`` part handler
"""
