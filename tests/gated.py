"""A function program that holds each invocation until its test lets it go: it touches a new file
in the directory STARTED, waits (at most 60 s) until the file RELEASE exists, then echoes its input
(stdin to stdout, as a krm function does). Fill it in with GATED.format(started=..., release=...)."""

GATED = """
import pathlib, sys, time, uuid
data = sys.stdin.read()
pathlib.Path({started!r}, uuid.uuid4().hex).touch()
release, deadline = pathlib.Path({release!r}), time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.stdout.write(data)
"""
