"""A memory limit enforced by the operating system for a child process: a memory cgroup
(v1: /sys/fs/cgroup/memory; v2: a cgroup.controllers listing "memory"), created for one run
and removed after it. Needs root (or a delegated cgroup). Used by examples/train_offload.py,
train_activations.py, train_tiled.py and bench/optimizer/param_offload.py.

    with MemoryLimit(512 << 20) as lim:
        rc = lim.run([sys.executable, "child.py"])
        print(lim.peak_bytes(), lim.oom_killed())

:func:`compare_runs` is the three runs the memory-limit examples make (offloaded under the
limit, torch without it, torch under it: killed).

Thread-safety: one run at a time per object.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Callable, Dict, List, Optional, Tuple

V1_ROOT = "/sys/fs/cgroup/memory"
V2_ROOT = "/sys/fs/cgroup"


class MemoryLimitUnavailable(RuntimeError):
    """No memory cgroup can be made here (not root, no controller); the message says why."""


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


class MemoryLimit:
    """A fresh memory cgroup of ``limit_bytes`` (bytes; swap excluded where the kernel
    accounts it). :raises MemoryLimitUnavailable: no memory controller, or not permitted."""

    def __init__(self, limit_bytes: int, name: Optional[str] = None):
        self.limit_bytes = int(limit_bytes)
        name = name or f"strata-{os.getpid()}-{time.monotonic_ns()}"
        if os.path.isfile(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
            self.version = 1
            self.path = os.path.join(V1_ROOT, name)
        elif "memory" in _safe_read(os.path.join(V2_ROOT, "cgroup.controllers")).split():
            self.version = 2
            self.path = os.path.join(V2_ROOT, name)
        else:
            raise MemoryLimitUnavailable(
                "no memory cgroup controller (neither /sys/fs/cgroup/memory nor a cgroup v2 "
                "hierarchy with the memory controller)")
        try:
            os.mkdir(self.path)
        except OSError as e:
            raise MemoryLimitUnavailable(f"cannot create the memory cgroup {self.path}: "
                                         f"{e.strerror} (errno {e.errno}); run as root") from e
        try:
            if self.version == 1:
                _write(os.path.join(self.path, "memory.limit_in_bytes"), str(self.limit_bytes))
                memsw = os.path.join(self.path, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    _write(memsw, str(self.limit_bytes))
            else:
                _write(os.path.join(self.path, "memory.max"), str(self.limit_bytes))
                _write(os.path.join(self.path, "memory.swap.max"), "0")
        except OSError as e:
            self.close()
            raise MemoryLimitUnavailable(f"cannot set the limit of {self.path}: {e}") from e

    def run(self, argv: List[str], timeout: Optional[float] = None, **popen_kwargs) -> int:
        """Runs ``argv`` inside the cgroup and waits; returns its exit status (negative:
        killed by that signal, e.g. -9 by the OOM killer). Kills it after ``timeout``
        seconds (then -9)."""
        procs = os.path.join(self.path, "cgroup.procs")

        def enter() -> None:
            _write(procs, str(os.getpid()))

        p = subprocess.Popen(argv, preexec_fn=enter, **popen_kwargs)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            return p.wait()
        except BaseException:
            p.kill()
            p.wait()
            raise

    def peak_bytes(self) -> int:
        """Most memory the cgroup was charged at once (bytes; anonymous + page cache)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        text = _safe_read(os.path.join(self.path, name)).strip()
        return int(text) if text else -1

    def oom_killed(self) -> int:
        """Processes of the cgroup the kernel's OOM killer killed (-1: not reported)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in _safe_read(os.path.join(self.path, name)).splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return -1

    def close(self) -> None:
        """Removes the cgroup (its processes must have ended). Idempotent."""
        if self.path and os.path.isdir(self.path):
            for _ in range(50):
                try:
                    os.rmdir(self.path)
                    break
                except OSError:
                    time.sleep(0.1)
        self.path = ""

    def __enter__(self) -> "MemoryLimit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _safe_read(path: str) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


def compare_runs(child_argv: Callable[[str, str], List[str]], limit_bytes: int, work: str,
                 oom_demo: bool = True, env: Optional[dict] = None
                 ) -> Tuple[Dict[str, dict], List[str]]:
    """The three runs of the memory-limit examples (train_activations.py, train_tiled.py):
    role "offload" under a fresh cgroup of ``limit_bytes``, role "torch" without a limit
    (the reference), and with ``oom_demo`` "torch" again under the limit, which must be
    killed for memory. ``child_argv(role, result_path)`` gives each child's command; a
    child writes its result as JSON to ``result_path`` (under ``work``). Prints each run's
    exit status (and the cgroup's peak charge). Returns the results by role ("offload",
    "torch"; a run that failed is missing) and the failures, as messages.

    :raises MemoryLimitUnavailable: no memory cgroup can be made here."""
    runs: Dict[str, dict] = {}
    failures: List[str] = []
    for role, limited in (("offload", True), ("torch", False)):
        res = os.path.join(work, f"{role}.json")
        print(f"{role} run{' under the limit' if limited else ', no limit'}:", flush=True)
        if limited:
            with MemoryLimit(limit_bytes) as lim:
                rc = lim.run(child_argv(role, res), env=env)
                peak = lim.peak_bytes()
            print(f"  exit status {rc}, cgroup peak {peak / 2**20:.0f} MiB of "
                  f"{limit_bytes / 2**20:.0f} MiB")
        else:
            rc = subprocess.run(child_argv(role, res), env=env).returncode
        if rc != 0 or not os.path.exists(res):
            failures.append(f"the {role} run failed (exit status {rc})")
            continue
        with open(res) as f:
            runs[role] = json.load(f)
    if oom_demo:
        print("torch in memory under the limit:", flush=True)
        with MemoryLimit(limit_bytes) as lim:
            rc = lim.run(child_argv("torch", os.path.join(work, "oom.json")), env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            killed = lim.oom_killed()
        print(f"  exit status {rc}, OOM kills {killed}")
        if not (rc == -9 and killed != 0):
            failures.append(f"the in-memory run under the limit was not killed (exit status "
                            f"{rc})")
    return runs, failures
