"""Function versions: semver tags and constraints, and the rules that pick a binary for a tag.

A *version* is a full semver `MAJOR.MINOR.PATCH[-PRE][+BUILD]`, optionally with a leading `v`
(`v0.4.1`). A *constraint* is a disjunction (`||`) of conjunctions (terms separated by commas or
spaces) of comparisons:

    =V ==V V    the version, or the whole range a partial V names (`0.4` is 0.4.x, `1` is 1.x.x)
    !=V         outside that
    >V >=V <V <=V   ordered against V (a partial V stands for its whole range: `>0.4` is >= 0.5.0)
    ~V          patch updates: ~1.2.3 is >=1.2.3 <1.3.0; ~1.2 is 1.2.x; ~1 is 1.x.x
    ^V          compatible updates: ^1.2.3 is >=1.2.3 <2.0.0; ^0.4.1 is >=0.4.1 <0.5.0; ^0.0.3 is 0.0.3
    A - B       >=A <=B
    * x         any version; `1.x`, `1.2.*` are wildcards like partial versions

A version with a pre-release tag satisfies a constraint only if the conjunction it is checked
against names a pre-release itself (so `>=1.0.0` does not pick `1.1.0-rc.1`).

The rules (`select`) given the requested tag and the candidates' constraint lists:
- a tag that parses as a version is matched against each candidate's constraints; the first
  candidate with a constraint it satisfies wins;
- a tag that is itself a constraint selects, among the candidates' tags that parse as versions,
  the highest one satisfying it;
- an empty tag means the image reference's tag; no tag at all, or no match, is NotFound.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import semver

from kruntimes.krm import errors

T = TypeVar("T")
Version = semver.Version

_PARTIAL = re.compile(
    r"^v?(?P<major>0|[1-9]\d*|[xX*])(?:\.(?P<minor>0|[1-9]\d*|[xX*]))?(?:\.(?P<patch>0|[1-9]\d*|[xX*]))?"
    r"(?:-(?P<pre>[0-9A-Za-z.-]+))?(?:\+(?P<build>[0-9A-Za-z.-]+))?$"
)
_OPERATORS = ("==", "!=", ">=", "<=", "~>", "=", ">", "<", "~", "^")
_WILD = {"x", "X", "*"}


class ConstraintError(ValueError):
    """The text is not a semver constraint (the message says which part)."""


def parse_version(text: str) -> Version | None:
    """The version `text` names exactly (`v` prefix allowed), or None."""
    try:
        return Version.parse(text[1:] if text[:1] in ("v", "V") else text)
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class _Partial:
    """A version with 0..3 numeric parts given (the rest wildcards)."""

    parts: tuple[int, ...]
    pre: str | None

    @property
    def low(self) -> Version:
        major, minor, patch = [*self.parts, 0, 0, 0][:3]
        return Version(major, minor, patch, prerelease=self.pre if len(self.parts) == 3 else None)

    def above(self) -> Version | None:
        """The lowest version past the range this partial names (None: no upper bound)."""
        if len(self.parts) == 3:
            return None
        if not self.parts:
            return None
        bumped = [*self.parts[:-1], self.parts[-1] + 1]
        return Version(*[*bumped, 0, 0, 0][:3])


def _partial(text: str) -> _Partial:
    match = _PARTIAL.match(text)
    if match is None:
        raise ConstraintError(f"{text!r} is not a version")
    parts: list[int] = []
    for name in ("major", "minor", "patch"):
        value = match.group(name)
        if value is None or value in _WILD:
            break
        parts.append(int(value))
    pre = match.group("pre")
    if pre is not None and len(parts) != 3:
        raise ConstraintError(f"{text!r}: a pre-release needs a full version")
    return _Partial(tuple(parts), pre)


Predicate = Callable[[Version], bool]


def _before(v: Version) -> Version:
    """The lowest version of `v`'s release line (`0.5.0-0`): a range that ends before 0.5.0 admits
    none of 0.5.0's pre-releases either."""
    return v.replace(prerelease="0")


def _range(low: Version | None, high: Version | None, *, high_inclusive: bool = False) -> Predicate:
    def check(v: Version) -> bool:
        if low is not None and v < low:
            return False
        if high is None:
            return True
        return v <= high if high_inclusive else v < high

    return check


def _exact_or_range(p: _Partial) -> Predicate:
    if len(p.parts) == 3:
        target = p.low
        return lambda v: v.compare(target) == 0
    above = p.above()
    return _range(p.low if p.parts else None, None if above is None else _before(above))


def _term(op: str, p: _Partial) -> Predicate:
    if op in ("", "=", "=="):
        return _exact_or_range(p)
    if op == "!=":
        inside = _exact_or_range(p)
        return lambda v: not inside(v)
    if op == ">=":
        return _range(p.low, None)
    if op == ">":
        above = p.above()
        if len(p.parts) == 3:
            low = p.low
            return lambda v: v > low
        return (lambda v: False) if above is None else _range(above, None)
    if op == "<":
        return _range(None, p.low)
    if op == "<=":
        if len(p.parts) == 3:
            return _range(None, p.low, high_inclusive=True)
        above = p.above()
        return _range(None, None if above is None else _before(above))
    if op in ("~", "~>"):
        if len(p.parts) <= 1:
            above = p.above()
            return _range(p.low, None if above is None else _before(above))
        return _range(p.low, _before(Version(p.parts[0], p.parts[1] + 1, 0)))
    if op == "^":
        parts = [*p.parts]
        if not parts:
            return _range(None, None)
        if parts[0] > 0 or len(parts) == 1:
            return _range(p.low, _before(Version(parts[0] + 1, 0, 0)))
        if len(parts) == 2 or parts[1] > 0:
            return _range(p.low, _before(Version(0, parts[1] + 1, 0)))
        return _range(p.low, _before(Version(0, 0, parts[2] + 1)))
    raise ConstraintError(f"unknown operator {op!r}")


@dataclass(frozen=True, slots=True)
class _Conjunction:
    terms: tuple[Predicate, ...]
    allows_prerelease: bool

    def __call__(self, v: Version) -> bool:
        if v.prerelease and not self.allows_prerelease:
            return False
        return all(term(v) for term in self.terms)


def _tokens(text: str) -> list[str]:
    # ">= 0.4.0 < 0.5.0" and ">=0.4.0, <0.5.0" both become [">=0.4.0", "<0.5.0"].
    raw = [t for t in re.split(r"[\s,]+", text.strip()) if t]
    tokens: list[str] = []
    pending = ""
    for token in raw:
        if token in _OPERATORS:
            if pending:
                raise ConstraintError(f"operator {pending!r} has no version")
            pending = token
            continue
        tokens.append(pending + token)
        pending = ""
    if pending:
        raise ConstraintError(f"operator {pending!r} has no version")
    return tokens


def _conjunction(text: str) -> _Conjunction:
    tokens = _tokens(text)
    if not tokens:
        raise ConstraintError("empty constraint")
    terms: list[Predicate] = []
    prerelease = False
    i = 0
    while i < len(tokens):
        if i + 2 < len(tokens) and tokens[i + 1] == "-":
            low, high = _partial(tokens[i]), _partial(tokens[i + 2])
            terms.append(_term(">=", low))
            terms.append(_term("<=", high))
            prerelease = prerelease or bool(low.pre or high.pre)
            i += 3
            continue
        token = tokens[i]
        op = next((o for o in _OPERATORS if token.startswith(o)), "")
        p = _partial(token[len(op) :])
        terms.append(_term(op, p))
        prerelease = prerelease or bool(p.pre)
        i += 1
    return _Conjunction(tuple(terms), prerelease)


@dataclass(frozen=True, slots=True)
class Constraint:
    text: str
    alternatives: tuple[_Conjunction, ...]

    def allows(self, version: Version) -> bool:
        return any(alternative(version) for alternative in self.alternatives)


def parse_constraint(text: str) -> Constraint:
    if not text.strip():
        raise ConstraintError("empty constraint")
    return Constraint(text, tuple(_conjunction(part) for part in text.split("||")))


def is_constraint(text: str) -> bool:
    try:
        parse_constraint(text)
    except ConstraintError:
        return False
    return True


def split_image(image: str) -> tuple[str, str]:
    """`name[:tag][@digest]` → (name, tag); the tag is "" when the reference has none. A colon
    before the last slash belongs to a registry port (`localhost:5000/fn`)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, ""


@dataclass(frozen=True, slots=True)
class Candidate(Generic[T]):
    """One binary offered for an image: its constraints and what to hand back when it wins."""

    constraints: tuple[Constraint, ...]
    value: T


def select(candidates: Sequence[Candidate[T]], *, tag: str, image: str) -> tuple[T, str]:
    """The winning candidate's value and the tag it matched; NotFound when there is none."""
    if not tag:
        tag = split_image(image)[1]
        if not tag:
            raise errors.NotFound(f"{image}: no tag requested and the image reference has none")
    version = parse_version(tag)
    if version is not None:
        for candidate in candidates:
            if any(c.allows(version) for c in candidate.constraints):
                return candidate.value, tag
        raise errors.NotFound(f"{image}: no binary for version {tag}")
    try:
        wanted = parse_constraint(tag)
    except ConstraintError as e:
        raise errors.NotFound(f"{image}: tag {tag!r} is neither a version nor a constraint ({e})") from e
    best: tuple[Version, T, str] | None = None
    for candidate in candidates:
        for constraint in candidate.constraints:
            offered = parse_version(constraint.text.strip())
            if offered is None or not wanted.allows(offered):
                continue
            if best is None or offered > best[0]:
                best = (offered, candidate.value, constraint.text.strip())
    if best is None:
        raise errors.NotFound(f"{image}: no binary tag satisfies {tag!r}")
    return best[1], best[2]
