"""The last error `krt status` shows for a component being restarted: the line of its log that
says why it ended, not what the interpreter printed while shutting down after it."""

from __future__ import annotations

from pathlib import Path

from kruntimes.workers.embedded.supervise import _last_error

SHUTDOWN_NOISE = (
    "Exception ignored in: <function Server.__del__ at 0x7f>\n"
    "Traceback (most recent call last):\n"
    '  File "server.py", line 1, in __del__\n'
    "RuntimeError: Event loop is closed\n"
)


def test_the_interpreters_shutdown_noise_after_the_error_is_left_out(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    log.write_text(
        SHUTDOWN_NOISE  # an earlier run's
        + 'serving\nTraceback (most recent call last):\n  File "x.py", line 2\n'
        + "OSError: [Errno 98] Address already in use\n"
        + SHUTDOWN_NOISE
    )
    assert _last_error(log) == "OSError: [Errno 98] Address already in use"


def test_without_noise_it_is_the_last_line_and_an_empty_log_says_so(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("krt worker: cannot connect to Temporal at 127.0.0.1:1\n")
    assert _last_error(log) == "krt worker: cannot connect to Temporal at 127.0.0.1:1"
    log.write_text("")
    assert _last_error(log) == "(no output)"
