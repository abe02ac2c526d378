"""The `tts` layout (Qwen3-TTS): text -> talker prefill rows and the per-frame text track.

Laid out exactly as qwen-tts 0.1.1 `Qwen3TTSForConditionalGeneration.generate` does
(modeling_qwen3_tts.py), with P(x) = text_projection(text_embedding(x)) (the `text_projected`
table) and E(c) the talker's codec embedding (`codec_embedding`):

    [P(instruct ids)]                                        when an instruct is given
    P(<|im_start|>), P(assistant), P(\\n)
    codec rows = [nothink, think_bos, think_eos]             no language ("auto")
               | [think, think_bos, LANG, think_eos]         with a language
               + [E(speaker)]                                when a voice is given
               + [codec_pad, codec_bos]
    rows       = (tts_pad x (len(codec rows)-2), tts_bos) + codec rows[:-1]
    then, all text in the prefill (default):
        P(t) + E(codec_pad) for every text token, tts_eos + E(codec_pad), tts_pad + E(codec_bos);
        text track: empty (tts_pad at every frame)
    or, the dual-track layout:
        P(t0) + E(codec_bos); text track: P(t1 .. t_last), tts_eos, then tts_pad

A cloned voice (a Base checkpoint, `generate_voice_clone`) puts its x-vector in the speaker row;
with its reference's text and codec frames too (in-context, ICL), the new text follows the
reference's instead (R: the reference's text ids, C(f): E(code 0 of frame f) + the code predictor's
embeddings of its other codes, summed):

    all text in the prefill:
        P(r) + E(codec_pad) for r in R + text + tts_eos, then tts_pad + E(codec_bos),
        tts_pad + C(f) for every reference frame; text track: empty
    or, the dual track, W = R + text + tts_eos against the codec rows (codec_bos, C(f) ...):
        P(W[i]) + codec row i while both last (W padded with tts_pad when shorter);
        text track: the rest of W

The text layout defaults to the reference's default for the path: all text in the prefill for
built-in speakers (generate_custom_voice), the dual track for cloned voices (generate_voice_clone);
`dual_track` chooses either way.

Dialect voices force their dialect's language id when the language is chinese or auto. Streamed
text (`more_text`) uses the dual-track layout; its ids come from a `TextStream` over the same
template, so they are the ids of the whole text, and the track grows as they are committed
(tts_eos once the text is final).
"""

from __future__ import annotations

import numpy as np

from edged.artifact.manifest import Manifest
from edged.clone.roles import can_clone
from edged.request import ClonedVoice, SpeechRequest
from edged.talker.prompt import Block, Given, Lookup, Prompt, PromptError
from edged.talker.text import Streamed, TextEncoder, TextStream

TEXT, CODEC, CP_CODEC = "text_projected", "codec_embedding", "cp_codec_embedding"
ROLE_ROWS = 3  # <|im_start|>, assistant, \n
TAIL_TOKENS = 5  # <|im_end|>, \n, <|im_start|>, assistant, \n: tokenized, never fed
ASSISTANT = "<|im_start|>assistant\n"


class TtsLayout:
    takes_context = False

    def __init__(self, manifest: Manifest, text: TextEncoder):
        self.manifest = manifest
        self.text = text
        self.sp = manifest.special

    def text_stream(self) -> TextStream:
        """Incremental tokenization of streamed text, in this layout's template."""
        return TextStream(self.text, ASSISTANT, ROLE_ROWS)

    def check(self, req: SpeechRequest) -> None:
        """Every reason to refuse a request but its text (voice, language, instruct)."""
        self._codec_rows(req)

    def fewest_rows(self) -> int:
        """The prefill rows of the shortest prompt this layout builds, planned as a request's: a
        one-token text on the dual track (which holds any more text outside the prefill), with no
        instruct, language, context or voice beyond what the layout always adds. No reply's KV room
        is larger than the one these rows leave."""
        one = Streamed(tuple(self.text.ids(ASSISTANT)[:ROLE_ROWS]), (self.sp["tts_pad"],), final=True)
        return self.plan(SpeechRequest(id="fewest_rows", text="", more_text=True), one).prefill_len

    def plan(self, req: SpeechRequest, streamed: Streamed | None = None) -> Prompt:
        """Tokenize (or take a stream's committed ids) and choose the codec rows; every reason to
        refuse the request is raised here."""
        sp = self.sp
        codec = self._codec_rows(req)
        final = streamed is None or streamed.final
        if streamed is None:
            if not req.text or not req.text.strip():
                raise PromptError("text is empty")
            ids = self.text.ids(f"{ASSISTANT}{req.text}<|im_end|>\n{ASSISTANT}")
            role, text = ids[:ROLE_ROWS], tuple(ids[ROLE_ROWS:-TAIL_TOKENS])
        else:
            role, text = list(streamed.head), streamed.ids
        if not text:
            raise PromptError("text is empty after tokenization")
        prefill = []
        if req.instruct:
            prefill.append(_text(self.text.ids(f"<|im_start|>user\n{req.instruct}<|im_end|>\n")))
        prefill.append(_text(role))
        pads = (sp["tts_pad"],) * (len(codec) - 2) + (sp["tts_bos"],)
        prefill += _rows(pads, codec[:-1])
        dual = req.more_text or (req.dual_track if req.dual_track is not None else req.clone is not None)
        if req.clone is not None and req.clone.icl:
            return self._in_context(prefill, req.clone, text, dual)
        if dual:
            prefill.append(Block((Lookup(TEXT, text[:1]), Lookup(CODEC, (sp["codec_bos"],)))))
            rest = text[1:] + ((sp["tts_eos"],) if final else ())
            return Prompt(tuple(prefill), (_text(rest),) if rest else (), text_tokens=len(text), dual_track=True)
        prefill += [Block((Lookup(TEXT, text + (sp["tts_eos"],)), Lookup(CODEC, (sp["codec_pad"],) * (len(text) + 1)))),
                    Block((Lookup(TEXT, (sp["tts_pad"],)), Lookup(CODEC, (sp["codec_bos"],))))]
        return Prompt(tuple(prefill), text_tokens=len(text))

    def _in_context(self, prefill: list[Block], clone: ClonedVoice, text: tuple[int, ...], dual: bool) -> Prompt:
        """The reference's text and codec frames before the new text (`generate_icl_prompt`)."""
        sp = self.sp
        ref = tuple(self.text.ids(f"{ASSISTANT}{clone.ref_text}<|im_end|>\n")[ROLE_ROWS:-2])
        words = (*ref, *text, sp["tts_eos"])
        codes = clone.ref_codes
        assert codes is not None  # clone.icl
        bos = Lookup(CODEC, (sp["codec_bos"],))
        frames = (Lookup(CODEC, tuple(int(c) for c in codes[:, 0])),
                  *(Lookup(CP_CODEC, tuple(int(c) for c in codes[:, g]), index=g - 1) for g in range(1, codes.shape[1])))
        if not dual:
            prefill += [Block((Lookup(TEXT, words), Lookup(CODEC, (sp["codec_pad"],) * len(words)))),
                        Block((Lookup(TEXT, (sp["tts_pad"],)), bos)),
                        Block((Lookup(TEXT, (sp["tts_pad"],) * len(codes)), *frames))]
            return Prompt(tuple(prefill), text_tokens=len(text))
        rows = 1 + len(codes)
        padded = words + (sp["tts_pad"],) * max(0, rows - len(words))
        prefill += [Block((Lookup(TEXT, padded[:1]), bos)), Block((Lookup(TEXT, padded[1:rows]), *frames))]
        rest = padded[rows:]
        return Prompt(tuple(prefill), (_text(rest),) if rest else (), text_tokens=len(text), dual_track=True)

    def _codec_rows(self, req: SpeechRequest) -> tuple[int | np.ndarray, ...]:
        """The codec prefix: ids, and a cloned voice's x-vector in the speaker row."""
        m, sp = self.manifest, self.sp
        if req.context and not self.takes_context:
            raise PromptError("context: this model (layout tts) takes no conversation context")
        if req.media is not None and not self.takes_context:
            raise PromptError("media: this model (layout tts) takes no media hidden states")
        if req.instruct and not m.supports_instruct:
            raise PromptError("this model does not support instruct (the reference ignores it for 0.6B CustomVoice)")
        voice = None
        if req.clone is not None:
            self._check_clone(req)
        elif req.voice:
            voice = m.speakers.get(req.voice.lower())
            if voice is None:
                raise PromptError(self._unknown_voice(req.voice))
        language = (req.language or "auto").lower()
        if language != "auto" and language not in m.languages:
            known = ", ".join(["auto", *sorted(m.languages)])  # what status's model.languages lists
            raise PromptError(f"unknown language {req.language!r} (known: {known})")
        lang_id = None if language == "auto" else m.languages[language]
        if voice is not None and voice.dialect and language in ("chinese", "auto"):
            lang_id = m.languages[voice.dialect]
        codec: list[int | np.ndarray]
        if lang_id is None:
            codec = [sp["codec_nothink"], sp["codec_think_bos"], sp["codec_think_eos"]]
        else:
            codec = [sp["codec_think"], sp["codec_think_bos"], lang_id, sp["codec_think_eos"]]
        if req.clone is not None:
            codec.append(req.clone.xvector.reshape(1, -1))
        elif voice is not None:
            codec.append(voice.id)
        return (*codec, sp["codec_pad"], sp["codec_bos"])

    def _unknown_voice(self, name: str) -> str:
        """Why `name` is no voice here, and what this model takes instead where it has no speakers."""
        m = self.manifest
        if m.speakers:
            return f"unknown voice {name!r} (known: {', '.join(sorted(m.speakers))})"
        if can_clone(m.graphs):
            return (f"unknown voice {name!r}: this model has no built-in speakers; enroll a voice from a recording "
                    f"(voice_add) and speak with its name")
        if m.supports_instruct:
            return f"unknown voice {name!r}: this model has no built-in speakers; describe the voice in instruct"
        return f"unknown voice {name!r}: this model has no speakers"

    def _check_clone(self, req: SpeechRequest) -> None:
        m, clone = self.manifest, req.clone
        assert clone is not None
        if not can_clone(m.graphs):
            raise PromptError("this model cannot clone voices (its artifact has no clone encoder: export a Base "
                              "checkpoint)")
        if clone.xvector.shape != (m.dims.hidden,):
            raise PromptError(f"x-vector has shape {list(clone.xvector.shape)}, the talker takes [{m.dims.hidden}]")
        if clone.icl:
            assert clone.ref_codes is not None
            if clone.ref_codes.ndim != 2 or clone.ref_codes.shape[1] != m.dims.code_groups or not len(clone.ref_codes):
                raise PromptError(f"reference codes have shape {list(clone.ref_codes.shape)}, "
                                  f"the talker takes [frames > 0, {m.dims.code_groups}]")
            if req.more_text:
                raise PromptError("a voice cloned in context (with its reference text) needs the whole text: "
                                  "it cannot take streamed text (more_text)")


def _rows(text_ids: tuple[int, ...], codec: tuple[int | np.ndarray, ...]) -> list[Block]:
    """Rows text_ids[i] + codec[i], as blocks of consecutive ids and one block per given vector."""
    blocks: list[Block] = []
    start = 0
    for i, row in enumerate((*codec, None)):
        if row is None or isinstance(row, np.ndarray):
            if i > start:
                ids = tuple(int(c) for c in codec[start:i])  # type: ignore[arg-type]
                blocks.append(Block((Lookup(TEXT, text_ids[start:i]), Lookup(CODEC, ids))))
            if row is not None:
                blocks.append(Block((Lookup(TEXT, text_ids[i:i + 1]), Given(row))))
            start = i + 1
    return blocks


def _text(ids) -> Block:
    return Block((Lookup(TEXT, tuple(ids)),))
