#!/usr/bin/env python3
"""Speak an LLM's answers while they are being written: an OpenAI-compatible chat completion, streamed
(server-sent events), fed piece by piece into the edged daemon as streamed text.

    python scripts/llm_speak.py "What is the weather like on Mars?" \\
        --url http://127.0.0.1:8000/v1/chat/completions --model qwen3 [--system TEXT] \\
        [--api-key-file FILE] [--endpoint E] [--voice V] [--language L] [--session S] [--no-play] \\
        [--max-audio-ms N] [--out FILE.wav]

With the prompt `-`, each line of standard input is a user prompt, and each is one exchange, until
the end of the input: a conversation. Each exchange sends the LLM the system message (`--system`),
the conversation so far and the new prompt. With `--session`, the conversation is that session's
history in the daemon, asked for with `wait` right before each exchange, so an answer that was cut
is there as far as it was heard; the prompt is added to it as the user's turn and the answer becomes
the assistant's turn. Without `--session`, the script keeps the conversation itself, each answer as
far as it was read, as the daemon's text filter speaks it (it cannot know what was heard). An answer
the daemon ends early (cancelled, interrupted, `--max-audio-ms`) is read no further.

Only the answer (`delta.content`) is spoken; reasoning sent apart (`delta.reasoning_content`) is not
sent to the daemon, and the daemon does not speak `<think>` blocks or markdown in the answer (the
speak's text filter). Each answer is printed as it arrives; each exchange's `done` report is printed
as one JSON line on stderr. Exit codes: 0 every answer was spoken to its end, 1 one ended otherwise
(cancelled, interrupted, error), 2 the LLM or the daemon refused a request (the next prompt is still
answered).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edged.client import Client, ProtocolError, RequestRejected
from edged.converse.chat import LlmError, completion_pieces
from edged.llm_text import filter_llm_text
from edged.locate import NoDaemon, candidates, daemon_endpoint


class Conversation:
    """The messages of each exchange: the system message, the conversation so far, the new prompt."""

    def __init__(self, client: Client, session: str | None, system: str | None):
        self.client, self.session = client, session
        self.system = [{"role": "system", "content": system}] if system else []
        self.turns: list[dict] = []
        """Without a session: the turns so far, kept here."""

    def ask(self, prompt: str) -> list[dict]:
        """The messages for the LLM, the prompt last; with a session, the prompt joins its history."""
        if self.session is None:
            self.turns.append({"role": "user", "content": prompt})
            return self.system + self.turns
        self.client.turn(self.session, "user", prompt)
        return self.system + self.client.messages(self.session)  # the last answer cut to what was heard

    def answered(self, answer: str) -> None:
        if self.session is None:
            self.turns.append({"role": "assistant", "content": filter_llm_text(answer)})


def prompts(prompt: str) -> Iterator[str]:
    """The prompt, or with "-" each line of standard input that is not blank, as it comes."""
    if prompt != "-":
        yield prompt
        return
    for line in sys.stdin:
        if line.strip():
            yield line.strip()


def echoed(pieces: Iterable[str], answer: list[str]) -> Iterator[str]:
    """The pieces, printed as they pass and kept in `answer`."""
    for piece in pieces:
        print(piece, end="", flush=True)
        answer.append(piece)
        yield piece


def exchange(client: Client, conversation: Conversation, prompt: str, args: argparse.Namespace,
             api_key: str | None, audio: list[tuple[np.ndarray, int | None]]) -> int:
    """One prompt and its spoken answer; the exit code it earns."""
    messages = conversation.ask(prompt)
    utterance = client.speak("", more_text=True, voice=args.voice, language=args.language, session=args.session,
                             play=not args.no_play, stream=args.out is not None, max_audio_ms=args.max_audio_ms)
    failed, answer = None, []
    try:
        for piece in echoed(completion_pieces(args.url, args.model, messages, api_key, args.timeout), answer):
            if not utterance.feed(piece):
                break  # the daemon ended it (rejected, cancelled, interrupted, out of room): the rest is not read
        else:
            utterance.end()
    except LlmError as exc:
        failed = str(exc)
        utterance.cancel()  # what was said so far stays said; the rest never comes
    print(flush=True)
    try:
        done = utterance.wait()
    except RequestRejected as exc:
        print(f"llm_speak: the daemon rejected the request: {exc.reason}", file=sys.stderr)
        return 2
    conversation.answered("".join(answer))
    audio.append((utterance.pcm, utterance.sample_rate))
    unheard = unheard_why(args.no_play, done.report)
    if unheard and args.session is not None:
        print(f"llm_speak: {unheard}, so session {args.session!r} keeps this answer as unheard (\"\", interrupted) "
              f"and the next prompt carries it empty; a client that plays the audio itself acks what it played "
              f"(docs/history.md)", file=sys.stderr)
    if failed:
        print(f"llm_speak: {failed}", file=sys.stderr)
    print(json.dumps({"id": done.id, "reason": done.reason, "error": done.error, **done.report}), file=sys.stderr)
    if failed:
        return 2
    return 0 if done.reason in ("eos", "length") else 1


def unheard_why(no_play: bool, report: dict) -> str | None:
    """Why nobody heard a reply (the history then keeps it as ""), or None."""
    if no_play:
        return "--no-play: the daemon played nothing and this script acks nothing"
    if report.get("playback") == "no output device":
        return "the daemon has no speaker (its report: playback no output device)"
    return None


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prompt", help='the user prompt; "-": one prompt per line of standard input')
    p.add_argument("--url", required=True, help="the chat completions URL (…/v1/chat/completions)")
    p.add_argument("--model", required=True)
    p.add_argument("--system", default=None, help="a system message, first in every exchange")
    p.add_argument("--api-key-file", type=Path, default=None, help="a file holding the API key (sent as a bearer token)")
    p.add_argument("--endpoint", default=None,
                   help=f"the daemon (default: the first of {', '.join(map(str, candidates()))} a daemon listens on)")
    p.add_argument("--voice", default=None)
    p.add_argument("--language", default=None)
    p.add_argument("--session", default=None, help="keep the conversation in this session's history")
    p.add_argument("--no-play", action="store_true", help="do not play on the daemon's speaker")
    p.add_argument("--max-audio-ms", type=positive, default=None, help="stop each answer after this much audio")
    p.add_argument("--out", type=Path, default=None,
                   help="also stream the audio back and write it to a WAV file (every answer, one after another)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the LLM or the daemon")
    args = p.parse_args(argv)

    api_key = args.api_key_file.read_text().strip() if args.api_key_file else None
    code, audio = 0, []  # audio: (pcm, sample rate) of each answer
    try:
        endpoint = daemon_endpoint(args.endpoint)
    except NoDaemon as exc:
        print(f"llm_speak: {exc}", file=sys.stderr)
        return 2
    with Client(endpoint, timeout_s=args.timeout) as client:
        conversation = Conversation(client, args.session, args.system)
        try:
            for prompt in prompts(args.prompt):
                code = max(code, exchange(client, conversation, prompt, args, api_key, audio))
        except (ProtocolError, TimeoutError) as exc:  # e.g. a daemon without history, or none at all
            print(f"llm_speak: the daemon: {exc}", file=sys.stderr)
            return 2
    if args.out is not None:
        from edged.audio.wav import write_wav

        pcm = np.concatenate([a for a, _ in audio]) if audio else np.zeros(0, np.float32)
        write_wav(args.out, pcm, next((rate for _, rate in audio if rate), 24000))
    return code


if __name__ == "__main__":
    sys.exit(main())
