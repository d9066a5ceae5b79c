"""Build the corpus of real training code, and the whole-repository cache, from fetched git snapshots.

    python3 benchmarks/build_corpus.py [--mirror /work/.mirror] [--corpus DIR] [--repos DIR]
                                       [--only corpus|repos] [--cap N] [--notebook-cap N] [--force]
                                       [--dry-run]

MIRROR holds one bare git directory per repository, ``MIRROR/<owner>+<name>/repo`` (or ``repo/.git``), as the
``fetch`` tool leaves them. Two things are built from each repository's newest commit (HEAD); neither is ever
part of this repository (third-party code):

- the FILE corpus, ``--corpus`` (default ``~/.cache/xla-migrate/corpus``), that ``benchmarks/corpus.py`` runs
  over: for each repository of ``CORPUS`` below, the ``.py`` and ``.ipynb`` files that mention torch and a
  training signal, strongest signals and training-like names first, at most ``--cap`` per repository (of
  them at most ``--notebook-cap`` notebooks), no tests, docs, ``setup.py`` or ``__init__.py`` (docs/corpus.md,
  "Building a corpus"); ``REPOS.md`` there lists each repository, its commit, the files taken and its style;
- the WHOLE-REPOSITORY cache, ``--repos`` (default ``~/.cache/xla-migrate/repos``), that whole programs are run
  from: every repository of MIRROR, its HEAD tree exported as ``git archive HEAD | tar -x`` would, less the
  files over 1 MiB, binary files (a NUL byte in the first 8000 bytes, git's test), symbolic links and
  submodules; ``REPOS.md`` there lists each repository, its commit and what was left out.

Idempotent: a repository folder whose content already matches (corpus) or whose recorded commit is HEAD
(repos, unless ``--force``) is left as it is; otherwise it is rebuilt beside and swapped in. Folders of other
repositories already there are left alone, with a warning. The repositories kept for an independent
evaluation (issue 11) are refused wherever they appear. Exit status: 0, 1 when a repository could not be
read or is missing from MIRROR (the others are still built), 2 for bad arguments. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The corpus of docs/corpus.md (issue 11's 40 repositories) and the style each stands for.
CORPUS = {
    "vwxyzjn/cleanrl": "RL, one file per algorithm",
    "microsoft/Swin-Transformer": "model zoo, main.py + utils, DDP + AMP",
    "ultralytics/yolov5": "detection model zoo, DDP + AMP",
    "milesial/Pytorch-UNet": "segmentation, small project, AMP",
    "facebookresearch/DiT": "diffusion, DDP",
    "karpathy/llama2.c": "LLM pre-training, one script, DDP + autocast",
    "jaywalnut310/vits": "speech (TTS), DDP + AMP",
    "tloen/alpaca-lora": "LLM fine-tuning, HF Trainer + LoRA",
    "bentrevett/pytorch-seq2seq": "tutorial notebooks (NLP)",
    "bentrevett/pytorch-sentiment-analysis": "tutorial notebooks (NLP)",
    "jik876/hifi-gan": "speech (vocoder GAN), DDP",
    "rosinality/stylegan2-pytorch": "GAN, DDP",
    "VainF/DeepLabV3Plus-Pytorch": "segmentation",
    "facebookresearch/detectron2": "detection framework",
    "NVIDIA/tacotron2": "speech (TTS), DDP + apex AMP",
    "aws-neuron/aws-neuron-samples": "already on torch_xla (Neuron)",
    "ronghanghu/vit_10b_fsdp_example": "already on torch_xla (FSDP)",
    "pytorch/ignite": "training library and examples, some on torch_xla",
    "KamilPiechowiak/iatransfer": "research, on torch_xla (TPU)",
    "facebookresearch/fairseq": "sequence-modelling framework, CUDA/TPU hybrid",
    "fco-dv/ignite-playground": "ignite on torch_xla",
    "huggingface/optimum-tpu": "already on torch_xla (TPU, LLM)",
    "mrdbourke/pytorch-deep-learning": "tutorial notebooks and scripts",
    "facebookresearch/barlowtwins": "self-supervised research, DDP",
    "fundamentalvision/Deformable-DETR": "detection research, main.py + engine.py + util",
    "dome272/Diffusion-Models-pytorch": "diffusion tutorial",
    "Lightning-AI/litgpt": "LLM pre-training and fine-tuning (Fabric)",
    "artidoro/qlora": "LLM fine-tuning, HF Trainer, 4-bit",
    "pytorch/torchtitan": "LLM pre-training, FSDP2 + torchrun",
    "meta-llama/llama-recipes": "LLM fine-tuning (FSDP), notebooks",
    "openai/guided-diffusion": "diffusion, DDP",
    "NVlabs/stylegan2-ada-pytorch": "GAN, custom ops, DDP",
    "Atcold/NYU-DLSP20": "course notebooks",
    "jzhang38/TinyLlama": "LLM pre-training (Fabric), XLA paths",
    "mlfoundations/open_clip": "contrastive pre-training, DDP + AMP",
    "lm-sys/FastChat": "LLM fine-tuning and serving",
    "HobbitLong/SupContrast": "contrastive research, small project",
    "sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning": "tutorial (image captioning)",
    "haotian-liu/LLaVA": "multimodal LLM fine-tuning (DeepSpeed)",
    "clovaai/deep-text-recognition-benchmark": "OCR research",
}

# Kept for an independent evaluation (issue 11): never in the corpus nor the cache.
EVALUATION_ONLY = {name.lower() for name in (
    "pytorch/examples", "pytorch/xla", "huggingface/transformers", "huggingface/accelerate", "huggingface/trl",
    "huggingface/peft", "huggingface/pytorch-image-models", "huggingface/alignment-handbook", "karpathy/nanoGPT",
    "karpathy/minGPT", "karpathy/build-nanogpt", "KellerJordan/modded-nanogpt", "facebookresearch/mae",
    "facebookresearch/moco", "facebookresearch/detr", "facebookresearch/deit", "facebookresearch/dino",
    "facebookresearch/ConvNeXt", "eriklindernoren/PyTorch-GAN", "yunjey/pytorch-tutorial",
    "kuangliu/pytorch-cifar", "lucidrains/denoising-diffusion-pytorch", "openai/improved-diffusion",
    "tatsu-lab/stanford_alpaca")}

DEFAULT_CAP = 23  # with the notebook cap, about the size of issue 11's corpus (372 files) from its 40 repositories
DEFAULT_NOTEBOOK_CAP = 5  # a tutorial's notebooks repeat one another's training loop
LARGEST_EXPORTED = 1 << 20  # bytes; larger files (weights, data, generated code) stay out of the repos cache
BINARY_PROBE = 8000  # git calls a file binary when its first 8000 bytes hold a NUL

# As benchmarks/corpus.py counts the files already on XLA.
IMPORTS_TORCH_XLA = re.compile(r"^[ \t]*(?:import[ \t]+torch_xla\b|from[ \t]+torch_xla\b)", re.MULTILINE)
MENTIONS_TORCH = re.compile(r"^\s*(?:import|from)\s+torch\b|\btorch\.", re.MULTILINE)
# Training signals and their weights: a file's strength is the sum over the signals it shows.
SIGNALS = (
    ("torch_xla", re.compile(r"\btorch_xla\b"), 6),
    (".cuda()", re.compile(r"\.cuda\("), 3),
    ("torch.cuda", re.compile(r"\btorch\.cuda\b"), 3),
    ("DDP", re.compile(r"\bDistributedDataParallel\b|\bDDP\b|\bFullyShardedDataParallel\b|\bFSDP\b"), 3),
    ("GradScaler", re.compile(r"\bGradScaler\b"), 3),
    ("autocast", re.compile(r"\bautocast\b"), 3),
    ("init_process_group", re.compile(r"\binit_process_group\b"), 3),
    ("backward", re.compile(r"\.backward\("), 2),
    ("optimizer.step", re.compile(r"\b\w*(?:optim|opt|scaler)\w*\.step\("), 2),
)
TRAINING_NAME = re.compile(r"train|main|engine|trainer|finetun|fine_tun|pretrain|solver|launch|ddp|fsdp|"
                           r"distributed|amp|xla|tpu", re.IGNORECASE)
TRAINING_NAME_BONUS = 2
SKIPPED_FOLDERS = {"test", "tests", "testing", "unittest", "unittests", "doc", "docs", "documentation",
                   "__pycache__"}
SKIPPED_FILES = re.compile(r"^(?:setup\.py|__init__\.py|conftest\.py|test(?:s|ing)?\.py|test_.*\.py|.*_tests?\.py)$")


class BuildError(Exception):
    """A repository that cannot be read; one line."""


# Reading a snapshot -------------------------------------------------------------------------------------------
def git_dir(mirror_entry: Path) -> Path | None:
    for candidate in (mirror_entry / "repo" / ".git", mirror_entry / "repo"):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def _git(directory: Path, *args: str) -> bytes:
    done = subprocess.run(["git", f"--git-dir={directory}", *args], capture_output=True)
    if done.returncode:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise BuildError(f"git {args[0]}: {message[-1] if message else f'exit {done.returncode}'}")
    return done.stdout


@dataclass
class Entry:
    path: str
    mode: str
    kind: str  # blob | commit (submodule)
    sha: str
    size: int | None  # None: a submodule, or a blob the snapshot lacks (files of 4 MiB and more)


def head_tree(directory: Path) -> tuple[str, list[Entry]]:
    """HEAD's commit and every entry of its tree (recursive)."""
    commit = _git(directory, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
    entries = []
    for record in _git(directory, "ls-tree", "-r", "-l", "-z", commit).split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, sha, size = meta.decode().split()
        entries.append(Entry(raw_path.decode("utf-8", "surrogateescape"), mode, kind, sha,
                             int(size) if size.isdigit() else None))
    return commit, entries


class Blobs:
    """Blob contents through one `git cat-file --batch` process; None for a blob the snapshot lacks."""

    def __init__(self, directory: Path):
        self.process = subprocess.Popen(["git", f"--git-dir={directory}", "cat-file", "--batch"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def read(self, sha: str) -> bytes | None:
        self.process.stdin.write(sha.encode() + b"\n")
        self.process.stdin.flush()
        header = self.process.stdout.readline().split()
        if len(header) != 3:  # "<sha> missing": files of 4 MiB and more are not in the snapshots
            return None
        data = self.process.stdout.read(int(header[2]))
        self.process.stdout.read(1)
        return data

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()

    def __enter__(self) -> Blobs:
        return self

    def __exit__(self, *_) -> None:
        self.close()


def safe_path(path: str) -> bool:
    """A tree path that stays inside the folder it is written to."""
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..", ".git") for p in parts)


# The file corpus ----------------------------------------------------------------------------------------------
def code_text(path: str, data: bytes) -> str | None:
    """The code a file holds: a script's text, a notebook's code cells joined; None when it is neither."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not path.endswith(".ipynb"):
        return text
    try:
        cells = json.loads(text).get("cells", [])
    except (ValueError, AttributeError):
        return None
    sources = []
    for cell in cells if isinstance(cells, list) else []:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            source = cell.get("source", "")
            sources.append("".join(source) if isinstance(source, list) else str(source))
    return "\n".join(sources)


def is_candidate(path: str) -> bool:
    if not path.endswith((".py", ".ipynb")):
        return False
    *folders, name = path.split("/")
    if any(f.startswith(".") or f.lower() in SKIPPED_FOLDERS for f in folders):
        return False
    return not name.startswith(".") and not SKIPPED_FILES.match(name)


def strength(path: str, code: str) -> tuple[int, list[str]]:
    """(score, signals shown): 0 without torch or without a training signal."""
    if not MENTIONS_TORCH.search(code):
        return 0, []
    shown = [(name, weight) for name, pattern, weight in SIGNALS if pattern.search(code)]
    if not shown:
        return 0, []
    stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    bonus = TRAINING_NAME_BONUS if TRAINING_NAME.search(stem) else 0
    return sum(weight for _, weight in shown) + bonus, [name for name, _ in shown]


@dataclass
class Selection:
    repo: str
    commit: str
    files: dict[str, bytes] = field(default_factory=dict)  # path -> content, in the order taken
    signals: dict[str, list[str]] = field(default_factory=dict)
    candidates: int = 0


def select(repo: str, directory: Path, cap: int, notebook_cap: int) -> Selection:
    commit, entries = head_tree(directory)
    selection = Selection(repo, commit)
    scored = []
    with Blobs(directory) as blobs:
        for entry in entries:
            if entry.kind != "blob" or entry.mode not in ("100644", "100755") or not is_candidate(entry.path):
                continue
            if not safe_path(entry.path):
                continue
            data = blobs.read(entry.sha)
            code = None if data is None else code_text(entry.path, data)
            if code is None:
                continue
            score, signals = strength(entry.path, code)
            if score:
                scored.append((-score, entry.path.count("/"), entry.path, data, signals))
    selection.candidates = len(scored)
    # Strongest first; among equals the shallower path (entry scripts sit near the top), then by name.
    notebooks = 0
    for _, _, path, data, signals in sorted(scored, key=lambda item: item[:3]):
        if len(selection.files) == cap:
            break
        if path.endswith(".ipynb"):
            if notebooks == notebook_cap:
                continue
            notebooks += 1
        selection.files[path] = data
        selection.signals[path] = signals
    return selection


def folder_matches(folder: Path, files: dict[str, bytes]) -> bool:
    if not folder.is_dir():
        return False
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()}
    return present == set(files) and all((folder / path).read_bytes() == data for path, data in files.items())


def write_tree(folder: Path, files: dict[str, tuple[bytes, bool]]) -> None:
    """Write FOLDER from {path: (content, executable)}: built beside it, then swapped in."""
    staging = folder.with_name(f".{folder.name}.part")  # hidden: benchmarks/corpus.py skips it if left behind
    shutil.rmtree(staging, ignore_errors=True)
    for path, (data, executable) in files.items():
        target = staging / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if executable:
            target.chmod(0o755)
    staging.mkdir(parents=True, exist_ok=True)  # a repository with nothing to export still gets its folder
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)


def corpus_readme(selections: list[Selection]) -> str:
    lines = ["# Corpus of real training code (third-party; never committed)", "",
             "Built by benchmarks/build_corpus.py from each repository's newest commit. "
             "Files: .py / .ipynb; XLA: files that import torch_xla.", "",
             "| repository | commit | files (.py / .ipynb) | XLA | style |", "|---|---|---|---|---|"]
    totals = [0, 0, 0]
    for s in selections:
        notebooks = sum(1 for p in s.files if p.endswith(".ipynb"))
        xla = sum(1 for data in s.files.values() if IMPORTS_TORCH_XLA.search(data.decode("utf-8", "replace")))
        totals = [totals[0] + len(s.files) - notebooks, totals[1] + notebooks, totals[2] + xla]
        lines.append(f"| {s.repo} | {s.commit[:12]} | {len(s.files) - notebooks} / {notebooks} | {xla} | "
                     f"{CORPUS.get(s.repo, '')} |")
    lines.append(f"| **{len(selections)} repositories** | | {totals[0]} / {totals[1]} ({totals[0] + totals[1]}) | "
                 f"{totals[2]} | |")
    lines += ["", "## Files taken (with the training signals that chose them)", ""]
    for s in selections:
        lines.append(f"### {s.repo} ({len(s.files)} of {s.candidates} candidates)")
        lines += [f"- {path}: {', '.join(s.signals[path])}" for path in s.files]
        lines.append("")
    return "\n".join(lines)


# The whole-repository cache -----------------------------------------------------------------------------------
@dataclass
class Export:
    repo: str
    commit: str
    files: int = 0
    large: int = 0
    binary: int = 0
    missing: int = 0  # blobs the snapshot lacks
    other: int = 0  # symbolic links, submodules, unsafe paths


def export(repo: str, directory: Path, folder: Path) -> Export:
    commit, entries = head_tree(directory)
    record = Export(repo, commit)
    files: dict[str, tuple[bytes, bool]] = {}
    with Blobs(directory) as blobs:
        for entry in entries:
            if entry.kind != "blob" or entry.mode not in ("100644", "100755") or not safe_path(entry.path):
                record.other += 1
            elif entry.size is not None and entry.size > LARGEST_EXPORTED:
                record.large += 1
            else:
                data = blobs.read(entry.sha)
                if data is None:
                    record.missing += 1
                elif b"\0" in data[:BINARY_PROBE]:
                    record.binary += 1
                else:
                    files[entry.path] = (data, entry.mode == "100755")
    record.files = len(files)
    write_tree(folder, files)
    return record


def repos_readme(records: list[Export]) -> str:
    lines = ["# Whole-repository cache (third-party; never committed)", "",
             "Built by benchmarks/build_corpus.py: each repository's newest tree, less files over 1 MiB, binary "
             "files, symbolic links and submodules.", "",
             "| repository | commit | files | left out: large / binary / absent from the snapshot / other |",
             "|---|---|---|---|"]
    lines += [f"| {r.repo} | {r.commit[:12]} | {r.files} | {r.large} / {r.binary} / {r.missing} / {r.other} |"
              for r in records]
    return "\n".join(lines) + "\n"


# Driver -------------------------------------------------------------------------------------------------------
def mirrored(mirror: Path) -> dict[str, Path]:
    """owner/name -> git directory for every usable snapshot in MIRROR."""
    found = {}
    for entry in sorted(mirror.iterdir()):
        if entry.is_dir() and "+" in entry.name and not entry.name.endswith((".part", ".tar")):
            directory = git_dir(entry)
            if directory is not None:
                found[entry.name.replace("+", "/", 1)] = directory
    return found


def warn(message: str) -> None:
    print(f"build_corpus: {message}", file=sys.stderr)


def warn_strangers(root: Path, known: set[str]) -> None:
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.is_dir() and "+" in entry.name and not entry.name.startswith(".") and entry.name not in known:
            warn(f"{entry}: not built from the mirror; left alone")


def build_corpus(snapshots: dict[str, Path], root: Path, cap: int, notebook_cap: int, dry_run: bool) -> bool:
    ok, selections = True, []
    if not dry_run:
        root.mkdir(parents=True, exist_ok=True)
    for repo in CORPUS:
        if repo not in snapshots:
            warn(f"{repo}: not in the mirror; fetch it first (github:{repo})")
            ok = False
            continue
        try:
            selection = select(repo, snapshots[repo], cap, notebook_cap)
        except BuildError as error:
            warn(f"{repo}: {error}")
            ok = False
            continue
        selections.append(selection)
        folder = root / repo.replace("/", "+")
        state = "as before"
        if not dry_run and not folder_matches(folder, selection.files):
            write_tree(folder, {path: (data, False) for path, data in selection.files.items()})
            state = "written"
        print(f"corpus {repo}: {len(selection.files)} of {selection.candidates} candidates at "
              f"{selection.commit[:12]}" + ("" if dry_run else f" ({state})"), file=sys.stderr)
    readme = corpus_readme(selections)
    if dry_run:
        print(readme)
    else:
        (root / "REPOS.md").write_text(readme)
        warn_strangers(root, {r.replace("/", "+") for r in CORPUS})
    total = sum(len(s.files) for s in selections)
    notebooks = sum(1 for s in selections for p in s.files if p.endswith(".ipynb"))
    print(f"corpus {root}: {total} files ({total - notebooks} .py, {notebooks} .ipynb) "
          f"from {len(selections)} repositories", file=sys.stderr)
    return ok


def build_repos(snapshots: dict[str, Path], root: Path, force: bool) -> bool:
    ok, records = True, []
    stamps = root / ".exports"
    stamps.mkdir(parents=True, exist_ok=True)
    for repo, directory in snapshots.items():
        name = repo.replace("/", "+")
        folder, stamp = root / name, stamps / f"{name}.json"
        try:
            previous = Export(**json.loads(stamp.read_text()))
        except (OSError, ValueError, TypeError):  # none yet, or not this script's: export again
            previous = None
        try:
            head = _git(directory, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
            if not force and folder.is_dir() and previous is not None and previous.commit == head:
                records.append(previous)
                continue
            record = export(repo, directory, folder)
        except BuildError as error:
            warn(f"{repo}: {error}")
            ok = False
            continue
        stamp.write_text(json.dumps(record.__dict__) + "\n")
        records.append(record)
        print(f"repos {repo}: {record.files} files at {record.commit[:12]} (left out: {record.large} large, "
              f"{record.binary} binary, {record.missing} absent, {record.other} other)", file=sys.stderr)
    (root / "REPOS.md").write_text(repos_readme(records))
    warn_strangers(root, {r.replace("/", "+") for r in snapshots})
    print(f"repos {root}: {len(records)} repositories", file=sys.stderr)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cache = Path.home() / ".cache" / "xla-migrate"
    parser.add_argument("--mirror", type=Path, default=Path("/work/.mirror"),
                        help="folder of fetched snapshots, <owner>+<name>/repo (default %(default)s)")
    parser.add_argument("--corpus", type=Path, default=cache / "corpus", help="the file corpus (default %(default)s)")
    parser.add_argument("--repos", type=Path, default=cache / "repos",
                        help="the whole-repository cache (default %(default)s)")
    parser.add_argument("--only", choices=("corpus", "repos"), help="build one of the two")
    parser.add_argument("--cap", type=int, default=DEFAULT_CAP, help="files per repository (default %(default)s)")
    parser.add_argument("--notebook-cap", type=int, default=DEFAULT_NOTEBOOK_CAP,
                        help="notebooks per repository, within --cap (default %(default)s)")
    parser.add_argument("--force", action="store_true", help="export every repository again")
    parser.add_argument("--dry-run", action="store_true", help="print the corpus' REPOS.md; write nothing")
    args = parser.parse_args(argv)
    if not args.mirror.is_dir():
        parser.error(f"{args.mirror}: not a folder")
    if args.cap < 1 or args.notebook_cap < 0:
        parser.error("--cap needs at least 1, --notebook-cap at least 0")
    if shutil.which("git") is None:
        parser.error("git is not on PATH")
    snapshots = mirrored(args.mirror)
    for repo in [r for r in snapshots if r.lower() in EVALUATION_ONLY]:
        warn(f"{repo}: kept for the independent evaluation (issue 11); left out")
        del snapshots[repo]
    if not snapshots:
        parser.error(f"{args.mirror}: no git snapshots (<owner>+<name>/repo)")
    try:
        ok = True
        if args.only != "repos":
            ok &= build_corpus(snapshots, args.corpus, args.cap, args.notebook_cap, args.dry_run)
        if args.only != "corpus" and not args.dry_run:
            ok &= build_repos(snapshots, args.repos, args.force)
    except OSError as error:
        warn(f"{error.filename or ''}: {error.strerror or error}")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
