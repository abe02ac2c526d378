"""Echo cancellation: remove the daemon's own voice from the microphone before the VAD hears it.

The daemon knows what it played: the speaker's tap holds every sample sent to the DAC, and the
listener reads it as a second stream beside the microphone's, so the echo lags its reference by the
output and input latency and the room's own delay. What is left for this module is the room: a
loudspeaker a few centimetres from the microphone, whose echo is louder than any user and whose
reverberation lasts a few hundred ms (docs/dev/echo.md has the measurements behind each choice).

- **Where the echo starts.** The reference is delayed by `lag` before the filter: the known latency
  (given by the listener: the speaker's DAC latency plus the microphone's) less LEAD_BLOCKS blocks,
  so the direct path falls in the filter's first partitions from the first block on. A GCC-PHAT
  search (every half second of sound) moves `lag` only when the echo's peak lies outside those
  partitions (the latency was misreported) and stands MOVE_RATIO above the correlation inside them
  (a user's voice over a reply can peak elsewhere, less high), and the filter starts over there. A latency reported
  long by more than the lead (an audio server's loopback skips the DAC) cannot move `lag` below
  zero: when the echo starts two partitions or more before the prior's direct one, the search
  moves the prior there, where it would otherwise learn at a hundredth of the step.
- **The filter** spans the room: TAIL_S of echo in partitions of one block each (partitioned-block
  frequency-domain filter, overlap-save), adapted as a Kalman filter per bin and partition: each
  partition's step is its uncertainty P over the expected error power. P starts as a prior of how a
  room's echo decays (PRIOR_RT60_S) and shrinks as the filter learns, so the first echo is learned
  fast and a converged filter moves little; it never falls below UNCERTAINTY_FLOOR of the prior, so
  no tap after the direct path is ever sure of itself (a tail learned silent is relearned). The
  error power the filter cannot explain (the user, noise) is estimated each block and slows the
  step: the user's speech cannot bias the filter, and double talk needs no detector and no hold.
- **Path changes.** A person moving or the device being moved changes the echo. The residual then
  follows the echo estimate (a user's voice does not): when the residual coherent with the estimate
  is a good share of the residual (COHERENT_SHARE) and more than P expects (REOPEN), P is scaled up
  to match and no lower than the prior's share of it, and the filter learns again as it did at
  first.
- **The suppressor** (a residual echo suppressor, per bin, on a sqrt-Hann WOLA of the residual):
  the residual echo expected from the filter's uncertainty (sum of P |X|^2), from what the linear
  filter cannot model (a leakage factor times the echo estimate's power: the loudspeaker's
  distortion, estimated by regression as speexdsp does, and learned only on blocks the gate took for
  echo: a user's voice follows the echo's spectrum too; scaled up on a block louder than the average
  it was learned on, as a soft-clipping loudspeaker's distortion grows faster than its level: else a
  loud syllable's distortion passed for the user) and the part of the residual coherent with
  the echo estimate (a path change) is subtracted by a spectral gain (over-subtraction OVER, floor
  FLOOR_DB). The user's speech passes where it stands above the expected residual.
- **What the gate reads.** Per block: the output's energy and the residual echo expected in it
  (after the gain), the coherent part from a faster estimate (GATE_COHERENCE) so that a changed
  path's first blocks are counted as echo too, and the background: per bin the least the smoothed
  residual came to over the last NOISE_WINDOW_S of blocks with no reference in the filter's span
  (minimum statistics), the microphone's and the room's noise, which no echo estimate holds.
  `near_end()` says whether the output stands above that echo and background by NEAR_DB; the
  listener lets speech barge in only on such blocks. A canceller that has not learned the echo
  expects all its prior allows, so its echo never passes as a user, and in a pause of the reply,
  where the echo it expects dies away, the background left is not the user either.

Output: one block out per block in, one block late (the WOLA). All arrays are allocated at
construction.
"""

from __future__ import annotations

import numpy as np

from edged.audio.slide import HALF, Slide

TAIL_S = 0.3
"""Echo the filter spans after the direct path: the energy of a 0.5 s room beyond 300 ms is 50 dB down."""
LEAD_BLOCKS = 2
"""Partitions before the expected direct path (the known latency may be a little long)."""
PRIOR_RT60_S = 0.3
"""The reverberation the prior expects: each partition's prior uncertainty decays 60 dB in this time."""
PRIOR_GAIN = 10.0
"""The echo the prior allows in its direct partition: up to 10 dB above the reference's level (a
microphone next to the loudspeaker). Until the filter has learned the room, it expects this much."""
PROCESS_NOISE = 1e-3
"""The Kalman filter's process noise per block, relative to each tap's power: how fast it forgets."""
UNCERTAINTY_FLOOR = 1e-3
"""No tap after the direct path is more certain than this share of the prior. Process noise scales
with a tap's power, so a tap learned silent (the tail of a dry room) grew certain of it; carried into
a more reverberant room, that tail's echo was then neither relearned nor expected by the suppressor,
and replies cut themselves off in their first seconds (docs/dev/echo.md, "Carried into another room").
The taps before the direct path keep no floor: there it made the first block of a path change
mid-reply pass for the user."""
NEAR_END_SMOOTHING = 0.5
"""Smoothing of the unexplained error power per block (the user and the noise)."""
COHERENCE = 0.85
"""Smoothing of the residual/echo-estimate cross-spectra per block (about 70 ms)."""
GATE_COHERENCE = 0.6
"""The same, faster, for the near-end verdict: a path change must not pass for the user while the
slower estimate catches up."""
GATE_BIAS = (1 - GATE_COHERENCE) / (1 + GATE_COHERENCE)
"""The magnitude-squared coherence an exponential average of that smoothing shows between unrelated
signals (1 / its effective number of blocks): 0.25, as much as a 6 dB verdict allows."""
REOPEN = 2.0
"""The coherent residual must exceed the residual P expects by this factor before P is scaled up..."""
COHERENT_SHARE = 0.25
"""...and be this share of the residual: a changed path's residual follows the echo estimate, a
user's does not (its coherence with the estimate is only the smoothing's bias, about 0.08)."""
MOVE_RATIO = 3.0
"""The delay search moves the filter only to a peak this many times higher than the best correlation at
the delays the filter covers now: an echo that moved leaves noise where it was (a tenth of the new
peak or less), while a user's voice over a reply can peak at another delay at about twice the echo's
correlation, and moving there threw the learned room away."""
UNLEARNED = 0.1
"""The delay search finds an echo, and the filter's taps hold less than this share of the
microphone's power over the reference's (on the blocks where the reference sounds): the echo is new
(the path changed from none)."""
OVER = 2.0
"""Over-subtraction of the expected residual echo in the suppressor's gain."""
FLOOR_DB = -40.0
"""The suppressor's deepest cut."""
SMOOTHING = 0.6
"""Smoothing of the suppressor's power estimates per block (fewer isolated bins left over)."""
LEAK_SMOOTHING = 0.95
"""Smoothing of the leakage regression per block."""
NEAR_DB = 6.0
"""A block is the user's (near end) when its output stands this far above the echo expected in it."""
NOISE_SMOOTHING = 0.9
"""Smoothing of the residual's power per bin per block for the background's estimate."""
NOISE_WINDOW_S = 1.5
"""The background per bin: the least of that smoothed residual power over this long of blocks with
no reference in the filter's span (the echo has died away: the microphone's and the room's noise
alone; minimum statistics, over NOISE_PARTS sub-windows)..."""
NOISE_PARTS = 6
NOISE_BIAS = 1.7
"""...times this: the minimum of a noisy power falls below its mean (white noise's mean power over
that minimum, summed over the bins: 1.7)."""


class EchoCanceller:
    def __init__(self, rate: int, block: int, *, latency: int = 0, max_delay_s: float = 0.5, history_s: float = 1.0) -> None:
        self.rate, self.block = rate, block
        b, bins = block, block + 1
        self.parts = k = int(np.ceil(TAIL_S * rate / block)) + LEAD_BLOCKS
        self.max_lag = int(max_delay_s * rate)
        self.latency = min(max(latency, 0), self.max_lag)
        self.lag = max(0, self.latency - LEAD_BLOCKS * b)
        """Samples the reference is delayed by before the filter."""
        self.delay = b
        """Samples the output lags the input."""
        self.ref = np.zeros(self.max_lag + 3 * b, dtype=np.float32)
        self.spectra = np.zeros((2 * k, bins), dtype=np.complex128)
        """Reference spectra, twice over, so spectra[head:head + parts] is the newest first."""
        self.head = 0
        self.w = np.zeros((k, bins), dtype=np.complex128)
        self.p = np.zeros((k, bins), dtype=np.float64)
        self.bins = bins
        self.direct, self.prior = LEAD_BLOCKS, self._prior(LEAD_BLOCKS)
        """How uncertain each tap is before anything is learned: the echo a room may have, its direct
        path in partition `direct`: where the latency puts it, or where the delay search found it."""
        self.psi = np.zeros(bins)
        self.slide = Slide(b, bins)
        """The echo's delay sliding with two clocks, taken out of the reference (edged/audio/slide.py)."""
        self.frame = np.zeros(2 * b, dtype=np.float32)
        self.err = np.zeros(2 * b)
        self.window = np.sqrt(np.hanning(2 * b + 1)[:-1])  # periodic sqrt-Hann
        self.res_frame = np.zeros(2 * b)
        self.est_frame = np.zeros(2 * b)
        self.tail = np.zeros(b)
        self.s_ey = np.zeros(bins, dtype=np.complex128)
        self.s_yy = np.zeros(bins)
        self.g_ey = np.zeros(bins, dtype=np.complex128)
        self.g_yy = np.zeros(bins)
        self.g_ee = np.zeros(bins)
        self.s_ee = np.zeros(bins)
        self.s_rr = np.zeros(bins)
        self.s_nn = np.zeros(bins)
        self.noise_parts = np.zeros((NOISE_PARTS, bins))
        self.noise_now = np.zeros(bins)
        self.noise = np.zeros(bins)
        """The background per bin (the microphone's noise, the room's): the residual where no echo is left."""
        self.noise_every = max(1, round(NOISE_WINDOW_S * rate / block / NOISE_PARTS))
        self.quiet = self.noise_blocks = 0
        self.p_ey = self.p_yy = 0.0
        self.leak = 0.0
        self.leak_level = 0.0
        self.floor = 10 ** (FLOOR_DB / 10)
        self.hist = max(int(history_s * rate) // b * b, 4 * b)
        self.mic_hist = np.zeros(self.hist, dtype=np.float32)
        self.ref_hist = np.zeros(self.hist + self.max_lag, dtype=np.float32)
        self.nfft = 1 << int(np.ceil(np.log2(self.hist + self.ref_hist.shape[0])))
        self.every = max(1, rate // (2 * b))
        self.reset()

    def reset(self) -> None:
        """Forget the echo path (a new device): filter, uncertainty, delay and histories."""
        for a in (self.ref, self.err, self.res_frame, self.est_frame, self.tail, self.mic_hist, self.ref_hist):
            a[:] = 0.0
        lag = max(0, self.latency - LEAD_BLOCKS * self.block)
        self._restart(lag, (self.latency - lag) // self.block)
        self.slide.reset()
        self.blocks = self.sound_blocks = 0
        self.lags_found = 0
        self.path_changes = 0
        """Episodes of a residual coherent with the echo estimate beyond what the filter expected."""
        self._changing = False
        self.erle_db = 0.0
        """Echo return loss enhancement over the last blocks with sound in the reference (dB)."""
        self._e_mic = self._e_out = 1e-12
        self.out_energy = self.echo_energy = 0.0
        """The last block's output energy and the residual echo energy expected in it (with the background)."""
        self.s_nn[:] = 0.0
        self.quiet = self.noise_blocks = 0
        self.noise_parts[:] = np.inf
        self.noise_now[:] = np.inf
        self.noise[:] = 0.0

    def _prior(self, direct: int) -> np.ndarray:
        """The prior with the direct path in partition `direct`: partitions before it are unlikely,
        the ones after decay as a room of PRIOR_RT60_S."""
        age = np.arange(self.parts) - direct
        decay = 10 ** (-6 * np.maximum(age, 0) * self.block / self.rate / PRIOR_RT60_S)
        decay[age < -1] = 0.01
        decay[age == -1] = 0.3
        return PRIOR_GAIN * decay[:, None] * np.ones(self.bins)

    def _restart(self, lag: int, direct: int) -> None:
        self.lag = lag
        self.slide.forget()
        self.direct, self.prior = direct, self._prior(direct)
        self.spectra[:] = 0.0
        self.w[:] = 0.0
        self.p[:] = self.prior
        self.psi[:] = 0.0
        self.s_ey[:] = self.g_ey[:] = 0.0
        self.s_yy[:] = self.g_yy[:] = self.g_ee[:] = self.s_ee[:] = self.s_rr[:] = 0.0
        self.p_ey = self.p_yy = 0.0
        self.leak = 0.0
        self.leak_level = 0.0

    def shift(self, samples: int) -> None:
        """The reference stream moved by `samples` against the microphone (the listener realigned
        it): move the lag with it and keep the learned filter, when the lag stays in range."""
        lag = self.lag + samples
        self.slide.forget()  # the filter relearns the history the jump misaligned: no move of the echo
        if 0 <= lag <= self.max_lag:
            self.lag = lag
        else:
            self._restart(min(max(lag, 0), self.max_lag), LEAD_BLOCKS)

    def _follow_slide(self) -> None:
        """The reference's fractional delay moves on by the slide's rate, its whole samples into the
        lag; where the lag cannot move (at its bounds, or too short to read ahead of) it stays put."""
        lag = self.lag + self.slide.advance()
        if HALF - 1 <= lag <= self.max_lag:
            self.lag = lag
        else:
            self.slide.frac = 0.0

    def near_end(self) -> bool:
        """The last block's output stands NEAR_DB above the residual echo expected in it."""
        return self.out_energy > 10 ** (NEAR_DB / 10) * self.echo_energy

    def process(self, mic: np.ndarray, ref: np.ndarray, out: np.ndarray) -> None:
        """One block: `mic` and `ref` (len == block) in, the suppressed residual out (the previous
        block's)."""
        b, k = self.block, self.parts
        self.ref[:-b] = self.ref[b:]
        self.ref[-b:] = ref
        self.mic_hist[:-b] = self.mic_hist[b:]
        self.mic_hist[-b:] = mic
        self.ref_hist[:-b] = self.ref_hist[b:]
        self.ref_hist[-b:] = ref
        self.blocks += 1
        self._follow_slide()
        frame = self.frame
        self.slide.frame(self.ref, len(self.ref) - self.lag, frame)
        sound = float(np.dot(frame[b:], frame[b:])) > 1e-7 * b
        if sound:
            self.sound_blocks += 1
            if self.sound_blocks % self.every == 0:
                self.slide.measure(self.w, self.blocks)
                self._search_lag()
                self.slide.frame(self.ref, len(self.ref) - self.lag, frame)

        # the filter: echo estimate and residual (overlap-save)
        self.head = (self.head - 1) % k
        self.spectra[self.head] = self.spectra[self.head + k] = np.fft.rfft(frame)
        x = self.spectra[self.head:self.head + k]  # [parts, bins], the newest first
        x2 = x.real ** 2 + x.imag ** 2
        y = np.fft.irfft(np.einsum("kf,kf->f", self.w, x), 2 * b)[b:]
        e = mic - y
        self.err[b:] = e
        err = np.fft.rfft(self.err)
        expected = np.einsum("kf,kf->f", self.p, x2)  # the residual echo the uncertainty allows

        # the residual as the echo estimate explains it (WOLA domain, the suppressor's)
        self.res_frame[:b] = self.res_frame[b:]
        self.res_frame[b:] = e
        self.est_frame[:b] = self.est_frame[b:]
        self.est_frame[b:] = y
        res = np.fft.rfft(self.res_frame * self.window)
        est = np.fft.rfft(self.est_frame * self.window)
        res2 = res.real ** 2 + res.imag ** 2
        est2 = est.real ** 2 + est.imag ** 2
        c = COHERENCE
        self.s_ey *= c
        self.s_ey += (1 - c) * res * np.conj(est)
        self.s_yy *= c
        self.s_yy += (1 - c) * est2
        coherent = (self.s_ey.real ** 2 + self.s_ey.imag ** 2) / np.maximum(self.s_yy, 1e-20)
        g = GATE_COHERENCE
        self.g_ey *= g
        self.g_ey += (1 - g) * res * np.conj(est)
        self.g_yy *= g
        self.g_yy += (1 - g) * est2
        self.g_ee *= g
        self.g_ee += (1 - g) * res2
        # less the coherence that so short an average shows between unrelated signals (GATE_BIAS):
        # else a user's own voice would count as a share of echo wherever the estimate sounds
        coherent_now = np.maximum(self.g_ey.real ** 2 + self.g_ey.imag ** 2 - GATE_BIAS * self.g_ee * self.g_yy, 0.0)
        coherent_now /= np.maximum(self.g_yy, 1e-20) * (1 - GATE_BIAS)

        if sound:  # silence teaches nothing, and the path is no less known after it
            self._adapt(x, x2, err, expected, coherent, est2, res2)
            if not self.near_end():  # the last block was echo: a user's voice must not pass for leakage
                self._leakage(res2, est2)

        # the suppressor; the loudspeaker's distortion grows faster than its level (a soft clip's odd
        # harmonics: their share of the power with its square), so a syllable louder than those the
        # leakage was learned on leaks more
        level = float(est2.sum())
        leak = self.leak * max(1.0, level / self.leak_level) if self.leak_level > 0 else self.leak
        echo = expected + leak * est2 + coherent
        s = SMOOTHING
        self.s_ee *= s
        self.s_ee += (1 - s) * res2
        self.s_rr *= s
        self.s_rr += (1 - s) * echo
        gain = np.maximum(self.floor, 1 - OVER * self.s_rr / np.maximum(self.s_ee, 1e-20))
        self.quiet = 0 if sound else self.quiet + 1
        if self.quiet > k:  # no reference left in the filter's span: what the microphone has is the background
            self._background(res2)
        self.out_energy = float(np.dot(gain, res2))
        self.echo_energy = float(np.dot(gain, np.maximum(echo, expected + leak * est2 + coherent_now) + self.noise))
        y_out = np.fft.irfft(res * np.sqrt(gain), 2 * b) * self.window
        out[:] = self.tail + y_out[:b]
        self.tail[:] = y_out[b:]
        if sound:
            self._e_mic = 0.95 * self._e_mic + 0.05 * float(np.dot(mic, mic))
            self._e_out = 0.95 * self._e_out + 0.05 * float(np.dot(out, out))
            self.erle_db = float(10 * np.log10(self._e_mic / max(self._e_out, 1e-12)))

    def _background(self, res2: np.ndarray) -> None:
        """The least smoothed residual power per bin over the last NOISE_WINDOW_S of quiet blocks
        (and the blocks since), times NOISE_BIAS."""
        n = NOISE_SMOOTHING
        if self.noise_blocks == 0:  # the smoothing starts from the first block, not from zero
            self.s_nn[:] = res2
        self.s_nn *= n
        self.s_nn += (1 - n) * res2
        np.minimum(self.noise_now, self.s_nn, out=self.noise_now)
        self.noise_blocks += 1
        if self.noise_blocks % self.noise_every == 0:
            self.noise_parts[(self.noise_blocks // self.noise_every) % NOISE_PARTS] = self.noise_now
            self.noise_now[:] = np.inf
        np.min(self.noise_parts, axis=0, out=self.noise)
        np.minimum(self.noise, self.noise_now, out=self.noise)
        self.noise *= NOISE_BIAS

    def _adapt(self, x: np.ndarray, x2: np.ndarray, err: np.ndarray, expected: np.ndarray,
               coherent: np.ndarray, est2: np.ndarray, res2: np.ndarray) -> None:
        """One Kalman step of every partition (the diagonal, partitioned form)."""
        b = self.block
        seen, believed = float(coherent.sum()), float(expected.sum())
        changed = seen > REOPEN * believed and seen > COHERENT_SHARE * float(res2.sum()) and seen > 1e-3 * float(est2.sum())
        if changed:  # the path changed: P was too sure of itself, and the prior says where to look
            self.p *= seen / believed
            np.maximum(self.p, self.prior * min(1.0, seen / float(est2.sum())), out=self.p)
            expected[:] = np.einsum("kf,kf->f", self.p, x2)
            self.path_changes += not self._changing
        self._changing = changed
        err2 = err.real ** 2 + err.imag ** 2
        unexplained = np.maximum(err2 - expected, 0.0)
        self.psi *= NEAR_END_SMOOTHING
        self.psi += (1 - NEAR_END_SMOOTHING) * unexplained
        step = self.p / (expected + 2 * np.maximum(self.psi, unexplained) + 1e-20)
        grad = np.fft.irfft(step * np.conj(x) * err, 2 * b, axis=1)
        grad[:, b:] = 0.0  # each partition is one block of taps (the gradient constraint)
        self.w += np.fft.rfft(grad, axis=1)
        self.p *= 1 - 0.5 * step * x2
        self.p *= 1 - PROCESS_NOISE
        self.p += PROCESS_NOISE * (self.w.real ** 2 + self.w.imag ** 2)
        tail = self.p[self.direct + 1:]
        np.maximum(tail, UNCERTAINTY_FLOOR * self.prior[self.direct + 1:], out=tail)

    def _leakage(self, res2: np.ndarray, est2: np.ndarray) -> None:
        """The residual power that follows the echo estimate's power: what the linear filter cannot
        model (speexdsp's leak estimate: a regression of |residual|^2 on |estimate|^2)."""
        de = res2 - res2.mean()
        dy = est2 - est2.mean()
        r = LEAK_SMOOTHING
        self.p_ey = r * self.p_ey + (1 - r) * float(np.dot(de, dy))
        self.p_yy = r * self.p_yy + (1 - r) * float(np.dot(dy, dy))
        self.leak = min(max(self.p_ey / max(self.p_yy, 1e-30), 0.005), 0.5)
        self.leak_level = r * self.leak_level + (1 - r) * float(est2.sum())

    def _search_lag(self) -> None:
        """GCC-PHAT over the histories: where the microphone best follows the reference. The lag
        moves only when that peak lies outside the filter's lead partitions and stands MOVE_RATIO
        above the best correlation inside them."""
        n = self.nfft
        cross = np.fft.rfft(self.mic_hist, n) * np.conj(np.fft.rfft(self.ref_hist, n))
        cross /= np.abs(cross) + 1e-12
        cc = np.fft.irfft(cross, n)
        # cc[k] = sum_i mic_hist[i + k] ref_hist[i]; an echo mic(t) = ref(t - L) pairs mic_hist[i]
        # with ref_hist[i + max_lag - L], so lag L in [0, max_lag] peaks at k = L - max_lag (mod n)
        lags = np.concatenate([cc[n - self.max_lag:], cc[:1]])
        peak = int(np.argmax(lags))
        height = lags[peak]
        rest = np.delete(lags, slice(max(0, peak - 8), peak + 9))
        if not (height > 6 * (np.std(rest) + 1e-12) and height > 0.05):
            return
        self.lags_found += 1
        b = self.block
        lead = slice(self.lag, self.lag + (LEAD_BLOCKS + 1) * b)
        if not lead.start <= peak < lead.stop:
            if height < MOVE_RATIO * float(lags[lead].max()):  # the echo is still where the filter has it
                return
            lag = max(0, peak - LEAD_BLOCKS * b)
            self._restart(lag, (peak - lag) // b)
            return
        direct = (peak - self.lag) // b
        allowed = self._level(peak)
        if self.lag == 0 and direct <= self.direct - 2:
            # The echo starts where the prior thought it unlikely (the latency was reported long, and
            # the lag cannot start before the reference): the prior moves to it, and those partitions
            # become as uncertain as it says, at the level the microphone has against the reference.
            self.direct, self.prior = direct, self._prior(direct)
            np.maximum(self.p, self.prior * (allowed / PRIOR_GAIN), out=self.p)
            return
        # An echo where the filter has learned next to none (the loudspeaker was silent in the
        # microphone until now, or far quieter): as uncertain as the prior, at the level the
        # microphone now has against the reference.
        learned = float(np.sum(self.w.real ** 2 + self.w.imag ** 2)) / self.w.shape[1]
        if learned < UNLEARNED * allowed:
            np.maximum(self.p, self.prior * (allowed / PRIOR_GAIN), out=self.p)
            self.path_changes += 1

    def _level(self, delay: int) -> float:
        """The microphone's power over the reference's, `delay` samples earlier, on the blocks where
        that reference sounds: a user's voice while the reference was silent (between replies) is no
        echo, and counted would make a learned echo look unlearned."""
        b = self.block
        ref = self.ref_hist[self.max_lag - delay:self.max_lag - delay + self.hist].reshape(-1, b)
        mic = self.mic_hist.reshape(-1, b)
        ref2 = np.einsum("ij,ij->i", ref, ref)
        sounds = ref2 > 1e-7 * b
        return float(np.einsum("ij,ij->", mic[sounds], mic[sounds])) / max(float(ref2[sounds].sum()), 1e-20)

    def echo_delay(self) -> int:
        """Samples from the reference to the echo's strongest tap (the lag and the filter's peak)."""
        taps = np.fft.irfft(self.w, 2 * self.block, axis=1)[:, :self.block]
        return self.lag + round(self.slide.frac) + int(np.argmax(np.abs(taps).ravel()))
