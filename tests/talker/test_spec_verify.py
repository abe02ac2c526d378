"""The code predictor's speculative verify (`sampling.cp_spec_verify_size`): greedy frames equal the
autoregressive loop's, and sampled codes have its distribution.

On random weights the later heads' drafts are almost never right, so the tests also run a checkpoint
made for agreement (`engines.agreeable`: a group tends to repeat the one before it). Then drafts are
accepted often, rejected often, and every path of the rule runs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
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


def _draws(synth: Synthesizer, window: int, calls: int, temperature: float, seed: int):
    """`calls` frames' groups for every row over one fixed talker hidden and code 0, through the stage's
    own `predict`; returns the codes [calls x rows, G-1] and the drafts proposed and accepted."""
    t, n = synth.core.talker, synth.core.artifact.max_batch
    hidden = np.random.default_rng(7).standard_normal(t.hidden.shape[1]).astype(np.float32)
    members = [Member(None, None, row, 1, np.random.default_rng([seed, row]), window=window)  # type: ignore[arg-type]
               for row in range(n)]
    t.stepping[:] = True
    t.cp_temperature[:n], t.cp_top_k[:n], t.cp_top_p[:n] = temperature, 0, 1.0
    codes = np.zeros((calls * n, t.codes.shape[1]), np.int64)
    for c in range(calls):
        t.hidden[:n], t.code0[:n] = hidden, 17
        t.predict(n, window, members)
        codes[c * n:(c + 1) * n] = t.codes[:n]
    return codes, sum(m.drafted for m in members), sum(m.accepted for m in members)


def _cells(codes: np.ndarray) -> np.ndarray:
    """Each frame's cell: which of groups 2..4 repeated the group before (8 cells), and group 2's code
    mod 4 (4 cells): 32 cells in all."""
    repeats = (codes[:, 1:4] == codes[:, 0:3]).astype(np.int64) @ np.array([1, 2, 4])
    return repeats * 4 + codes[:, 1] % 4


def _homogeneity(a: np.ndarray, b: np.ndarray) -> float:
    """The p-value of a chi-square test that two samples of cells share one distribution (cells seen
    fewer than 10 times in both pooled together)."""
    cells = np.union1d(a, b)
    table = np.array([[np.sum(x == c) for c in cells] for x in (a, b)])
    rare = table.sum(0) < 10
    table = np.column_stack([table[:, ~rare], table[:, rare].sum(1)]) if rare.any() else table
    return float(stats.chi2_contingency(table)[1])


def test_sampled_codes_have_the_autoregressive_distribution(agreeable, backend):
    """Window 4 against window 0, 4000 seeded frames each over one fixed hidden state: a chi-square test
    of homogeneity over 32 cells does not reject at alpha 1e-3. Its power: against any shift of 0.05 in
    probability between two cells of mass >= 0.05 it rejects with probability > 0.99 (noncentral
    chi-square, computed below), and it does reject the small change a 1.25x temperature makes."""
    synth = Synthesizer(load_artifact(agreeable), backend)
    calls, temperature = 1000, 0.7
    auto, drafted0, _ = _draws(synth, 0, calls, temperature, seed=1)
    spec, drafted, accepted = _draws(synth, 4, calls, temperature, seed=2)
    assert drafted0 == 0 and 0.2 < accepted / drafted < 0.9, (accepted, drafted)  # both ways of the rule run
    n = len(auto)
    cells_auto, cells_spec = _cells(auto), _cells(spec)
    assert _homogeneity(cells_auto, cells_spec) > ALPHA
    hotter, _, _ = _draws(synth, 0, calls, 1.25 * temperature, seed=3)
    assert _homogeneity(cells_auto, _cells(hotter)) < ALPHA
    df = len(np.unique(np.concatenate([cells_auto, cells_spec]))) - 1
    shift = 0.05
    noncentrality = n / 2 * (shift ** 2 / 0.05) * 2  # two cells of mass 0.05, each moved by 0.05
    power = stats.ncx2.sf(stats.chi2.isf(ALPHA, df), df, noncentrality)
    assert power > 0.99, power
