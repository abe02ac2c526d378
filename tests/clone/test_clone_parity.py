"""Voice cloning against the public reference (qwen-tts 0.1.1 `generate_voice_clone`) on tiny
random Base checkpoints of three shapes.

Here the runtime takes the reference's own clone prompt (its x-vector and reference codes, from
`create_voice_clone_prompt`), so what is checked is the prompt layout of both modes in both text
layouts and the vocoder primed with the reference's frames: greedy codec frames equal frame for
frame, PCM within 1e-4. (The encoders, PCM -> x-vector and PCM -> codes, are checked against the
library in tests/engines.)

The library decodes the reference's frames and the new ones together and cuts a share of the samples
off the front, in floating point; edged cuts exactly ref_frames * 1920. The comparison reads the
length the library returns: at most one sample more than the new frames' (rounding), which it drops.
"""

from __future__ import annotations

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.families.model import describe
from edged.request import ClonedVoice, Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.qwen3_tts.reference import reference_clone

VARIANTS = (0, 1, 2)
PCM_TOLERANCE = 1e-4
SPF = 1920


def reference_audio(seconds: float, seed: int) -> np.ndarray:
    """A deterministic stand-in for speech: a few harmonics with a slow vibrato, and noise."""
    t = np.arange(int(seconds * 24000)) / 24000
    rng = np.random.default_rng(seed)
    f0 = 140 + 20 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 24000
    voiced = sum(0.2 / k * np.sin(k * phase) for k in range(1, 5))
    return (voiced + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


CASES = [
    # (text, reference seconds, reference text (None: x-vector only), dual track (None: the default), language, frames)
    ("A cloned voice says hello.", 2.0, None, None, "auto", 24),
    ("The x-vector alone, all text at once.", 1.5, None, False, "english", 20),
    ("In context, after the reference.", 2.5, "This is the reference speaking.", None, "auto", 24),
    ("Short.", 3.3, "A longer reference transcript than the new text has words for.", None, "english", 20),
    ("In context with the whole text in the prefill.", 2.0, "The reference again.", False, "auto", 20),
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_cloned_greedy_frames_and_pcm_equal_reference(variant, artifacts, tiny_reference, backend):
    """In context, twice: the vocoder decoding the reference's frames at admission, and starting
    from the state the clone encoder primed with them (what enrolled voices and synth use)."""
    from dataclasses import replace

    from edged.clone import VoiceEncoder

    art = load_artifact(artifacts(variant, kind="base"))
    synth = Synthesizer(art, backend)
    encoder = VoiceEncoder(art, backend)
    encoder.preallocate()
    reference = tiny_reference(variant, kind="base")
    for i, (text, seconds, ref_text, dual, language, frames) in enumerate(CASES):
        audio = reference_audio(seconds, seed=variant * 10 + i)
        mode = True if dual is None else dual
        codes, pcm, xvector, ref_codes = reference_clone(reference, text, audio, ref_text, language=language,
                                                         max_frames=frames, non_streaming_mode=not mode)
        voice = ClonedVoice(xvector, ref_codes, ref_text)
        voices = [voice]
        if voice.icl:
            assert ref_codes is not None
            voices.append(replace(voice, primed=encoder.prime(ref_codes)))
            extra = len(pcm) - len(codes) * SPF  # what the library's cut left of the reference's samples
            assert 0 <= extra <= 1, (len(pcm), len(codes))
            pcm = pcm[extra:]  # its cut moved to exactly the end of the reference's frames
        for v in voices:
            request = SpeechRequest("c", text, language=language, sampling=Sampling.greedy(), dual_track=dual,
                                    max_frames=frames, clone=v)
            got = synth.synthesize([request])[0]
            case = f"variant {variant}, case {i}: {text!r} icl={voice.icl} dual={dual} primed={v.primed is not None}"
            assert np.array_equal(got.frames, codes), case
            assert got.pcm.shape == pcm.shape, case
            assert np.abs(got.pcm - pcm).max() <= PCM_TOLERANCE, case


def test_cloning_needs_a_base_model_and_well_shaped_prompts(artifacts, backend):
    base = Synthesizer(load_artifact(artifacts(0, kind="base")), backend)
    hidden, groups = base.artifact.dims.hidden, base.artifact.dims.code_groups
    custom = Synthesizer(load_artifact(artifacts(0)), backend)
    good = ClonedVoice(np.zeros(hidden, np.float32))
    cases = [
        (custom, ClonedVoice(np.zeros(custom.artifact.dims.hidden, np.float32)), {}, "cannot clone voices"),
        (base, ClonedVoice(np.zeros(hidden + 1, np.float32)), {}, f"x-vector has shape \\[{hidden + 1}\\]"),
        (base, ClonedVoice(np.zeros(hidden, np.float32), np.zeros((3, groups + 1), np.int64), "ref"), {},
         "reference codes have shape"),
        (base, ClonedVoice(np.zeros(hidden, np.float32), np.zeros((3, groups), np.int64), "ref"),
         {"more_text": True}, "needs the whole text"),
        (base, None, {"voice": "vivian"}, "unknown voice 'vivian': this model has no built-in speakers; enroll a "
                                          "voice from a recording \\(voice_add\\) and speak with its name"),
    ]
    from edged.synth import RequestError

    for synth, voice, extra, message in cases:
        with pytest.raises(RequestError, match=message):
            synth.synthesize([SpeechRequest("c", "Hello.", sampling=Sampling.greedy(), max_frames=4, clone=voice,
                                            **extra)])
    assert base.synthesize([SpeechRequest("c", "Hello.", sampling=Sampling.greedy(), max_frames=4, clone=good)])
    model = describe(base.artifact, base.core.talker.fewest_rows)  # what status.model says of a Base artifact
    assert (model["type"], model["speakers"], model["clone"], model["instruct_means"]) == ("base", [], True, "none")


XVECTOR_TOLERANCE = 1e-4
"""Max |edged - library| of an x-vector, relative to its largest component (measured: < 1e-6)."""


@pytest.mark.parametrize("variant", VARIANTS)
def test_synth_ref_audio_equals_generate_voice_clone(variant, artifacts, tiny_reference, tmp_path):
    """`edged synth --ref-audio` as a user runs it (the CLI, the artifact's clone encoder on ONNX
    Runtime): the x-vector within XVECTOR_TOLERANCE and the reference codes exactly as the library
    makes them, and the greedy frames of both modes equal generate_voice_clone's."""
    from edged.audio.wav import read_wav, write_wav
    from edged.backends import make_backend
    from edged.cli import main
    from edged.clone import VoiceEncoder

    art = load_artifact(artifacts(variant, kind="base"))
    reference = tiny_reference(variant, kind="base")
    wav = tmp_path / "ref.wav"
    write_wav(wav, reference_audio(2.7, seed=100 + variant), 24000)
    audio, _ = read_wav(wav)  # what both sides read: the 16-bit file
    encoder = VoiceEncoder(art, make_backend("onnxruntime", 1))
    encoder.preallocate()
    for ref_text in (None, "What the reference says."):
        codes, _, xvector, ref_codes = reference_clone(reference, "Cloned from a file.", audio, ref_text,
                                                       max_frames=16)
        voice = encoder.encode(audio, ref_text)
        assert np.abs(voice.xvector - xvector).max() <= XVECTOR_TOLERANCE * np.abs(xvector).max()
        if ref_text:
            assert voice.ref_codes is not None and ref_codes is not None
            assert voice.ref_codes.shape == ref_codes.shape == (-(-len(audio) // SPF), art.dims.code_groups)
            assert np.array_equal(voice.ref_codes, ref_codes)
        out, frames = tmp_path / "out.wav", tmp_path / "frames.json"
        args = ["synth", "--artifact", str(art.path), "--text", "Cloned from a file.", "--ref-audio", str(wav),
                "--greedy", "--max-frames", "16", "--out", str(out), "--codes", str(frames), "--threads", "generation=1"]
        assert main(args + (["--ref-text", ref_text] if ref_text else [])) == 0
        import json

        assert np.array_equal(np.asarray(json.loads(frames.read_text())["frames"]), codes), (variant, ref_text)


def test_synth_ref_audio_refuses_what_it_cannot_use(artifacts, tmp_path, capsys):
    from edged.audio.wav import write_wav
    from edged.cli import main

    base, custom = artifacts(0, kind="base"), artifacts(0)
    short, not_wav = tmp_path / "short.wav", tmp_path / "not.wav"
    write_wav(short, reference_audio(0.5, seed=1), 24000)
    not_wav.write_bytes(b"RIFF....not a wave file")
    cases = [
        ([str(base), "--ref-audio", str(short)], "reference is 500 ms long; a reference must be 1000..30000 ms"),
        ([str(base), "--ref-audio", str(not_wav)], "not a PCM WAV file"),
        ([str(base), "--ref-audio", str(tmp_path / "missing.wav")], "No such file"),
        ([str(base), "--ref-text", "hello"], "--ref-text needs --ref-audio"),
        ([str(custom), "--ref-audio", str(short)], "no clone encoder"),
    ]
    for extra, message in cases:
        code = main(["synth", "--artifact", extra[0], "--text", "Hi.", "--out", str(tmp_path / "o.wav"), *extra[1:]])
        err = capsys.readouterr().err
        assert code == 2 and message in err, (extra, err)
