"""The `tts` prefill builder: text -> talker prefill rows and the per-frame text track.

Laid out exactly as qwen-tts 0.1.1 `Qwen3TTSForConditionalGeneration.generate` does
(modeling_qwen3_tts.py), with P(x) = text_projection(text_embedding(x)) and E(c) the talker's
codec embedding:

    [P(instruct ids)]                                        when an instruct is given
    P(<|im_start|>), P(assistant), P(\\n)
    codec rows = [nothink, think_bos, think_eos]             no language ("auto")
               | [think, think_bos, LANG, think_eos]         with a language
               + [E(speaker)]                                when a voice is given
               + [codec_pad, codec_bos]
    rows       = (tts_pad x (len(codec rows)-2), tts_bos) + codec rows[:-1]
    then, all text in the prefill (default):
        P(t) + E(codec_pad) for every text token, tts_eos + E(codec_pad), tts_pad + E(codec_bos);
        text track: tts_pad at every frame
    or, streaming text (dual track):
        P(t0) + E(codec_bos); text track: P(t1 .. t_last), tts_eos, then tts_pad

Dialect voices force their dialect's language id when the language is chinese or auto.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from edged.artifact import Artifact
from edged.request import SpeechRequest

ROLE_ROWS = 3  # <|im_start|>, assistant, \n
TAIL_TOKENS = 5  # <|im_end|>, \n, <|im_start|>, assistant, \n: tokenized, never fed


class PromptError(ValueError):
    """A request whose prompt cannot be built; the message names the field."""


@dataclass(frozen=True)
class Prompt:
    """A request's token ids and codec rows, decided at admission."""

    instruct_ids: list[int]
    role_ids: list[int]
    text_ids: list[int]
    codec_ids: list[int]
    streaming_text: bool

    @property
    def prefill_len(self) -> int:
        n = len(self.instruct_ids) + len(self.role_ids) + len(self.codec_ids) - 1
        return n + (1 if self.streaming_text else len(self.text_ids) + 2)

    @property
    def track_len(self) -> int:
        return len(self.text_ids) if self.streaming_text else 0  # t1..t_last + tts_eos


class TextEncoder:
    """The tokenizer and the projected text table (text_projection(text_embedding(x)), precomputed at export)."""

    def __init__(self, artifact: Artifact, tables: dict[str, np.ndarray]):
        self.tokenizer = Tokenizer.from_file(str(artifact.files["tokenizer"]))
        self.table = tables["text_projected"]  # [text_vocab, H]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def project(self, ids: list[int], out: np.ndarray) -> None:
        """out [len(ids), H] = P(ids)."""
        np.take(self.table, ids, axis=0, out=out)


class PrefillBuilder:
    def __init__(self, artifact: Artifact, tables: dict[str, np.ndarray]):
        self.artifact = artifact
        self.text = TextEncoder(artifact, tables)
        self.codec = tables["codec_embedding"]
        self.tts_bos, self.tts_eos, self.tts_pad = tables["tts_bos"], tables["tts_eos"], tables["tts_pad"]
        self.sp = artifact.special

    def plan(self, req: SpeechRequest) -> Prompt:
        """Tokenize and choose the codec rows; every reason to refuse the request is raised here."""
        if not req.text or not req.text.strip():
            raise PromptError("text is empty")
        if req.instruct and not self.artifact.supports_instruct:
            raise PromptError("this model does not support instruct (the reference ignores it for 0.6B CustomVoice)")
        voice = None
        if req.voice:
            voice = self.artifact.speakers.get(req.voice.lower())
            if voice is None:
                raise PromptError(f"unknown voice {req.voice!r} (known: {', '.join(sorted(self.artifact.speakers)) or 'none'})")
        language = (req.language or "auto").lower()
        if language != "auto" and language not in self.artifact.languages:
            known = ", ".join(["auto", *sorted(k for k in self.artifact.languages if "dialect" not in k)])
            raise PromptError(f"unknown language {req.language!r} (known: {known})")
        lang_id = None if language == "auto" else self.artifact.languages[language]
        if voice is not None and voice.dialect and language in ("chinese", "auto"):
            lang_id = self.artifact.languages[voice.dialect]

        sp = self.sp
        if lang_id is None:
            codec = [sp["codec_nothink"], sp["codec_think_bos"], sp["codec_think_eos"]]
        else:
            codec = [sp["codec_think"], sp["codec_think_bos"], lang_id, sp["codec_think_eos"]]
        if voice is not None:
            codec.append(voice.id)
        codec += [sp["codec_pad"], sp["codec_bos"]]

        ids = self.text.ids(f"<|im_start|>assistant\n{req.text}<|im_end|>\n<|im_start|>assistant\n")
        text_ids = ids[ROLE_ROWS:-TAIL_TOKENS]
        if not text_ids:
            raise PromptError("text is empty after tokenization")
        instruct_ids = self.text.ids(f"<|im_start|>user\n{req.instruct}<|im_end|>\n") if req.instruct else []
        prompt = Prompt(instruct_ids, ids[:ROLE_ROWS], text_ids, codec, req.streaming_text)
        if prompt.prefill_len >= self.artifact.max_seq:
            raise PromptError(
                f"text too long: the prefill needs {prompt.prefill_len} of {self.artifact.max_seq} KV slots "
                f"and leaves no room for audio")
        return prompt

    def write(self, prompt: Prompt, rows: np.ndarray, track: np.ndarray) -> None:
        """Fill rows[:prefill_len] and track[:track_len] (preallocated [max_seq, H] buffers)."""
        n = 0
        for ids in (prompt.instruct_ids, prompt.role_ids):
            if ids:
                self.text.project(ids, rows[n:n + len(ids)])
                n += len(ids)
        codec = self.codec[prompt.codec_ids]  # [C, H]
        c = len(prompt.codec_ids)
        rows[n:n + c - 2] = self.tts_pad
        rows[n + c - 2] = self.tts_bos
        rows[n:n + c - 1] += codec[:-1]
        n += c - 1
        text = prompt.text_ids
        if prompt.streaming_text:
            self.text.project(text[:1], rows[n:n + 1])
            rows[n] += codec[-1]
            n += 1
            if len(text) > 1:
                self.text.project(text[1:], track[:len(text) - 1])
            track[len(text) - 1] = self.tts_eos
        else:
            self.text.project(text, rows[n:n + len(text)])
            rows[n + len(text)] = self.tts_eos
            rows[n:n + len(text) + 1] += self.codec[self.sp["codec_pad"]]
            rows[n + len(text) + 1] = self.tts_pad + self.codec[self.sp["codec_bos"]]
            n += len(text) + 2
        assert n == prompt.prefill_len, (n, prompt.prefill_len)
