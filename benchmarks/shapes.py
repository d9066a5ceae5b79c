"""Generated scripts of one shape each, for the growth benchmark (issue 38) and profiling.

    python benchmarks/shapes.py SHAPE MEGABYTES OUT.py

Shapes: ``functions`` (benchmarks/large_file.py's script: the example's model, train() and main() repeated
under fresh names), ``imports`` (the example with its import block repeated before each copy, as a file
concatenated from many scripts has), ``statements`` (long function bodies of training statements, 500 kB
each: a statement over 1 MB is refused), ``nesting`` (the example's loop nested in classes and functions a
few levels deep, repeated), and ``real``
(real scripts of the developers' corpus, ~/.cache/xla-migrate/corpus, concatenated: third-party code, built
on the fly, never kept; ``from __future__`` lines dropped, since only a file's first statements may have them).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "fixtures" / "examples" / "train_cuda.py"
CORPUS = Path.home() / ".cache" / "xla-migrate" / "corpus"


def _example() -> tuple[str, str]:
    header, _, body = EXAMPLE.read_text().partition("class Net")
    return header, "class Net" + body.replace('if __name__ == "__main__":\n    main()\n', "")


def _renamed(body: str, index: int) -> str:
    return body.replace("Net", f"Net{index}").replace("def train(", f"def train{index}(") \
        .replace("train(model", f"train{index}(model").replace("def main(", f"def main{index}(")


def _repeat(first: str, part, size: int) -> str:
    parts, total, index = [first], len(first), 0
    while total < size:
        piece = part(index)
        parts.append(piece)
        total += len(piece)
        index += 1
    return "".join(parts)


def functions(size: int) -> str:
    header, body = _example()
    return _repeat(header, lambda i: _renamed(body, i), size)


def imports(size: int) -> str:
    header, body = _example()
    return _repeat("", lambda i: header + _renamed(body, i), size)


# A statement over 1,000,000 characters is refused (input_checks.MAX_STATEMENT_CHARS): the long function
# starts again under a new name every STATEMENT_CHARS.
STATEMENT_CHARS = 500_000


def statements(size: int) -> str:
    head = ("    device = torch.device('cuda')\n    model = nn.Linear(8, 2).to(device)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    step = ("    x{i} = torch.randn(4, 8).cuda()\n"
            "    loss{i} = model(x{i}).sum()\n"
            "    optimizer.zero_grad()\n"
            "    loss{i}.backward()\n"
            "    optimizer.step()\n"
            "    print(loss{i}.item())\n")
    per_function = STATEMENT_CHARS // len(step.format(i=10000))
    parts = ["import torch\n", "import torch.nn as nn\n"]
    total, index = sum(map(len, parts)), 0
    while total < size:
        part = (f"\n\ndef main{index // per_function}():\n" + head if index % per_function == 0 else "") + \
            step.format(i=index)
        parts.append(part)
        total += len(part)
        index += 1
    return "".join(parts) + "".join(f"\n\nmain{k}()\n" for k in range(index // per_function + 1))


def nesting(size: int) -> str:
    header, body = _example()

    def part(index: int) -> str:
        inner = _renamed(body, index)
        indented = "".join(("    " * 2 + line) if line.strip() else line for line in inner.splitlines(True))
        return f"class Outer{index}:\n    def build(self):\n{indented}\n\n"
    return _repeat(header, part, size)


def _taken(path: Path) -> str | None:
    """The script's text when CPython and libcst both take it (``from __future__`` lines dropped)."""
    import libcst

    text = path.read_text(encoding="utf-8", errors="replace")
    text = "".join(line for line in text.splitlines(True) if not line.startswith("from __future__"))
    try:
        compile(text, str(path), "exec")
        libcst.parse_module(text)
    except Exception:  # noqa: BLE001 - a file CPython or libcst refuses has no place in the concatenation
        return None
    return text if text.endswith("\n") else text + "\n"


# The corpus's scripts, checked in order as far as a size needs them (checking all 15 MB of them costs more
# than migrating 1 MB), kept for the next size in the same process.
_CHECKED: list[str] = []
_UNCHECKED: list[Path] = []


def real(size: int) -> str:
    if not _CHECKED and not _UNCHECKED:
        _UNCHECKED.extend(reversed(sorted(CORPUS.rglob("*.py"))))
    parts, total, index = [], 0, 0
    while total < size:
        while index >= len(_CHECKED) and _UNCHECKED:
            text = _taken(_UNCHECKED.pop())
            if text is not None:
                _CHECKED.append(text)
        if not _CHECKED:
            raise SystemExit(f"no corpus under {CORPUS} (docs/corpus.md)")
        piece = _CHECKED[index % len(_CHECKED)]
        parts.append(piece)
        total += len(piece)
        index += 1
    return "".join(parts)


SHAPES = {"functions": functions, "imports": imports, "statements": statements, "nesting": nesting,
          "real": real}


if __name__ == "__main__":
    shape, megabytes, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    Path(out).write_text(SHAPES[shape](int(megabytes * 1_000_000)))
