"""The Runtime Server: one per runtime host; registers, invokes and unregisters functions, runs tasks.

Layers (each module imports only those above it):
  framing        length-prefixed frames on the control socket of a function process
  limits         resource limits applied to every function process
  zygote         a pre-started, single-threaded process that forks function processes
  spawner        the server's side of the zygote: spawn, kill, exit statuses
  capture        bounded stdout/stderr capture
  process        one function process and one exchange with it (invoke or run once)
  registry       registrations keyed by Run UID: generations, fencing, idle clock
  tasks          task-mode executions, idempotent per (run uid, attempt)
  workspace      per-registration working directories
  service        the gRPC servicer
  server         assembly: gRPC server, health service, shutdown
"""
