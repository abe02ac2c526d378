#!/usr/bin/env python3
"""Write the config files of the tiny test checkpoints as the installed transformers writes them, with
the libraries' own config classes (no weights, no torch): the test data of tests/engines/configs/.

    python scripts/checkpoint_configs.py tests/engines/configs

writes <out>/<family>/transformers-<version>/: qwen3_tts's config.json and speech_tokenizer/config.json
(qwen-tts 0.1.1's classes) and qwen3_omni's config.json (transformers' Qwen3OmniMoeConfig), for the
tiny shape variant 0 that `edged-engines tiny` builds. Run it once with the project's transformers
(4.57.3) and once from a scratch environment with transformers 5.x and qwen-tts installed without
its dependencies (`pip install transformers==5.23.0 && pip install --no-deps qwen-tts==0.1.1`; the
project never depends on it). qwen-tts's config modules are loaded from their files, because its
package imports torch and refuses any transformers but 4.57.3.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engines.qwen3_omni.tiny import MEDIA_SPECIALS, tiny_config, token_ids
from engines.qwen3_tts.tiny import VARIANTS, configs, fix_speaker_encoder_config
from engines.tiny_text import write_text_tokenizer

QWEN_TTS_CONFIGS = {"model": "core/models/configuration_qwen3_tts.py",
                    "speech": "core/tokenizer_12hz/configuration_qwen3_tts_tokenizer_v2.py"}


def qwen_tts_classes() -> tuple:
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("qwen-tts is not installed here (pip install --no-deps qwen-tts==0.1.1)")
    root = Path(next(iter(spec.submodule_search_locations)))
    modules = {}
    for role, relative in QWEN_TTS_CONFIGS.items():
        module_spec = importlib.util.spec_from_file_location(f"qwen_tts_config_{role}", root / relative)
        assert module_spec is not None and module_spec.loader is not None
        modules[role] = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(modules[role])
    return modules["model"].Qwen3TTSConfig, modules["speech"].Qwen3TTSTokenizerV2Config


def as_saved(config, architecture: str):
    """The config as a model's save_pretrained writes it (its class name, its weights' dtype)."""
    config.architectures = [architecture]
    config.dtype = "float32"
    return config


def main(out: Path) -> None:
    import transformers

    version = f"transformers-{transformers.__version__}"
    with tempfile.TemporaryDirectory() as tmp:
        tts = out / "qwen3_tts" / version
        model, speech = configs(VARIANTS[0], "custom_voice", write_text_tokenizer(Path(tmp)), qwen_tts_classes())
        as_saved(model, "Qwen3TTSForConditionalGeneration").save_pretrained(tts)
        fix_speaker_encoder_config(tts, VARIANTS[0])
        as_saved(speech, "Qwen3TTSTokenizerV2Model").save_pretrained(tts / "speech_tokenizer")
        tok = write_text_tokenizer(Path(tmp) / "omni", MEDIA_SPECIALS)
    omni = out / "qwen3_omni" / version
    as_saved(tiny_config(token_ids(tok), tok.get_vocab_size(), 0), "Qwen3OmniMoeForConditionalGeneration").save_pretrained(omni)
    print(tts, omni)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
