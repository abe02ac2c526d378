"""Checkpoint configs as users have them: config.json files as transformers 4.57.3 and 5.x write them
(tests/engines/configs/, made once by scripts/checkpoint_configs.py with the libraries' own config
classes, for the tiny shape variant 0 of both families). Both layouts read to one config, a
checkpoint with either exports the same artifact, and a config missing a model-defining key is
refused with the key and the file named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engines.config import ConfigError
from engines.export import export
from engines.export_memo import ENV as EXPORT_MEMO
from engines.qwen3_omni.config import Qwen3OmniConfig
from engines.qwen3_tts.config import Qwen3TTSConfig

CONFIGS = Path(__file__).parent / "configs"
OLD, NEW = "transformers-4.57.3", "transformers-5.23.0"
READERS = {"qwen3_tts": Qwen3TTSConfig, "qwen3_omni": Qwen3OmniConfig}
FILES = {"qwen3_tts": ("config.json", "speech_tokenizer/config.json"), "qwen3_omni": ("config.json",)}


@pytest.fixture(scope="module")
def tiny(checkpoints, omni_artifacts):
    """family -> the tiny variant-0 checkpoint (written with the project's transformers, 4.57.3)."""
    return {"qwen3_tts": checkpoints(0), "qwen3_omni": omni_artifacts(0, 20)[0]}


def with_configs(checkpoint: Path, family: str, layout: str, dest: Path, edit=None) -> Path:
    """`checkpoint`'s files (weights linked) with the config files of `layout`, edited by `edit`."""
    for path in checkpoint.rglob("*"):
        if path.is_file():
            target = dest / path.relative_to(checkpoint)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    for name in FILES[family]:
        config = json.loads((CONFIGS / family / layout / name).read_text())
        if edit is not None and name == "config.json":
            edit(config)
        (dest / name).unlink()
        (dest / name).write_text(json.dumps(config))
    return dest


@pytest.mark.parametrize("family", READERS)
def test_the_old_layout_is_what_the_tiny_builder_writes(tiny, family):
    for name in FILES[family]:
        assert json.loads((CONFIGS / family / OLD / name).read_text()) == json.loads((tiny[family] / name).read_text())


@pytest.mark.parametrize("family", READERS)
def test_the_new_layout_names_keys_differently_and_reads_to_the_same_config(tiny, family, tmp_path):
    new = json.loads((CONFIGS / family / NEW / "config.json").read_text())["talker_config"]
    talker = new if family == "qwen3_tts" else new["text_config"]
    assert "rope_parameters" in talker and "rope_scaling" not in talker
    assert ("num_local_experts" in talker and "num_experts" not in talker) == (family == "qwen3_omni")
    read = READERS[family].from_checkpoint
    assert read(with_configs(tiny[family], family, NEW, tmp_path)) == read(tiny[family])


@pytest.mark.parametrize("family", READERS)
def test_a_checkpoint_with_the_new_layout_exports_the_same_artifact(tiny, family, artifacts, omni_artifacts, tmp_path,
                                                                    monkeypatch):
    old = artifacts(0) if family == "qwen3_tts" else omni_artifacts(0, 20)[1]
    if family == "qwen3_omni":  # every graph traced again: the vocoder's trace is deterministic too
        monkeypatch.delenv(EXPORT_MEMO)
    # qwen3_tts: its vocoder is traced again only if the new layout's codec config reads differently
    new = tmp_path / "new"
    export(with_configs(tiny[family], family, NEW, tmp_path / "ckpt"), new, max_batch=4, max_seq=256)
    names = sorted(p.name for p in old.iterdir())
    assert names == sorted(p.name for p in new.iterdir())
    for name in names:
        assert (old / name).read_bytes() == (new / name).read_bytes(), name


MISSING = {  # family -> (layout, key path in config.json, the key the error names)
    "qwen3_tts": [
        (OLD, "talker_config.rope_theta", "talker_config.rope_theta"),
        (NEW, "talker_config.rope_parameters.rope_theta", "talker_config.rope_parameters.rope_theta"),
        (NEW, "talker_config.rope_parameters.mrope_section", "talker_config.rope_parameters.mrope_section"),
        (OLD, "talker_config.rms_norm_eps", "talker_config.rms_norm_eps"),
        (NEW, "talker_config.num_key_value_heads", "talker_config.num_key_value_heads"),
        (OLD, "talker_config.code_predictor_config.hidden_size", "talker_config.code_predictor_config.hidden_size"),
        (OLD, "talker_config.code_predictor_config.head_dim", "talker_config.code_predictor_config.head_dim"),
        (NEW, "talker_config.codec_eos_token_id", "talker_config.codec_eos_token_id"),
        (OLD, "talker_config.spk_id", "talker_config.spk_id"),
        (NEW, "tts_model_type", "tts_model_type"),
    ],
    "qwen3_omni": [
        (OLD, "talker_config.text_config.num_experts", "talker_config.text_config.num_local_experts"),
        (NEW, "talker_config.text_config.num_local_experts", "talker_config.text_config.num_experts"),
        (OLD, "talker_config.text_config.rope_theta", "talker_config.text_config.rope_theta"),
        (NEW, "talker_config.text_config.rope_parameters.rope_theta",
         "talker_config.text_config.rope_parameters.rope_theta"),
        (OLD, "talker_config.text_config.norm_topk_prob", "talker_config.text_config.norm_topk_prob"),
        (NEW, "talker_config.text_config.shared_expert_intermediate_size",
         "talker_config.text_config.shared_expert_intermediate_size"),
        (OLD, "talker_config.code_predictor_config.num_key_value_heads",
         "talker_config.code_predictor_config.num_key_value_heads"),
        (NEW, "talker_config.code_predictor_config.head_dim", "talker_config.code_predictor_config.head_dim"),
        (NEW, "code2wav_config.rope_parameters.rope_theta", "code2wav_config.rope_parameters.rope_theta"),
        (OLD, "code2wav_config.sliding_window", "code2wav_config.sliding_window"),
        (NEW, "talker_config.speaker_id", "talker_config.speaker_id"),
        (OLD, "tts_eos_token_id", "tts_eos_token_id"),
    ],
}


@pytest.mark.parametrize("family,layout,path,named", [(f, *case) for f, cases in MISSING.items() for case in cases])
def test_a_missing_model_defining_key_is_refused_naming_it_and_the_file(tiny, family, layout, path, named, tmp_path):
    def drop(config: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            config = config[key]
        del config[last]

    checkpoint = with_configs(tiny[family], family, layout, tmp_path, edit=drop)
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'config.json'}: missing key .*'{named}'"):
        READERS[family].from_checkpoint(checkpoint)


def test_a_missing_speech_tokenizer_key_is_refused_naming_it_and_the_file(tiny, tmp_path):
    checkpoint = with_configs(tiny["qwen3_tts"], "qwen3_tts", NEW, tmp_path)
    path = checkpoint / "speech_tokenizer" / "config.json"
    config = json.loads(path.read_text())
    del config["decoder_config"]["rope_theta"]
    path.unlink()
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=rf"{path}: missing key 'decoder_config.rope_theta'"):
        Qwen3TTSConfig.from_checkpoint(checkpoint)


def test_an_omni_code_predictor_narrower_than_its_talker_is_refused_naming_both(tiny, tmp_path):
    """transformers' Qwen3-Omni code predictor has no width projection (its norm would fail)."""
    def narrower(config: dict) -> None:
        config["talker_config"]["code_predictor_config"]["hidden_size"] += 8

    checkpoint = with_configs(tiny["qwen3_omni"], "qwen3_omni", OLD, tmp_path, edit=narrower)
    with pytest.raises(ConfigError, match=r"code_predictor_config.hidden_size=\d+ differs from "
                                          r"talker_config.text_config.hidden_size=\d+"):
        Qwen3OmniConfig.from_checkpoint(checkpoint)


@pytest.mark.parametrize("layout,edit,message", [
    (OLD, lambda t: t["rope_scaling"].update(rope_type="yarn"), "talker_config.rope_scaling.rope_type='yarn' is not"),
    (NEW, lambda t: t["rope_parameters"].update(mrope_section=[1, 1, 1]), "mrope_section=.* summing to head_dim"),
    (OLD, lambda t: t.update(hidden_act="gelu"), "talker_config.hidden_act='gelu' is not supported"),
    (NEW, lambda t: t.update(sliding_window=64), "talker_config.sliding_window=64 is not supported"),
    (OLD, lambda t: t.update(attention_bias=True), "talker_config.attention_bias=True is not supported"),
    (NEW, lambda t: t["code_predictor_config"].update(attention_bias=True),
     "talker_config.code_predictor_config.attention_bias=True is not supported"),
    (OLD, lambda t: t.update(num_attention_heads=3), r"talker_config.num_attention_heads=3 must be a positive multiple "
                                                     r"of talker_config.num_key_value_heads=2"),
    (NEW, lambda t: t["code_predictor_config"].update(num_key_value_heads=3),
     r"code_predictor_config.num_attention_heads=\d+ must be a positive multiple of "
     r"talker_config.code_predictor_config.num_key_value_heads=3"),
    (NEW, lambda t: t.update(rope_theta=10000), r"talker_config.rope_theta and talker_config.rope_parameters.rope_theta "
                                                r"disagree"),
    (OLD, lambda t: t["rope_scaling"].update(type="yarn", rope_type="default"),
     r"'talker_config.rope_scaling.rope_type' and 'talker_config.rope_scaling.type' disagree \('default', 'yarn'\)"),
])
def test_a_setting_the_port_does_not_implement_is_refused(tiny, layout, edit, message, tmp_path):
    checkpoint = with_configs(tiny["qwen3_tts"], "qwen3_tts", layout, tmp_path,
                              edit=lambda config: edit(config["talker_config"]))
    with pytest.raises(ConfigError, match=message):
        Qwen3TTSConfig.from_checkpoint(checkpoint)



def test_disagreeing_spellings_of_the_experts_count_are_refused_naming_both(tiny, tmp_path):
    def both(config: dict) -> None:
        text = config["talker_config"]["text_config"]
        text["num_local_experts"] = text["num_experts"] + 1

    checkpoint = with_configs(tiny["qwen3_omni"], "qwen3_omni", OLD, tmp_path, edit=both)
    with pytest.raises(ConfigError, match=r"'talker_config.text_config.num_experts' and "
                                          r"'talker_config.text_config.num_local_experts' disagree \(4, 5\)"):
        Qwen3OmniConfig.from_checkpoint(checkpoint)


def test_the_export_command_names_a_checkpoint_fault_in_one_line(tiny, tmp_path, capsys):
    """`edged-engines export` on a config missing a key, and on weights whose shape the config does
    not imply: exit 2, one line naming the key or the tensor, no traceback."""
    from engines.cli import main

    def drop(config: dict) -> None:
        del config["talker_config"]["code_predictor_config"]["head_dim"]

    checkpoint = with_configs(tiny["qwen3_tts"], "qwen3_tts", OLD, tmp_path / "a", edit=drop)
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edged-engines export: ") and "missing key 'talker_config.code_predictor_config.head_dim'" in err
    assert "Traceback" not in err and err.count("\n") == 1

    def wider(config: dict) -> None:
        config["talker_config"]["intermediate_size"] += 8

    checkpoint = with_configs(tiny["qwen3_tts"], "qwen3_tts", OLD, tmp_path / "b", edit=wider)
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "has shape" in err and "the config implies" in err and err.count("\n") == 1

    assert main(["export", "--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nowhere: no such directory, and not a Hugging Face repo id (owner/name)" in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    assert main(["export", "--checkpoint", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "empty/config.json: missing (is " in err and err.count("\n") == 1
