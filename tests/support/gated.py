"""A function program that holds each invocation until its test lets it go: it touches a new file
in the directory STARTED, waits (at most 60 s) until the file RELEASE exists, then echoes its input
(stdin to stdout, as a krm function does). Fill it in with GATED.format(started=..., release=...).

HOLDER holds an exclusive lock on the file its input names (it and the child it forks, both ignoring
SIGTERM), touches that name + ".started" and sleeps: the lock is free only when both are gone."""

GATED = """
import pathlib, sys, time, uuid
data = sys.stdin.read()
pathlib.Path({started!r}, uuid.uuid4().hex).touch()
release, deadline = pathlib.Path({release!r}), time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.stdout.write(data)
"""

HOLDER = """
import fcntl, os, pathlib, signal, sys, time
name = sys.stdin.read().strip()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
lock = open(name, "a")
fcntl.flock(lock, fcntl.LOCK_EX)
os.fork()
pathlib.Path(name + ".started").touch()
time.sleep(60)
"""
