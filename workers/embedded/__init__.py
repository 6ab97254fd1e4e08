"""The embedded platform on one machine: `krt up [--detach]`, `krt down`, `krt status`.

`krt up` runs, as child processes: the Temporal dev server (in a network namespace of its own), its
front (mutual TLS, the UI and the codec endpoint for the owner), the gateway and the worker, whose
pools start each runtime's minimum hosts. Ports, certificates and the token are kept in the state dir,
so a restart on the same state dir keeps every Run (a Run whose host went away with the old
platform recovers onto a new one). SIGINT or SIGTERM stops everything it started.

    layout     the state dir: which file holds what, and preparing them (ports, token, configs)
    supervise  starting, watching and stopping the processes (foreground, detached, by pid)
    hidden_temporal  the dev server in its network namespace, served on Unix sockets
    temporal_cli     the `temporal` CLI's profiles for the platform (temporal.toml)
    commands   the three entry points: arguments, what they print, exit codes
    errors     PlatformError

`python -m kruntimes.workers.embedded up|down|status` runs one of them (`krt up --detach` starts `up` so).
"""
