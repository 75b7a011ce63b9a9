"""One Ctrl-C path for every long command (fuzz, prove, mutants, bench).

A stop is never a verdict. The first Ctrl-C raises `KeyboardInterrupt` where the program
is (as Python does); the command stops its workers, prints and writes the report of the
part that ran, marked interrupted, and exits with status 130. A second Ctrl-C while that
report is written ends the process at once with status 130 and one line, instead of a
traceback fragment from whatever it hit. `was_interrupted()` lets code that must catch
`KeyboardInterrupt` (a campaign that keeps its partial report) tell its caller, so no
caller records an interrupted run as a result; `stop_if_interrupted()` raises again.

Worker processes (`quiet_worker`) leave Ctrl-C to their parent, which terminates them:
the parent alone decides, so it can stop within a second whatever the workers are in.

SIGTERM (`kill`) takes the same path as Ctrl-C: the part that ran is reported, workers
are terminated, temporary files removed (an atomic output's temporary file is removed by
the exception), and the exit status is 143 (128 + SIGTERM). A process killed outright
(`kill -9`) cleans nothing up, so every worker watches its parent (`watch_parent`) and
ends itself within PARENT_POLL_S once the parent is gone.

Z3 in this process: Z3's own Ctrl-C handler would turn the signal into an "unknown"
result (a stop recorded as a verdict). `z3_leaves_ctrl_c_to_us` turns it off; a watcher
thread woken by the signal (`signal.set_wakeup_fd`) interrupts the running check, which
returns at once, and the Python handler raises as usual.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

from kvpocket.verify.exits import EXIT_INTERRUPTED, EXIT_TERMINATED

_state = {"count": 0}


def _handler(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGTERM:
        _state["signal"] = signum
    if _state["count"] == 0 and _in_finalizer(frame):
        # An exception cannot leave a finalizer: Python would print it as "Exception ignored
        # in ..." with a traceback and carry on. Deliver this Ctrl-C again once it is done.
        _redeliver_later()
        return
    _state["count"] += 1
    if _state["count"] > 1:  # a second Ctrl-C: no more waiting, no traceback fragments
        os.write(2, b"kvpocket: interrupted again; stopping now (no report)\n")
        os._exit(exit_status())
    raise KeyboardInterrupt



def exit_status() -> int:
    """The status of an interrupted run: 143 after SIGTERM, 130 after Ctrl-C."""
    return EXIT_TERMINATED if _state.get("signal") == signal.SIGTERM else EXIT_INTERRUPTED


def _in_finalizer(frame: FrameType | None) -> bool:
    """The signal arrived inside a `__del__`, a `weakref.finalize` callback (a temporary
    directory's or a pool's clean-up, run by the garbage collector) or a function in
    `gc.callbacks` (Hypothesis registers one): an exception cannot leave any of them."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code in callbacks or (
                code.co_name == "__call__" and code.co_filename.endswith("weakref.py")):
            return True
        frame = frame.f_back
    return False


REDELIVER_S = 0.05  # long enough for a finalizer to return


def _redeliver_later() -> None:
    """Raise SIGINT in the main thread again shortly (its handler runs there)."""
    timer = threading.Timer(REDELIVER_S, _thread.interrupt_main)
    timer.daemon = True
    timer.start()


@contextlib.contextmanager
def interrupt_scope() -> Iterator[None]:
    """Within the block, Ctrl-C follows the rules above (main thread only; elsewhere the
    block runs as it is). The previous handler and the count are restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _handler)
    previous_term = signal.signal(signal.SIGTERM, _handler)
    _state["count"] = _state["signal"] = 0
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_wake_z3, args=(read_fd,), daemon=True,
                     name="kvpocket-ctrl-c").start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        _state["count"] = 0
        os.close(write_fd)  # the watcher reads end-of-file and closes its end


def _wake_z3(read_fd: int) -> None:
    """Interrupt a Z3 check running in the main thread when a signal arrives."""
    try:
        while os.read(read_fd, 64):
            z3 = sys.modules.get("z3")
            if z3 is not None:
                with contextlib.suppress(Exception):
                    z3.main_ctx().interrupt()
    finally:
        os.close(read_fd)


def z3_leaves_ctrl_c_to_us() -> None:
    """Turn off Z3's own Ctrl-C handler (call before the first check): see above."""
    # z3 only when a Z3 run starts: campaigns set up Ctrl-C handling through this module too
    import z3

    z3.set_param("ctrl_c", False)


def was_interrupted() -> bool:
    """True once a Ctrl-C reached `interrupt_scope` (until the scope ends)."""
    return _state["count"] > 0


def stop_if_interrupted() -> None:
    """Raise `KeyboardInterrupt` again if one was caught and absorbed below the caller."""
    if was_interrupted():
        raise KeyboardInterrupt


@contextlib.contextmanager
def starting_workers() -> Iterator[None]:
    """Worker processes started in the block begin with Ctrl-C ignored (inherited across
    exec), so a Ctrl-C while they import prints no traceback; `worker_ctrl_c`, their
    initializer, then turns it on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _worker_handler(signum: int, frame: FrameType | None) -> None:
    if _state["count"] == 0 and _state.get("busy") and _in_finalizer(frame):
        _redeliver_later()  # as `_handler`: raised once the finalizer has returned
        return
    _state["count"] += 1
    if _state["count"] > 1 or not _state.get("busy"):
        os._exit(EXIT_INTERRUPTED)  # idle, or a second Ctrl-C: end quietly
    raise KeyboardInterrupt


def worker_ctrl_c() -> None:
    """A campaign worker's initializer: the first Ctrl-C during a task raises
    `KeyboardInterrupt` there (the worker hands back the part it ran, `working`); an idle
    worker, or a second Ctrl-C, ends quietly (no traceback fragments)."""
    _state["count"] = 0
    signal.signal(signal.SIGINT, _worker_handler)
    _worker_signals()


@contextlib.contextmanager
def working() -> Iterator[None]:
    """A worker's task: a Ctrl-C within it raises (see `worker_ctrl_c`)."""
    _state["busy"] = 1
    try:
        yield
    finally:
        _state["busy"] = 0


def quiet_worker() -> None:
    """A worker process's initializer: Ctrl-C is the parent's to handle (it terminates
    the workers), so a worker neither stops half-way nor prints a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_signals()


def _worker_signals() -> None:
    """A worker forked from the CLI inherits its SIGTERM handler and wake-up fd: put them
    back, so the pool's terminate (SIGTERM) ends it quietly, and watch the parent."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    watch_parent()


PARENT_POLL_S = 0.2


PR_SET_PDEATHSIG = 1  # prctl(2)


def watch_parent() -> None:
    """A worker ends once the process that started it is gone (killed with -9, which no
    handler sees). On Linux the kernel kills it at once (prctl PR_SET_PDEATHSIG: no
    half-sent result, no traceback of a broken pipe); everywhere, a daemon thread polls
    the parent's id, which changes when the parent dies (the orphan is adopted), and
    ends the worker with status 143. (The pools that call this start their workers from
    the main thread, which PR_SET_PDEATHSIG watches.)"""
    # The parent that started this worker, as recorded when it was started: the parent
    # may already have died while the worker imported (then getppid() is the adopter's)
    started_by = multiprocessing.parent_process()
    parent = started_by.pid if started_by is not None and started_by.pid else os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    if os.getppid() != parent:  # gone before the death signal was asked for
        os._exit(EXIT_TERMINATED)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(EXIT_TERMINATED)

    threading.Thread(target=watch, daemon=True, name="kvpocket-parent-watch").start()
