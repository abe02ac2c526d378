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
    if job.text is not None:
        out |= job.text.report()
    if job.text is not None or (m is not None and m.prompt.dual_track):
        out["text_truncated"] = _text_truncated(job, entry.status.reason)
    if job.submit.play:
        out["played_ms"] = job.played * 1000 // rate if job.played is not None else 0
        if job.reply is None:
            out["playback"] = "no output device"
    if job.submit.report_codes:
        out["rvq_codes"] = core.frames(m).tolist() if m else []
    return out


def _text_truncated(job: Job, reason: str) -> bool:
    """Text the reply never spoke: left out for lack of KV room, come after generation had ended, or
    still coming when it ended with length."""
    if job.member is not None and job.member.text_truncated:
        return True
    text = job.text
    return text is not None and (text.late or (reason == "length" and not text.final))
