"""The static token file's format, one caller per line: `token,user,uid,"group1,group2"`.

A line is CSV with three or four columns (the groups column is itself a comma-separated list);
fields are stripped, blank lines and lines starting with `#` (after whitespace) are skipped, and a
UTF-8 byte order mark is allowed. The gateway's TokenFile (what a token may do) and the embedded
platform (which writes the admin token) both read and write it through here.

No error message and no repr holds a token: a problem is named by its line number.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass, field

# The largest token file either side reads.
MAX_FILE_BYTES = 1024 * 1024


class TokenFormatError(ValueError):
    """A line of a token file is malformed: `line N <problem>`, never the line's content."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line} {problem}")
        self.line = line
        self.problem = problem


@dataclass(frozen=True)
class TokenEntry:
    """One caller of the file. The token is left out of repr so an entry can be logged."""

    token: str = field(repr=False)
    user: str
    uid: str
    groups: tuple[str, ...] = ()


def decode(data: bytes) -> str:
    """The file's text: UTF-8, with or without a byte order mark."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise TokenFormatError(data[: e.start].count(b"\n") + 1, "is not UTF-8") from None


def parse_line(text: str, *, line: int = 1) -> TokenEntry | None:
    """The entry of one line, or None for a blank or comment line. `line` only numbers errors.

    Only the syntax is checked here: whether a token or user is acceptable is the reader's rule.
    """
    if not text.strip() or text.lstrip().startswith("#"):
        return None
    try:
        row = next(csv.reader([text.rstrip("\r")], strict=True))
    except csv.Error:
        raise TokenFormatError(line, "is not valid CSV") from None  # csv's message may quote the line
    if len(row) not in (3, 4):
        raise TokenFormatError(line, f"has {len(row)} columns, expected token,user,uid[,groups]")
    groups = tuple(g.strip() for g in row[3].split(",") if g.strip()) if len(row) == 4 else ()
    return TokenEntry(token=row[0].strip(), user=row[1].strip(), uid=row[2].strip(), groups=groups)


def entries(text: str) -> Iterator[tuple[int, TokenEntry]]:
    """Every entry of a file's text with its line number (from 1), lazily, in file order."""
    for number, line in enumerate(text.split("\n"), start=1):
        entry = parse_line(line, line=number)
        if entry is not None:
            yield number, entry


def format_line(entry: TokenEntry) -> str:
    """The line (with its newline) that `parse_line` reads back as `entry`.

    Raises ValueError, without the token, for a field that would not read back unchanged.
    """
    for name, value in (("token", entry.token), ("user", entry.user), ("uid", entry.uid)):
        if value != value.strip() or "\n" in value or "\r" in value:
            raise ValueError(f"the {name} has surrounding whitespace or a line break")
    for group in entry.groups:
        if not group or group != group.strip() or any(c in group for c in ',"\n\r'):
            raise ValueError("a group is empty or has whitespace around it, a comma, a quote or a line break")
    if not entry.token or entry.token.lstrip().startswith("#"):
        raise ValueError("the token is empty or starts with '#'")
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([entry.token, entry.user, entry.uid])
    return f'{out.getvalue()},"{",".join(entry.groups)}"\n'
