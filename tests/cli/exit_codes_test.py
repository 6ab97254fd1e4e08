"""Errors become one `krt: ` line and an exit code: 1 failed, 2 usage, 3 not found, 4 unreachable."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import kruntimes
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import ManifestError, Run
from kruntimes.api.status import RunStatus
from kruntimes.cli import commands as cli_commands
from kruntimes.cli import main as cli
from kruntimes.cli.parser import PASSTHROUGH, UsageError
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.runs import prepare
from kruntimes.temporal.devserver import free_port
from kruntimes.workers import krt
from kruntimes.workers.embedded import commands
from tests.cli.conftest import one_error_line
from tests.sdk.stack import manifest


def _failed() -> kruntimes.RunFailed:
    run = prepare(Run.from_dict(manifest("a", namespace="team")))
    status = RunStatus(phase=RunPhase.Failed, message="no runtime 'x'")
    return kruntimes.RunFailed(kruntimes.RunObject.of(run, status))


ERRORS: list[tuple[BaseException, int, str]] = [
    (UsageError("bad flag"), 2, "bad flag"),
    (
        ManifestError(["spec.handler: wrong", "metadata.name: bad"]),
        2,
        "spec.handler: wrong; metadata.name: bad",
    ),
    (kruntimes.RunNotFound("team", "a"), 3, "`krt run list -n team`"),
    (kruntimes.ConfigError("cannot reach Temporal at x: is `krt up` running?"), 4, "krt up"),
    (kruntimes.RunAlreadyExists("default", "a"), 1, "`krt run delete a`"),
    (kruntimes.SpecConflict("team", "a", ["spec.env"]), 1, "`krt run delete a -n team`"),
    (_failed(), 1, "`krt run get a -n team -o yaml`"),
    (kruntimes.WaitTimeout("still Pending"), 1, "still Pending"),
    (kruntimes.Busy(429, "FunctionBusy", "busy", invocation_id="i", retry_after=2), 1, "retry in 2 s"),
    (kruntimes.NotReady(503, "RunNotReady", "wait", invocation_id="i", retry_after=1), 1, "retry in 1 s"),
    (kruntimes.Unauthorized(401, "Unauthenticated", "no", invocation_id="i"), 1, "KRT_TOKEN"),
    (kruntimes.OutcomeUnknown(504, "InvocationTimeout", "late", invocation_id="i"), 1, "may have run"),
    (kruntimes.FunctionNotFound(404, "RunNotFound", "gone", invocation_id="i"), 1, "RunNotFound"),
    (kruntimes.PayloadRejected(413, "PayloadTooLarge", "big", invocation_id="i"), 1, "PayloadTooLarge"),
    (
        kruntimes.InvocationFailed(
            kruntimes.InvokeResult(
                invocationId="i",
                status="HandlerError",
                error={"type": "ValueError", "message": "boom"},
                stderr={"data": "Traceback...\nValueError: boom\n"},
            )
        ),
        1,
        "the function failed: HandlerError: ValueError: boom (stderr: ValueError: boom)",
    ),  # fmt: skip
    (kruntimes.KruntimesError("odd"), 1, "odd"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (RuntimeError("bug\nsecond line"), 1, "unexpected error: RuntimeError"),
]


@pytest.mark.parametrize(("error", "code", "says"), ERRORS, ids=[type(e[0]).__name__ for e in ERRORS])
def test_each_error_maps_to_its_exit_code_and_a_hint(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: BaseException,
    code: int,
    says: str,
) -> None:
    async def fail(args: object) -> int:
        raise error

    monkeypatch.setattr(cli_commands, "dispatch", fail)
    assert cli.run(["run", "get", "a"]) == code
    captured = capsys.readouterr()
    assert says in one_error_line(captured.err) and captured.out == ""


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in clientconfig.ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KRT_STATE_DIR", str(tmp_path))
    return tmp_path


def test_config_view_prints_the_effective_values_with_the_secrets_redacted_unless_raw(
    state: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clientconfig.write(
        state,
        ClientConfig(
            gatewayUrl="https://gw:1",
            token="tok-123",
            caFile="/ca.crt",
            temporalApiKey="key-456",
            uiLoginKey="login-789",
            identity="alice",
        ),
    )
    monkeypatch.setenv("KRT_TEMPORAL_ADDRESS", "temporal:7233")
    for output in ("json", "yaml"):
        assert cli.run(["config", "view", "-o", output]) == 0
        shown = capsys.readouterr().out
        assert "tok-123" not in shown and "key-456" not in shown and "login-789" not in shown
        assert shown.count("REDACTED") == 3
    assert cli.run(["config", "view", "-o", "json", "--raw"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "temporalAddress": "temporal:7233",
        "temporalNamespace": "default",
        "taskQueue": "kruntimes",
        "gatewayUrl": "https://gw:1",
        "caFile": "/ca.crt",
        "token": "tok-123",
        "uiUrl": None,
        "uiLoginKey": "login-789",
        "temporalTlsCert": None,
        "temporalTlsKey": None,
        "temporalTlsCa": None,
        "temporalTlsServerName": None,
        "temporalApiKey": "key-456",
        "temporalApiKeyFile": None,
        "codecKeys": None,
        "identity": "alice",
        "stateDir": str(state),
    }


def test_an_unreadable_client_config_exits_4(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (state / clientconfig.CLIENT_FILE).write_text("{not json")
    assert cli.run(["config", "view"]) == 4
    assert "run `krt up` again" in one_error_line(capsys.readouterr().err)


def test_an_unreachable_platform_exits_4(
    state: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KRT_TEMPORAL_ADDRESS", f"127.0.0.1:{free_port()}")
    assert cli.run(["run", "list"]) == 4
    assert "is `krt up` running?" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["up", "down", "status"])
def test_up_down_status_hand_their_arguments_to_the_embedded_platform(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    calls: list[tuple[str, list[str]]] = []
    for name in ("up", "down", "status"):
        monkeypatch.setitem(commands.MAIN, name, lambda argv, name=name: calls.append((name, argv)) or 7)
    assert krt.run([command, "--state-dir", "/x", "--help"]) == 7
    assert calls == [(command, ["--state-dir", "/x", "--help"])]


def test_the_console_script_hands_every_other_command_to_the_sdk_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fail(args: object) -> int:
        raise kruntimes.RunNotFound("team", "a")

    monkeypatch.setattr(cli_commands, "dispatch", fail)
    assert krt.run(["run", "get", "a", "-n", "team"]) == 3
    assert "`krt run list -n team`" in one_error_line(capsys.readouterr().err)
    assert krt.run([]) == 2


@pytest.mark.parametrize("command", sorted(PASSTHROUGH))
def test_the_sdk_cli_alone_points_process_commands_at_the_console_script(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert cli.run([command, "--help"]) == 1
    captured = capsys.readouterr()
    assert f"python -m kruntimes.workers.krt {command}" in one_error_line(captured.err) and captured.out == ""


def test_the_krt_script_is_the_console_script_module() -> None:
    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"][
        "scripts"
    ]
    assert scripts == {"krt": "kruntimes.workers.krt:main"}
    assert set(krt.COMMANDS) == set(PASSTHROUGH)


@pytest.mark.parametrize("entry", ["kruntimes.cli.main", "kruntimes.workers.krt"])
def test_a_command_that_loaded_the_temporal_client_leaves_with_its_code_its_output_and_its_exit_handlers(
    tmp_path: Path, entry: str
) -> None:
    # Every `krt` entry point ends through cli.leave: once the Temporal client's Rust threads are
    # loaded, an interpreter teardown can abort (exit -6) after the command did its work.
    marker = tmp_path / "handler-ran"
    program = (
        "import atexit, pathlib, sys, temporalio.bridge.client\n"
        f"import {entry} as entry\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
        "sys.stdout.write('partial line without newline')\n"
        "sys.stderr.write('and an error line')\n"
        "entry.cli.leave(3) if hasattr(entry, 'cli') else entry.leave(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        3,
        "partial line without newline",
        "and an error line",
    )
    assert marker.read_text() == "yes"


@pytest.mark.parametrize("argv", [["fn", "--help"], ["run", "--help"], ["no-such-command"]])
def test_krt_main_ends_every_command_through_leave(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # kruntimes.workers.krt's own commands (up, fn, ...) once left with sys.exit and so met the teardown abort.
    left: list[int] = []

    def leave(code: int) -> None:
        left.append(code)

    monkeypatch.setattr(cli, "leave", leave)
    krt.main(argv)
    capsys.readouterr()
    assert left == [krt.run(argv)]


@pytest.mark.parametrize("command", sorted(PASSTHROUGH))
def test_every_process_command_reaches_its_own_entry_point(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # COMMANDS names each entry point by its module: --help shows that the name still leads there.
    code: object
    try:
        code = krt.run([command, "--help"])
    except SystemExit as left:  # argparse's --help
        code = left.code
    captured = capsys.readouterr()
    assert code == 0
    assert (captured.out + captured.err).startswith(f"usage: krt {command}")
