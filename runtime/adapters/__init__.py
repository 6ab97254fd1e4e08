"""Language adapters. Each is described (name, handler rule, warm or not) in
`kruntimes.api.adapters`; here is how a host runs it: `host` (what every adapter says), one module
per adapter (`python`, `bash`, `krm`), `registered` (all of them by name), and `python_worker`,
which runs inside a python function process.

This package imports nothing itself: the zygote imports `python_worker` and must not load the rest.
"""
