"""What this machine charges for memory (bench/_benchlib.page_costs_us): prints JSON with the µs
a page of a first write to fresh anonymous memory, and of the copy a forked child makes when it
first writes a page it shares with its parent. Standard library only, run by itself.

    python bench/_page_probe.py PAGES
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time


def touch(area: mmap.mmap, value: int) -> float:
    """Seconds to write one byte of every page of `area`."""
    t0 = time.perf_counter()
    for offset in range(0, len(area), mmap.PAGESIZE):
        area[offset] = value
    return time.perf_counter() - t0


def main() -> None:
    pages = int(sys.argv[1])
    area = mmap.mmap(-1, pages * mmap.PAGESIZE)
    fresh_s = touch(area, 1)
    loop_s = touch(area, 2)  # the loop alone: every page already this process's own
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: time its copies, report them, leave without cleaning up
        os.write(write, repr(touch(area, 3)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        cow_s = float(answer.read())
    os.waitpid(pid, 0)
    print(
        json.dumps(
            {
                "fresh_page_us": round((fresh_s - loop_s) * 1e6 / pages, 2),
                "copy_on_write_us": round((cow_s - loop_s) * 1e6 / pages, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
