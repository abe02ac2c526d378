"""Local audio: the speaker (`speaker.Speaker` over `playback.Playback` and its DAC-accurate cursor),
the microphone (`listener.Listener`: echo cancelling, Silero VAD, barge-in), and their parts.

Nothing here loads PortAudio at import; the streams do when they open.
"""
