"""The talker stage: prefill per request, then one codec frame per member per step.

Per step, for the whole cohort at once: the code predictor turns each member's pending code 0
(and the talker hidden that produced it) into groups 1..G-1, the frame is published on the codec
port, and the talker decodes one step from the frame's codec-embedding sum plus the next
text-track row, sampling the next code 0. Sampling runs inside the graphs; only codes cross to the
host. Every buffer is claimed in `preallocate()`; the step path runs bound plans and copies rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

import numpy as np

from edged.artifact import Artifact
from edged.backends import Backend, Plan
from edged.request import SpeechRequest
from edged.talker.port import CodecPort
from edged.talker.prefill import PrefillBuilder, Prompt, PromptError
from edged.talker.sampling import SamplingError

EOS_BLOCKED_DECISIONS = 2  # the reference masks eos for the first two code-0 decisions


class Outcome(Enum):
    RUNNING = "running"
    EOS = "eos"
    LENGTH = "length"


@dataclass
class Member:
    """One request's state inside the talker stage; `slot` indexes every batch buffer."""

    request: SpeechRequest
    prompt: Prompt
    slot: int
    max_frames: int
    rng: np.random.Generator
    position: int = 0  # next KV slot to write
    frames: int = 0
    decisions: int = 0  # code-0 tokens sampled so far
    outcome: Outcome = Outcome.RUNNING
    prefill_ms: float = 0.0
    step_ms: float = 0.0
    first_frame_at: float | None = None
    reason: str | None = None  # set by finish(): eos | length | cancelled | interrupted | error


class TalkerStage:
    def __init__(self, artifact: Artifact, backend: Backend, tables: dict[str, np.ndarray], port: CodecPort):
        self.artifact = artifact
        self.backend = backend
        self.port = port
        self.builder = PrefillBuilder(artifact, tables)
        self.tts_pad = tables["tts_pad"]
        self.eos = artifact.special["codec_eos"]
        files = artifact.files
        self.prefill_engine = backend.load(files["talker_prefill"])
        self.decode_engine = backend.load(files["talker_decode"])
        self.cp_engine = backend.load(files["code_predictor"])
        self.claimed: dict[str, int] = {}

    # ---------------------------------------------------------------------------------- boot

    def preallocate(self) -> dict[str, int]:
        """Claim every buffer (sized max_batch x max_seq) and bind every plan; returns bytes per part."""
        a, d = self.artifact, self.artifact.dims
        b, s, h, g = a.max_batch, a.max_seq, d.hidden, d.code_groups
        e = self.backend.empty
        self.keys = [e((b, d.kv_heads, d.head_dim, s), np.float32) for _ in range(d.layers)]  # [B, Hkv, D, S]
        self.values = [e((b, d.kv_heads, s, d.head_dim), np.float32) for _ in range(d.layers)]  # [B, Hkv, S, D]
        self.new_keys = [e((b, d.kv_heads, d.head_dim, 1), np.float32) for _ in range(d.layers)]
        self.new_values = [e((b, d.kv_heads, 1, d.head_dim), np.float32) for _ in range(d.layers)]
        self.prefill_keys = [e((d.kv_heads * d.head_dim * s,), np.float32) for _ in range(d.layers)]
        self.prefill_values = [e((d.kv_heads * d.head_dim * s,), np.float32) for _ in range(d.layers)]
        self.prefill_rows = e((s, h), np.float32)
        self.track = e((b, s, h), np.float32)
        self.inputs_embeds = e((b, h), np.float32)
        self.positions = e((b,), np.int64)
        self.seen = e((b, d.vocab), np.float32)
        self.repetition_penalty = e((b,), np.float32)
        self.allow_eos = e((b,), np.bool_)
        self.temperature, self.top_k, self.top_p = e((b,), np.float32), e((b,), np.int64), e((b,), np.float32)
        self.noise = e((b, d.vocab), np.float32)
        self.hidden = e((b, h), np.float32)
        self.code0 = e((b,), np.int64)
        self.cp_temperature, self.cp_top_k, self.cp_top_p = e((b,), np.float32), e((b,), np.int64), e((b,), np.float32)
        self.cp_noise = e((b, g - 1, d.codebook_size), np.float32)
        self.codes = e((b, g - 1), np.int64)
        self.codec_sum = e((b, h), np.float32)
        self.held_hidden, self.held_code0 = np.zeros((b, h), np.float32), np.zeros(b, np.int64)
        self.stepping = np.zeros(b, dtype=bool)
        self.decode_plans = [self._decode_plan(n) for n in range(1, b + 1)]
        self.cp_plans = [self._cp_plan(n) for n in range(1, b + 1)]
        kv = sum(x.nbytes for x in (*self.keys, *self.values))
        scratch = sum(x.nbytes for x in (*self.new_keys, *self.new_values, *self.prefill_keys, *self.prefill_values))
        io = sum(x.nbytes for x in (self.inputs_embeds, self.positions, self.seen, self.repetition_penalty,
                                    self.allow_eos, self.temperature, self.top_k, self.top_p, self.noise,
                                    self.hidden, self.code0, self.cp_temperature, self.cp_top_k, self.cp_top_p,
                                    self.cp_noise, self.codes, self.codec_sum))
        text = self.prefill_rows.nbytes + self.track.nbytes
        self.claimed = {"kv_cache": kv, "kv_scratch": scratch, "prefill_and_text_track": text, "step_io": io,
                        "codec_port": self.port.nbytes}
        return self.claimed

    def _code0_bindings(self, rows: slice) -> dict[str, np.ndarray]:
        """The code-0 sampling inputs and the hidden/code0 outputs, shared by prefill and decode."""
        return {"seen": self.seen[rows], "repetition_penalty": self.repetition_penalty[rows],
                "allow_eos": self.allow_eos[rows], "temperature": self.temperature[rows],
                "top_k": self.top_k[rows], "top_p": self.top_p[rows], "noise": self.noise[rows],
                "hidden": self.hidden[rows], "code0": self.code0[rows]}

    def _decode_plan(self, n: int) -> Plan:
        rows = slice(0, n)
        binds = {"inputs_embeds": self.inputs_embeds[rows], "positions": self.positions[rows],
                 **self._code0_bindings(rows)}
        for i in range(self.artifact.dims.layers):
            binds |= {f"past_keys_{i}": self.keys[i][rows], f"past_values_{i}": self.values[i][rows],
                      f"new_keys_{i}": self.new_keys[i][rows], f"new_values_{i}": self.new_values[i][rows]}
        return self.decode_engine.plan(binds)

    def _cp_plan(self, n: int) -> Plan:
        rows = slice(0, n)
        return self.cp_engine.plan({
            "hidden": self.hidden[rows], "code0": self.code0[rows], "temperature": self.cp_temperature[rows],
            "top_k": self.cp_top_k[rows], "top_p": self.cp_top_p[rows], "noise": self.cp_noise[rows],
            "codes": self.codes[rows], "codec_sum": self.codec_sum[rows]})

    # ---------------------------------------------------------------------------------- requests

    def admit(self, request: SpeechRequest) -> tuple[bool, str]:
        """Refuse for free: unknown voice/language, bad sampling, empty or too long text."""
        try:
            self.builder.plan(request)
            request.sampling.validated()
        except (PromptError, SamplingError) as exc:
            return False, str(exc)
        if request.max_frames is not None and request.max_frames < 1:
            return False, f"max_frames must be >= 1, got {request.max_frames}"
        return True, ""

    def prepare(self, request: SpeechRequest, slot: int) -> Member:
        """Prefill one request into `slot`; afterwards its first code 0 is pending."""
        t0 = time.perf_counter()
        prompt = self.builder.plan(request)
        sampling = request.sampling.validated()
        room = self.artifact.max_seq - prompt.prefill_len + 1
        max_frames = min(request.max_frames or room, room)
        m = Member(request, prompt, slot, max_frames, np.random.default_rng(sampling.seed))
        self.builder.write(prompt, self.prefill_rows, self.track[slot])
        self.seen[slot] = 0.0
        self.repetition_penalty[slot] = sampling.repetition_penalty
        self.temperature[slot], self.top_k[slot], self.top_p[slot] = sampling.temperature, sampling.top_k, sampling.top_p
        self.cp_temperature[slot], self.cp_top_k[slot] = sampling.cp_temperature, sampling.cp_top_k
        self.cp_top_p[slot] = sampling.cp_top_p
        self.allow_eos[slot] = False
        self._fill_noise(m)
        self._prefill_plan(prompt.prefill_len, slot).run()
        self._load_prefill_kv(prompt.prefill_len, slot)
        m.position = prompt.prefill_len
        self._commit_code0(m)
        self.port.open(slot)
        m.prefill_ms = (time.perf_counter() - t0) * 1e3
        return m

    def _prefill_plan(self, t: int, slot: int) -> Plan:
        d = self.artifact.dims
        rows = slice(slot, slot + 1)
        binds = {"inputs_embeds": self.prefill_rows[:t].reshape(1, t, d.hidden), **self._code0_bindings(rows)}
        for i in range(d.layers):
            binds[f"new_keys_{i}"] = self.prefill_keys[i][: d.kv_heads * d.head_dim * t].reshape(1, d.kv_heads, d.head_dim, t)
            binds[f"new_values_{i}"] = self.prefill_values[i][: d.kv_heads * t * d.head_dim].reshape(1, d.kv_heads, t, d.head_dim)
        return self.prefill_engine.plan(binds)

    def _load_prefill_kv(self, t: int, slot: int) -> None:
        d = self.artifact.dims
        for i in range(d.layers):
            self.keys[i][slot, :, :, :t] = self.prefill_keys[i][: d.kv_heads * d.head_dim * t].reshape(d.kv_heads, d.head_dim, t)
            self.values[i][slot, :, :t] = self.prefill_values[i][: d.kv_heads * t * d.head_dim].reshape(d.kv_heads, t, d.head_dim)

    # ---------------------------------------------------------------------------------- the step

    def step_cohort(self, members: list[Member]) -> list[Outcome]:
        """Exactly one codec frame per member; returns each member's outcome after it."""
        t0 = time.perf_counter()
        n = max(m.slot for m in members) + 1
        self._hold(members, n)
        for m in members:
            self._fill_cp_noise(m)
        self.cp_plans[n - 1].run()  # groups 1..G-1 for every pending code 0
        talking = [m for m in members if self._publish(m)]
        for m in talking:
            self._feed(m)
        if talking:
            self.decode_plans[n - 1].run()  # next code 0 for members still talking
        self._restore(n)
        for m in talking:
            self._commit_kv(m)
            self._commit_code0(m)
        elapsed = (time.perf_counter() - t0) * 1e3
        for m in members:
            m.step_ms += elapsed
        return [m.outcome for m in members]

    def _hold(self, members: list[Member], n: int) -> None:
        """The batched plans run rows 0..n-1: keep the pending code 0 and hidden of every row that
        does not step (a paused member's code 0 is already `seen`; decoding it again could change it)."""
        self.stepping[:] = False
        for m in members:
            self.stepping[m.slot] = True
        for row in range(n):
            if not self.stepping[row]:
                self.held_hidden[row] = self.hidden[row]
                self.held_code0[row] = self.code0[row]

    def _restore(self, n: int) -> None:
        for row in range(n):
            if not self.stepping[row]:
                self.hidden[row] = self.held_hidden[row]
                self.code0[row] = self.held_code0[row]

    def _publish(self, m: Member) -> bool:
        """Frame -> codec port. False when the member reached its frame limit."""
        self.port.append(m.slot, int(self.code0[m.slot]), self.codes[m.slot])
        m.frames += 1
        if m.first_frame_at is None:
            m.first_frame_at = time.perf_counter()
        if m.frames >= m.max_frames:
            m.outcome = Outcome.LENGTH
            return False
        return True

    def _feed(self, m: Member) -> None:
        """Next talker input: the frame's codec sum + the text-track row of this step (or tts_pad)."""
        k = m.frames - 1
        text = self.track[m.slot, k] if k < m.prompt.track_len else self.tts_pad
        np.add(self.codec_sum[m.slot], text, out=self.inputs_embeds[m.slot])
        self.positions[m.slot] = m.position
        self.allow_eos[m.slot] = m.decisions >= EOS_BLOCKED_DECISIONS
        self._fill_noise(m)

    def _commit_kv(self, m: Member) -> None:
        for keys, values, new_k, new_v in zip(self.keys, self.values, self.new_keys, self.new_values):
            keys[m.slot, :, :, m.position] = new_k[m.slot, :, :, 0]
            values[m.slot, :, m.position] = new_v[m.slot, :, 0]
        m.position += 1

    def _commit_code0(self, m: Member) -> None:
        code0 = self.code0[m.slot]
        m.decisions += 1
        self.seen[m.slot, code0] = 1.0  # the repetition penalty sees every earlier code 0
        if code0 == self.eos:
            m.outcome = Outcome.EOS

    def _fill_noise(self, m: Member) -> None:
        if self.temperature[m.slot] > 0:
            m.rng.random(dtype=np.float32, out=self.noise[m.slot])

    def _fill_cp_noise(self, m: Member) -> None:
        if self.cp_temperature[m.slot] > 0:
            m.rng.random(dtype=np.float32, out=self.cp_noise[m.slot])

    # ---------------------------------------------------------------------------------- lifecycle

    def finish(self, m: Member, reason: str) -> None:
        """Every exit path: record why and close the member's port so the vocoder drains it."""
        m.reason = reason
        self.port.close(m.slot)

    def reset(self) -> None:
        """Forget every member; buffers stay claimed. Idempotent."""
        self.port.published[:] = 0
        self.port.closed[:] = True

    def diagnostics(self, m: Member) -> dict:
        return {
            "stage": "talker", "frames": m.frames, "stopped": m.reason or m.outcome.value,
            "prefill_rows": m.prompt.prefill_len, "text_tokens": len(m.prompt.text_ids),
            "max_frames": m.max_frames, "prefill_ms": round(m.prefill_ms, 3), "step_ms": round(m.step_ms, 3),
        }
