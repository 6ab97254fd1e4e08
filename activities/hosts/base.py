"""The host-provider interface and the manager that dispatches to providers by name.

Every failure leaving the manager is a ``ProviderError`` carrying a structured ``ProviderFailure``
(provider, host, operation, reason, retryable, message, and the correlation id of who asked);
library errors are wrapped at the provider boundary and anything that slips through becomes
``UnexpectedError``. Every operation is counted, timed and logged (observe.py), and creates go
through the breaker of their provider and runtime (circuit.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from kruntimes.activities.hosts.circuit import CircuitBreakers
from kruntimes.activities.hosts.observe import (
    SUCCEEDED,
    Correlation,
    ProviderMetrics,
    correlated,
    correlation,
)
from kruntimes.api.names import validate_dns1123_label
from kruntimes.config.runtimes import PlatformConfig
from kruntimes.contracts.providers import CreatedHost, HostSpec
from kruntimes.decisions.scheduling.failures import (
    FailureReason,
    ProviderError,
    ProviderFailure,
    ProviderOperation,
)
from kruntimes.pki import HostIssuer

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.common import MetricMeter

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


class ProviderConfigError(Exception):
    """A provider cannot be used as configured; raised before the worker serves anything."""


@dataclass(frozen=True)
class Fenced:
    """A fence's outcome: `fenced` when proven, and how (for the host's audit trail)."""

    fenced: bool
    how: str


# ProviderFailure.provider must be a valid name; a lookup of a malformed one reports this instead.
_INVALID_PROVIDER = "invalid"


class HostProvider(Protocol):
    """One way of creating hosts (process, attach, kubernetes ...)."""

    name: str

    async def create(self, spec: HostSpec) -> CreatedHost:
        """Start (or adopt) the host, return once it serves. Idempotent per (runtime, hostId)."""
        ...

    async def delete(self, *, runtime: str, host_id: str, host_uid: str) -> bool:
        """Stop that incarnation of the host; True if something was stopped, False if absent."""
        ...

    async def probe(self, host: CreatedHost) -> bool:
        """Whether the host serves (gRPC health SERVING) and is still the same incarnation."""
        ...

    async def gone(self, host: CreatedHost) -> bool:
        """Whether that incarnation is proven unable to serve (no side effects): its process or
        pod no longer exists, or another incarnation answers at its address. False when unsure."""
        ...

    async def fence(self, host: CreatedHost) -> Fenced:
        """Make that incarnation unable to serve any registration, and prove it: kill its process
        and see it gone; or see the pod deleting and out of routing; or have it acknowledge
        unregistering everything. Not fenced (try again later) when that cannot be done now."""
        ...


@runtime_checkable
class FencingProvider(Protocol):
    """A provider that can prove a host gone from its backend's own records (a pod's uid)."""

    async def verdict(self, *, runtime: str, host_id: str, host_uid: str, address: str | None) -> bool | None:
        """True: that incarnation is proven gone; False: it may still run; None: cannot say."""
        ...


@runtime_checkable
class OrphanCollecting(Protocol):
    """A provider that can list its own hosts and delete those no pool knows (kubernetes)."""

    async def collect_orphans(
        self, *, runtime: str, known: Collection[str], creating: Collection[str], grace_s: float
    ) -> list[str]:
        """Delete `runtime`'s hosts whose uid is not in `known` and whose host id is not in
        `creating`, once unknown for `grace_s`; the host ids deleted."""
        ...


@runtime_checkable
class LocalHosts(Protocol):
    """A provider whose hosts are processes on this machine, recorded under a state directory
    with their workspaces: a probe and the reconciler read those records and workspaces."""

    def records(self, state_dir: str | os.PathLike[str]) -> list[CreatedHost]:
        """Every host of this provider recorded under `state_dir`."""
        ...

    def running(self, record: CreatedHost) -> bool:
        """Whether the process of a recorded host still runs."""
        ...

    def work_root(self, state_dir: str | os.PathLike[str]) -> Path:
        """Where its hosts under `state_dir` keep their workspaces: one directory per host uid."""
        ...


@dataclass(frozen=True)
class ProviderSetup:
    """What every provider kind is built from: the platform config (which runtimes use it), the
    owner of this control plane's hosts, the worker's state directory, whether it can issue host
    certificates (it has the platform CA; known before `issuer` is loaded) and the issuer (None:
    none is issued), and each provider's own options by its name (its config model)."""

    config: PlatformConfig
    control_plane: str
    state_dir: str | None = None
    can_issue: bool = False
    issuer: HostIssuer | None = None
    options: Mapping[str, object] = field(default_factory=dict)


class ProviderKind(Protocol):
    """One registered way of creating hosts (activities/hosts/registry.py): its name, its own
    worker flags and the options they make, a check of the platform config made before anything
    is served, and its start-up."""

    name: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add its own `krt worker` flags (none: nothing)."""
        ...

    def options_from(self, args: argparse.Namespace) -> object | None:
        """Its options (its config model) from its flags; None: its defaults."""
        ...

    def check(self, setup: ProviderSetup) -> None:
        """Raise ValueError (or ProviderConfigError) saying what in the configuration this
        provider cannot serve."""
        ...

    def start(
        self, setup: ProviderSetup, *, client: Client | None
    ) -> AbstractAsyncContextManager[HostProvider | None]:
        """The provider with its start-up tasks running until the context exits; None when no
        runtime needs it. `client` is the worker's, for reports to HostWorkflows."""
        ...


def options_of(setup: ProviderSetup, name: str, model: type[M]) -> M:
    """Provider `name`'s options from `setup` (its model's defaults when none are given)."""
    found = setup.options.get(name)
    if found is None:
        return model()
    if not isinstance(found, model):
        wrong = type(found).__name__
        raise ValueError(f"host provider {name}: options must be {model.__name__}, not {wrong}")
    return found


def provider_error(
    reason: FailureReason,
    *,
    provider: str,
    operation: ProviderOperation,
    host: str | None = None,
    tenant: str | None = None,
    message: str = "",
    retryable: bool | None = None,
) -> ProviderError:
    """A ProviderError whose ``retryable`` defaults to the catalogue's answer for ``reason``."""
    failure = ProviderFailure.of(
        reason,
        retryable=retryable,
        provider=provider,
        operation=operation,
        host=host or None,
        tenant=tenant,
        message=message,
    )
    return ProviderError(failure)


def spec_error(
    reason: FailureReason, spec: HostSpec, *, provider: str, operation: ProviderOperation, message: str
) -> ProviderError:
    """A ProviderError about the host ``spec`` asks for (its id and tenant)."""
    return provider_error(
        reason, provider=provider, operation=operation, host=spec.hostId, tenant=spec.tenant, message=message
    )


class HostManager:
    """The providers of one worker, looked up by their stable lowercase names; `meter` takes
    their operations' metrics (None: none), `breakers` guard their creates (None: the defaults)."""

    def __init__(
        self,
        providers: Iterable[HostProvider],
        *,
        meter: MetricMeter | None = None,
        breakers: CircuitBreakers | None = None,
    ) -> None:
        self.metrics = ProviderMetrics(meter)
        self.breakers = breakers or CircuitBreakers()
        self._providers: dict[str, HostProvider] = {}
        for provider in providers:
            validate_dns1123_label(provider.name, field="provider")
            if provider.name in self._providers:
                raise ValueError(f"duplicate host provider name: {provider.name}")
            self._providers[provider.name] = provider

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._providers)

    def provider(self, name: str) -> HostProvider:
        found = self._providers.get(name)
        if found is not None:
            return found
        try:
            validate_dns1123_label(name, field="provider")
        except ValueError:
            reported = _INVALID_PROVIDER
        else:
            reported = name
        raise provider_error(
            FailureReason.ProviderNotFound,
            provider=reported,
            operation=ProviderOperation.Select,
            message=f"no host provider named {name!r:.80}; known: {', '.join(self._providers) or 'none'}",
        )

    def local(self, name: str) -> LocalHosts | None:
        """The provider named `name` if its hosts are local processes; else None."""
        found = self._providers.get(name)
        return found if isinstance(found, LocalHosts) else None

    @property
    def local_providers(self) -> list[LocalHosts]:
        return [p for p in self._providers.values() if isinstance(p, LocalHosts)]

    async def create(self, spec: HostSpec) -> CreatedHost:
        """The provider's create, through its breaker for this runtime: while that is open, a
        CircuitOpen failure at once and the provider is not called."""
        provider = self.provider(spec.provider)
        name, runtime = provider.name, spec.runtime
        admitted = self.breakers.admit(name, runtime)
        if admitted.open_for is not None:
            who = correlation()
            err = spec_error(
                FailureReason.CircuitOpen,
                spec,
                provider=name,
                operation=ProviderOperation.Create,
                message=(
                    f"{admitted.failures} creates of runtime {runtime} failed in a row; the "
                    f"{name} provider is not called for {admitted.open_for:.1f}s more"
                    + (f"; the last: {admitted.last}" if admitted.last else "")
                ),
            )
            self._report(ProviderOperation.Create, name, runtime, spec.hostId, spec.tenant, 0.0, who, err)
            raise correlated(err, who) from None
        try:
            created = await self._call(
                name,
                ProviderOperation.Create,
                runtime,
                spec.hostId,
                lambda p: p.create(spec),
                tenant=spec.tenant,
            )
        except ProviderError as err:
            if err.reason == FailureReason.OperationCancelled:
                self.breakers.abandoned(name, runtime, trial=admitted.trial)
            else:
                self.breakers.failed(
                    name, runtime, trial=admitted.trial, last=f"{err.reason}: {err.failure.message}"
                )
            raise
        except BaseException:  # cancelled: no verdict on the provider
            self.breakers.abandoned(name, runtime, trial=admitted.trial)
            raise
        else:
            self.breakers.succeeded(name, runtime)
            return created
        finally:
            self.metrics.circuit(provider=name, runtime=runtime, state=self.breakers.state(name, runtime))

    async def delete(self, *, provider: str, runtime: str, host_id: str, host_uid: str) -> bool:
        return await self._call(
            provider,
            ProviderOperation.Delete,
            runtime,
            host_id,
            lambda p: p.delete(runtime=runtime, host_id=host_id, host_uid=host_uid),
        )

    async def verdict(
        self, *, provider: str, runtime: str, host_id: str, host_uid: str, address: str | None
    ) -> bool | None:
        """The provider's fencing verdict on a host; None when it has none (or is not known)."""
        found = self._providers.get(provider)
        if not isinstance(found, FencingProvider):
            return None
        who, started = correlation(), time.monotonic()
        try:
            verdict = await found.verdict(
                runtime=runtime, host_id=host_id, host_uid=host_uid, address=address
            )
        except Exception as e:
            log.warning("provider %s could not judge host %s", provider, host_id, exc_info=True)
            self.metrics.operation(
                ProviderOperation.Status,
                provider=provider,
                runtime=runtime,
                host=host_id,
                result=str(FailureReason.UnexpectedError),
                seconds=time.monotonic() - started,
                who=who,
                message=f"{type(e).__name__}: {e}",
            )
            return None
        self._report(ProviderOperation.Status, provider, runtime, host_id, None, started, who, None)
        return verdict

    async def collect_orphans(
        self, *, runtime: str, known: Collection[str], creating: Collection[str], grace_s: float
    ) -> list[str]:
        """Every collecting provider's orphans of `runtime`, deleted; the host ids."""
        deleted: list[str] = []
        for provider in self._providers.values():
            if isinstance(provider, OrphanCollecting):
                deleted += await self._call(
                    provider.name,
                    ProviderOperation.Delete,
                    runtime,
                    None,
                    lambda p: _collect(p, runtime, known, creating, grace_s),
                )
        return deleted

    async def probe(self, host: CreatedHost) -> bool:
        return await self._call(
            host.provider, ProviderOperation.Status, host.runtime, host.hostId, lambda p: p.probe(host)
        )

    async def gone(self, host: CreatedHost) -> bool:
        return await self._call(
            host.provider, ProviderOperation.Status, host.runtime, host.hostId, lambda p: p.gone(host)
        )

    async def fence(self, host: CreatedHost) -> Fenced:
        return await self._call(
            host.provider, ProviderOperation.Fence, host.runtime, host.hostId, lambda p: p.fence(host)
        )

    async def _call(
        self,
        name: str,
        operation: ProviderOperation,
        runtime: str,
        host: str | None,
        call: Callable[[HostProvider], Awaitable[T]],
        *,
        tenant: str | None = None,
    ) -> T:
        """`call` of the provider named `name` (which must be known), its library errors as
        `operation`'s unexpected errors on `host`; counted, timed and logged, and a failure
        carries the correlation id of who asked."""
        provider = self.provider(name)
        who, started = correlation(), time.monotonic()
        try:
            result = await _guarded(
                call(provider), provider=provider.name, operation=operation, host=host, tenant=tenant
            )
        except ProviderError as err:
            self._report(operation, provider.name, runtime, host, tenant, started, who, err)
            found = correlated(err, who)
            if found is err:
                raise
            raise found from err.__cause__
        except asyncio.CancelledError:
            cancelled = provider_error(
                FailureReason.OperationCancelled, provider=provider.name, operation=operation, host=host
            )
            self._report(operation, provider.name, runtime, host, tenant, started, who, cancelled)
            raise
        self._report(operation, provider.name, runtime, host, tenant, started, who, None)
        return result

    def _report(
        self,
        operation: ProviderOperation,
        provider: str,
        runtime: str,
        host: str | None,
        tenant: str | None,
        started: float,
        who: Correlation,
        err: ProviderError | None,
    ) -> None:
        """The operation's metric and log line; `started` is monotonic seconds (0: it took none)."""
        seconds = time.monotonic() - started if started else 0.0
        self.metrics.operation(
            operation,
            provider=provider,
            runtime=runtime,
            host=host,
            tenant=tenant,
            result=SUCCEEDED if err is None else str(err.reason),
            seconds=seconds,
            who=who,
            message=err.failure.message if err is not None else "",
        )


async def _collect(
    provider: HostProvider, runtime: str, known: Collection[str], creating: Collection[str], grace_s: float
) -> list[str]:
    if not isinstance(provider, OrphanCollecting):
        return []
    return await provider.collect_orphans(runtime=runtime, known=known, creating=creating, grace_s=grace_s)


async def _guarded(
    call: Awaitable[T],
    *,
    provider: str,
    operation: ProviderOperation,
    host: str | None,
    tenant: str | None = None,
) -> T:
    try:
        return await call
    except ProviderError:
        raise
    except Exception as e:
        raise provider_error(
            FailureReason.UnexpectedError,
            provider=provider,
            operation=operation,
            host=host,
            tenant=tenant,
            message=f"{type(e).__name__}: {e}",
        ) from e
