"""Streamed text input through the real daemon over the protocol: what an LLM client sees.

1. A streamed reply makes the frames of the same text sent whole with the dual-track layout, and
   of `edged synth --dual-track`.
2. Bad input gets an `error` naming the id; an empty stream, text beyond the KV room, a stream that
   stops sending (the text timeout), a cancel at any point and SIGTERM each end the reply with
   exactly one `done`, and the daemon keeps serving.
3. The first piece has a wait of its own (daemon.first_text_timeout_ms): a late one is spoken, none
   at all ends the reply with an error; after it, a gap beyond daemon.text_timeout_ms makes the text final.
4. Reasoning and markdown are not spoken (text_filter "llm", a stream's default): the frames are
   those of the plain text, however the pieces were cut.
5. `edged say -` speaks standard input as it comes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from edged.client import Client, ProtocolError, RequestRejected
from edged.llm_text import filter_llm_text

TEXT = "Well, here's the answer you asked for: it's twelve o'clock, and the café is still open."
FRAMES = 60
REASONED = ("<think>\nThe user asked for the time. Keep it *short*.\n</think>\n\n**Well**, here's the answer you "
            "asked for: it's *twelve o'clock*, and the [café](https://example.org/cafe_(open)) is still open.")
"""An LLM's reply whose spoken text is TEXT."""


def words(text: str) -> list[str]:
    parts = text.split(" ")
    return [parts[0]] + [" " + w for w in parts[1:]]


def test_streamed_equals_whole_and_synth(start_daemon, tmp_path):
    daemon = start_daemon()
    with Client(daemon.endpoint) as client:
        whole = client.speak(TEXT, voice="ryan", play=False, max_audio_ms=FRAMES * 80, report_codes=True).wait()
        streamed = client.speak_iter(iter(words(TEXT)), voice="ryan", play=False, max_audio_ms=FRAMES * 80,
                                     report_codes=True).wait()
        by_char = client.speak_iter(iter(TEXT), voice="ryan", play=False, max_audio_ms=FRAMES * 80,
                                    report_codes=True).wait()
    codes = tmp_path / "codes.json"
    done = subprocess.run([sys.executable, "-m", "edged", "synth", "--text", TEXT, "--speaker", "ryan", "--greedy",
                           "--dual-track", "--max-frames", str(FRAMES), "--out", str(tmp_path / "x.wav"),
                           "--codes", str(codes)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    offline = json.loads(codes.read_text())["frames"]
    assert streamed.reason == by_char.reason == "length"
    assert streamed.report["rvq_codes"] == by_char.report["rvq_codes"] == offline
    assert whole.report["rvq_codes"] != offline  # the default layout reads all text in the prefill
    assert streamed.report["stages"][0]["text_tokens"] == by_char.report["stages"][0]["text_tokens"] > 20


def test_bad_text_messages_get_errors_naming_the_id(start_daemon):
    daemon = start_daemon()
    with Client(daemon.endpoint) as client:
        client.send_text("nobody", "hello")
        with pytest.raises(ProtocolError, match="text: no speak with id 'nobody' is in flight"):
            client.status()
        plain = client.speak("Not a stream.", play=False, max_audio_ms=4000)
        client.send_text(plain.id, "more")
        with pytest.raises(ProtocolError, match=f"text: speak '{plain.id}' was not sent with more_text"):
            plain.wait()
        stream = client.speak("Hello", more_text=True, play=False, max_audio_ms=800)
        stream.end(" there.")
        client.send_text(stream.id, " too late")
        with pytest.raises(ProtocolError, match=f"text: speak '{stream.id}' already had its final text"):
            stream.wait()
        assert stream.wait().reason == "length"
        empty = client.speak("", more_text=True, play=False)
        empty.end("  ")
        done = empty.wait()
        assert (done.reason, done.error, done.report["frames"]) == ("error", "text is empty", 0)
        assert client.speak("Still serving.", play=False, max_audio_ms=400).wait().reason == "length"


def test_text_beyond_the_kv_room_ends_with_length_and_says_so(start_daemon):
    daemon = start_daemon()  # the built-in artifact: 512 KV slots
    long = " ".join(["word"] * 700)
    with Client(daemon.endpoint, timeout_s=120) as client:
        done = client.speak_iter(iter(words(long)), play=False).wait()
    assert done.reason == "length" and done.report["text_truncated"] is True
    assert done.report["frames"] == done.report["stages"][0]["max_frames"]


def test_a_stream_that_stops_sending_is_final_after_the_text_timeout(start_daemon):
    daemon = start_daemon(config="[daemon]\ntext_timeout_ms = 300\n")
    with Client(daemon.endpoint) as client:
        stream = client.speak("Hello there, this stream just stops", more_text=True, play=False,
                              max_audio_ms=4000)
        t0 = time.monotonic()
        done = stream.wait()
    assert done.reason in ("eos", "length") and done.report["text_timed_out"] is True
    assert done.report["text_timeout"] == "daemon.text_timeout_ms"
    assert time.monotonic() - t0 >= 0.3
    assert done.report["stages"][0]["text_tokens"] > 5  # the held-back last word was spoken too


def test_a_first_piece_later_than_the_text_timeout_is_spoken(start_daemon):
    """Until the first piece, only first_text_timeout_ms applies (counted from acceptance; an empty
    piece is no text); after it, a gap beyond text_timeout_ms makes the text final, and all of it is
    spoken: the frames of the same text sent at once."""
    daemon = start_daemon(config="[daemon]\ntext_timeout_ms = 300\nfirst_text_timeout_ms = 60000\n")
    common = dict(voice="ryan", play=False, max_audio_ms=FRAMES * 80, report_codes=True)
    with Client(daemon.endpoint) as client:
        late = client.speak("", more_text=True, **common)
        assert late.next_event().op == "accepted"
        late.feed("")
        time.sleep(1.5)  # five text timeouts after its acceptance
        late.feed(TEXT)  # and then nothing more
        done = late.wait()
        prompt = client.speak(TEXT, more_text=True, **common)
        prompt.end()
        at_once = prompt.wait()
    assert done.reason == at_once.reason == "length" and done.error is None
    assert done.report["text_timed_out"] is True and done.report["text_timeout"] == "daemon.text_timeout_ms"
    assert done.report["queued_ms"] >= 1500  # it waited in the queue for its first token
    assert done.report["rvq_codes"] == at_once.report["rvq_codes"]
    assert at_once.report["text_timed_out"] is False and "text_timeout" not in at_once.report


def test_no_text_within_the_first_text_timeout_ends_the_reply(start_daemon):
    daemon = start_daemon(config="[daemon]\ntext_timeout_ms = 100\nfirst_text_timeout_ms = 800\n")
    with Client(daemon.endpoint) as client:
        stream = client.speak("", more_text=True, play=False)
        stream.feed("")  # empty pieces are no text
        done = stream.wait()
        client.send_text(stream.id, "too late")
        with pytest.raises(ProtocolError, match="text: no speak with id"):
            client.status()
        assert client.speak("Still serving.", play=False, max_audio_ms=400).wait().reason == "length"
    assert (done.reason, done.error) == ("error", "no text came within daemon.first_text_timeout_ms (800 ms)")
    assert done.report["text_timed_out"] is True and done.report["text_timeout"] == "daemon.first_text_timeout_ms"
    assert done.report["frames"] == 0 and done.report["queued_ms"] >= 800


def test_reasoning_and_markdown_are_not_spoken(start_daemon):
    """A streamed reply with a think block and markdown, cut by word or by character, makes the frames
    of its plain text sent in one piece; text_filter "none" speaks the markup; a whole text is
    filtered when it asks for "llm"; a stream that is all reasoning has nothing to speak."""
    assert filter_llm_text(REASONED) == TEXT
    daemon = start_daemon()
    common = dict(voice="ryan", play=False, max_audio_ms=FRAMES * 80, report_codes=True)
    with Client(daemon.endpoint) as client:
        plain = client.speak(TEXT, more_text=True, text_filter="none", **common)
        plain.end()
        plain_done = plain.wait()
        by_word = client.speak_iter(iter(words(REASONED)), **common).wait()
        by_char = client.speak_iter(iter(REASONED), **common).wait()
        unfiltered = client.speak_iter(iter(words(REASONED)), text_filter="none", **common).wait()
        whole = client.speak(TEXT, **common).wait()
        whole_filtered = client.speak(REASONED, text_filter="llm", **common).wait()
        thinking = client.speak_iter(iter(["<think>Only", " thinking", "</think>\n"]), play=False).wait()
        with pytest.raises(RequestRejected, match="text is empty"):
            client.speak("<think>Only thinking</think>", text_filter="llm", play=False).wait()
    codes = plain_done.report["rvq_codes"]
    assert by_word.report["rvq_codes"] == by_char.report["rvq_codes"] == codes
    assert by_word.report["stages"][0]["text_tokens"] == plain_done.report["stages"][0]["text_tokens"]
    assert unfiltered.report["rvq_codes"] != codes
    assert whole_filtered.report["rvq_codes"] == whole.report["rvq_codes"]
    assert (thinking.reason, thinking.error) == (
        "error", "text is empty after the llm text filter (all of it was reasoning or markup)")


def test_cancel_at_any_point_of_a_stream(start_daemon):
    daemon = start_daemon()
    with Client(daemon.endpoint) as client:
        before = client.speak("Hel", more_text=True, play=False)  # no text is certain yet: not started
        before.cancel()
        assert before.wait().reason == "cancelled" and before.done.report["frames"] == 0
        waiting = client.speak("Hello there, ", more_text=True, play=False)
        deadline = time.monotonic() + 30
        while client.status()["cohort"]["waiting_for_text"] != [str(waiting.id)]:  # it speaks what it has, then waits
            assert time.monotonic() < deadline, client.status()["cohort"]
            time.sleep(0.02)
        waiting.cancel()
        done = waiting.wait()
        assert done.reason == "cancelled" and done.report["text_wait_frames"] > 0
        client.send_text(waiting.id, "more")  # the request is over: an error, and the daemon carries on
        with pytest.raises(ProtocolError, match="no speak with id"):
            client.status()
        assert client.status()["state"] == "serving"


def test_sigterm_drains_an_open_stream(start_daemon):
    daemon = start_daemon(config="[daemon]\ndrain_timeout_s = 0.5\n")
    with Client(daemon.endpoint) as client:
        stream = client.speak("An open stream, ", more_text=True, play=False)
        assert stream.next_event().op == "accepted"  # in flight before the signal, however loaded the machine
        daemon.proc.send_signal(15)
        done = stream.wait()
    assert done.reason == "cancelled"
    assert daemon.proc.wait(timeout=30) == 0


def test_say_dash_speaks_standard_input_as_it_comes(start_daemon, tmp_path):
    daemon = start_daemon()
    writer = ("import sys, time\n"
              "for w in 'Piped from a slow writer, a few words at a time.'.split(' '):\n"
              "    sys.stdout.write(w + ' '); sys.stdout.flush(); time.sleep(0.05)\n")
    feeder = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE)
    say = subprocess.run([sys.executable, "-m", "edged", "say", "-", "--no-play", "--endpoint", daemon.endpoint,
                          "--max-audio-ms", "6000", "--out", str(tmp_path / "out.wav")],
                         stdin=feeder.stdout, capture_output=True, text=True, timeout=120)
    feeder.wait()
    assert say.returncode == 0, say.stderr
    report = json.loads(say.stdout)
    assert report["reason"] in ("eos", "length") and report["stages"][0]["text_tokens"] > 10
    assert (tmp_path / "out.wav").stat().st_size > 44
