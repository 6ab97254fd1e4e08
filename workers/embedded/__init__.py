"""The embedded platform on one machine: `krt up [--detach]`, `krt down`, `krt status`.

`krt up` runs, as child processes: the Temporal dev server, the gateway and the worker, whose pools
start each runtime's minimum hosts. Ports, certificates and the token are kept in the state dir,
so a restart on the same state dir keeps every Run (a Run whose host went away with the old
platform recovers onto a new one). SIGINT or SIGTERM stops everything it started.

    layout     the state dir: which file holds what, and preparing them (ports, token, configs)
    supervise  starting, watching and stopping the processes (foreground, detached, by pid)
    commands   the three entry points: arguments, what they print, exit codes
    errors     PlatformError

`python -m kruntimes.workers.embedded up|down|status` runs one of them (`krt up --detach` starts `up` so).
"""
