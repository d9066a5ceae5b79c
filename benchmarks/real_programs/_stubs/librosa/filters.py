"""librosa.filters.mel with its defaults (htk=False: Slaney's mel scale, linear below 1 kHz and logarithmic above;
norm="slaney": each triangle divided by its width in Hz, so every filter has the same area)."""

import numpy as np

_F_SP = 200.0 / 3  # Hz per mel in the linear part
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(hz):
    hz = np.asanyarray(hz, dtype=np.float64)
    linear = hz / _F_SP
    return np.where(hz >= _MIN_LOG_HZ, _MIN_LOG_MEL + np.log(np.maximum(hz, 1e-10) / _MIN_LOG_HZ) / _LOGSTEP, linear)


def _mel_to_hz(mel):
    mel = np.asanyarray(mel, dtype=np.float64)
    return np.where(mel >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL)), _F_SP * mel)


def mel(sr, n_fft, n_mels=128, fmin=0.0, fmax=None, *args, dtype=np.float32, **kwargs):
    # older programs pass sr, n_fft, n_mels, fmin, fmax positionally (librosa < 0.10 allowed it)
    fmax = sr / 2.0 if fmax is None else fmax
    fft_freqs = np.linspace(0, sr / 2.0, 1 + n_fft // 2)
    mel_freqs = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(mel_freqs)
    ramps = mel_freqs[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_freqs[2:n_mels + 2] - mel_freqs[:n_mels]))[:, None]
    return weights.astype(dtype)
