"""The kubernetes provider's registration: its checks of the platform config and its start-up.

Started only when a runtime names `provider: kubernetes`: it reaches the API server from its
options (a kubeconfig and context, `KubernetesAccess`) or, inside a cluster, its service account;
checks every pod template against the Kubernetes schema and that it may list pods in each
runtime's namespace before anything is served; and watches the host pods of its control plane,
so that an event that may mean a lost pod goes to that host's HostWorkflow as a provider report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio.client import Client

from kruntimes.activities.hosts import kubernetes as kube
from kruntimes.activities.hosts.base import ProviderSetup
from kruntimes.activities.hosts.events import HostEvent, HostWorkflowRoute, WorkflowSignals
from kruntimes.activities.hosts.kubernetes_pods import check_control_plane_id
from kruntimes.activities.hosts.kubernetes_watch import PodWatch
from kruntimes.config.runtimes import KUBERNETES_PROVIDER
from kruntimes.decisions.scheduling.failures import ProviderError

log = logging.getLogger(__name__)

NAME = KUBERNETES_PROVIDER

# Certificate Secrets are checked this often for renewal: a small part of their lifetime, at most
# an hour (a check reads every Secret the provider issued).
_RENEW_MAX = timedelta(hours=1)
_RENEW_PARTS = 30


class KubernetesHosts:
    """Its options are a `KubernetesAccess` (`--kubeconfig`, `--kube-context`; None: in a cluster
    its service account, else the default kubeconfig)."""

    name = NAME

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("provider: kubernetes")
        group.add_argument(
            "--kubeconfig",
            help="kubeconfig file for provider: kubernetes (default: in a cluster its service account, "
            "else $KUBECONFIG or ~/.kube/config)",
        )
        group.add_argument("--kube-context", help="the kubeconfig context to use (default: its current one)")

    def options_from(self, args: argparse.Namespace) -> kube.KubernetesAccess | None:
        if args.kubeconfig is None and args.kube_context is None:
            return None
        return kube.KubernetesAccess(kubeconfig=args.kubeconfig, context=args.kube_context)

    def check(self, setup: ProviderSetup) -> None:
        check_control_plane_id(setup.control_plane)
        self._access(setup)
        runtimes = kube.runtimes_of(setup.config)
        kube.validate_templates(runtimes, control_plane=setup.control_plane)
        kube.check_certificates(runtimes, can_issue=setup.can_issue or setup.issuer is not None)

    @contextlib.asynccontextmanager
    async def start(
        self, setup: ProviderSetup, *, client: Client | None
    ) -> AsyncIterator[kube.KubernetesProvider | None]:
        """Raises KubernetesConfigError (before anything is served) when the API cannot be used."""
        runtimes = kube.runtimes_of(setup.config)
        if not runtimes:
            yield None
            return
        kube.validate_templates(runtimes, control_plane=setup.control_plane)
        access = self._access(setup) or kube.KubernetesAccess(in_cluster=kube.in_cluster())
        api_client = await kube.connect(access)
        try:
            await kube.check_access(api_client, {r.namespace for r in runtimes.values()})
            if client is None:
                raise kube.KubernetesConfigError("the kubernetes provider needs the worker's Temporal client")
            provider = kube.KubernetesProvider(
                api_client,
                runtimes=runtimes,
                control_plane=setup.control_plane,
                issuer=setup.issuer,
                name=self.name,
            )
            signals = WorkflowSignals(client, HostWorkflowRoute())

            def on_event(event: HostEvent) -> None:
                signals(event)

            watches = [
                PodWatch(
                    api_client,
                    namespace=namespace,
                    control_plane=setup.control_plane,
                    on_event=on_event,
                    on_pod=provider.notify,
                    provider=provider.name,
                )
                for namespace in sorted(provider.namespaces)
            ]
            tasks = [asyncio.create_task(w.run()) for w in watches] + [asyncio.create_task(signals.run())]
            if setup.issuer is not None:
                lifetime = setup.issuer.lifetime.total_seconds()
                every_s = min(_RENEW_MAX.total_seconds(), lifetime / _RENEW_PARTS)
                tasks.append(asyncio.create_task(_renew_certificates(provider, every_s=every_s)))
            try:
                yield provider
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await api_client.close()

    def _access(self, setup: ProviderSetup) -> kube.KubernetesAccess | None:
        found = setup.options.get(self.name)
        if found is not None and not isinstance(found, kube.KubernetesAccess):
            wrong = type(found).__name__
            raise ValueError(f"host provider {self.name}: options must be KubernetesAccess, not {wrong}")
        return found


async def _renew_certificates(provider: kube.KubernetesProvider, *, every_s: float) -> None:
    """Re-issue the certificate Secrets of the provider's host pods as they come due, until
    cancelled."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await provider.renew_certificates()
        except ProviderError:
            log.warning("renewing host pod certificates failed", exc_info=True)
