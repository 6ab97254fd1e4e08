"""The SDK's parts, behind the one public facade `kruntimes.Client` (kruntimes.sdk.client):

    errors    the error tree every SDK call raises from
    results   what the calls return: RunObject, Applied, FunctionObject, FunctionApplied, HostView,
              InvokeResult, AsyncInvocation, Invocation
    runs      the Run operations over Temporal: create, apply, get, status, list, wait, cancel,
              delete, hosts
    functions the Function operations (Client.functions): apply, get, list, describe, delete,
              rollback, scale, wait_ready, rollout_status, invoke (through the Function's URL)
    watch     the history watcher `wait` sleeps on between status queries
    invoke    the HTTPS invoke client: a target to its endpoint, one POST, the answer to a result
              or a typed error
    invocations  async invocations (Client.invoke_async, Client.invocations): submit, get, wait,
              list, resubmit, each one request of the gateway's invocation API

Apps (and the SDK's tests) import the SDK's names from `kruntimes` or `kruntimes.sdk.client`; these
modules and the CLI import each from the module that defines it. `import kruntimes` loads none
of these modules until a name is used, and they import temporalio and aiohttp only when a call
needs them.
"""
