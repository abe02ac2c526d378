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
so streamed text works the same way. Media placeholders of user turns (thinker hidden states) are
not taken yet.
"""

from __future__ import annotations

from dataclasses import replace

from edged.request import SpeechRequest
from edged.talker.layouts.tts import TtsLayout, _text
from edged.talker.prompt import Prompt, PromptError
from edged.talker.text import Streamed

ROLES = ("system", "user", "assistant")
DEFAULT_SPEAKER = "ethan"  # the reference's default


class SegmentsLayout(TtsLayout):
    takes_context = True

    def check(self, req: SpeechRequest) -> None:
        for i, turn in enumerate(req.context):
            if len(turn) != 2 or turn[0] not in ROLES or not isinstance(turn[1], str):
                raise PromptError(f"context[{i}] must be a (role, content) turn with role in {', '.join(ROLES)}")
        super().check(self._reply(req))

    def plan(self, req: SpeechRequest, streamed: Streamed | None = None) -> Prompt:
        self.check(req)
        reply = super().plan(self._reply(req), streamed)
        users = tuple(_text(self.text.ids(f"<|im_start|>user\n{content}<|im_end|>\n"))
                      for role, content in req.context if role == "user")
        return Prompt(users + reply.prefill, reply.track, reply.text_tokens)

    def _reply(self, req: SpeechRequest) -> SpeechRequest:
        """The reply as the `tts` layout builds it: dual track, a speaker always."""
        speakers = self.manifest.speakers
        if not speakers:
            raise PromptError("this artifact has no speakers; the segments layout needs one")
        voice = req.voice or (DEFAULT_SPEAKER if DEFAULT_SPEAKER in speakers else next(iter(speakers)))
        return replace(req, voice=voice, dual_track=True)
