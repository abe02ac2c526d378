"""The `done` report of a request: what it made, how fast, why it stopped, what was heard."""

from __future__ import annotations

import time
from typing import Any

from edged.core import Core
from edged.scheduler.outputs import Job
from edged.scheduler.scheduler import Entry


def report(entry: Entry, core: Core) -> dict[str, Any]:
    job: Job = entry.payload
    now = time.monotonic()
    m = job.member
    rate = core.artifact.sample_rate
    audio_s = job.samples_sent / rate
    out: dict[str, Any] = {
        "reason": entry.status.reason,
        "frames": m.frames if m else 0,
        "audio_ms": round(audio_s * 1e3, 1),
        "queued_ms": round(((job.started_at or now) - job.accepted_at) * 1e3, 3),
        "first_audio_ms": round((job.first_audio_at - job.accepted_at) * 1e3, 3) if job.first_audio_at else None,
        "rtf": round(((job.generated_at or now) - job.started_at) / audio_s, 4) if audio_s and job.started_at else None,
        "stages": core.diagnostics(m) if m else [],
    }
    if job.cancelled_at_frame is not None:
        out["cancelled_at_frame"] = job.cancelled_at_frame
    if job.submit.play:
        out["played_ms"] = job.played * 1000 // rate if job.played is not None else 0
        if job.reply is None:
            out["playback"] = "no output device"
    if job.submit.report_codes:
        out["rvq_codes"] = core.frames(m).tolist() if m else []
    return out
