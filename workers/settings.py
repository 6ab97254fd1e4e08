"""What the worker runs with: its settings, read once by its entry point (workers/worker.py).

Its platform credentials (`WorkerTrust`): the control-plane certificate every channel to a host
presents, the key it signs assignments with (only activities hold it), and optionally the platform
CA, with which its providers issue the hosts they start their certificates and renew them; the CA
directory is read again when it changes (a CA rotation's new bundle, then its new key), and a host
certificate not of the CA's current key and bundle is re-issued at the next renewal check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from kruntimes.activities.callbacks import CallbackPolicy
from kruntimes.activities.hosts.base import ProviderSetup
from kruntimes.config.runtimes import PlatformConfig
from kruntimes.contracts.names import POOL_TASK_QUEUE, TASK_QUEUE
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.providers import HostDefaults
from kruntimes.pki import (
    DEFAULT_LIFETIME,
    AuthorityError,
    AuthorityWatch,
    HostIssuer,
    PeerTLS,
    PeerTLSError,
    Role,
)
from kruntimes.pki.assignments import AssignmentError, Signer
from kruntimes.pki.authority import check_lifetime
from kruntimes.temporal.connect import TemporalSettings
from kruntimes.workers.tuning import DEFAULT_WORKFLOW_CACHE


@dataclass(frozen=True)
class WorkerTrust:
    """The worker's platform credentials (see the module docstring)."""

    peer_tls: Path  # its certificate directory: a control-plane identity of the platform CA
    assignment_key: Path  # the Ed25519 private key assignments are signed with
    platform_ca: Path | None = None  # ca.crt, ca.key, bundle.crt; None: no provider issues certificates
    host_certificate_lifetime: timedelta = DEFAULT_LIFETIME


@dataclass(frozen=True)
class WorkerSettings:
    temporal: TemporalSettings
    config: PlatformConfig
    platform: PlatformInfo
    trust: WorkerTrust
    metrics_address: str | None = None
    probe_interval_s: float | None = 60.0
    sandboxed: bool = False  # see tuning.workflow_runner
    workflow_cache: int = DEFAULT_WORKFLOW_CACHE  # the Runs' worker's; the pools' keeps the SDK's
    # The task queues this process serves: the Runs' (RunWorkflow, ScaleOut, Cleanup and their
    # activities) and/or the pools'.
    queues: frozenset[str] = frozenset({"runs", "pools"})
    # Their names: a test or a second platform on the same Temporal namespace picks its own.
    run_task_queue: str = TASK_QUEUE
    pool_task_queue: str = POOL_TASK_QUEUE
    # What hosts are told about isolation: the default for runtimes that name none, where
    # `source.path` may point, what functions never see (the state directory is always added).
    host_defaults: HostDefaults = field(default_factory=HostDefaults)
    # Each host provider's options (its config model, from its own flags) by its name; a provider
    # not named here takes its defaults.
    provider_options: Mapping[str, object] = field(default_factory=dict)
    # The owner annotated on this control plane's hosts (default: Temporal namespace and pool
    # task queue); two control planes sharing a backend (a Kubernetes namespace) need different ones.
    control_plane_id: str | None = None
    # Async invocations' callbacks: the hosts let through to internal addresses, the CA file trusted.
    callbacks: CallbackPolicy = field(default_factory=CallbackPolicy)

    @property
    def control_plane(self) -> str:
        return self.control_plane_id or f"{self.temporal.namespace}/{self.pool_task_queue}"


def host_defaults(settings: WorkerSettings) -> HostDefaults:
    """What hosts are told: the worker's defaults, the platform config's roots and shared
    directories, and the state directory hidden."""
    defaults = settings.host_defaults
    roots = settings.config.allowedSourceRoots
    hide = sorted({*defaults.hide, *([settings.platform.stateDir] if settings.platform.stateDir else [])})
    return defaults.model_copy(
        update={
            "allowedSourceRoots": defaults.allowedSourceRoots if roots is None else roots,
            "hide": hide,
            "shared": sorted({*defaults.shared, *settings.config.sharedDirectories}),
        }
    )


def provider_setup(settings: WorkerSettings, *, issuer: HostIssuer | None = None) -> ProviderSetup:
    """What the registered host providers are built from (activities/hosts/registry.py)."""
    return ProviderSetup(
        config=settings.config,
        control_plane=settings.control_plane,
        state_dir=settings.platform.stateDir or None,
        can_issue=settings.trust.platform_ca is not None,
        issuer=issuer,
        options=settings.provider_options,
    )


class TrustError(Exception):
    """The worker's platform credentials cannot be used."""


def load_trust(trust: WorkerTrust) -> tuple[PeerTLS, Signer, HostIssuer | None]:
    try:
        peer_tls = PeerTLS(trust.peer_tls, role=Role.CONTROL_PLANE)
        signer = Signer.load(trust.assignment_key)
        check_lifetime(trust.host_certificate_lifetime)
        issuer = None
        if trust.platform_ca is not None:
            issuer = HostIssuer(
                AuthorityWatch(trust.platform_ca), signer.public_pem, trust.host_certificate_lifetime
            )
    except (PeerTLSError, AssignmentError, AuthorityError, ValueError) as e:
        raise TrustError(str(e)) from e
    return peer_tls, signer, issuer
