"""Audio track decode for audio-video clips: same start as the video, stereo, fixed length."""

from __future__ import annotations

import io

import numpy as np

from fgdata.media.errors import VideoDecodeError


def decode_audio(
    data: bytes, start: float, duration: float, target_sample_rate: int | None = None
) -> tuple[np.ndarray, int] | None:
    """Decode ``duration`` s of the first audio stream from ``start`` s.

    Returns ``(float32 [2, N] in [-1, 1], rate)`` with ``N = round(duration * rate)``, trimmed or
    zero-padded so clips collate; ``None`` when the container has no audio stream. Mono is
    duplicated to both channels; other layouts are downmixed to stereo by
    libswresample, which also resamples to ``target_sample_rate`` when given.
    """
    import av

    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            rate = int(target_sample_rate or stream.sample_rate)
            mono = stream.channels == 1
            resampler = av.AudioResampler(
                format="fltp", layout="mono" if mono else "stereo", rate=rate
            )
            n = round(duration * rate)
            if start > 0:
                container.seek(int(start / (stream.time_base or 1)), stream=stream)
            chunks: list[np.ndarray] = []
            first_time: float | None = None
            have = 0
            end = start + duration
            for frame in container.decode(stream):
                t = float(frame.time) if frame.time is not None else 0.0
                if t + frame.samples / frame.sample_rate <= start:
                    continue  # wholly before the clip (the seek lands on an earlier packet)
                if first_time is None:
                    first_time = t
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray())
                    have += out.samples
                if t >= end and have >= n + round((start - first_time) * rate):
                    break
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray())
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"cannot decode audio: {e}") from e
    channels = 1 if mono else 2
    wave = np.concatenate(chunks, axis=1) if chunks else np.zeros((channels, 0), np.float32)
    skip = max(0, round((start - (first_time or 0.0)) * rate))
    wave = wave[:, skip : skip + n]
    if wave.shape[1] < n:
        wave = np.pad(wave, ((0, 0), (0, n - wave.shape[1])))
    if mono:
        wave = np.repeat(wave, 2, axis=0)
    return np.clip(wave, -1.0, 1.0).astype(np.float32, copy=False), rate
