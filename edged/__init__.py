"""edged: an on-device speech daemon for the Qwen3-TTS talker stack."""

__version__ = "0.1.0"
