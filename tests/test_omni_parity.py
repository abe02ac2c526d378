"""Qwen3-Omni end to end: greedy codec frames from edged (the exported artifact on ONNX Runtime,
`Synthesizer` and the `segments` layout) equal, frame for frame, those of transformers' own talker
generation on tiny random checkpoints of three shapes, with and without earlier user turns, for each
speaker, with media hidden states in user turns, and on a checkpoint made to end on eos; the PCM is
within 1e-4 of the library's code2wav over the samples it returns (1920 x frames - 555)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from edged.artifact import load_artifact
from edged.cli import main
from edged.families import get_family
from edged.request import Sampling, SpeechRequest
from edged.synth import RequestError, Synthesizer
from engines.qwen3_omni import reference
from engines.qwen3_omni.artifact import export
from engines.qwen3_omni.tiny import VARIANTS, build_model

TOLERANCE = 1e-4
FRAMES = 24
CASES = [  # reply, earlier user turns, speaker
    ("Hello there, how are you today?", (), "ethan"),
    ("The quick brown fox jumps over the lazy dog.", ("What does the fox do?",), "chelsie"),
    ("Yes! I can't believe it's already the end of the year.", ("Good morning!", "Is it December?"), "aiden"),
]


def make(tmp_path_factory, variant: int, seed: int, edit=None):
    ckpt = tmp_path_factory.mktemp(f"omni-ckpt-{variant}-{seed}")
    model = build_model(seed, variant, tokenizer_dir=ckpt)
    if edit is not None:
        edit(model)
    model.save_pretrained(ckpt)
    art = tmp_path_factory.mktemp(f"omni-art-{variant}-{seed}")
    export(ckpt, art, max_batch=4, max_seq=256)
    return model, load_artifact(art)


@pytest.fixture(scope="module")
def omni(omni_artifacts):
    """omni(variant) -> (the library's model, edged's artifact of it), seed 20 + variant, exported once
    for the session (an export is most of a test's time; the model is built again from its seed)."""
    made: dict[int, tuple] = {}

    def get(variant: int):
        if variant not in made:
            _, art = omni_artifacts(variant, 20 + variant)
            made[variant] = build_model(20 + variant, variant), load_artifact(art)
        return made[variant]

    return get


def ours(artifact, backend, cases, max_frames: int) -> list:
    requests = [SpeechRequest(f"r{i}", text, voice=speaker, sampling=Sampling.greedy(), max_frames=max_frames,
                              context=tuple(("user", u) for u in users)) for i, (text, users, speaker) in enumerate(cases)]
    return Synthesizer(artifact, backend).synthesize(requests)


def check(model, artifact, got, case, max_new_tokens: int) -> None:
    text, users, speaker = case
    codes, pcm = reference.generate(model, artifact.file("tokenizer"), text, users, speaker, max_new_tokens)
    assert got.frames.shape == codes.shape and np.array_equal(got.frames, codes), (got.frames.shape, codes.shape)
    assert got.pcm.shape == pcm.shape == (max(0, 1920 * len(codes) - 555),)
    assert np.abs(got.pcm - pcm).max() <= TOLERANCE


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_greedy_frames_and_pcm_equal_the_library(tmp_path_factory, backend, omni, variant):
    model, artifact = omni(variant)
    results = ours(artifact, backend, CASES, FRAMES - 1)  # the library's last token gets no frame
    for got, case in zip(results, CASES):
        check(model, artifact, got, case, FRAMES)
        assert got.reason == "length"
    if variant == 0:  # `edged synth` on the artifact: the same frames as the cohort above
        text, users, speaker = CASES[1]
        out = tmp_path_factory.mktemp("omni-synth")
        argv = ["synth", "--artifact", str(artifact.path), "--text", text, "--speaker", speaker, "--greedy",
                "--max-frames", str(FRAMES - 1), "--out", str(out / "a.wav"), "--codes", str(out / "a.json")]
        assert main([*argv, *(a for u in users for a in ("--user-text", u))]) == 0
        assert np.array_equal(json.loads((out / "a.json").read_text())["frames"], results[1].frames)


def test_a_reply_that_ends_on_eos_ends_like_the_library(tmp_path_factory, backend, omni):
    """eos is allowed from the first decision (unlike Qwen3-TTS): the eos row of the codec head is made
    the twin of a code the greedy run picks at step 6, so eos wins there (or earlier, on a near-tie)."""
    plain, artifact = omni(0)
    codes, _ = reference.generate(plain, artifact.file("tokenizer"), *CASES[0], max_new_tokens=FRAMES)
    target = int(codes[6, 0])

    def end_early(model):
        with torch.no_grad():
            head = model.talker.codec_head.weight
            head[model.config.talker_config.codec_eos_token_id] = head[target] * 1.01
    model, artifact = make(tmp_path_factory, 0, seed=20, edit=end_early)
    got = ours(artifact, backend, CASES[:1], FRAMES - 1)[0]
    assert got.reason == "eos" and len(got.frames) <= 6
    check(model, artifact, got, CASES[0], FRAMES)


def test_segments_requests_are_checked(backend, omni):
    model, artifact = omni(2)
    synth = Synthesizer(artifact, backend)
    for request, message in (
            (SpeechRequest("a", "hi", voice="nobody"), r"unknown voice 'nobody' \(known: aiden, chelsie, ethan\)"),
            (SpeechRequest("b", "hi", language="english"), r"unknown language 'english' \(known: auto\)"),
            (SpeechRequest("c", "hi", context=(("robot", "beep"),)), r"context\[0\] must be a \(role, content\) turn"),
            (SpeechRequest("d", "hi", instruct="whisper"), "does not support instruct")):
        with pytest.raises(RequestError, match=message):
            synth.synthesize([request])
    system_and_history = (("system", "Be brief."), ("user", "Hi!"), ("assistant", "Hello."), ("user", "And now?"))
    plain = SpeechRequest("e", "Fine.", voice="ethan", sampling=Sampling.greedy(), max_frames=8,
                          context=(("user", "Hi!"), ("user", "And now?")))
    dropped = replace(plain, id="f", context=system_and_history)
    a, b = synth.synthesize([plain, dropped])
    codes, _ = reference.generate(model, artifact.file("tokenizer"), "Fine.", system_and_history, "ethan", 9)
    assert np.array_equal(b.frames, codes)  # the library's loop skips the system and the earlier assistant turn
    assert np.array_equal(a.frames, b.frames)  # and edged drops them: the user turns alone give the same frames


MEDIA_TURNS = ("<|audio_start|>" + "<|audio_pad|>" * 3 + "<|audio_end|>What did I just say?",
               "<|vision_start|>" + "<|image_pad|>" * 2 + "<|vision_end|>And this?<|vision_start|><|video_pad|>"
               "<|vision_end|>")
"""User turns as the thinker's processor expands them: one pad token per media row (3 + 2 + 1)."""


def test_media_rows_and_frames_equal_the_library(backend, omni):
    """The talker rows of user turns with media placeholders equal `_get_talker_user_parts` for the
    same thinker hidden states (hidden_projection at the placeholders, text_projection elsewhere), and
    greedy frames follow the library's."""
    model, artifact = omni(1)
    hidden = np.random.default_rng(1).standard_normal((6, artifact.dims.text_hidden)).astype(np.float16)
    request = SpeechRequest("m", "I heard a bird, and I see a cat.", voice="aiden", sampling=Sampling.greedy(),
                            max_frames=FRAMES - 1, context=tuple(("user", u) for u in MEDIA_TURNS), media=hidden)
    prompt = get_family("qwen3_omni").layout(artifact).plan(request)
    rows = np.zeros((prompt.prefill_len, artifact.dims.hidden), np.float32)
    prompt.write(artifact.tables(), rows, np.zeros((prompt.track_len, artifact.dims.hidden), np.float32))
    want = reference.user_rows(model, artifact.file("tokenizer"), MEDIA_TURNS, hidden)
    assert np.abs(rows[:len(want)] - want).max() <= 1e-5
    plain = replace(request, media=np.zeros_like(hidden))
    got, without = Synthesizer(artifact, backend).synthesize([request, plain])
    codes, pcm = reference.generate(model, artifact.file("tokenizer"), request.text, MEDIA_TURNS, "aiden", FRAMES,
                                    media=hidden)
    assert np.array_equal(got.frames, codes) and np.abs(got.pcm - pcm).max() <= TOLERANCE
    assert not np.array_equal(got.frames, without.frames)  # the hidden states are read


def test_media_requests_are_checked(backend, omni):
    _, artifact = omni(2)
    synth = Synthesizer(artifact, backend)
    width = artifact.dims.text_hidden
    turns = tuple(("user", u) for u in MEDIA_TURNS)
    for media, context, message in (
            (None, turns, "media: the context's user turns have 6 media placeholders, and the request has no "
                          "media hidden states for them"),
            (np.zeros((5, width), np.float32), turns, "media: 5 rows of hidden states for 6 media placeholders"),
            (np.zeros((6, width + 1), np.float32), turns,
             rf"media: hidden states of shape \[6, {width + 1}\]; this model's thinker rows have width {width}"),
            (np.full((6, width), np.nan, np.float32), turns, "media: the hidden states hold NaN or infinite values"),
            (np.zeros((1, width), np.float32), (), "media: 1 rows of hidden states for 0 media placeholders")):
        with pytest.raises(RequestError, match=message):
            synth.synthesize([SpeechRequest("a", "hi", context=context, media=media)])
    with pytest.raises(RequestError, match=r"media: this model \(layout tts\) takes no media hidden states"):
        Synthesizer(load_artifact(), backend).synthesize([SpeechRequest("b", "hi", media=np.zeros((1, 4)))])


def test_a_bad_hidden_projection_fails_at_load(tmp_path, backend, omni):
    from safetensors.numpy import load_file, save_file

    from edged.artifact import ArtifactError

    shutil.copytree(omni(2)[1].path, tmp_path / "art")  # broken below: the module's artifact stays whole
    artifact = load_artifact(tmp_path / "art")
    path = artifact.file("embeddings")
    tables = load_file(str(path))
    for edit, message in (
            (lambda t: t.pop("hidden_projection.fc2.bias"), "missing tensor 'hidden_projection.fc2.bias'"),
            (lambda t: t.update({"hidden_projection.fc1.weight": t["hidden_projection.fc1.weight"][:, :-1]}),
             r"tensor 'hidden_projection.fc1.weight' has shape \(\d+, 31\), expected \(\d+, 32\)")):
        broken = dict(tables)
        edit(broken)
        save_file(broken, str(path))
        with pytest.raises(ArtifactError, match=message):
            Synthesizer(load_artifact(artifact.path), backend)
