"""The tag rules and the constraint grammar."""

from __future__ import annotations

import pytest

from kruntimes.krm import errors, tags
from kruntimes.krm.tags import Candidate, parse_constraint, parse_version, select


def allows(constraint: str, version: str) -> bool:
    v = parse_version(version)
    assert v is not None
    return parse_constraint(constraint).allows(v)


@pytest.mark.parametrize(
    ("constraint", "yes", "no"),
    [
        (">= 0.4.0 < 0.5.0", ["0.4.0", "v0.4.9"], ["0.3.9", "0.5.0"]),
        (">=0.4.0, <0.5.0", ["0.4.2"], ["0.5.1"]),
        ("v0.4.1", ["0.4.1", "0.4.1+build"], ["0.4.2"]),
        ("0.4", ["0.4.0", "0.4.7"], ["0.5.0"]),
        ("1.x", ["1.0.0", "1.9.3"], ["2.0.0", "0.9.0"]),
        ("1.2.*", ["1.2.5"], ["1.3.0"]),
        ("*", ["0.0.1", "9.0.0"], ["1.0.0-rc.1"]),
        ("~1.2.3", ["1.2.3", "1.2.9"], ["1.3.0", "1.2.2"]),
        ("~1", ["1.5.0"], ["2.0.0"]),
        ("^1.2.3", ["1.2.3", "1.9.0"], ["2.0.0"]),
        ("^0.4.1", ["0.4.1", "0.4.9"], ["0.5.0"]),
        ("^0.0.3", ["0.0.3"], ["0.0.4"]),
        (">0.4", ["0.5.0"], ["0.4.9"]),
        ("<=0.4", ["0.4.9"], ["0.5.0"]),
        ("!=0.4.1", ["0.4.2"], ["0.4.1"]),
        ("1.0.0 - 1.2.0", ["1.0.0", "1.2.0"], ["1.2.1"]),
        ("<1.0.0 || >=2.0.0", ["0.9.0", "2.1.0"], ["1.5.0"]),
        (">=1.0.0-rc.1", ["1.0.0-rc.2", "1.0.0"], ["1.0.0-alpha"]),
        (">=1.0.0", ["1.1.0"], ["1.1.0-rc.1"]),
        ("=1.2.3", ["1.2.3"], ["1.2.4"]),
        ("==1.2.3", ["1.2.3"], ["1.2.2"]),
        (">1.2.3", ["1.2.4"], ["1.2.3"]),
        (">*", [], ["0.0.1", "9.0.0"]),
        ("~>1.2.3", ["1.2.3", "1.2.9"], ["1.3.0", "1.2.2"]),
        ("~1", ["1.5.0"], ["2.0.0", "0.9.0"]),
        ("^1.2.3", ["1.2.3", "1.9.0"], ["2.0.0", "1.2.2"]),
        ("^0.4.1", ["0.4.1", "0.4.9"], ["0.5.0", "0.4.0"]),
        ("^0.1.2", ["0.1.2", "0.1.5"], ["0.2.0", "0.1.1"]),
        ("^0.4", ["0.4.0", "0.4.5"], ["0.5.0", "0.3.9"]),
        ("^0", ["0.0.0", "0.9.0"], ["1.0.0"]),
        ("^0.0.3", ["0.0.3"], ["0.0.4", "0.0.2"]),
        ("^*", ["0.0.1", "3.0.0"], []),
        ("1.0.0-rc.1 - 1.2.0", ["1.0.0-rc.2", "1.2.0"], ["1.0.0-alpha", "1.2.1"]),
        ("1.0.0 - 1.2.0-rc.2", ["1.2.0-rc.1"], ["1.2.0"]),
        (">=0.1.0 1.0.0 - 1.2.0", ["1.1.0"], ["0.5.0", "1.2.1"]),
        ("1.0.0 - 1.2.0 !=1.1.0", ["1.0.5"], ["1.1.0"]),
        ("* >=0.0.0-alpha", ["0.0.0-beta", "1.0.0"], []),
        # A range's end excludes the next release line's pre-releases: `0.4` is 0.4.x only.
        ("0.4 >=0.4.0-rc.1", ["0.4.1-rc.1", "0.4.9"], ["0.5.0-rc.1", "0.5.0-0"]),
        ("~1.2.0 >=1.2.0-rc.1", ["1.2.5"], ["1.3.0-rc.1"]),
        ("^1.2.0 >=1.2.0-rc.1", ["1.9.0"], ["2.0.0-rc.1"]),
        ("<=0.4 >=0.4.0-rc.1", ["0.4.9"], ["0.5.0-alpha"]),
        (">0.4 >=0.4.0-rc.1", ["0.5.0", "0.5.1-rc.1"], ["0.5.0-rc.1"]),
    ],
)
def test_constraints_allow_exactly_their_versions(constraint: str, yes: list[str], no: list[str]) -> None:
    assert [allows(constraint, v) for v in yes] == [True] * len(yes)
    assert [allows(constraint, v) for v in no] == [False] * len(no)


@pytest.mark.parametrize("text", ["", "latest", ">=", "1.2.3.4", "=> 1.0", "1.x-rc", "1.0.0 -"])
def test_text_that_is_no_constraint_is_refused(text: str) -> None:
    with pytest.raises(tags.ConstraintError):
        parse_constraint(text)
    assert not tags.is_constraint(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("  ", "empty constraint"),
        (">=1.0.0 ||", "empty constraint"),
        ("latest", "'latest' is not a version"),
        ("1.x-rc", "'1.x-rc': a pre-release needs a full version"),
        (">= >= 1.0.0", "operator '>=' has no version"),
        ("<1.0.0 >=", "operator '>=' has no version"),
    ],
)
def test_a_refused_constraint_says_which_part_is_wrong(text: str, says: str) -> None:
    """The message reaches the caller inside NotFound ("neither a version nor a constraint (...)")."""
    with pytest.raises(tags.ConstraintError) as err:
        parse_constraint(text)
    assert str(err.value) == says


@pytest.mark.parametrize("text", [">=1.0.0", "1.x", "^0.4.1 || 2.0.0 - 2.1.0", "v1.2.3"])
def test_every_constraint_of_the_grammar_is_one(text: str) -> None:
    assert tags.is_constraint(text)


def test_a_version_is_full_semver_with_an_optional_v() -> None:
    assert str(parse_version("v1.2.3")) == "1.2.3"
    assert str(parse_version("V1.2.3")) == "1.2.3"
    assert parse_version("1.2") is None
    assert parse_version("latest") is None


def test_the_image_reference_splits_at_the_tag_not_the_registry_port() -> None:
    assert tags.split_image("localhost:5000/fn/set-labels:v1") == ("localhost:5000/fn/set-labels", "v1")
    assert tags.split_image("localhost:5000/fn/set-labels") == ("localhost:5000/fn/set-labels", "")
    assert tags.split_image("ghcr.io/fn@sha256:abc") == ("ghcr.io/fn", "")
    assert tags.split_image("ghcr.io/fn:v2@sha256:abc") == ("ghcr.io/fn", "v2")
    assert tags.split_image("fn:v1") == ("fn", "v1")
    assert tags.split_image("fn") == ("fn", "")


def test_a_colon_of_the_path_or_the_digest_is_never_the_tag() -> None:
    """Only a colon after the last slash, before the first "@", starts a tag."""
    assert tags.split_image("registry:5000/team:x/fn") == ("registry:5000/team:x/fn", "")
    assert tags.split_image("ghcr.io/fn@sha256:abc@sha256:def") == ("ghcr.io/fn", "")


def candidates(**offers: list[str]) -> list[Candidate[str]]:
    return [Candidate(tuple(parse_constraint(t) for t in offered), name) for name, offered in offers.items()]


IMAGE = "example.com/fn/x"


def test_a_concrete_tag_is_matched_against_the_constraints() -> None:
    offer = candidates(old=[">=0.1.0 <0.2.0"], new=["^0.2.0"])
    assert select(offer, tag="v0.2.5", image=IMAGE) == ("new", "v0.2.5")
    assert select(offer, tag="0.1.3", image=IMAGE) == ("old", "0.1.3")


def test_the_first_candidate_whose_constraints_match_wins() -> None:
    offer = candidates(first=["1.x"], second=["1.x"])
    assert select(offer, tag="1.0.0", image=IMAGE)[0] == "first"


def test_a_constraint_tag_selects_the_highest_offered_version_satisfying_it() -> None:
    offer = candidates(a=["v0.4.0", "v0.4.2", ">=9.0.0"], b=["v0.4.1", "v0.5.0"])
    assert select(offer, tag=">= 0.4.0 < 0.5.0", image=IMAGE) == ("a", "v0.4.2")
    assert select(offer, tag="~0.5", image=IMAGE) == ("b", "v0.5.0")


def test_of_candidates_offering_the_same_highest_version_the_first_wins() -> None:
    offer = candidates(first=["v0.4.2"], second=["0.4.2"])
    assert select(offer, tag="^0.4.0", image=IMAGE) == ("first", "v0.4.2")


def test_a_constraint_tag_ignores_offered_tags_that_are_ranges() -> None:
    offer = candidates(a=["^0.4.0"])
    with pytest.raises(errors.NotFound, match="no binary tag satisfies"):
        select(offer, tag=">=0.4.0", image=IMAGE)


def test_an_empty_tag_uses_the_image_references_tag() -> None:
    offer = candidates(a=["1.x"])
    assert select(offer, tag="", image=IMAGE + ":v1.4.0") == ("a", "v1.4.0")


def test_no_tag_anywhere_is_not_found() -> None:
    with pytest.raises(errors.NotFound, match="no tag"):
        select(candidates(a=["1.x"]), tag="", image=IMAGE)


def test_a_miss_is_not_found() -> None:
    offer = candidates(a=["1.x"])
    with pytest.raises(errors.NotFound, match="no binary for version"):
        select(offer, tag="2.0.0", image=IMAGE)
    with pytest.raises(errors.NotFound, match="neither a version nor a constraint"):
        select(offer, tag="latest", image=IMAGE)
