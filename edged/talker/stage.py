"""The talker stage: prefill per request, then one codec frame per member per step.

Per step, for the members that step: the code predictor turns each pending code 0 (and the talker
hidden that produced it) into groups 1..G-1 over its own small KV cache (`predict`: one pass per
group, or with a speculative verify window fewer: each pass checks drafts for the next groups that
the later groups' heads propose), the frame is published on the codec port, and the talker
decodes one step from the frame's codec-embedding sum plus the next text-track row, sampling the
next code 0. Sampling runs
inside the graphs; only codes cross to the host. Every buffer is claimed in `preallocate()`, each
with the dtype its graph declares; the step path runs bound plans. The KV caches, the new K/V rows
and the code predictor's stacked heads are the backend's device buffers (`Backend.device_empty`,
`device_from`): each plan that makes K/V rows carries an `Append` that writes them into the cache at
each member's position when it runs (on TensorRT one kernel launch inside the plan's CUDA graph),
never through the host. The family (`edged.families`) supplies the prompt layout and the special
ids; nothing here names a family.

One talker graph does both (it holds the weights once): a decode plan binds n members x 1 new row
over the cache, attending only its first L slots (plans are bound per span L = 64, 128, ...,
max_seq, and a step runs the shortest that holds its members' positions, so a long max_seq costs
nothing until it is used); a prefill plan binds 1 member x the prompt's rows at position 0 over a
one-slot cache that the graph's mask hides. Every bound view starts on a 256-byte boundary: batched plans
bind rows 0..n-1 from the start of each buffer, and the prefill (one request in any slot) binds
buffers of its own, whose results are copied into the slot's rows.

CUDA graphs (TensorRT) are captured at boot for the plans the configuration runs: every decode and
vocoder plan, and the code-predictor passes of its default verify window (`graph_window`); the
passes and drafts of other windows are bound too, and enqueued when a request asks for them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from edged.artifact import Artifact
from edged.backends import Append, Backend, Plan, Rows
from edged.core.port import CodecPort
from edged.families import Talking
from edged.request import MAX_VERIFY_WINDOW as MAX_WINDOW
from edged.request import SamplingError, SpeechRequest
from edged.talker.prompt import Prompt, PromptError, frame_room
from edged.talker.text import Streamed, TextStream


class Outcome(Enum):
    """What the stage saw end a member's generation (the request's end reason is the scheduler's)."""

    RUNNING = "running"
    EOS = "eos"
    LENGTH = "length"
    STOPPED = "stopped"  # ended from outside: cancelled, failed, cut


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
    track_len: int = 0
    """Text-track rows written (the prompt's, then a stream's as they are committed)."""
    text_final: bool = True
    """No more text will come: once the track is used up the pad row follows."""
    text_tokens: int = 0
    text_truncated: bool = False
    """Text was left out: the track holds only what the KV room lets the member read."""
    window: int = 0
    """The code predictor's speculative verify window (0: one pass per group)."""
    passes: int = 0
    """Code-predictor passes run for this member, the drafts they checked, and how many were accepted."""
    drafted: int = 0
    accepted: int = 0
    prefill_ms: float = 0.0
    step_ms: float = 0.0
    first_frame_at: float | None = None


PREFILL_PLANS = 64
"""Prefill plans kept, one per prompt length, the least recently used dropped first: a length seen
recently is admitted without binding anything."""

BUCKET_MIN = 64
"""The shortest attention span a decode plan is bound for; spans double from it up to max_seq."""


def buckets(max_seq: int) -> list[int]:
    """The attention spans decode plans are bound for: 64, 128, ... and max_seq itself."""
    spans, length = [], BUCKET_MIN
    while length < max_seq:
        spans.append(length)
        length *= 2
    return [*spans, max_seq]


class TalkerStage:
    def __init__(self, artifact: Artifact, backend: Backend, talking: Talking, tables: dict[str, np.ndarray],
                 port: CodecPort, *, graph_window: int = 0):
        self.artifact = artifact
        self.graph_window = graph_window
        self.backend = backend
        self.port = port
        self.layout = talking.layout
        self.fewest_rows = self.layout.fewest_rows()
        """The shortest prefill of any request: its frame room is the longest reply (`status.model`)."""
        self.eos = talking.eos
        self.eos_blocked_decisions = talking.eos_blocked_decisions
        self.tables = dict(tables)  # the stage takes cp_heads out into its bound buffer
        self.pad_row = tables[talking.pad.table][talking.pad.ids[0]]
        self.text_table = tables[talking.text_table]
        self.text_end = tables[talking.text_end.table][talking.text_end.ids[0]]
        self.engine = backend.load(artifact.file("talker"))
        self.cp_engine = backend.load(artifact.file("code_predictor"))
        self.draft_engine = backend.load(artifact.file("code_predictor_draft"))
        self.codec_table = tables["codec_embedding"]
        self.claimed: dict[str, int] = {}

    # ---------------------------------------------------------------------------------- boot

    def preallocate(self) -> dict[str, int]:
        """Claim every buffer (sized max_batch x max_seq) and bind every plan; returns bytes per part."""
        a, d = self.artifact, self.artifact.dims
        b, s, h, g = a.max_batch, a.max_seq, d.hidden, d.code_groups
        dec = pre = self.engine.dtype
        cp = self.cp_engine.dtype
        e, dev = self.backend.empty, self.backend.device_empty  # host-visible I/O; what only the engines read
        self.keys = [dev((b, d.kv_heads, d.head_dim, s), dec(f"past_keys_{i}")) for i in range(d.layers)]  # [B, Hkv, D, S]
        self.values = [dev((b, d.kv_heads, s, d.head_dim), dec(f"past_values_{i}")) for i in range(d.layers)]  # [B, Hkv, S, D]
        self.new_keys = [dev((b, d.kv_heads, d.head_dim, 1), dec(f"new_keys_{i}")) for i in range(d.layers)]
        self.new_values = [dev((b, d.kv_heads, 1, d.head_dim), dec(f"new_values_{i}")) for i in range(d.layers)]
        self.prefill_keys = [dev((d.kv_heads * d.head_dim * s,), pre(f"new_keys_{i}")) for i in range(d.layers)]
        self.prefill_values = [dev((d.kv_heads * d.head_dim * s,), pre(f"new_values_{i}")) for i in range(d.layers)]
        self.no_keys = dev((1, d.kv_heads, d.head_dim, 1), pre("past_keys_0"))  # the prefill's one-slot cache, masked
        self.no_values = dev((1, d.kv_heads, 1, d.head_dim), pre("past_values_0"))
        self.prefill_rows = e((s, h), pre("inputs_embeds"))
        self.prefill_position = e((1,), pre("positions"))  # always 0
        self.prefill_slot = e((1,), np.int64)  # where the prefill's K/V rows go
        self.track = e((b, s, h), dec("inputs_embeds"))
        self.inputs_embeds = e((b, h), dec("inputs_embeds"))
        self.positions = e((b,), dec("positions"))
        self.seen = e((b, d.vocab), dec("seen"))
        self.repetition_penalty = e((b,), dec("repetition_penalty"))
        self.allow_eos = e((b,), dec("allow_eos"))
        self.temperature, self.top_k, self.top_p = e((b,), dec("temperature")), e((b,), dec("top_k")), e((b,), dec("top_p"))
        self.noise = e((b, d.vocab), dec("noise"))
        self.hidden = e((b, h), dec("hidden"))
        self.code0 = e((b,), dec("code0"))
        self.cp_temperature, self.cp_top_k, self.cp_top_p = e((b,), cp("temperature")), e((b,), cp("top_k")), e((b,), cp("top_p"))
        self._claim_predictor(b, g, h, d.codebook_size)
        self.codes = np.zeros((b, g - 1), self.cp_codes[1].dtype)
        self.codec_sum = np.zeros((b, h), self.cp_table.dtype)
        self.cp_row = np.zeros((b, h), self.cp_table.dtype)  # one group's embeddings, on their way into the sum
        self.held_hidden, self.held_code0 = np.zeros_like(self.hidden), np.zeros_like(self.code0)
        self.prefill_plans: OrderedDict[int, Plan] = OrderedDict()
        self.prefill_io = {name: e((1, *self.decode_buffers[name].shape[1:]), pre(name))
                           for name in ("seen", "repetition_penalty", "allow_eos", "temperature", "top_k", "top_p",
                                        "noise", "hidden", "code0")}
        self.stepping = np.zeros(b, dtype=bool)
        self.appending = e((b,), np.uint8)  # the rows whose decoded K/V row joins the cache
        self.slots = e((s,), dec("slots"))  # only its bound length is read: the cache slots a plan attends
        self.buckets = buckets(s)
        self.decode_plans = [{length: self._decode_plan(n, length) for length in self.buckets} for n in range(1, b + 1)]
        self.verify_plans = [self._verify_plans(n) for n in range(1, b + 1)]
        self.draft_plans = [self._draft_plans(n) for n in range(1, b + 1)]
        self.engine.reserve(self._prefill_binding(t) for t in range(1, s))  # every prompt length plan() admits
        kv = sum(x.nbytes for x in (*self.keys, *self.values, *self.cp_keys, *self.cp_values))
        scratch = sum(x.nbytes for x in (*self.new_keys, *self.new_values, *self.prefill_keys, *self.prefill_values,
                                         self.no_keys, self.no_values,
                                         *(x for keys, values in self.cp_new.values() for x in (*keys, *values))))
        io = sum(x.nbytes for x in (self.inputs_embeds, self.positions, self.prefill_slot, self.appending, self.seen,
                                    self.repetition_penalty,
                                    self.allow_eos, self.temperature, self.top_k, self.top_p, self.noise,
                                    self.hidden, self.code0, self.cp_temperature, self.cp_top_k, self.cp_top_p,
                                    *self._predictor_io(), self.codes, self.codec_sum, self.cp_row,
                                    self.held_hidden, self.held_code0, *self.prefill_io.values()))
        text = self.prefill_rows.nbytes + self.prefill_position.nbytes + self.track.nbytes
        self.claimed = {"kv_cache": kv, "kv_scratch": scratch, "prefill_and_text_track": text, "step_io": io,
                        "predictor_heads": self.cp_heads.nbytes,
                        "predictor_scratch": sum(x.nbytes for x in self._predictor_scratch())}
        return self.claimed

    @property
    def decode_buffers(self) -> dict[str, np.ndarray]:
        """The code-0 sampling inputs and the hidden/code0 outputs of the batched decode."""
        return {"seen": self.seen, "repetition_penalty": self.repetition_penalty, "allow_eos": self.allow_eos,
                "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "noise": self.noise,
                "hidden": self.hidden, "code0": self.code0}

    def _decode_plan(self, n: int, length: int) -> Plan:
        """The decode of members 0..n-1 attending the first `length` cache slots."""
        rows = slice(0, n)
        binds = {"inputs_embeds": self.inputs_embeds[rows].reshape(n, 1, -1), "positions": self.positions[rows],
                 "slots": self.slots[:length], **{name: buf[rows] for name, buf in self.decode_buffers.items()}}
        for i in range(self.artifact.dims.layers):
            binds |= {f"past_keys_{i}": self.keys[i][rows], f"past_values_{i}": self.values[i][rows],
                      f"new_keys_{i}": self.new_keys[i][rows], f"new_values_{i}": self.new_values[i][rows]}
        append = Append(self._kv_rows(self.keys, self.values, self.new_keys, self.new_values, rows), self.positions,
                        active=self.appending)
        return self.engine.plan(binds, append=append, label=f"decode of {n} member(s) over {length} slots")

    @staticmethod
    def _kv_rows(keys, values, new_keys, new_values, rows: slice) -> tuple[Rows, ...]:
        """Each layer's new key columns [n, Hkv, D, T] and value rows [n, Hkv, T, D] into its cache."""
        return tuple(r for k, v, nk, nv in zip(keys, values, new_keys, new_values)
                     for r in (Rows(k, nk[rows], 3), Rows(v, nv[rows], 2)))

    def decode_plan(self, n: int, length: int) -> Plan:
        """The decode plan of members 0..n-1 whose positions are all below `length`: the smallest
        bucket that holds them (a held row's larger position only spoils its own discarded result)."""
        plans = self.decode_plans[n - 1]
        return plans[next((b for b in self.buckets if b >= length), self.buckets[-1])]

    def _claim_predictor(self, b: int, g: int, h: int, vc: int) -> None:
        """The code predictor's buffers: per pass size (T new rows, V verified rows: 1..MAX_WINDOW) its
        inputs and outputs, its G-slot cache, the draft graph's, and the stacked heads the plans bind
        by view (loaded here, once; the residual embeddings stay a host table)."""
        cp, dr = self.cp_engine.dtype, self.draft_engine.dtype
        e, dev = self.backend.empty, self.backend.device_empty
        heads = self.tables.pop("cp_heads")  # [G-1, Hc, Vc]: held once, in the bound buffer
        # device memory: every pass reads its heads, and the GPU reads pinned host memory uncached
        self.cp_heads = self.backend.device_from(heads.astype(cp("heads"), copy=False))
        self.cp_table = self.tables["cp_codec_embedding"]  # [G-1, Vc, H]
        hc, sizes = heads.shape[1], range(1, MAX_WINDOW + 1)
        self.cp_rows = {t: e((b, t, h), cp("inputs_embeds")) for t in sizes}
        self.cp_positions = e((b,), cp("positions"))
        self.cp_drafts = {v: e((b, v), cp("drafts")) for v in sizes}
        self.cp_draft_probs = {v: dev((b, v, vc), cp("draft_probs")) for v in sizes}  # the last column stays 0
        self.cp_accept_noise = {v: e((b, v), cp("accept_noise")) for v in sizes}
        self.cp_noise = {v: e((b, v, vc), cp("noise")) for v in sizes}
        self.cp_codes = {v: e((b, v), cp("codes")) for v in sizes}
        self.cp_accepted = {v: e((b,), cp("accepted")) for v in sizes}
        self.cp_hidden = {v: dev((b, v, hc), cp("hidden")) for v in sizes}
        layers = sum(name.startswith("past_keys_") for name in self.cp_engine.inputs)
        kv_heads, head_dim = (int(x or 0) for x in self.cp_engine.inputs["past_keys_0"].shape[1:3])
        self.cp_keys = [dev((b, kv_heads, head_dim, g), cp(f"past_keys_{i}")) for i in range(layers)]
        self.cp_values = [dev((b, kv_heads, g, head_dim), cp(f"past_values_{i}")) for i in range(layers)]
        self.cp_new = {t: ([dev((b, kv_heads, head_dim, t), cp(f"new_keys_{i}")) for i in range(layers)],
                           [dev((b, kv_heads, t, head_dim), cp(f"new_values_{i}")) for i in range(layers)])
                       for t in sizes}
        self.draft_hidden = dev((b, hc), dr("hidden"))
        self.draft_noise = {k: e((b, k, vc), dr("noise")) for k in sizes[:-1]}
        self.drafts = {k: e((b, k), dr("drafts")) for k in sizes[:-1]}
        self.draft_probs = {k: dev((b, k, vc), dr("draft_probs")) for k in sizes[:-1]}

    def _predictor_io(self) -> list[np.ndarray]:
        """The code predictor's and its drafts' buffers the host reads or writes."""
        return [self.cp_positions,
                *(x for buffers in (self.cp_rows, self.cp_drafts, self.cp_accept_noise, self.cp_noise, self.cp_codes,
                                    self.cp_accepted, self.draft_noise, self.drafts) for x in buffers.values())]

    def _predictor_scratch(self) -> list[np.ndarray]:
        """Their outputs only the next graph reads (hidden states, draft probabilities): device memory."""
        return [self.draft_hidden, *(x for buffers in (self.cp_draft_probs, self.cp_hidden, self.draft_probs)
                                     for x in buffers.values())]

    def _verify_plans(self, n: int) -> dict[tuple[int, int], Plan]:
        """Every code-predictor pass of members 0..n-1, by (first head, new rows): a frame's first pass
        ([hidden, E(code 0)], head 0, no drafts), then passes of 1 + D rows from head h (D drafts,
        D <= MAX_WINDOW - 1 and h + D <= G - 2)."""
        last = self.artifact.dims.code_groups - 2
        shapes = [(0, 2, 1)] + [(h, 1 + k, 1 + k) for h in range(1, last + 1) for k in range(min(MAX_WINDOW, last - h + 1))]
        return {(h, t): self._verify_plan(n, h, t, v) for h, t, v in shapes}

    def _verify_plan(self, n: int, head: int, t: int, v: int) -> Plan:
        rows = slice(0, n)
        binds = {"inputs_embeds": self.cp_rows[t][rows], "positions": self.cp_positions[rows],
                 "heads": self.cp_heads[head:head + v], "drafts": self.cp_drafts[v][rows],
                 "draft_probs": self.cp_draft_probs[v][rows], "temperature": self.cp_temperature[rows],
                 "top_k": self.cp_top_k[rows], "top_p": self.cp_top_p[rows], "accept_noise": self.cp_accept_noise[v][rows],
                 "noise": self.cp_noise[v][rows], "codes": self.cp_codes[v][rows], "accepted": self.cp_accepted[v][rows],
                 "hidden": self.cp_hidden[v][rows]}
        new_keys, new_values = self.cp_new[t]
        for i in range(len(self.cp_keys)):
            binds |= {f"past_keys_{i}": self.cp_keys[i][rows], f"past_values_{i}": self.cp_values[i][rows],
                      f"new_keys_{i}": new_keys[i][rows], f"new_values_{i}": new_values[i][rows]}
        # all T rows join the cache: rows past the accepted drafts sit beyond the next pass's position,
        # masked, and are written over
        append = Append(self._kv_rows(self.cp_keys, self.cp_values, new_keys, new_values, rows), self.cp_positions)
        return self.cp_engine.plan(binds, graph=head == 0 or t == 1 or t <= self.graph_window, append=append,
                                   label=f"pass of {n} member(s), {t} row(s) from head {head}")

    @property
    def predictor_plans(self) -> list[Plan]:
        """Every bound code-predictor plan: the passes, then the drafts."""
        return [p for plans in (*self.verify_plans, *self.draft_plans) for p in plans.values()]

    def _draft_plans(self, n: int) -> dict[tuple[int, int], Plan]:
        """The draft graph for members 0..n-1, by (first drafted head h, drafts D): heads h..h+D-1."""
        last = self.artifact.dims.code_groups - 2
        rows = slice(0, n)
        return {(h, k): self.draft_engine.plan({
                    "hidden": self.draft_hidden[rows], "heads": self.cp_heads[h:h + k],
                    "temperature": self.cp_temperature[rows], "top_k": self.cp_top_k[rows], "top_p": self.cp_top_p[rows],
                    "noise": self.draft_noise[k][rows], "drafts": self.drafts[k][rows], "draft_probs": self.draft_probs[k][rows]},
                    graph=k < self.graph_window, label=f"{k} draft(s) of {n} member(s) from head {h}")
                for h in range(1, last + 1) for k in range(1, min(MAX_WINDOW - 1, last - h) + 1)}

    # ---------------------------------------------------------------------------------- requests

    def text_stream(self) -> TextStream:
        return self.layout.text_stream()

    def plan(self, request: SpeechRequest, streamed: Streamed | None = None) -> Prompt:
        """The request's prompt; every reason to refuse it (PromptError, SamplingError) is raised here."""
        prompt = self.layout.plan(request, streamed)
        request.sampling.validated()
        if prompt.prefill_len >= self.artifact.max_seq:
            raise PromptError(f"text too long: the prefill needs {prompt.prefill_len} of {self.artifact.max_seq} "
                              f"KV slots and leaves no room for audio")
        if request.max_frames is not None and request.max_frames < 1:
            raise PromptError(f"max_frames must be >= 1, got {request.max_frames}")
        return prompt

    def admit(self, request: SpeechRequest) -> tuple[bool, str]:
        """Refuse for free: unknown voice/language, bad sampling, empty or too long text (a streamed
        request's text is checked as it comes)."""
        try:
            if request.more_text:
                self.layout.check(request)
                request.sampling.validated()
                if request.max_frames is not None and request.max_frames < 1:
                    raise PromptError(f"max_frames must be >= 1, got {request.max_frames}")
            else:
                self.plan(request)
        except (PromptError, SamplingError) as exc:
            return False, str(exc)
        return True, ""

    def prepare(self, request: SpeechRequest, slot: int, streamed: Streamed | None = None) -> Member:
        """Prefill one request (a stream: from its committed text) into `slot`; afterwards its first
        code 0 is pending."""
        t0 = time.perf_counter()
        prompt = self.plan(request, streamed)
        sampling = request.sampling.validated()
        room = frame_room(self.artifact.max_seq, prompt.prefill_len)
        m = Member(request, prompt, slot, min(request.max_frames or room, room), np.random.default_rng(sampling.seed),
                   window=sampling.cp_spec_verify_size)
        capacity = room - 1  # track rows the member can read before its KV room is used up
        prompt.write(self.tables, self.prefill_rows, self.track[slot, :capacity])
        m.track_len, m.text_truncated = min(prompt.track_len, capacity), prompt.track_len > capacity
        m.text_final, m.text_tokens = streamed is None or streamed.final, prompt.text_tokens
        self.seen[slot] = 0
        self.repetition_penalty[slot] = sampling.repetition_penalty
        self.temperature[slot], self.top_k[slot], self.top_p[slot] = sampling.temperature, sampling.top_k, sampling.top_p
        self.cp_temperature[slot], self.cp_top_k[slot] = sampling.cp_temperature, sampling.cp_top_k
        self.cp_top_p[slot] = sampling.cp_top_p
        self.allow_eos[slot] = self.eos_blocked_decisions == 0
        self._fill_noise(m)
        t = prompt.prefill_len
        self.prefill(slot, t)
        m.position = t
        self._commit_code0(m)
        self.port.open(slot)
        m.prefill_ms = (time.perf_counter() - t0) * 1e3
        return m

    def prefill(self, slot: int, t: int) -> None:
        """Run the prefill over prefill_rows[:t] with the slot's sampling inputs: the slot's KV rows
        (appended by the plan), hidden and code 0. (The prefill binds buffers of its own: a slot's row
        of a per-slot scalar is not 256-byte aligned.)"""
        io = self.prefill_io
        for name, buf in self.decode_buffers.items():
            if name not in ("hidden", "code0"):
                io[name][0] = buf[slot]
        self.prefill_slot[0] = slot
        self._prefill_plan(t).run()
        self.hidden[slot] = io["hidden"][0]
        self.code0[slot] = io["code0"][0]

    def _prefill_plan(self, t: int) -> Plan:
        plans = self.prefill_plans
        if t in plans:
            plans.move_to_end(t)
            return plans[t]
        if len(plans) >= PREFILL_PLANS:
            plans.popitem(last=False)
        plans[t] = plan = self._bind_prefill(t)
        return plan

    def _bind_prefill(self, t: int) -> Plan:
        binds, append = self._prefill_binding(t)
        return self.engine.plan(binds, repeated=False, append=append, label=f"prefill of {t} rows")

    def _prefill_binding(self, t: int) -> tuple[dict[str, np.ndarray], Append]:
        """What a prefill of `t` rows binds, and its K/V append."""
        d = self.artifact.dims
        binds = {"inputs_embeds": self.prefill_rows[:t].reshape(1, t, d.hidden), "positions": self.prefill_position,
                 "slots": self.slots[:1], **self.prefill_io}
        new_keys, new_values = [], []
        for i in range(d.layers):
            binds[f"past_keys_{i}"], binds[f"past_values_{i}"] = self.no_keys, self.no_values
            new_keys.append(self.prefill_keys[i][: d.kv_heads * d.head_dim * t].reshape(1, d.kv_heads, d.head_dim, t))
            new_values.append(self.prefill_values[i][: d.kv_heads * t * d.head_dim].reshape(1, d.kv_heads, t, d.head_dim))
            binds[f"new_keys_{i}"], binds[f"new_values_{i}"] = new_keys[i], new_values[i]
        rows = self._kv_rows(self.keys, self.values, new_keys, new_values, slice(0, 1))
        return binds, Append(rows, self.prefill_position, self.prefill_slot)

    def extend_text(self, m: Member, ids: list[int], final: bool) -> None:
        """A stream's newly committed ids onto the member's track (and its end row when `final`)."""
        capacity = self.artifact.max_seq - m.prompt.prefill_len
        n = max(0, min(len(ids), capacity - m.track_len))
        for i in range(n):
            self.track[m.slot, m.track_len + i] = self.text_table[ids[i]]
        m.track_len += n
        m.text_tokens += len(ids)
        m.text_truncated = m.text_truncated or n < len(ids)
        if final:
            if m.track_len < capacity:
                self.track[m.slot, m.track_len] = self.text_end
                m.track_len += 1
            m.text_final = True

    def ready(self, m: Member) -> bool:
        """Whether the member's next step has its text row (a stream waits for text; it never reads
        the pad row early)."""
        return m.text_final or m.frames < m.track_len or m.frames + 1 >= m.max_frames

    # ---------------------------------------------------------------------------------- the step

    def step_cohort(self, members: list[Member]) -> None:
        """Exactly one codec frame per member; members not listed come out unchanged."""
        t0 = time.perf_counter()
        n = max(m.slot for m in members) + 1
        self._hold(members, n)
        self.predict(n, min(m.window for m in members), members)  # groups 1..G-1 for every pending code 0
        talking = [m for m in members if self._publish(m)]
        self.appending[:n] = 0
        for m in talking:
            self._feed(m)
        if talking:
            self.decode_plan(n, max(m.position for m in talking) + 1).run()  # next code 0 (and K/V rows) of those talking
        self._restore(n)
        for m in talking:
            m.position += 1
            self._commit_code0(m)
        elapsed = (time.perf_counter() - t0) * 1e3
        for m in members:
            m.step_ms += elapsed

    def predict(self, n: int, window: int = 0, members: Sequence[Member] = ()) -> None:
        """Groups 1..G-1 of rows 0..n-1 (`members` step; the other rows ride along, unused). The first
        pass reads [hidden, E(code 0)] at position 0 and draws group 1 with head 0. Each later pass
        reads the last drawn group's embedding and, with a window W, the embeddings of D = W - 1
        drafts for the next groups (the draft graph applies their heads to the hidden that drew the
        last group); it checks every draft by the speculative rule. The members go in lockstep: a pass
        commits the drafts that every stepping member accepted, then one more group (each member's
        own draw there), so all rows share their positions. A cohort step uses the smallest window
        any stepping member asked for. `members` fill their noise (sampling) and count drafts. The
        frame's codec sum is E(code 0) plus every group's embedding, in order."""
        last = self.artifact.dims.code_groups - 2  # the last head
        first = self.cp_rows[2]
        first[:n, 0] = self.hidden[:n]
        np.take(self.codec_table, self.code0[:n], axis=0, out=first[:n, 1])
        self.codec_sum[:n] = first[:n, 1]
        self.cp_positions[:n] = 0
        self._fill_cp_noise(members, 1)
        self.verify_plans[n - 1][0, 2].run()
        head, position, t, verified = 0, 0, 2, 1
        while True:
            k = self._agreed(n, verified)
            self._commit_groups(members, n, head, k, verified)
            position, head = position + t - verified + 1 + k, head + k + 1
            if head > last:
                return
            drafts = min(max(window - 1, 0), last - head)
            self._draft(members, n, head, drafts, verified, k)
            np.take(self.cp_table[head - 1], self.cp_codes[verified][:n, k], axis=0, out=self.cp_rows[1 + drafts][:n, 0])
            for j in range(drafts):
                np.take(self.cp_table[head + j], self.drafts[drafts][:n, j], axis=0, out=self.cp_rows[1 + drafts][:n, 1 + j])
            t = verified = 1 + drafts
            self.cp_positions[:n] = position
            self._fill_cp_noise(members, verified)
            self.verify_plans[n - 1][head, t].run()

    def _agreed(self, n: int, verified: int) -> int:
        """The drafts every stepping row of the last pass accepted (its verified rows - 1 at most)."""
        k, accepted = verified - 1, self.cp_accepted[verified]
        for row in range(n):
            if self.stepping[row] and accepted[row] < k:
                k = int(accepted[row])
        return k

    def _commit_groups(self, members: Sequence[Member], n: int, head: int, k: int, verified: int) -> None:
        """The last pass's first k + 1 codes are groups head + 1 .. head + k + 1 of the frame."""
        codes = self.cp_codes[verified]
        for i in range(k + 1):
            self.codes[:n, head + i] = codes[:n, i]
            np.take(self.cp_table[head + i], codes[:n, i], axis=0, out=self.cp_row[:n])
            self.codec_sum[:n] += self.cp_row[:n]
        for m in members:
            m.passes += 1
            m.drafted += verified - 1
            m.accepted += k

    def _draft(self, members: Sequence[Member], n: int, head: int, drafts: int, verified: int, k: int) -> None:
        """Drafts for heads head..head+drafts-1 from the hidden that drew the last committed group (the
        last pass's verified row k), into the next pass's drafts and draft_probs."""
        if drafts == 0:
            return
        self.backend.copy(self.draft_hidden[:n], self.cp_hidden[verified][:n, k])
        for m in members:
            if self.cp_temperature[m.slot] > 0:
                m.rng.random(dtype=np.float32, out=self.draft_noise[drafts][m.slot])
        self.draft_plans[n - 1][head, drafts].run()
        self.cp_drafts[drafts + 1][:n, :drafts] = self.drafts[drafts][:n]
        self.backend.copy(self.cp_draft_probs[drafts + 1][:n, :drafts], self.draft_probs[drafts][:n])

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
        self.port.append(m.slot, self.code0[m.slot], self.codes[m.slot])
        m.frames += 1
        if m.first_frame_at is None:
            m.first_frame_at = time.perf_counter()
        if m.frames >= m.max_frames:
            m.outcome = Outcome.LENGTH
            return False
        return True

    def _feed(self, m: Member) -> None:
        """Next talker input: the frame's codec sum + the text-track row of this step (or the pad row)."""
        k = m.frames - 1
        text = self.track[m.slot, k] if k < m.track_len else self.pad_row
        np.add(self.codec_sum[m.slot], text, out=self.inputs_embeds[m.slot])
        self.positions[m.slot] = m.position
        self.appending[m.slot] = 1
        self.allow_eos[m.slot] = m.decisions >= self.eos_blocked_decisions
        self._fill_noise(m)

    def _commit_code0(self, m: Member) -> None:
        code0 = self.code0[m.slot]
        m.decisions += 1
        self.seen[m.slot, code0] = 1  # the repetition penalty sees every earlier code 0
        if code0 == self.eos:
            m.outcome = Outcome.EOS

    def _fill_noise(self, m: Member) -> None:
        if self.temperature[m.slot] > 0:
            m.rng.random(dtype=np.float32, out=self.noise[m.slot])

    def _fill_cp_noise(self, members: Sequence[Member], verified: int) -> None:
        """A pass's noise for every sampling member: the acceptance draws and the Gumbel noise of each
        verified row."""
        for m in members:
            if self.cp_temperature[m.slot] > 0:
                m.rng.random(dtype=np.float32, out=self.cp_accept_noise[verified][m.slot])
                m.rng.random(dtype=np.float32, out=self.cp_noise[verified][m.slot])

    # ---------------------------------------------------------------------------------- lifecycle

    def finish(self, m: Member) -> None:
        """Every exit path: a member still running is stopped; its port closes so the vocoder drains it."""
        if m.outcome is Outcome.RUNNING:
            m.outcome = Outcome.STOPPED
        self.port.close(m.slot)

    def reset(self) -> None:
        """Forget every member; buffers stay claimed. Idempotent."""
        self.port.reset()

    def diagnostics(self, m: Member) -> dict:
        return {
            "stage": "talker", "frames": m.frames, "stopped": m.outcome.value,
            "prefill_rows": m.prompt.prefill_len, "text_tokens": m.text_tokens,
            "max_frames": m.max_frames, "prefill_ms": round(m.prefill_ms, 3), "step_ms": round(m.step_ms, 3),
            "cp_passes": m.passes, "cp_drafted": m.drafted, "cp_accepted": m.accepted,
        }
