"""Fake data in the shapes real programs read, made with the standard library only (no download, no weights).

Every maker is deterministic (seeded), so the original and the migrated copy read the same bytes.
"""

from __future__ import annotations

import array
import gzip
import math
import random
import struct
import wave
import zlib
from pathlib import Path


def png_bytes(width: int, height: int, seed: int, channels: int = 3) -> bytes:
    """A PNG of smooth noise (8-bit grey, RGB or RGBA); PIL reads it whatever the file's extension."""
    rng = random.Random(seed)
    base = [rng.randrange(256) for _ in range(channels)]
    rows = []
    for y in range(height):
        row = bytearray([0])  # filter type: none
        for x in range(width):
            for c in range(channels):
                row.append((base[c] + 7 * x + 5 * y + rng.randrange(32)) % 256)
        rows.append(bytes(row))
    color_type = {1: 0, 3: 2, 4: 6}[channels]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
            + chunk(b"IEND", b""))


def mask_png(path: Path, width: int, height: int, seed: int, values=(0, 255)) -> None:
    """A one-channel mask made of rectangles of the given values."""
    rng = random.Random(seed)
    x0, y0 = rng.randrange(width // 2), rng.randrange(height // 2)
    rows = []
    for y in range(height):
        row = bytearray([0])
        for x in range(width):
            row.append(values[1] if x0 <= x < x0 + width // 2 and y0 <= y < y0 + height // 2 else values[0])
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
                     + chunk(b"IEND", b""))


def image(path: Path, size: int | tuple[int, int], seed: int, channels: int = 3) -> None:
    width, height = (size, size) if isinstance(size, int) else size
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_bytes(width, height, seed, channels))


def image_folder(root: Path, classes: int, per_class: int, size: int, ext: str = "png", seed: int = 0) -> None:
    """torchvision ImageFolder's layout: root/class_k/img_i.ext."""
    for k in range(classes):
        for i in range(per_class):
            image(root / f"class_{k}" / f"img_{i}.{ext}", size, seed * 100_000 + k * 1000 + i)


def flat_images(root: Path, count: int, size: int, ext: str = "png", seed: int = 0, prefix: str = "img_") -> None:
    for i in range(count):
        image(root / f"{prefix}{i:04d}.{ext}", size, seed * 100_000 + i)


def idx_images(path: Path, count: int, rows: int = 28, cols: int = 28, seed: int = 0, compress: bool = False) -> None:
    """An MNIST idx3-ubyte file."""
    rng = random.Random(seed)
    data = struct.pack(">IIII", 2051, count, rows, cols) + bytes(rng.randrange(256) for _ in range(count * rows * cols))
    _write(path, data, compress)


def idx_labels(path: Path, count: int, classes: int = 10, seed: int = 0, compress: bool = False) -> None:
    """An MNIST idx1-ubyte file."""
    rng = random.Random(seed + 1)
    _write(path, struct.pack(">II", 2049, count) + bytes(rng.randrange(classes) for _ in range(count)), compress)


def mnist_raw(root: Path, train: int = 64, test: int = 32, seed: int = 0) -> None:
    """torchvision's MNIST/FashionMNIST layout under root/<Name>/raw (uncompressed; no download is tried)."""
    for name in ("MNIST", "FashionMNIST"):
        raw = root / name / "raw"
        idx_images(raw / "train-images-idx3-ubyte", train, seed=seed)
        idx_labels(raw / "train-labels-idx1-ubyte", train, seed=seed)
        idx_images(raw / "t10k-images-idx3-ubyte", test, seed=seed + 7)
        idx_labels(raw / "t10k-labels-idx1-ubyte", test, seed=seed + 7)


def cifar10_batches(root: Path, train: int = 64, test: int = 32, seed: int = 0) -> None:
    """torchvision's CIFAR10 layout (cifar-10-batches-py, pickled dicts; its checksum check is skipped by
    ``download=False`` only when the md5s match, so recipes use ImageFolder-style data instead where they can)."""
    import pickle

    rng = random.Random(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n: int) -> dict:
        return {b"data": bytes(rng.randrange(256) for _ in range(n * 3072)), b"labels": [rng.randrange(10) for _ in range(n)]}

    for i in range(1, 6):
        _pickle(folder / f"data_batch_{i}", batch(train // 5), pickle)
    _pickle(folder / "test_batch", batch(test), pickle)
    _pickle(folder / "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]}, pickle)


def _pickle(path: Path, value, pickle) -> None:
    path.write_bytes(pickle.dumps(value, protocol=2))


def token_shards(folder: Path, shards: int, tokens: int, vocab: int, seed: int = 0, prefix: str = "data") -> None:
    """uint16 token files (llama2.c / nanoGPT-style .bin shards)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for s in range(shards):
        values = array.array("H", (rng.randrange(vocab) for _ in range(tokens)))
        (folder / f"{prefix}{s:02d}.bin").write_bytes(values.tobytes())


WORDS = ("the a cat dog sat on mat ran to house red blue big small tree river bird sky sun moon "
         "walks eats sees likes happy sad old new fast slow").split()


def sentences(count: int, seed: int = 0, low: int = 4, high: int = 10) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)]


def text_file(path: Path, lines: int, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(sentences(lines, seed)) + "\n", encoding="utf-8")


def wav(path: Path, seconds: float, rate: int = 22050, seed: int = 0, samples: int | None = None) -> None:
    """A mono 16-bit wav of a few tones (``samples`` frames when given, else ``seconds`` long)."""
    rng = random.Random(seed)
    freqs = [rng.uniform(100, 1000) for _ in range(3)]
    frames = array.array("h", (int(8000 * sum(math.sin(2 * math.pi * f * t / rate) for f in freqs) / 3)
                               for t in range(samples or int(seconds * rate))))
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames.tobytes())


def _write(path: Path, data: bytes, compress: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if compress else data)
