"""Same outputs before and after a change of the pipeline's internals: every file migrated, its result saved.

    .venv/bin/python benchmarks/same_outputs.py save OUT.json [DIR ...] [--targets sagemaker,2.9]
    .venv/bin/python benchmarks/same_outputs.py compare OLD.json [DIR ...] [--targets sagemaker,2.9]

DIR: folders of ``.py`` and ``.ipynb`` files (any depth; default: the developers' corpus
``~/.cache/xla-migrate/corpus`` when it exists, see docs/corpus.md, and ``fixtures/realistic``). Each file is
migrated in this process (``xla_migrate.migrate_file``) for each target; saved per file and target: a hash of
the output bytes, the changes, the findings (with their end positions), the error, the data-parallel form
and the releases. ``compare`` migrates again and prints every file whose record differs (exit 1), else how
many records are the same. For changes meant to keep behaviour (issue 38's speed work): run ``save`` at the
base commit, ``compare`` after. Nothing of the corpus is kept but hashes and the tool's own messages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path.home() / ".cache" / "xla-migrate" / "corpus"


def files(folders: list[Path]) -> list[Path]:
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.suffix in (".py", ".ipynb") and path.is_file() and not any(
                    part.startswith(".") or part == "__pycache__" for part in path.relative_to(folder).parts):
                found.append(path)
    return found


def record(path: Path, target: str) -> dict:
    from xla_migrate import migrate_file

    result = migrate_file(path, target=target)
    items = lambda rows: [[*row.to_dict().values(), row.end_line, row.end_column] for row in rows]  # noqa: E731
    return {"output": hashlib.sha256(result.output_bytes).hexdigest(), "changes": items(result.changes),
            "findings": items(result.findings), "error": str(result.error) if result.error else None,
            "data_parallel": result.data_parallel, "releases": repr(result.releases)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("save", "compare"))
    parser.add_argument("json")
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--targets", default="sagemaker,2.9")
    args = parser.parse_args()
    folders = args.folders or [f for f in (CORPUS, ROOT / "fixtures" / "realistic") if f.is_dir()]
    targets = args.targets.split(",")
    old = json.loads(Path(args.json).read_text()) if args.mode == "compare" else {}
    records, differ, start = {}, [], time.perf_counter()
    for path in files(folders):
        for target in targets:
            key = f"{path}::{target}"
            records[key] = record(path, target)
            if args.mode == "compare" and old.get(key) != records[key]:
                differ.append(key)
                print(f"DIFFERS {key}: " + ", ".join(
                    field for field in records[key] if (old.get(key) or {}).get(field) != records[key][field]),
                      flush=True)
    if args.mode == "save":
        Path(args.json).write_text(json.dumps(records, indent=0, sort_keys=True))
        print(f"saved {len(records)} records in {time.perf_counter() - start:.0f} s")
        return 0
    missing = sorted(set(old) - set(records))
    for key in missing:
        print(f"MISSING {key}")
    print(f"{len(records) - len(differ)} of {len(records)} records the same, {len(differ)} differ, "
          f"{len(missing)} missing ({time.perf_counter() - start:.0f} s)")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
