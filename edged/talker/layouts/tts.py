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

Dialect voices force their dialect's language id when the language is chinese or auto. Streamed
text (`more_text`) uses the dual-track layout; its ids come from a `TextStream` over the same
template, so they are the ids of the whole text, and the track grows as they are committed
(tts_eos once the text is final).
"""

from __future__ import annotations

from edged.artifact.manifest import Manifest
from edged.request import SpeechRequest
from edged.talker.prompt import Block, Lookup, Prompt, PromptError
from edged.talker.text import Streamed, TextEncoder, TextStream

TEXT, CODEC = "text_projected", "codec_embedding"
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
        self._codec_ids(req)

    def plan(self, req: SpeechRequest, streamed: Streamed | None = None) -> Prompt:
        """Tokenize (or take a stream's committed ids) and choose the codec rows; every reason to
        refuse the request is raised here."""
        sp = self.sp
        codec = self._codec_ids(req)
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
        prefill.append(Block((Lookup(TEXT, pads), Lookup(CODEC, codec[:-1]))))
        if req.dual_track or req.more_text:
            prefill.append(Block((Lookup(TEXT, text[:1]), Lookup(CODEC, (sp["codec_bos"],)))))
            rest = text[1:] + ((sp["tts_eos"],) if final else ())
            return Prompt(tuple(prefill), (_text(rest),) if rest else (), text_tokens=len(text))
        prefill += [Block((Lookup(TEXT, text + (sp["tts_eos"],)), Lookup(CODEC, (sp["codec_pad"],) * (len(text) + 1)))),
                    Block((Lookup(TEXT, (sp["tts_pad"],)), Lookup(CODEC, (sp["codec_bos"],))))]
        return Prompt(tuple(prefill), text_tokens=len(text))

    def _codec_ids(self, req: SpeechRequest) -> tuple[int, ...]:
        m, sp = self.manifest, self.sp
        if req.context and not self.takes_context:
            raise PromptError("context: this model (layout tts) takes no conversation context")
        if req.media is not None and not self.takes_context:
            raise PromptError("media: this model (layout tts) takes no media hidden states")
        if req.instruct and not m.supports_instruct:
            raise PromptError("this model does not support instruct (the reference ignores it for 0.6B CustomVoice)")
        voice = None
        if req.voice:
            voice = m.speakers.get(req.voice.lower())
            if voice is None:
                raise PromptError(f"unknown voice {req.voice!r} (known: {', '.join(sorted(m.speakers)) or 'none'})")
        language = (req.language or "auto").lower()
        if language != "auto" and language not in m.languages:
            known = ", ".join(["auto", *sorted(k for k in m.languages if "dialect" not in k)])
            raise PromptError(f"unknown language {req.language!r} (known: {known})")
        lang_id = None if language == "auto" else m.languages[language]
        if voice is not None and voice.dialect and language in ("chinese", "auto"):
            lang_id = m.languages[voice.dialect]
        if lang_id is None:
            codec = [sp["codec_nothink"], sp["codec_think_bos"], sp["codec_think_eos"]]
        else:
            codec = [sp["codec_think"], sp["codec_think_bos"], lang_id, sp["codec_think_eos"]]
        if voice is not None:
            codec.append(voice.id)
        return (*codec, sp["codec_pad"], sp["codec_bos"])


def _text(ids) -> Block:
    return Block((Lookup(TEXT, tuple(ids)),))
