"""Child processes that die with the stage: a `kill -9` of the stage command leaves nothing running.

- `die_with_parent()`, for a direct child (e.g. `subprocess.Popen(..., preexec_fn=die_with_parent)`): Linux sends it
  SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG, through ctypes: no dependency); elsewhere it does nothing.
  The signal follows the *thread* that created the child: start it from a thread that lives as long as the child.
- `exit_with(pid)`, for a grandchild such as a multiprocessing pool worker (forked by the forkserver, not by the
  stage): a daemon thread that ends this process as soon as process `pid` is gone (a pidfd on Linux: no polling,
  no pid reuse; elsewhere a poll every half second). Once the workers are gone, the forkserver and the resource
  tracker see their pipes close and exit by themselves."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Get `sig` (SIGKILL) when the parent process dies; True when the kernel took the request (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def exit_with(pid: int) -> None:
    """End this process (exit code 1, no cleanup: its work has nobody to report to) when process `pid` ends."""
    threading.Thread(target=_watch, args=(pid,), name=f"exit-with-{pid}", daemon=True).start()


def _watch(pid: int) -> None:
    pidfd = -1
    with contextlib.suppress(AttributeError, OSError):  # os.pidfd_open: Linux >= 5.3, Python >= 3.9
        pidfd = os.pidfd_open(pid)
    if pidfd >= 0:
        select.select([pidfd], [], [])  # readable once the process has exited
    else:
        while alive(pid):
            time.sleep(POLL_S)
    os._exit(1)


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one this user may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
