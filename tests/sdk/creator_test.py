"""A Run's creator (metadata.creator): validated in the manifest, set by the SDK from its config's
identity whatever the manifest said, `schedule` for a schedule's Runs, and shown plainly."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

import pytest

from kruntimes.api.names import CREATOR_KINDS
from kruntimes.api.run import ManifestError, Run
from kruntimes.api.spec import Creator, CreatorKind
from kruntimes.api.status import RunStatus
from kruntimes.cli.output import describe
from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.config import load as load_config
from kruntimes.sdk.results import RunObject
from kruntimes.sdk.runs import Runs, differences, prepare
from kruntimes.sdk.schedules import template_of
from kruntimes.wire.summaries import run_details, run_summary
from tests.sdk.stack import manifest


def _with_creator(creator: object) -> dict[str, object]:
    document = manifest("a")
    document["metadata"] = {**document["metadata"], "creator": creator}
    return document


def test_the_creator_kinds_are_one_list() -> None:
    assert get_args(CreatorKind) == CREATOR_KINDS


@pytest.mark.parametrize(
    ("creator", "said"),
    [
        ({"kind": "sdk", "subject": "a b"}, "metadata.creator.subject: 1..128 ASCII"),
        ({"kind": "sdk", "subject": "\u202eadmin"}, "metadata.creator.subject"),
        ({"kind": "sdk", "subject": "x" * 129}, "metadata.creator.subject"),
        ({"kind": "root", "subject": "admin"}, "metadata.creator.kind"),
        ({"kind": "sdk"}, "metadata.creator.subject"),
    ],
    ids=["space", "format-character", "too-long", "unknown-kind", "no-subject"],
)
def test_a_creator_out_of_bounds_is_refused_by_field(creator: dict[str, str], said: str) -> None:
    with pytest.raises(ManifestError) as err:
        Run.from_dict(_with_creator(creator))
    assert any(p.startswith(said) for p in err.value.problems), err.value.problems


def test_the_sdk_records_its_identity_and_replaces_a_manifests_own() -> None:
    claimed = Run.from_dict(_with_creator({"kind": "schedule", "subject": "admin"}))
    runs = Runs(ClientConfig(identity="team-a-ci"))
    assert prepare(claimed, creator=runs.creator()).metadata.creator == Creator(
        kind="sdk", subject="team-a-ci"
    )
    cli = Runs(ClientConfig(identity="alice@example.com"), creator_kind="cli")
    assert str(prepare(claimed, creator=cli.creator()).metadata.creator) == "cli:alice@example.com"
    anonymous = Runs(ClientConfig())
    assert anonymous.creator() is None
    assert prepare(claimed, creator=anonymous.creator()).metadata.creator is None


def test_a_schedules_runs_are_created_by_the_schedule_for_its_creator() -> None:
    task = Run.from_dict(manifest("nightly", mode={"task": {}}))
    runs = Runs(ClientConfig(identity="ops"), creator_kind="cli")
    template = template_of(task, name="nightly", namespace="team-b", creator=runs.creator("schedule"))
    assert template.metadata.creator == Creator(kind="schedule", subject="ops")


def test_another_identity_applying_the_same_spec_changes_nothing() -> None:
    run = Run.from_dict(manifest("a"))
    mine = prepare(run, creator=Creator(kind="sdk", subject="alice"))
    theirs = prepare(run, creator=Creator(kind="cli", subject="bob"))
    assert differences(mine, theirs, uid=None) == []


def test_the_identity_comes_from_the_client_config_or_krt_identity(tmp_path: object) -> None:
    assert load_config({"KRT_STATE_DIR": str(tmp_path), "KRT_IDENTITY": "ci-bot"}).identity == "ci-bot"
    with pytest.raises(ValueError, match="identity"):
        load_config({"KRT_STATE_DIR": str(tmp_path), "KRT_IDENTITY": "ci bot"})


def test_the_creator_is_shown_plainly_in_the_summary_the_details_and_describe() -> None:
    run = prepare(Run.from_dict(manifest("a")), creator=Creator(kind="cli", subject="admin"))
    assert run_summary(run) == "function python default/a by cli:admin"
    assert "| creator | `cli:admin` |" in run_details(run)
    text = describe(RunObject.of(run, RunStatus(), created=datetime.now(UTC)), [])
    assert "Creator:" in text and "cli:admin" in text
    anonymous = prepare(Run.from_dict(manifest("a")))
    assert run_summary(anonymous) == "function python default/a"
