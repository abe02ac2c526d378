"""The TOML config: defaults, every key validated, unknown keys named, systemd directories."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from edged.config import Config, ConfigError, ThreadPlan, default_endpoint, load_config, runtime_dir, state_dir

INSTALLED_CONFIG = Path(__file__).resolve().parents[1] / "systemd" / "edged.toml"


def write(tmp_path, text: str):
    path = tmp_path / "edged.toml"
    path.write_text(text)
    return path


def documented_block() -> str:
    """The configuration reference's block (the ```toml in docs/configuration.md)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    start = text.index("```toml") + len("```toml")
    return text[start:text.index("```", start)]


def test_the_documented_config_block_is_every_key_at_its_default(tmp_path):
    """The block docs/configuration.md documents loads as the built-in defaults, and names every key
    of every section (keys whose default is "unset" are there as comments)."""
    block = documented_block()
    assert load_config(write(tmp_path, block)) == Config() == load_config(None)
    defaults = Config()
    for section in fields(defaults):
        assert re.search(rf"^\[{section.name}\]", block, re.M), f"docs/configuration.md has no [{section.name}]"
        for key in fields(getattr(defaults, section.name)):
            table = getattr(getattr(defaults, section.name), key.name)
            if is_dataclass(table):  # a table of its own: [daemon.threads]
                name = f"{section.name}.{key.name}"
                assert re.search(rf"^\[{re.escape(name)}\]", block, re.M), f"docs/configuration.md has no [{name}]"
                for sub in fields(table):
                    assert re.search(rf"^{sub.name} = ", block, re.M), f"docs/configuration.md misses {name}.{sub.name}"
            else:
                assert re.search(rf"^#? ?{key.name} = ", block, re.M), f"docs/configuration.md misses {section.name}.{key.name}"


def commented_out(block: str) -> str:
    """The documented block as /etc/edged/edged.toml has it: every key line commented out ("# "), the
    comment lines that continue one moved with it; section headers and comments as they are."""
    lines = []
    for line in block.strip("\n").splitlines():
        if re.match(r"[a-z_]+ = ", line):
            lines.append("# " + line)
        else:
            lines.append("  " + line if line.startswith(" ") else line)
    return "\n".join(lines) + "\n"


def test_the_installed_config_is_the_documented_block_commented_out():
    """systemd/edged.toml, which `make install-system` writes to /etc/edged/edged.toml where there is
    none: a header of comments, then docs/configuration.md's block with every key commented out, so it
    names every key at its default and cannot fall behind the page (or the code: the test above)."""
    text = INSTALLED_CONFIG.read_text()
    body = text[re.search(r"^\[", text, re.M).start():]  # type: ignore[union-attr]
    assert all(line.startswith("#") or not line for line in text[:len(text) - len(body)].splitlines())
    assert body == commented_out(documented_block())
    assert load_config(INSTALLED_CONFIG) == Config()
    assert '#   artifact = "/var/lib/edged/artifacts/NAME"' in text  # where install-system makes room for one


def test_a_full_file(tmp_path):
    cfg = load_config(write(tmp_path, """
[daemon]
listen = "tcp://127.0.0.1:5555"
queue_limit = 3
drain_timeout_s = 1
[daemon.threads]
generation = 2
vocoder = 0
[vocoder]
chunk_frames = 2
[audio]
on_missing_device = "reject"
device = "USB Audio"
input_device = "none"
[vad]
min_speech_ms = 96
[events]
listen = "none"
[history]
path = "/var/lib/edged/h.sqlite3"
policy = "none"
[sampling]
temperature = 0.7
top_k = 20
"""))
    assert cfg.endpoint == "tcp://127.0.0.1:5555" and cfg.daemon.queue_limit == 3
    assert cfg.daemon.threads == ThreadPlan(generation=2, vocoder=0, clone_encoder=1)
    assert cfg.daemon.drain_timeout_s == 1.0 and cfg.vocoder.chunk_frames == 2
    assert cfg.audio.on_missing_device == "reject" and cfg.sampling.temperature == 0.7 and cfg.sampling.top_k == 20
    assert cfg.with_overrides(listen="ipc:///x").endpoint == "ipc:///x"
    assert cfg.audio.device == "USB Audio" and cfg.audio.input_device == "none" and cfg.vad.min_speech_ms == 96
    assert cfg.events_endpoint is None and str(cfg.history_path) == "/var/lib/edged/h.sqlite3"
    assert cfg.history.policy == "none"
    moved = cfg.with_overrides(audio_device="hw:1", input_device="hw:2")
    assert (moved.audio.device, moved.audio.input_device) == ("hw:1", "hw:2")


@pytest.mark.parametrize("text,message", [
    ("[daemon]\nqueue_limt = 3\n", "unknown key 'daemon.queue_limt'"),
    ("[deamon]\n", "unknown key 'deamon'"),
    ("[daemon.threads]\ngeneration = \"two\"\n", "daemon.threads.generation must be int"),
    ("[daemon.threads]\nvocoder = true\n", "daemon.threads.vocoder must be int"),
    ("[daemon.threads]\nvocodr = 1\n", "unknown key 'daemon.threads.vocodr' (known: clone_encoder, generation, vocoder)"),
    ("[daemon.threads]\ngeneration = 0\n", "daemon.threads: generation and clone_encoder must be >= 1, vocoder >= 0"),
    ("[daemon.threads]\nvocoder = -1\n", "daemon.threads: generation and clone_encoder must be >= 1, vocoder >= 0"),
    ("[daemon]\nthreads = 2\n", "[daemon.threads] must be a table (keys: clone_encoder, generation, vocoder), got 2"),
    ("[voices]\nthreads = 2\n", "unknown key 'voices.threads' (moved to daemon.threads.clone_encoder)"),
    ("[daemon]\nbackend = \"cuda\"\n", "daemon.backend must be onnxruntime or tensorrt"),
    ("[vocoder]\nchunk_frames = 0\n", "vocoder.chunk_frames and vocoder.first_chunk_frames must be >= 1"),
    ("[audio]\non_missing_device = \"maybe\"\n", "audio.on_missing_device must be silent or reject"),
    ("[audio]\nahead_ms = 0\n", "audio.ahead_ms must be >= 1"),
    ("[audio]\nbarge_in = 1\n", "audio.barge_in must be bool"),
    ("[audio]\ninput = \"mic\"\n", "unknown key 'audio.input'"),
    ("[vad]\nthreshold = 1.5\n", "vad.threshold must be in"),
    ("[events]\nmic = true\n", "unknown key 'events.mic'"),
    ("[history]\npolicy = \"guess\"\n", "history.policy must be rate, asr or none"),
    ("[history]\npolicy = \"asr\"\n", "history.policy = \"asr\" needs history.asr_url and history.asr_model"),
    ("[history]\nwait_ms = 0\n", "history.wait_ms must be >= 1"),
    ("daemon = 3\n", "[daemon] must be a table"),
    ("[daemon]\nlisten = \"bogus://x\"\n", "daemon.listen must be ipc://PATH or tcp://HOST:PORT, got 'bogus://x'"),
    ("[daemon]\nlisten = \"/run/edged.sock\"\n", "daemon.listen must be ipc://PATH or tcp://HOST:PORT"),
    ("[events]\nlisten = \"udp://x\"\n", "events.listen must be ipc://PATH or tcp://HOST:PORT, or \"none\""),
    ("[daemon\n", "not valid TOML"),
])
def test_bad_config_is_named(tmp_path, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write(tmp_path, text))


def documented_bounds() -> list[tuple[str, str, float]]:
    """(key, ">=" or ">", edge) of each simple bound in docs/configuration.md's "Bounds" table."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    table = text[text.index("## Bounds"):text.index("## Threads per stage")]
    return [(key, op, float(edge)) for key, op, edge in re.findall(r"^\| `([a-z_.]+)` \| (>=?) (-?[\d.]+)", table, re.M)]


def test_every_documented_bound_is_the_one_enforced(tmp_path):
    """At its edge a value loads; one step past it the config is refused, naming the key."""
    bounds = documented_bounds()
    assert len(bounds) >= 25
    defaults = Config()
    for key, op, edge in bounds:
        *section, name = key.split(".")
        default = getattr(defaults, section[0])
        for part in section[1:]:
            default = getattr(default, part)
        kind = type(getattr(default, name))
        step = 1 if kind is int else 0.5
        inside = edge if op == ">=" else edge + step
        header = f"[{'.'.join(section)}]\n"
        assert load_config(write(tmp_path, f"{header}{name} = {kind(inside)!r}\n")), key
        with pytest.raises(ConfigError, match=re.escape(name)):
            load_config(write(tmp_path, f"{header}{name} = {kind(edge - step if op == '>=' else edge)!r}\n"))


def test_a_thread_plan_as_the_command_line_writes_it():
    """`edged synth --threads` reads the plan as `STAGE=N,...`; stages left out keep their defaults."""
    assert ThreadPlan.parse("vocoder=0") == ThreadPlan(generation=1, vocoder=0, clone_encoder=1)
    assert ThreadPlan.parse("generation=2, vocoder=1,clone_encoder=3") == ThreadPlan(2, 1, 3)
    assert ThreadPlan.parse(str(ThreadPlan(2, 0, 3))) == ThreadPlan(2, 0, 3)
    for text, message in (("vocodr=1", "unknown stage 'vocodr'"), ("2", "unknown stage '2'"),
                          ("vocoder=x", "vocoder must be an int, got 'x'"), ("generation=0", "must be >= 1")):
        with pytest.raises(ConfigError, match=message):
            ThreadPlan.parse(text)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")


def test_systemd_directories(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/edged")
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/edged")
    assert str(runtime_dir()) == "/run/edged" and default_endpoint() == "ipc:///run/edged/edged.sock"
    assert str(state_dir()) == "/var/lib/edged"
    (tmp_path / "edged.toml").write_text("[daemon]\nqueue_limit = 5\n")
    monkeypatch.setenv("CONFIGURATION_DIRECTORY", str(tmp_path))
    assert load_config(None).daemon.queue_limit == 5
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert default_endpoint() == "ipc:///run/user/1000/edged/edged.sock"


def test_serve_refuses_a_bad_config_with_exit_2(tmp_path):
    path = write(tmp_path, "[daemon]\nlisten_on = \"tcp://127.0.0.1:1\"\n")
    done = subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"edged serve: boot failed: {path}: unknown key 'daemon.listen_on' (known: ")


def test_serve_exits_2_on_a_listen_address_it_cannot_use(tmp_path):
    """A malformed endpoint is a config error; one that is well formed but cannot be bound fails the
    boot: exit 2 both, one line each, no traceback."""
    base = write(tmp_path, '[audio]\ndevice = "none"\ninput_device = "none"\n[events]\nlisten = "none"\n'
                           '[daemon]\ninsecure_tcp = true\n')
    for listen, wanted in (("bogus://x", "--listen: daemon.listen must be ipc://PATH or tcp://HOST:PORT"),
                           ("tcp://999.1.1.1:5599", "boot failed: ")):
        done = subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(base), "--listen", listen],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and wanted in done.stderr, (listen, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
