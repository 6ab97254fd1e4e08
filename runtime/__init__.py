"""The Runtime Server: one per runtime host; registers, invokes and unregisters functions, runs tasks.

Layers (each module imports only those above it):
  errors         the server's errors, each with a stable reason
  framing        length-prefixed frames on the control socket of a function process
  limits         resource limits applied to every function process
  adapters.python_worker  the python adapter's worker, run inside a function process
  zygote         a pre-started, single-threaded process that forks function processes
  spawner        the server's side of the zygote: spawn, kill, exit statuses
  capture        bounded stdout/stderr capture
  workspace      per-registration working directories
  config         a function's immutable config, its run identity, how to start its process
  outcome        how one execution ended, and how the process's answer frame settles it
  pipes          the server's ends of a function process's pipes, and a blocking pump over them
  warm           a python registration's warm process and one exchange with it, on the event loop
  once           a one-shot execution: start a process, give it its input, wait for its end
  results        outputs of a finished execution, checked against the bounds
  adapters       each language adapter as the server runs it (python, bash, krm), by name
  registry       registrations keyed by Run UID: generations, fencing, idle clock
  tasks          task-mode executions, idempotent per (run uid, attempt)
  service        the gRPC servicer
  invoke         the invoke port: InvokeFunction over raw framed TCP, the gateway's data plane
  heartbeat      host → gateway heartbeats of the registrations
  server         assembly: gRPC server, health service, shutdown
"""
