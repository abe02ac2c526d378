"""The one small interface between the runtime and a model family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from edged.artifact.manifest import VOCODER_TWINS, ArtifactError, Dims, Manifest
from edged.request import SpeechRequest
from edged.talker.prompt import Lookup, Prompt
from edged.talker.text import Streamed, TextStream

if TYPE_CHECKING:
    from edged.artifact import Artifact

TALKER_GRAPHS = ("talker", "code_predictor", "code_predictor_draft", "vocoder")
"""The graphs every talker family exports (contracts in docs/artifact.md)."""


class Layout(Protocol):
    def plan(self, request: SpeechRequest, streamed: Streamed | None = None) -> Prompt:
        """The request's prompt (from a stream's committed text when `streamed` is given); raises
        PromptError naming what is wrong with the request."""
        ...

    def check(self, request: SpeechRequest) -> None:
        """Every reason to refuse a request but its text (a streamed request's text comes later)."""
        ...

    def text_stream(self) -> TextStream:
        """Incremental tokenization for this layout's streamed text."""
        ...

    def fewest_rows(self) -> int:
        """The prefill rows of the shortest prompt this layout builds."""
        ...


@dataclass(frozen=True)
class Talking:
    """What the talker stage needs from a family."""

    layout: Layout
    eos: int
    """The code 0 that ends an utterance (its frame is never published)."""
    pad: Lookup
    """The text-track row fed once the track is used up (one row)."""
    text_table: str
    """The table streamed text ids are rows of (they grow the text track)."""
    text_end: Lookup
    """The row that ends a streamed text on the track (one row)."""
    eos_blocked_decisions: int
    """Code-0 decisions at the start during which eos is masked (Qwen3-TTS's reference: 2;
    Qwen3-Omni's: none)."""


class Family(ABC):
    name: str
    graphs: tuple[str, ...] = TALKER_GRAPHS
    optional_graphs: tuple[str, ...] = ()
    files: tuple[str, ...] = ("embeddings", "tokenizer")
    special_keys: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ("tts",)
    """The prompt layouts this family builds prefills for (`model.layout`)."""

    def check(self, m: Manifest) -> None:
        """What this family requires of a manifest beyond its types; raises ArtifactError naming the key."""
        if m.layout not in self.layouts:
            raise ArtifactError(f"artifact.json: model.layout {m.layout!r} is not one family {self.name} builds "
                                f"({', '.join(self.layouts)})")
        if "talker" not in m.graphs and "talker_decode" in m.graphs:
            raise ArtifactError("artifact.json: this artifact has separate talker_prefill/talker_decode graphs; "
                                "the runtime takes one talker graph now: export the checkpoint again "
                                "(edged-engines export)")
        if "code_predictor" in m.graphs and "code_predictor_draft" not in m.graphs:
            raise ArtifactError("artifact.json: no code_predictor_draft graph: this artifact's code predictor "
                                "holds its heads inside one graph per group (an older contract): export the "
                                "checkpoint again (edged-engines export)")
        for role in self.graphs:
            if role not in m.graphs:
                raise ArtifactError(f"artifact.json: missing key 'tensors.{role}' (with inputs and outputs lists)")
        unknown = sorted(set(m.graphs) - set(self.graphs) - set(self.optional_graphs) - set(VOCODER_TWINS))
        if unknown:
            raise ArtifactError(f"artifact.json: graphs {unknown} are not known to family {self.name}")
        for role in self.files:
            if role not in m.files:
                raise ArtifactError(f"artifact.json: missing key 'files.{role}'")
        for key in self.special_keys:
            if key not in m.special:
                raise ArtifactError(f"artifact.json: missing or non-integer key 'special.{key}'")
        if not m.graphs["vocoder"].state:
            raise ArtifactError("artifact.json: missing key 'tensors.vocoder.state' (the streaming vocoder's state list)")
        fp32 = m.graphs["vocoder"]
        for role in VOCODER_TWINS:
            twin = m.graphs.get(role)
            if twin is not None and (twin.inputs, twin.outputs, twin.state) != (fp32.inputs, fp32.outputs, fp32.state):
                raise ArtifactError(f"artifact.json: 'tensors.{role}' must have the inputs, outputs and state of "
                                    "'tensors.vocoder' (the int8 vocoder stands in for it)")

    def instruct_means(self, m: Manifest) -> str:
        """What a speak's `instruct` is to this artifact (`status.model.instruct_means`): "none" where
        it is refused."""
        return "style" if m.supports_instruct else "none"

    @abstractmethod
    def table_shapes(self, dims: Dims) -> dict[str, tuple[int | None, ...]]:
        """The host tables (embeddings.safetensors) this family reads, with their shapes (None: any
        size)."""

    @abstractmethod
    def talking(self, artifact: Artifact) -> Talking:
        """The prompt layout and special ids, for the talker stage."""


def predictor_table_shapes(dims: Dims) -> dict[str, tuple[int | None, ...]]:
    """The code predictor's host tables, in every family: its heads [G-1, Hc, Vc] (Hc is the
    predictor's own width) and its residual codec embeddings [G-1, Vc, H]."""
    g, vc = dims.code_groups - 1, dims.codebook_size
    return {"cp_heads": (g, None, vc), "cp_codec_embedding": (g, vc, dims.hidden)}
