"""The patch markers of each recorded history: `python -m tests.replay.markers [NAME...]`.

What docs/workflow-changes.md's removal step reads: the histories that carry a patch's marker
are recorded again when that patch is removed.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

HISTORIES = Path(__file__).parent / "histories"


def patch_markers(path: Path) -> list[tuple[str, bool]]:
    """Each patch marker of the history at `path`, in order: (its patch id, whether deprecated)."""
    found = []
    for event in json.loads(path.read_text())["events"]:
        marker = event.get("markerRecordedEventAttributes", {})
        if marker.get("markerName") != "core_patch":
            continue
        data = json.loads(base64.b64decode(marker["details"]["patch-data"]["payloads"][0]["data"]))
        found.append((str(data["id"]), bool(data.get("deprecated"))))
    return found


def main(names: list[str]) -> None:
    paths = [HISTORIES / f"{n}.json" for n in names] if names else sorted(HISTORIES.glob("*.json"))
    for path in paths:
        markers = patch_markers(path)
        if markers:
            shown = ", ".join(f"{i} (deprecated)" if deprecated else i for i, deprecated in markers)
            print(f"{path.stem}: {shown}")


if __name__ == "__main__":
    main(sys.argv[1:])
