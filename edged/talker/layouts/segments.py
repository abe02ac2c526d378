"""The `segments` layout (Qwen3-Omni): the conversation's user turns, then the `tts` dual-track reply.

Laid out as transformers' `Qwen3OmniMoeForConditionalGeneration.generate` builds the talker's input
(`_get_talker_user_parts`, `_get_talker_assistant_parts`), with P(x) = text_projection(thinker
embed_tokens(x)) (the `text_projected` table) and E(c) the talker's codec embedding:

    P(<|im_start|>user\\n{content}<|im_end|>\\n)    for every user turn of the context, in order
                                                 (system turns and earlier assistant turns are dropped)
    P(<|im_start|>), P(assistant), P(\\n)
    tts_pad + E(nothink), tts_pad + E(think_bos), tts_pad + E(think_eos), tts_pad + E(speaker),
    tts_bos + E(codec_pad)
    P(t0) + E(codec_bos); text track: P(t1 .. t_last), tts_eos, then tts_pad

The reply part is the `tts` layout's dual-track prompt with no language and a speaker (the reference
requires one: "ethan" when the request names none and the artifact has it, else its first speaker),
so streamed text works the same way.

A user turn's media placeholders (the thinker's audio, image and video pad tokens, one per row, as
the thinker's processor expanded them) are not text rows: their rows are H(hidden), the artifact's
`hidden_projection` of the thinker's hidden states at those positions, which come with the request
(`media`, [rows, thinker width], one row per placeholder of all user turns, in order). No codec row
is added to user rows.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

import numpy as np

from edged.artifact.manifest import Manifest
from edged.request import SpeechRequest
from edged.talker.layouts.tts import TEXT, TtsLayout
from edged.talker.projection import Projection
from edged.talker.prompt import Block, Lookup, Projected, Prompt, PromptError
from edged.talker.text import Streamed, TextEncoder

ROLES = ("system", "user", "assistant")
DEFAULT_SPEAKER = "ethan"  # the reference's default
MEDIA_TOKENS = ("audio_token", "image_token", "video_token")
"""The manifest's special ids of the thinker's media placeholders."""


class SegmentsLayout(TtsLayout):
    takes_context = True

    def __init__(self, manifest: Manifest, text: TextEncoder, media: Projection):
        super().__init__(manifest, text)
        self.media = media
        self.media_ids = frozenset(manifest.special[k] for k in MEDIA_TOKENS)

    def check(self, req: SpeechRequest) -> None:
        super().check(self._reply(req))
        self._user_turns(req)

    def plan(self, req: SpeechRequest, streamed: Streamed | None = None) -> Prompt:
        users = self._user_turns(req)  # the reply's own checks are the tts layout's plan
        reply = super().plan(self._reply(req), streamed)
        return Prompt(users + reply.prefill, reply.track, reply.text_tokens, reply.dual_track)

    def _user_turns(self, req: SpeechRequest) -> tuple[Block, ...]:
        """The user turns' rows: runs of text rows, and runs of media rows projected from the request's
        hidden states; raises PromptError when the media do not fit the placeholders."""
        for i, turn in enumerate(req.context):
            if len(turn) != 2 or turn[0] not in ROLES or not isinstance(turn[1], str):
                raise PromptError(f"context[{i}] must be a (role, content) turn with role in {', '.join(ROLES)}")
        turns = [self.text.ids(f"<|im_start|>user\n{content}<|im_end|>\n") for role, content in req.context
                 if role == "user"]
        wanted = sum(1 for ids in turns for i in ids if i in self.media_ids)
        hidden = self._media(req, wanted)
        blocks, used = [], 0
        for ids in turns:
            for is_media, group in groupby(ids, key=lambda i: i in self.media_ids):
                run = tuple(group)
                if is_media:
                    blocks.append(Block((Projected(hidden[used:used + len(run)], self.media),)))
                    used += len(run)
                else:
                    blocks.append(Block((Lookup(TEXT, run),)))
        return tuple(blocks)

    def _media(self, req: SpeechRequest, placeholders: int) -> np.ndarray:
        media, width = req.media, self.media.width
        if media is None:
            if placeholders:
                raise PromptError(f"media: the context's user turns have {placeholders} media placeholders, "
                                  f"and the request has no media hidden states for them")
            return np.zeros((0, width), np.float32)
        if media.ndim != 2 or media.shape[1] != width:
            raise PromptError(f"media: hidden states of shape {list(media.shape)}; this model's thinker rows "
                              f"have width {width}")
        if media.shape[0] != placeholders:
            raise PromptError(f"media: {media.shape[0]} rows of hidden states for {placeholders} media "
                              f"placeholders in the context's user turns")
        if not np.isfinite(media).all():
            raise PromptError("media: the hidden states hold NaN or infinite values")
        return media

    def _reply(self, req: SpeechRequest) -> SpeechRequest:
        """The reply as the `tts` layout builds it: dual track, a speaker always."""
        speakers = self.manifest.speakers
        if not speakers:
            raise PromptError("this artifact has no speakers; the segments layout needs one")
        voice = req.voice or (DEFAULT_SPEAKER if DEFAULT_SPEAKER in speakers else next(iter(speakers)))
        return replace(req, voice=voice, dual_track=True)
