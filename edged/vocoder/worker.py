"""The vocoder on a thread of its own: it decodes the windows of one step while the step thread
makes the next frame, so a frame costs max(generation, vocoder) rather than their sum.

The step thread stages windows (`VocoderStage.next_window`: bookkeeping and a copy of their codes)
and hands a list of them over (`start`); the worker runs their bound plans, in order, on the
vocoder's own engines (a backend of its own, with its own thread budget), and the step thread
`wait`s for the list before it reads the windows or stages more (`done` says whether it would wait).
Between `start` and `wait` the list and the PCM buffers its windows write are the worker's. Two
plain locks pass the turn back and forth, so a handover allocates nothing. An error in the worker
is handed back: `wait` raises it. Not `threaded`, there is no thread: `run` decodes on the caller's
(TensorRT's one CUDA stream, or a plan that gives the vocoder no thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from edged.backends import EngineError
from edged.vocoder.stage import Window


class VocoderWorker:
    def __init__(self, fill: Callable[[Window], None], *, threaded: bool):
        self.fill = fill
        self.threaded = threaded
        self.windows: list[Window] = []
        self.busy = False
        self.error: Exception | None = None
        self.closing = not threaded
        self._go = threading.Lock()  # held while there is nothing to decode
        self._go.acquire()
        self._done = threading.Lock()  # held until the windows handed over are decoded
        self._done.acquire()
        if threaded:
            self._thread = threading.Thread(target=self._run, name="edged-vocoder", daemon=True)
            self._thread.start()

    def start(self, windows: list[Window]) -> None:
        """Decode `windows` on the worker (the list is the worker's until `wait`)."""
        assert self.threaded and not self.busy
        self.windows, self.busy = windows, True
        self._go.release()

    def done(self) -> bool:
        """Whether the windows handed over last are decoded (`wait` would not block)."""
        return not self.busy or not self._done.locked()

    def wait(self) -> None:
        """Until the windows handed over last are decoded; raises what decoding them raised."""
        if not self.busy:
            return
        self._done.acquire()
        self.busy = False
        if self.error is not None:
            error, self.error = self.error, None
            raise EngineError(f"vocoder: {error}") from error

    def run(self, windows: list[Window]) -> None:
        """Decode `windows` now (on the worker, or here when not threaded), and wait for them."""
        if not self.threaded:
            for window in windows:
                self.fill(window)
            return
        self.start(windows)
        self.wait()

    def close(self) -> None:
        """Stop the thread (after what it is decoding); idempotent."""
        if self.closing:
            return
        if self.busy:
            self._done.acquire()
            self.busy = False
        self.closing = True
        self._go.release()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            if self.closing:
                return
            try:
                for window in self.windows:
                    self.fill(window)
            except Exception as exc:  # handed back to the step thread, which fails the step
                self.error = exc
            self._done.release()
