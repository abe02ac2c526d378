"""What the Linux kernel says of this CPU (/proc/cpuinfo), for tests that compare with it."""

from __future__ import annotations

from pathlib import Path


def cpuinfo_flags() -> set[str]:
    """The first processor's `flags` (empty where there are none: ARM64 says `Features`)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()
