"""The embedded platform's state directory: which file holds what, and the files `krt up` prepares.

    platform.json       the ports, chosen once and kept, so URLs (and Run endpoints) stay valid
    platform.lock       held (flock) by the one supervisor running from this directory
    up.json             the supervisor's and its components' pids with their start times, and
                        which is being restarted (kruntimes.cli.components): who to signal, what
                        to show
    up.ready            written once everything serves; `krt up --detach` waits for it
    tokens.csv          the gateway's token file (0600) with the generated admin token
    rolebindings.yaml   who may invoke which namespace's Runs, and whose Runs may use which
                        namespace's secrets (kruntimes.config.bindings; hosts read it too)
    runtimes.yaml       the runtimes and their pools
    callback-origins.yaml
                        the origins each namespace's per-request callback URLs may name
                        (`krt gateway --callback-origins`); none at first
    client.json         where the CLI and SDK find the platform (kruntimes.sdk.config), with
                        the owner's client certificate and the UI's login key (0600)
    temporal.toml       the `temporal` CLI's profiles for this platform (TEMPORAL_CONFIG_FILE):
                        the front's address and the owner's certificate; `decode` adds the codec
                        endpoint and the admin token (0600)
    gateway.ready.json  the gateway's URL and heartbeat address, written once it serves
    temporal.ready.json the hidden dev server's mode (netns, userns, exposed) and sockets
    front.ready.json    the front's address and UI URL, written once it serves
    logs/  tls/  temporal/  hosts/
                        the components' logs, the gateway's serving CA and certificate, the dev
                        server's SQLite, the process hosts' records and certificates
                        (kruntimes.activities.hosts.process)
    front/              (0700) the Temporal front's CA, serving certificate and the owner's client
                        certificate (kruntimes.pki.local.ensure_front_tls), and the UI's login key
                        ui-login.key (0600)
    sockets/            (0700) the dev server's frontend, UI and metrics as Unix sockets (0600):
                        the dev server listens only inside a network namespace of its own
    pki/                (0700) the platform CA of the internal hops (ca.crt, ca.key 0600, the
                        trust bundle bundle.crt and the rotation state ca-state.json 0600:
                        kruntimes.pki.rotation), the assignment signing key (assignments.key
                        0600, assignments.pub), and the certificate directories of the gateway
                        (gateway/) and the worker (control-plane/), issued here and renewed by
                        the running platform, which also moves a CA rotation along

Everything kept here survives a restart on the same state dir, so the Runs do too.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from kruntimes.cli import components as components_record
from kruntimes.pki import CA_CERT, DEFAULT_LIFETIME, TLS_CERT, Authority, Identity, IdentityError, identity_of
from kruntimes.pki import rotation as ca_rotation
from kruntimes.pki.assignments import Signer
from kruntimes.pki.authority import CA_LIFETIME
from kruntimes.pki.local import ensure_front_tls, ensure_tls
from kruntimes.sdk import config as clientconfig
from kruntimes.temporal import ui_login
from kruntimes.temporal.codec import ensure_key
from kruntimes.temporal.devserver import free_port
from kruntimes.wire import tokens as token_format
from kruntimes.wire.tokens import TokenEntry, TokenFormatError
from kruntimes.workers.embedded.errors import PlatformError

# "temporal" and "temporalUi" are the front's (the dev server's own are in its network namespace)
PORT_NAMES = (
    "temporal",
    "temporalUi",
    "gateway",
    "heartbeat",
    "workerMetrics",
)
GATEWAY_ID = "gateway-0"
WORKER_ID = "worker-0"
ADMIN_USER = "admin"
ADMIN_GROUP = "admins"

DEFAULT_RUNTIMES = """\
# Runtimes of the embedded platform. Edit and restart `krt up` to change them.
runtimes:
  - name: python
    adapter: python
    runs: 10        # Runs per host
    minHosts: 1     # warm hosts kept running
    maxHosts: 4
  - name: bash
    adapter: bash
    runs: 10
    minHosts: 1
    maxHosts: 2
"""
# What `prepare` wrote before secrets had bindings; such an untouched file is replaced by the next.
_BINDINGS_BEFORE_SECRETS = f"""\
# Who may invoke which namespace's Runs: users or groups from tokens.csv, namespace or "*".
bindings:
  - namespace: "*"
    groups: [{ADMIN_GROUP}]
"""
DEFAULT_BINDINGS = f"""\
# Who may invoke which namespace's Runs: users or groups from tokens.csv, namespace or "*".
# Who may use which namespace's secrets (envFrom): the creators of Runs (client.json's
# identity), with verbs [use-secrets], optionally naming `secrets: [...]` (docs/configuration.md).
bindings:
  - namespace: "*"
    groups: [{ADMIN_GROUP}]
  - namespace: "*"
    verbs: [use-secrets]
    users: [{ADMIN_USER}]
"""

# The origins a per-request callback URL (X-Kruntime-Callback-URL) may name: none until you list
# them (docs/async-invocations.md); read when the gateway starts.
DEFAULT_CALLBACK_ORIGINS = """\
# The origins each namespace's async invocations may name in X-Kruntime-Callback-URL (a
# namespace, or "*" for every one): https://host[:port], https://*.domain[:port] (one label), or an
# IP address. None allowed until listed; restart the platform (krt down; krt up) after a change.
# namespaces:
#   default: ["https://hooks.example.com"]
namespaces: {}
"""


@dataclass(frozen=True)
class Layout:
    """The paths of one state directory."""

    root: Path

    @property
    def ports(self) -> Path:
        return self.root / "platform.json"

    @property
    def up(self) -> Path:
        return self.root / "up.json"

    @property
    def lock(self) -> Path:
        """Locked by the running supervisor (flock): the kernel lets go of it when it dies."""
        return self.root / "platform.lock"

    @property
    def ready(self) -> Path:
        return self.root / "up.ready"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens.csv"

    @property
    def bindings(self) -> Path:
        return self.root / "rolebindings.yaml"

    @property
    def runtimes(self) -> Path:
        return self.root / "runtimes.yaml"

    @property
    def callback_origins(self) -> Path:
        return self.root / "callback-origins.yaml"

    @property
    def client(self) -> Path:
        return self.root / clientconfig.CLIENT_FILE

    @property
    def gateway_ready(self) -> Path:
        return self.root / "gateway.ready.json"

    @property
    def temporal_ready(self) -> Path:
        return self.root / "temporal.ready.json"

    @property
    def front_ready(self) -> Path:
        return self.root / "front.ready.json"

    @property
    def temporal_cli_config(self) -> Path:
        """The `temporal` CLI's profiles for this platform (TEMPORAL_CONFIG_FILE)."""
        return self.root / "temporal.toml"

    @property
    def front(self) -> Path:
        """The front's certificates and the owner's client certificate (0700)."""
        return self.root / "front"

    @property
    def login_key(self) -> Path:
        """The key `krt ui` mints the UI's one-time login tickets with (0600)."""
        return self.front / "ui-login.key"

    @property
    def sockets(self) -> Path:
        """The dev server's frontend, UI and metrics as Unix sockets (0700)."""
        return self.root / "sockets"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def tls(self) -> Path:
        return self.root / "tls"

    @property
    def temporal(self) -> Path:
        return self.root / "temporal"

    @property
    def hosts(self) -> Path:
        return self.root / "hosts"

    @property
    def pki(self) -> Path:
        """The platform CA (ca.crt, ca.key, bundle.crt, ca-state.json) and the platform's signing
        key and certificates."""
        return self.root / "pki"

    @property
    def assignment_key(self) -> Path:
        return self.pki / "assignments.key"

    @property
    def assignment_public_key(self) -> Path:
        return self.pki / "assignments.pub"

    @property
    def gateway_tls(self) -> Path:
        """The gateway's platform certificate directory (heartbeats in, invokes out)."""
        return self.pki / "gateway"

    @property
    def worker_tls(self) -> Path:
        """The worker's platform certificate directory (a control-plane identity)."""
        return self.pki / "control-plane"

    @property
    def codec_keys(self) -> Path:
        """The payload codec's keys: Run specs, env and outputs are encrypted in Temporal."""
        return self.root / "codec-keys"

    def log(self, component: str) -> Path:
        """The log of one component ("temporal", "gateway", "worker", "platform")."""
        return self.logs / f"{component}.log"


def make_root(layout: Layout) -> None:
    """The state directory, mode 0700 and this user's: one made open to others (0755, by hand or
    an older tool) is closed, since its database, logs and bindings lie in it by path; one of
    another user is refused."""
    layout.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.stat(layout.root)
    if st.st_uid != os.geteuid():
        raise PlatformError(
            f"state directory {layout.root} belongs to uid {st.st_uid}, not to this user: "
            "use a directory of your own (KRT_STATE_DIR)"
        )
    if st.st_mode & 0o077:
        os.chmod(layout.root, 0o700)
    layout.logs.mkdir(exist_ok=True, mode=0o700)


def prepare(layout: Layout) -> tuple[dict[str, int], str]:
    """Create what is missing (directories, certificates, token file, default configs).

    Returns the ports and the admin token.
    """
    make_root(layout)
    ensure_tls(layout.tls)
    ensure_front_tls(layout.front)
    ensure_login_key(layout)
    ensure_pki(layout)
    ensure_key(layout.codec_keys)
    token = admin_token(layout)
    if not layout.bindings.exists() or layout.bindings.read_text() == _BINDINGS_BEFORE_SECRETS:
        layout.bindings.write_text(DEFAULT_BINDINGS)
    # hosts refuse bindings others could write (they decide who gets secrets)
    os.chmod(layout.bindings, os.stat(layout.bindings).st_mode & 0o755)
    if not layout.runtimes.exists():
        layout.runtimes.write_text(DEFAULT_RUNTIMES)
    if not layout.callback_origins.exists():
        layout.callback_origins.write_text(DEFAULT_CALLBACK_ORIGINS)
    return ports(layout), token


def ensure_login_key(layout: Layout) -> str:
    """The UI's login key: made once (0600), kept."""
    try:
        key = layout.login_key.read_text().strip()
    except FileNotFoundError:
        key = ""
    if key:
        return key
    key = ui_login.new_key()
    fd = os.open(layout.login_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def platform_certificates(layout: Layout) -> list[tuple[Path, Identity]]:
    """The certificate directories the platform process issues and renews, with their identities."""
    return [
        (layout.gateway_tls, Identity.gateway(GATEWAY_ID)),
        (layout.worker_tls, Identity.control_plane(WORKER_ID)),
    ]


def ensure_pki(
    layout: Layout,
    *,
    lifetime: dt.timedelta = DEFAULT_LIFETIME,
    now: dt.datetime | None = None,
    ca_lifetime: dt.timedelta = CA_LIFETIME,
    start_rotation: bool = False,
) -> tuple[Authority, list[ca_rotation.Step]]:
    """The platform CA (created once, kept; its rotation moved along to `now`, the rotation's
    clock: `lifetime` is the longest of the certificates it issues, the hosts' included;
    `start_rotation` begins one now), the assignment signing key, and the gateway's and the
    worker's certificates, issued at the real time: when missing or of another identity, else
    again when stale (due, or not of the CA's current key and bundle). Returns the signing CA and
    the rotation steps taken."""
    state, steps = ca_rotation.ensure(
        layout.pki, max_leaf_lifetime=lifetime, now=now, ca_lifetime=ca_lifetime, start=start_rotation
    )
    authority = state.authority()
    Signer.ensure(layout.assignment_key)
    for directory, identity in platform_certificates(layout):
        if _holds(directory, identity):
            authority.renew_if_due(directory)
        else:
            authority.write(
                directory, identity, lifetime=lifetime, dns_names=("localhost",), ip_addresses=("127.0.0.1",)
            )
    return authority, steps


def _holds(directory: Path, identity: Identity) -> bool:
    """Whether `directory` holds a readable certificate of `identity` and a ca.crt."""
    try:
        cert = x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes())
        return identity_of(cert) == identity and (directory / CA_CERT).is_file()
    except (OSError, ValueError, IdentityError):
        return False


def ports(layout: Layout) -> dict[str, int]:
    """The ports of this state dir: the saved ones while free, a new one for any taken; saved."""
    saved: dict[str, int] = json.loads(layout.ports.read_text()) if layout.ports.exists() else {}
    return recheck_ports(layout, saved, PORT_NAMES)


def recheck_ports(layout: Layout, current: dict[str, int], names: Iterable[str]) -> dict[str, int]:
    """`current` with a new port for each of `names` that is missing or taken now, saved.

    The ports are picked before anything binds them, so one may be taken meanwhile: the dev
    server opens ports of its own for its internal services when it starts, any of which may be
    one picked for a component started after it. Those components' ports are checked again
    right before each is started. No two names get the same port."""
    check = set(names)
    chosen: dict[str, int] = {}
    for name in PORT_NAMES:
        port = current.get(name)
        if port is None or port in chosen.values() or (name in check and not _port_free(port)):
            port = free_port()
            while port in chosen.values() or port in current.values():
                port = free_port()
        chosen[name] = port
    layout.ports.write_text(json.dumps(chosen, indent=2))
    return chosen


def _port_free(port: int) -> bool:
    """Whether a server could listen on `port` now: connections of an earlier run of it waiting
    out TIME_WAIT do not take it (the components listen with SO_REUSEADDR), a listener does."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def admin_token(layout: Layout) -> str:
    """The token of the token file's first admin entry; without one, a new file with a new token.

    A token file that cannot be read as the format is refused (PlatformError) rather than replaced.
    """
    if layout.tokens.exists():
        data = _read_bounded(layout.tokens, max_bytes=token_format.MAX_FILE_BYTES)
        try:
            for _, entry in token_format.entries(token_format.decode(data)):
                if entry.user == ADMIN_USER:
                    return entry.token
        except TokenFormatError as e:
            raise PlatformError(f"token file {layout.tokens}: {e}") from e
    token = "krt_" + secrets.token_urlsafe(32)
    line = token_format.format_line(TokenEntry(token=token, user=ADMIN_USER, uid="0", groups=(ADMIN_GROUP,)))
    fd = os.open(layout.tokens, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(line)
    return token


def _read_bounded(path: Path, *, max_bytes: int) -> bytes:
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PlatformError(f"token file {path} is larger than {max_bytes} bytes")
    return data


def write_up(
    layout: Layout,
    *,
    pid: int,
    components: dict[str, int],
    restarting: dict[str, components_record.Restarting] | None = None,
) -> None:
    """Record the running platform's pid, its components' pids (each with its start time) and
    those being started again (kruntimes.cli.components)."""
    components_record.write(layout.up, pid=pid, components=components, restarting=restarting)


def recorded(layout: Layout) -> components_record.Record:
    return components_record.read(layout.up)


def recorded_pid(layout: Layout) -> int:
    """The pid of the platform recorded as running, 0 when none is (or its pid is another
    process's now)."""
    return recorded(layout).supervisor()


def recorded_components(layout: Layout) -> dict[str, int]:
    """The components' pids recorded by the platform (name → pid), those still the processes
    recorded."""
    return recorded(layout).live_components()
