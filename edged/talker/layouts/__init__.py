"""Prefill builders, one per prompt layout: `tts` (Qwen3-TTS); `segments` (Qwen3-Omni) comes next."""
