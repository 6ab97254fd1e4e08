"""`krt pki`: the platform's certificates (the commands' entry point; the logic is kruntimes.pki's).

    krt pki init-cluster ...   the platform's Secrets on a cluster, a CA rotation moved along
                               (kruntimes.pki.cluster, through workers/pki_secrets.py;
                               `--rotate-ca` starts one)
    krt pki ca-status          a CA directory's rotation: its phase, its CAs, when its next step
                               is due (`--ca-dir`, default $KRT_STATE_DIR/pki; `-o json`)
    krt pki rotate-ca          start a rotation of that CA now: the next CA is published in the
                               bundle; the running platform (`krt up`) takes it from there —
                               it re-issues every certificate with the new bundle, switches after
                               the overlap and drops the old CA after as long again

Exit codes: 0 done, 1 the CA directory (or the cluster's API, or a Secret that is not ours)
cannot be used, 2 a wrong command line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import sys
from pathlib import Path
from typing import Any

from cryptography import x509

from kruntimes.pki import rotation as ca_rotation
from kruntimes.pki.authority import DEFAULT_LIFETIME, AuthorityError, check_lifetime
from kruntimes.pki.cluster import DEFAULT_LEAF_LIFETIME, ClusterPki, ClusterPkiError, Outcome, Plan
from kruntimes.sdk import config as clientconfig

LOCAL = ("ca-status", "rotate-ca")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="krt pki", description="the platform's certificates")
    commands = top.add_subparsers(dest="command", required=True)
    commands.add_parser("init-cluster", help="the platform's Secrets on a cluster (krt pki init-cluster -h)")
    for name, help_text in (
        ("ca-status", "a CA directory's rotation: its phase, its CAs, when its next step is due"),
        ("rotate-ca", "start a rotation of a CA directory's CA now (publish the next CA)"),
    ):
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument(
            "--ca-dir",
            type=Path,
            help="the CA directory (default: the embedded platform's, $KRT_STATE_DIR/pki)",
        )
        command.add_argument(
            "--max-leaf-lifetime",
            type=float,
            default=DEFAULT_LIFETIME.total_seconds(),
            help="seconds the longest certificate the CA issues is valid (the overlap of each phase); "
            "default 30 days, what `krt up` issues",
        )
        if name == "ca-status":
            command.add_argument("-o", "--output", choices=["text", "json"], default="text")
    return top


def _when(t: dt.datetime | None) -> str | None:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else None


def _ca(cert: x509.Certificate) -> dict[str, str | None]:
    return {"subject": cert.subject.rfc4514_string(), "notAfter": _when(cert.not_valid_after_utc)}


def status(state: ca_rotation.Rotation, *, max_leaf_lifetime: dt.timedelta) -> dict[str, Any]:
    """What `ca-status` shows of a rotation (no key material)."""
    if state.next is not None:
        next_step, due = "switch", state.switch_after
    elif state.retired:
        next_step, due = "drop", state.retire_until
    else:
        next_step, due = "publish", ca_rotation.rotation_due(state.current.cert, max_leaf_lifetime)
    return {
        "phase": state.phase,
        "signing": _ca(state.current.cert),
        "next": _ca(state.next.cert) if state.next else None,
        "retired": [_ca(c) for c in state.retired],
        "bundle": len(state.bundle()),
        "nextStep": next_step,
        "nextStepDue": _when(due),
    }


def _text(shown: dict[str, Any]) -> str:
    lines = [f"phase      {shown['phase']} ({shown['bundle']} CA(s) in the bundle)"]
    for label, ca in (
        ("signing", shown["signing"]),
        ("next", shown["next"]),
        *(("retired", c) for c in shown["retired"]),
    ):
        if ca is not None:
            lines.append(f"{label:<10} {ca['subject']} (valid until {ca['notAfter']})")
    lines.append(f"next step  {shown['nextStep']}, from {shown['nextStepDue']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in LOCAL:
        if argv and argv[0] == "init-cluster":
            return init_cluster_main(argv)
        parser().parse_args(argv)  # exits 2 with the usage, or 0 for -h
        return 2
    args = parser().parse_args(argv)
    directory: Path = args.ca_dir or clientconfig.state_dir() / "pki"
    try:
        lifetime = check_lifetime(dt.timedelta(seconds=args.max_leaf_lifetime))
    except ValueError as e:
        print(f"krt pki: {e}", file=sys.stderr)
        return 2
    try:
        if args.command == "rotate-ca":
            if ca_rotation.load(directory) is None:
                raise AuthorityError(f"{directory} holds no CA")
            state, steps = ca_rotation.ensure(directory, max_leaf_lifetime=lifetime, start=True)
            if not steps:
                print(f"a rotation is under way already ({state.phase}); nothing done")
            for step in steps:
                print(f"platform CA rotation: {ca_rotation.describe(step, state)}")
            return 0
        found = ca_rotation.load(directory)
        if found is None:
            raise AuthorityError(f"{directory} holds no CA")
    except (AuthorityError, OSError) as e:
        print(f"krt pki: {e}", file=sys.stderr)
        return 1
    shown = status(found, max_leaf_lifetime=lifetime)
    print(json.dumps(shown, indent=2) if args.output == "json" else _text(shown))
    return 0


# --- init-cluster ----------------------------------------------------------------------------------


def cluster_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="krt pki", description="the platform's certificates on a cluster")
    commands = top.add_subparsers(dest="command", required=True)
    init = commands.add_parser(
        "init-cluster",
        help="create or renew the platform CA, worker and gateway certificates and the assignment key",
        description="The platform's own Secrets in a namespace, without cert-manager.",
    )
    init.add_argument("--namespace", required=True, help="the namespace of the Secrets")
    init.add_argument("--release", required=True, help="the release owning them (their owner annotation)")
    init.add_argument("--ca-secret", required=True, help="the platform CA's Secret")
    init.add_argument("--worker", help="the worker's identity name (its Secret: NAME-peer)")
    init.add_argument(
        "--gateway", action="append", default=[], help="a gateway identity name (its Secret: NAME-peer)"
    )
    init.add_argument("--assignment-secret", help="the assignment key's Secret (omit: one exists already)")
    init.add_argument(
        "--certificate-lifetime",
        type=float,
        default=DEFAULT_LEAF_LIFETIME.total_seconds(),
        help="seconds the worker's and gateways' certificates are valid (renewed after two thirds)",
    )
    init.add_argument(
        "--host-certificate-lifetime",
        type=float,
        default=DEFAULT_LIFETIME.total_seconds(),
        help="seconds the host certificates the worker issues are valid (the worker's own flag): a CA "
        "rotation waits for the longest lifetime between its phases",
    )
    init.add_argument(
        "--rotate-ca",
        action="store_true",
        help="start a CA rotation now (publish the next CA), even if the CA is not due yet",
    )
    init.add_argument("--api-server", help="the API server's URL (default: in-cluster, else kubeconfig)")
    init.add_argument("--kubeconfig", help="a kubeconfig file (default: in-cluster, else ~/.kube/config)")
    return top


def plan_from(args: argparse.Namespace) -> Plan:
    return Plan(
        namespace=args.namespace,
        release=args.release,
        ca_secret=args.ca_secret,
        worker=args.worker,
        gateways=tuple(dict.fromkeys(args.gateway)),
        assignment_secret=args.assignment_secret,
        lifetime=dt.timedelta(seconds=args.certificate_lifetime),
        host_lifetime=dt.timedelta(seconds=args.host_certificate_lifetime),
        rotate_ca=args.rotate_ca,
    )


async def init_cluster(plan: Plan, *, api_server: str | None, kubeconfig: str | None) -> dict[str, Outcome]:
    from kruntimes.workers import pki_secrets  # the Kubernetes client only for this command

    api_client = await pki_secrets.connect(api_server=api_server, kubeconfig=kubeconfig)
    try:
        return await ClusterPki(pki_secrets.SecretApi(api_client), plan).run()
    finally:
        await api_client.close()


def init_cluster_main(argv: list[str]) -> int:
    """`krt pki init-cluster ...`: 0 when every Secret is in place, 1 when one is refused or the
    API fails, 2 for a wrong command line."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = cluster_parser().parse_args(argv)
    try:
        plan = plan_from(args)
    except ValueError as e:
        print(f"krt pki: {e}", file=sys.stderr)
        return 2
    try:
        outcomes = asyncio.run(init_cluster(plan, api_server=args.api_server, kubeconfig=args.kubeconfig))
    except ClusterPkiError as e:
        print(f"krt pki: {e}", file=sys.stderr)
        return 1
    for name, outcome in outcomes.items():
        print(f"secret {plan.namespace}/{name}: {outcome}")
    return 0
