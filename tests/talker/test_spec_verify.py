"""The code predictor's speculative verify (`sampling.cp_spec_verify_size`): greedy frames equal the
autoregressive loop's, and sampled codes have its distribution.

On random weights the later heads' drafts are almost never right, so the tests also run a checkpoint
made for agreement (`engines.agreeable`: a group tends to repeat the one before it). Then drafts are
accepted often, rejected often, and every path of the rule runs.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from scipy import stats

from edged.artifact import load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from edged.talker.stage import Member

TEXTS = ("Speculate on the residual groups.", "A second, longer sentence rides in the same cohort as the first.",
         "Short one.")
ALPHA = 1e-3


def _synthesize(synth: Synthesizer, window: int, frames: int = 16) -> list:
    sampling = replace(Sampling.greedy(), cp_spec_verify_size=window)
    voice = next(iter(synth.core.artifact.speakers))
    requests = [SpeechRequest(f"r{i}", text, voice=voice, sampling=sampling, max_frames=frames)
                for i, text in enumerate(TEXTS)]
    return synth.synthesize(requests)


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_greedy_frames_equal_the_autoregressive_loop(artifacts, backend, variant):
    """Every window gives the frames of window 0 (which test_parity checks against qwen-tts), for a
    cohort of three members in lockstep, on each tiny shape (4, 8 and 16 code groups)."""
    synth = Synthesizer(load_artifact(artifacts(variant)), backend)
    want = _synthesize(synth, 0)
    for window in (2, 4, 8):
        got = _synthesize(synth, window)
        for w, g in zip(want, got):
            assert np.array_equal(w.frames, g.frames), (variant, window, w.id)
            assert g.report["stages"][0]["cp_drafted"] > 0 and w.report["stages"][0]["cp_drafted"] == 0


@pytest.fixture(scope="module")
def agreeable(checkpoints, tmp_path_factory):
    """An artifact of tiny variant 1 (8 code groups) whose code predictor tends to repeat a group."""
    from engines.agreeable import make_agreeable
    from engines.export import export

    ckpt = make_agreeable(checkpoints(1), tmp_path_factory.mktemp("agreeable") / "ckpt")
    out = ckpt.parent / "art"
    export(ckpt, out, max_batch=4, max_seq=128)
    return out


def test_greedy_drafts_that_agree_are_all_accepted(agreeable, backend):
    synth = Synthesizer(load_artifact(agreeable), backend)
    want = _synthesize(synth, 0)
    for window in (2, 4, 8):
        got = _synthesize(synth, window)
        for w, g in zip(want, got):
            assert np.array_equal(w.frames, g.frames), (window, w.id)
            talker = g.report["stages"][0]
            assert talker["cp_accepted"] == talker["cp_drafted"] > 0


def _draws(synth: Synthesizer, window: int, calls: int, cp: tuple[float, int, float], seed: int):
    """`calls` frames' groups for every row over one fixed talker hidden and code 0, through the stage's
    own `predict`, at the code predictor's (temperature, top-k, top-p) `cp`; returns the codes
    [calls x rows, G-1] and the drafts proposed and accepted."""
    t, n = synth.core.talker, synth.core.artifact.max_batch
    hidden = np.random.default_rng(7).standard_normal(t.hidden.shape[1]).astype(np.float32)
    members = [Member(None, None, row, 1, np.random.default_rng([seed, row]), window=window)  # type: ignore[arg-type]
               for row in range(n)]
    t.stepping[:] = True
    t.cp_temperature[:n], t.cp_top_k[:n], t.cp_top_p[:n] = cp
    codes = np.zeros((calls * n, t.codes.shape[1]), np.int64)
    for c in range(calls):
        t.hidden[:n], t.code0[:n] = hidden, 17
        t.predict(n, window, members)
        codes[c * n:(c + 1) * n] = t.codes[:n]
    return codes, sum(m.drafted for m in members), sum(m.accepted for m in members)


def _homogeneity(a: np.ndarray, b: np.ndarray) -> float:
    """The p-value of a chi-square test that two samples of cells share one distribution (cells seen
    fewer than 10 times in both together are pooled; one cell left is nothing to tell apart)."""
    cells = np.union1d(a, b)
    table = np.array([[np.sum(x == c) for c in cells] for x in (a, b)])
    rare = table.sum(0) < 10
    table = np.column_stack([table[:, ~rare], table[:, rare].sum(1)]) if rare.any() else table
    table = table[:, table.sum(0) > 0]
    return float(stats.chi2_contingency(table)[1]) if table.shape[1] > 1 else 1.0


def _family(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """p-values that codes `a` and `b` [frames, G-1] share one distribution, each on its own: every
    residual group's marginal, every pair of groups repeating (g_i == g_j), and for every three groups
    in a row which of them are equal (a rejected draft shows there: it was drawn for the group two back)."""
    groups = a.shape[1]
    out = {f"group {i + 1}": _homogeneity(a[:, i], b[:, i]) for i in range(groups)}
    for i, j in itertools.combinations(range(groups), 2):
        out[f"groups {i + 1} == {j + 1}"] = _homogeneity(a[:, i] == a[:, j], b[:, i] == b[:, j])
    for g in range(2, groups):
        out[f"groups {g - 1}..{g + 1} equal"] = _homogeneity(*(_equal_pattern(x, g) for x in (a, b)))
    return out


def _equal_pattern(codes: np.ndarray, g: int) -> np.ndarray:
    first, second, third = codes[:, g - 2], codes[:, g - 1], codes[:, g]
    return (first == second) * 1 + (second == third) * 2 + (first == third) * 4


MUTANTS = ("swapped", "loosened", "residual from p")


def _mutant(artifact: Path, out: Path, mutant: str) -> Path:
    """A copy of `artifact` whose code-predictor pass breaks the speculative rule one way; the rule's
    nodes are found by the graph inputs they read (accept when accept_noise * q(d) < p(d); a rejected
    row draws from max(p - draft_probs, 0)). swapped: accept when accept_noise * p(d) < q(d); loosened:
    accept when accept_noise * q(d) < 2 p(d); residual from p: a rejected row draws from p itself."""
    shutil.copytree(artifact, out)
    graph = onnx.load(str(out / "code_predictor.onnx"))
    nodes = graph.graph.node

    def one(op: str, reads: str):
        found = [n for n in nodes if n.op_type == op and reads in n.input]
        assert len(found) == 1, f"{op} reading {reads}: {len(found)} nodes"
        return found[0]

    scaled = one("Mul", "accept_noise")
    test = one("Less", scaled.output[0])
    residual = one("Sub", "draft_probs")
    q_draft = next(x for x in scaled.input if x != "accept_noise")
    p_draft = test.input[1]
    if mutant == "swapped":
        scaled.input[list(scaled.input).index(q_draft)], test.input[1] = p_draft, q_draft
    elif mutant == "loosened":
        graph.graph.initializer.append(numpy_helper.from_array(np.array(2, np.float32), "mutant_two"))
        nodes.append(helper.make_node("Mul", [p_draft, "mutant_two"], ["mutant_twice_p"]))
        test.input[1] = "mutant_twice_p"
    else:
        graph.graph.initializer.append(numpy_helper.from_array(np.array(0, np.float32), "mutant_zero"))
        residual.input[1] = "mutant_zero"
    onnx.save(graph, str(out / "code_predictor.onnx"))
    return out


@pytest.fixture(scope="module")
def mutants(agreeable):
    """mutants(name) -> the agreeable artifact with that mutant of the rule (made once, when first asked)."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = _mutant(agreeable, agreeable.parent / f"mutant {name}", name)
        return made[name]

    return get


SETTINGS = {
    "defaults": (None, ("swapped",)),
    "truncated": ((1.5, 10, 0.9), MUTANTS),
}
"""Per setting, the code predictor's (temperature, top-k, top-p) (None: the artifact's defaults, top-k
50) and the mutants the tests must reject there. At the defaults this checkpoint's draft and verify
distributions barely overlap (a draft is either the group's own code or far off), so a loosened
rule or a residual drawn from p changes the codes too little to show in 4000 frames; hotter and
truncated, they overlap, and each mutant moves the codes."""
CALLS = 1000


@pytest.mark.parametrize("setting", SETTINGS)
def test_sampled_codes_have_the_autoregressive_distribution(agreeable, mutants, backend, setting):
    """Window 4 against window 0, 4000 seeded frames each over one fixed hidden state (four members in
    lockstep): every test of `_family` (each residual group's marginal, each pair's repeats, each run
    of three) keeps its p-value above alpha 1e-3 over the number of tests (Bonferroni), at the
    defaults and at a truncated setting, with drafts both accepted and rejected. Mutants of the rule
    (swapped, loosened, a residual drawn from p) must fail at least one of those tests."""
    synth = Synthesizer(load_artifact(agreeable), backend)
    cp, must_reject = SETTINGS[setting]
    if cp is None:
        d = Sampling.defaults(synth.core.artifact.sampling)
        cp = (d.cp_temperature, d.cp_top_k, d.cp_top_p)
    auto, drafted0, _ = _draws(synth, 0, CALLS, cp, seed=1)
    spec, drafted, accepted = _draws(synth, 4, CALLS, cp, seed=2)
    assert drafted0 == 0 and 0.05 < accepted / drafted < 0.9, (accepted, drafted)  # both ways of the rule run
    tests = _family(auto, spec)
    alpha = ALPHA / len(tests)
    assert all(p > alpha for p in tests.values()), {k: p for k, p in tests.items() if p <= alpha}
    for name in must_reject:
        codes, _, _ = _draws(Synthesizer(load_artifact(mutants(name)), backend), 4, CALLS, cp, seed=2)
        assert any(p <= alpha for p in _family(auto, codes).values()), f"the {name} mutant passes every test"
