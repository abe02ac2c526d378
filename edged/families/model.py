"""`status.model`: what a request may choose on an artifact, and how long a reply can be.

Read from the manifest and the family (voices, languages, dialects, what `instruct` means, whether
voices can be cloned) and from the talker's prompt layout (its fewest prefill rows): a reply ends
with `length` when its frames fill the KV cache, after `frame_room(max_seq, prefill rows)` frames,
so the longest reply is the room the shortest prefill leaves. Longer prefills leave less: the text
in it (the whole-text layout), a speaker or language row, an instruct, a cloned voice's reference.
"""

from __future__ import annotations

from typing import Any

from edged.artifact.manifest import Manifest
from edged.clone.roles import can_clone
from edged.families import get_family
from edged.talker.prompt import frame_room


def longest_reply_ms(m: Manifest, prefill_rows: int) -> float:
    """The audio of a reply that fills the KV room `prefill_rows` leave, in ms (rounded as the done
    report's `audio_ms`)."""
    return round(m.stream_samples(frame_room(m.max_seq, prefill_rows)) / m.sample_rate * 1e3, 1)


def dialects(m: Manifest) -> list[str]:
    """The language keys that are dialects: a speaker's dialect, or named so (qwen-tts tells them
    apart by "dialect" in the key)."""
    return sorted({k for k in m.languages if "dialect" in k} | {s.dialect for s in m.speakers.values() if s.dialect})


def describe(m: Manifest, fewest_rows: int) -> dict[str, Any]:
    """`status.model` (docs/protocol.md); `fewest_rows`: the layout's shortest prefill."""
    return {
        "type": m.model_type, "sample_rate": m.sample_rate,
        "speakers": sorted(m.speakers),
        "speaker_dialects": {name: s.dialect for name, s in sorted(m.speakers.items()) if s.dialect},
        "languages": sorted(m.languages), "dialects": dialects(m),
        "instruct": m.supports_instruct, "instruct_means": get_family(m.family).instruct_means(m),
        "clone": can_clone(m.graphs),
        "max_seq": m.max_seq, "fixed_rows": fewest_rows, "max_reply_ms": longest_reply_ms(m, fewest_rows),
    }
