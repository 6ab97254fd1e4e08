"""`krt mcp`: the control plane as Model Context Protocol tools, over the SDK (kruntimes.sdk.client).

access   who calls (Caller) and what they may do: the local user over stdio (as the CLI), a
         bearer token checked by the gateway's authorizer over HTTP (passed in by
         kruntimes.workers.mcp, which owns the gateway's auth methods)
errors   a refusal as an MCP tool error: a stable reason and one line, never a traceback
tools    the tools: their input models (JSON schemas from the API's pydantic models) and
         what each does through the SDK
invokers the gateway sessions a remote caller's invocations go in, each with its own token
server   the official MCP SDK's low-level server over those tools, and the resources
"""
