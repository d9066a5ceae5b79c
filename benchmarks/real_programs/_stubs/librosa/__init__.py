"""A small stand-in for librosa, which speech programs import for two helpers only (the real-programs suite; librosa
itself pulls in numba and audio codecs): ``util.normalize`` and ``filters.mel``, written here from their
definitions (peak normalisation; Slaney's mel scale and area-normalised triangular filters, librosa's defaults)."""

from . import filters, util  # noqa: F401
