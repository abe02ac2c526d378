"""Local audio: playback with the DAC-accurate cursor (`playback.Playback`) over a PCM ring (`ring.PcmRing`).

Nothing here loads PortAudio at import; `Playback` does when it opens its stream.
"""
