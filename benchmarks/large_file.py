"""Time and peak memory of migrating one generated CUDA script of a given size (default 5 MB).

    python benchmarks/large_file.py [MEGABYTES]

Prints the size, lines, wall and CPU seconds and the peak resident memory of the xla-migrate process.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generate(size: int) -> str:
    """The example script's model, train() and main() repeated under fresh names until ``size`` bytes."""
    source = (ROOT / "fixtures" / "examples" / "train_cuda.py").read_text()
    header, _, body = source.partition("class Net")
    body = body.replace('if __name__ == "__main__":\n    main()\n', "")
    parts, total, index = [header], len(header), 0
    while total < size:
        part = ("class Net" + body).replace("Net", f"Net{index}").replace("def train(", f"def train{index}(") \
            .replace("train(model", f"train{index}(model").replace("def main(", f"def main{index}(")
        parts.append(part)
        total += len(part)
        index += 1
    return "".join(parts)


def main() -> None:
    megabytes = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    text = generate(int(megabytes * 1_000_000))
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "big.py"
        source.write_text(text)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "xla_migrate", "--in", str(source), "--out",
                               str(Path(folder) / "big_xla.py"), "-q"], capture_output=True, text=True)
        wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"size {len(text) / 1e6:.1f} MB, {text.count(chr(10))} lines: exit {done.returncode}, "
          f"{wall:.1f} s wall, {usage.ru_utime:.1f} s CPU, peak memory {usage.ru_maxrss / 1024:.0f} MB")
    if done.returncode:
        print(done.stderr)


if __name__ == "__main__":
    main()
