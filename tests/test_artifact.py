"""Bad artifacts fail at load, with an error that names the file and the key or tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edged.artifact import ArtifactError, load_artifact
from edged.backends import EngineError
from edged.synth import Synthesizer


@pytest.fixture
def copy(builtin_artifact, tmp_path) -> Path:
    out = tmp_path / "art"
    shutil.copytree(builtin_artifact, out)
    return out


def _edit(path: Path, change) -> None:
    manifest = json.loads((path / "artifact.json").read_text())
    change(manifest)
    (path / "artifact.json").write_text(json.dumps(manifest))


def _boot(path: Path, backend) -> Synthesizer:
    return Synthesizer(load_artifact(path), backend)


def test_builtin_artifact_loads(builtin_artifact, backend):
    synth = _boot(builtin_artifact, backend)
    assert synth.claimed["kv_cache"] > 0


def test_builtin_graphs_carry_no_provenance(builtin_artifact):
    """The exporter's per-node provenance (source files and lines of the machine that exported it)
    is not shipped: engines.onnx.save_program drops it, and the built-in graphs are free of it."""
    import onnx

    for graph in load_artifact(builtin_artifact).graphs.values():
        model = onnx.load(str(builtin_artifact / graph.file), load_external_data=False)
        assert not [n.name for n in model.graph.node if n.metadata_props], graph.file


def test_missing_graph_names_the_file(copy):
    (copy / "talker.onnx").unlink()
    with pytest.raises(ArtifactError, match=r"talker\.onnx: missing from the artifact"):
        load_artifact(copy)


def test_an_artifact_with_the_old_two_talker_graphs_says_to_export_again(copy):
    def split(m):
        m["tensors"]["talker_prefill"] = m["tensors"]["talker_decode"] = m["tensors"].pop("talker")
        m["files"]["talker_prefill"], m["files"]["talker_decode"] = "talker_prefill.onnx", "talker_decode.onnx"
        del m["files"]["talker"]
    _edit(copy, split)
    with pytest.raises(ArtifactError, match=r"separate talker_prefill/talker_decode graphs; the runtime takes one "
                                            r"talker graph now: export the checkpoint again"):
        load_artifact(copy)


def test_no_manifest(tmp_path):
    with pytest.raises(ArtifactError, match="no artifact.json"):
        load_artifact(tmp_path)


def test_corrupt_manifest(copy):
    (copy / "artifact.json").write_text('{"format": 1, "family": ')
    with pytest.raises(ArtifactError, match="artifact.json: not valid JSON"):
        load_artifact(copy)


@pytest.mark.parametrize("key", ["dims", "special", "files", "tensors", "audio", "limits", "sampling", "model"])
def test_missing_section_names_the_key(copy, key):
    _edit(copy, lambda m: m.pop(key))
    with pytest.raises(ArtifactError, match=f"artifact.json: missing key '{key}'|artifact.json: '{key}'"):
        load_artifact(copy)


def test_missing_nested_key(copy):
    _edit(copy, lambda m: m["dims"].pop("head_dim"))
    with pytest.raises(ArtifactError, match=r"'dims\.head_dim'"):
        load_artifact(copy)


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["model"].update(layout="segments"),
     r"model\.layout 'segments' is not one family qwen3_tts builds \(tts\)"),
    (lambda m: m["model"].update(layout=3), r"'model\.layout' must be a string"),
    (lambda m: m["audio"].update(lead_samples=555), r"audio\.lead_samples must be 0 for qwen3_tts"),
    (lambda m: m["audio"].update(lead_samples=1920), r"'audio\.lead_samples' must be an integer in \[0, samples_per_frame\)"),
])
def test_layout_and_lead_samples_are_checked(copy, edit, message):
    _edit(copy, edit)
    with pytest.raises(ArtifactError, match=message):
        load_artifact(copy)


def test_unknown_family_and_format(copy):
    _edit(copy, lambda m: m.update(family="qwen9"))
    with pytest.raises(ArtifactError, match="family 'qwen9' is not supported"):
        load_artifact(copy)
    _edit(copy, lambda m: m.update(family="qwen3_tts", format=99))
    with pytest.raises(ArtifactError, match="format 99 is not supported"):
        load_artifact(copy)


def test_an_artifact_from_before_the_draft_graph_is_refused_naming_the_fix(copy):
    def drop(m):
        del m["files"]["code_predictor_draft"], m["tensors"]["code_predictor_draft"]

    _edit(copy, drop)
    with pytest.raises(ArtifactError, match=r"no code_predictor_draft graph: .* export the checkpoint again"):
        load_artifact(copy)


def test_special_id_out_of_range(copy):
    _edit(copy, lambda m: m["special"].update(codec_eos=5000))
    with pytest.raises(ArtifactError, match=r"special\.codec_eos=5000 is outside the talker vocab"):
        load_artifact(copy)


@pytest.mark.parametrize("key,factor,message", [
    ("hidden", 2, r"embeddings\.safetensors: tensor 'text_projected' has shape"),
    ("code_groups", 2, r"embeddings\.safetensors: tensor 'cp_heads' has shape \(3, 64, 2048\), artifact\.json dims "
                       r"imply \(7, any, 2048\)"),
])
def test_mismatched_dims_name_the_table(copy, backend, key, factor, message):
    _edit(copy, lambda m: m["dims"].update({key: m["dims"][key] * factor}))
    with pytest.raises(ArtifactError, match=message):
        _boot(copy, backend)


@pytest.mark.parametrize("key,delta,message", [
    ("kv_heads", 1, r"talker\.onnx: tensor past_keys_0 has shape"),
    ("layers", 1, r"talker\.onnx: has no tensor past_keys_2"),
])
def test_mismatched_dims_name_graph_and_tensor(copy, backend, key, delta, message):
    _edit(copy, lambda m: m["dims"].update({key: m["dims"][key] + delta}))
    with pytest.raises(EngineError, match=message):
        _boot(copy, backend)


def test_corrupt_graph_names_the_file(copy, backend):
    (copy / "code_predictor.onnx").write_bytes(b"not an onnx graph")
    with pytest.raises(EngineError, match=r"code_predictor\.onnx: cannot be loaded"):
        _boot(copy, backend)


def test_corrupt_embeddings_names_the_file(copy, backend):
    (copy / "embeddings.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ArtifactError, match=r"embeddings\.safetensors: cannot be read"):
        _boot(copy, backend)


def test_missing_embedding_tensor(copy, backend):
    from safetensors.numpy import load_file, save_file

    tables = load_file(str(copy / "embeddings.safetensors"))
    tables.pop("codec_embedding")
    save_file(tables, str(copy / "embeddings.safetensors"))
    with pytest.raises(ArtifactError, match=r"embeddings\.safetensors: missing tensor 'codec_embedding'"):
        _boot(copy, backend)


def test_vocoder_state_shape_mismatch_names_the_tensor(copy, backend):
    _edit(copy, lambda m: m["tensors"]["vocoder"]["state"][0].update(shape=[7, 7]))
    with pytest.raises(EngineError, match=r"vocoder\.onnx: tensor state_in_0 has shape"):
        _boot(copy, backend)


def test_vocoder_state_list_missing(copy):
    _edit(copy, lambda m: m["tensors"]["vocoder"].pop("state"))
    with pytest.raises(ArtifactError, match=r"'tensors\.vocoder\.state'"):
        load_artifact(copy)


def test_optional_graphs_are_carried_and_checked(copy, backend):
    """A family may declare optional graphs (a speaker encoder): listed ones load, their files must
    exist, and a graph the family does not know is an error."""
    shutil.copy(copy / "code_predictor.onnx", copy / "speaker_encoder.onnx")

    def add(role: str):
        def change(m):
            m["files"][role] = "speaker_encoder.onnx"
            m["tensors"][role] = dict(m["tensors"]["code_predictor"])
        return change

    _edit(copy, add("speaker_encoder"))
    artifact = load_artifact(copy)
    assert artifact.file("speaker_encoder") == copy / "speaker_encoder.onnx"
    assert artifact.graphs["speaker_encoder"].inputs == artifact.graphs["code_predictor"].inputs
    assert _boot(copy, backend).claimed["kv_cache"] > 0
    (copy / "speaker_encoder.onnx").unlink()
    with pytest.raises(ArtifactError, match=r"speaker_encoder\.onnx: missing from the artifact"):
        load_artifact(copy)
    _edit(copy, lambda m: (m["files"].pop("speaker_encoder"), m["tensors"].pop("speaker_encoder")))
    shutil.copy(copy / "code_predictor.onnx", copy / "speaker_encoder.onnx")
    _edit(copy, add("thinker"))
    with pytest.raises(ArtifactError, match=r"graphs \['thinker'\] are not known to family qwen3_tts"):
        load_artifact(copy)


def test_the_manifest_reads_back_what_it_writes(builtin_artifact):
    """One definition: the manifest the toolchain writes (Manifest.to_json) is the file on disk."""
    manifest = json.loads((builtin_artifact / "artifact.json").read_text())
    assert load_artifact(builtin_artifact).to_json() == manifest
