"""The daemon's `status`: the cohort, the queue, counters, memory, the audio devices and the history."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edged.collector import collector_status
from edged.cpu import this_cpu
from edged.families.model import describe

if TYPE_CHECKING:
    from edged.scheduler.loop import CohortLoop


@dataclass
class Counters:
    accepted: int = 0
    rejected: int = 0
    done: dict[str, int] = field(default_factory=lambda: {r: 0 for r in ("eos", "length", "cancelled", "interrupted", "error")})
    frames: int = 0
    steps: int = 0


@dataclass
class Surroundings:
    """The parts of `status` that are not the loop's own (the daemon fills them in)."""

    output: Callable[[], dict] = lambda: {"state": "off"}
    """The speaker's status while there is no speaker (off, or no PortAudio)."""
    input: Callable[[], dict] = lambda: {"state": "off"}
    """The microphone's status."""
    history: Callable[[], dict] = dict
    voices: Callable[[], dict] = lambda: {"state": "off"}
    """The enrolled voices' status (voice cloning)."""
    claimed: dict[str, int] = field(default_factory=dict)
    """Bytes claimed at boot, per part."""
    events: str | None = None
    """The event socket's endpoint (None: events.listen = "none")."""


def status(loop: CohortLoop) -> dict[str, Any]:
    s, a, c = loop.scheduler, loop.core.artifact, loop.counters
    running = s.members
    return {
        "state": "draining" if loop.draining else "serving",
        "uptime_s": round(time.monotonic() - loop.started, 3),
        "artifact": str(a.path), "family": a.family,
        "model": describe(a, loop.core.talker.fewest_rows),
        "cpu": this_cpu().to_json(),
        "vocoder": loop.core.vocoder.form.to_json(),
        "backend": {"name": loop.core.talker.backend.name, "cuda_graphs": loop.core.talker.backend.graph_report()},
        "cohort": {"running": len(running), "max_batch": a.max_batch,
                   "members": [str(e.payload.id) for e in running],
                   "waiting_for_text": [str(e.payload.id) for e in running
                                        if e.payload.text is not None and e.payload.text.waiting_since is not None]},
        "queue": {"waiting": len(s.waiting), "limit": s.queue_limit},
        "counters": {"accepted": c.accepted, "rejected": c.rejected, "done": dict(c.done), "frames": c.frames,
                     "steps": c.steps},
        "memory": dict(loop.around.claimed),
        "audio": {"output": loop.speaker.status() if loop.speaker is not None else loop.around.output(),
                  "input": loop.around.input()},
        "playing": len(s.playing),
        "history": loop.around.history(),
        "voices": loop.around.voices(),
        "events": loop.around.events,
        "collector": collector_status(),
    }
