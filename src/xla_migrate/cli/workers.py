"""Running a tree run's files: ``run_all``, in supervised worker processes (or, with nothing to parse, in
this one).

A worker that dies while migrating a file (libcst's native parser can overflow its stack on input the
nesting guard did not foresee; the kernel's OOM killer) costs only that file: it is reported as one error
line, a fresh worker takes the files that were left, and the run goes on. That holds for ``-j 1`` too,
which uses one worker. Workers leave with their parent, however it ends (``kill -9`` included).

Tasks go out in small batches (one big file alone) and each outcome comes back as soon as it is done, so
the file a dead worker was on is always known. Ctrl-C (``run_all`` installs the handler) is passed on to
the workers; each finishes a write in progress, abandons a migration, reports what it finished and stops.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tree import Options, Outcome, Task

# A batch of small files goes to a worker in one message; a file this big or bigger goes alone.
BATCH_FILES = 16
BATCH_BYTES = 256 * 1024


# Running many ------------------------------------------------------------------------------------------------
def run_all(tasks: list[Task], options: Options, jobs: int, progress=None) -> list[Outcome]:
    """Migrate every task in ``jobs`` supervised worker processes (see above: a worker that crashes costs
    only its file). Sorted by path. Only a run with nothing to parse, or ``XLA_MIGRATE_DEBUG``
    set with ``-j 1`` (tracebacks reach the terminal), runs in this process.

    Ctrl-C stops the run promptly: pending files are not started, files being migrated are abandoned, writes
    in progress complete; then ``Interrupted`` says what finished and what was not reached."""
    from .tree import _INTERRUPT, Interrupted, _SigintHandled, process

    parse_work = [t for t in tasks if t.kind != "other"]
    jobs = max(1, min(jobs, len(parse_work)))
    outcomes: list[Outcome] = []
    with _SigintHandled():
        if not parse_work or (jobs == 1 and os.environ.get("XLA_MIGRATE_DEBUG")):
            for task in tasks:
                if _INTERRUPT.requested:
                    break
                try:
                    outcomes.append(process(task, options))
                except KeyboardInterrupt:
                    break
                if progress:
                    progress(1)
        else:
            outcomes = run_supervised(tasks, options, jobs, progress)
        interrupted = _INTERRUPT.requested
    if interrupted:
        finished = {o.path for o in outcomes}
        raise Interrupted(outcomes, [t for t in tasks if t.path not in finished])
    return sorted(outcomes, key=lambda o: o.path)


def run_supervised(tasks: list, options, jobs: int, progress=None) -> list:
    """Migrate ``tasks`` in ``jobs`` worker processes; outcomes in no particular order (after Ctrl-C only
    those of the files that finished)."""
    import multiprocessing

    from ..engine import registry
    from .tree import interrupt_requested

    registry.all_rules()  # import the rules once here: forked workers inherit them
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    context = multiprocessing.get_context(method)
    # Biggest first: the long files start early and the small ones even out the end.
    pending = deque(sorted(tasks, key=lambda t: _size(t.path), reverse=True))
    outcomes: list = []
    workers = [_Worker(context, options) for _ in range(min(jobs, len(pending)))]
    if progress:
        progress(0, start=True)
    try:
        for worker in workers:
            worker.give(pending)
        while any(worker.batch for worker in workers) and not interrupt_requested():
            busy = [w for w in workers if w.batch]
            # A timeout, so that Ctrl-C (whose handler only sets a flag) is seen while all are busy.
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=0.2)
            for worker in busy:
                if worker.conn not in ready and worker.process.sentinel not in ready:
                    continue
                done = worker.collect()
                outcomes += done
                if progress and done:
                    progress(len(done))
                if interrupt_requested():
                    break
                if worker.batch and not worker.process.is_alive():
                    worker.process.join()
                    if worker.process.exitcode != 0:  # it crashed on the first file it did not report
                        outcomes.append(_after_crash(_crash_outcome(worker.batch.pop(0), worker.process.exitcode),
                                                     options))
                        if progress:
                            progress(1)
                    pending.extendleft(reversed(worker.batch))  # the rest goes back to the queue
                    worker.batch = []
                    if pending:
                        workers[workers.index(worker)] = worker = _Worker(context, options)
                if not worker.batch:
                    worker.give(pending)
        if interrupt_requested():
            for worker in workers:
                outcomes += worker.interrupt()
    finally:
        for worker in workers:
            worker.stop()
    return outcomes


class _Worker:
    def __init__(self, context, options) -> None:
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child_end, options, os.getpid()), daemon=True)
        self.process.start()
        child_end.close()
        self.batch: list = []  # tasks sent and not yet reported

    def give(self, pending: deque) -> None:
        if not pending:
            return
        batch = [pending.popleft()]
        size = _size(batch[0].path)
        while pending and len(batch) < BATCH_FILES and size < BATCH_BYTES:
            size += _size(pending[0].path)
            batch.append(pending.popleft())
        try:
            self.conn.send(batch)
        except OSError:  # it died before it got them: put them back; the next wait sees its sentinel
            pending.extendleft(reversed(batch))
            return
        self.batch = batch

    def collect(self) -> list:
        """The outcomes it has sent (the tasks left in ``batch`` are not done)."""
        done = []
        try:
            while self.batch and self.conn.poll():
                done.append(self.conn.recv())
                self.batch.pop(0)
        except (EOFError, OSError):
            pass
        return done

    def interrupt(self, timeout: float = 30) -> list:
        """Pass Ctrl-C on (``kill -INT`` reaches only the parent) and collect what it finishes before it
        stops; the rest of its batch was not reached."""
        if self.process.is_alive():
            try:
                os.kill(self.process.pid, signal.SIGINT)
                self.conn.send(None)  # an idle worker waits for work: this ends it
            except OSError:
                pass
            self.process.join(timeout)
        done = self.collect()
        self.batch = []
        return done

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _crash_outcome(task, exitcode: int | None):
    from .tree import Outcome

    if exitcode is not None and exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with status {exitcode}"
    return Outcome(task.path, task.kind, task.out_path,
                   error=f"{task.path}: xla-migrate crashed on this file (the process migrating it {how}); "
                         "the other files were migrated; please report it")


def _after_crash(outcome, options):
    """As for any file that cannot be migrated: a mirror still gets a copy, so the mirrored tree is whole."""
    from pathlib import Path

    from .tree import _write_mirror

    if options.write and options.copy_others and options.mirror_root is not None and outcome.out_path is not None:
        try:
            _write_mirror(Path(outcome.out_path), Path(outcome.path).read_bytes(), Path(outcome.path),
                          options.mirror_root)
            outcome.written = True
        except OSError:
            pass
    return outcome


def _worker_main(conn, options, parent_pid: int) -> None:
    _exit_with_parent(parent_pid)
    from .tree import init_worker, interrupt_requested, process

    init_worker()
    while not interrupt_requested():
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for task in batch:
            if interrupt_requested():
                return
            try:
                outcome = process(task, options)
            except KeyboardInterrupt:  # Ctrl-C: this file was abandoned before anything was written
                return
            conn.send(outcome)


def _exit_with_parent(parent_pid: int) -> None:
    """End this process when the parent does: at once on Linux (the kernel's parent-death signal), else
    within half a second (a thread watching who the parent is)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="xla-migrate-parent-watch", daemon=True).start()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
