"""Fixtures of the strata Python tests (run by ctest with PYTHONPATH=<build>/python)."""
import os

import pytest

import strata


@pytest.fixture
def store_path(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def store(store_path):
    s = strata.Store.open(store_path, host_budget="64MiB", staging="16MiB", chunk_size="1MiB",
                          workers=2)
    yield s
    if not s.closed:
        s.close()


@pytest.fixture
def strata_dir(tmp_path, monkeypatch):
    """An empty $STRATA_DIR (where strata.torch optimizers make their temporary stores)."""
    d = tmp_path / "strata_dir"
    d.mkdir()
    monkeypatch.setenv("STRATA_DIR", str(d))
    return d


def _read_proc_io():
    """(read_bytes, write_bytes) of this process from /proc/self/io (None: not readable)."""
    try:
        with open("/proc/self/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
        return int(fields["read_bytes"]), int(fields["write_bytes"])
    except (OSError, KeyError, ValueError):
        return None


@pytest.fixture
def proc_io():
    """proc_io() -> (read_bytes, write_bytes) this process has read from and written to
    storage so far (/proc/self/io, bytes); skips the test where that is not readable."""
    if _read_proc_io() is None:
        pytest.skip("/proc/self/io is not readable here")
    return _read_proc_io


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount_tmpfs(size) -> path of a tmpfs of `size` (e.g. "20m") mounted under tmp_path,
    unmounted after the test; skips the test with the reason where mount is refused (it
    needs CAP_SYS_ADMIN)."""
    import subprocess
    mounted = []

    def mount(size):
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"mount -t tmpfs -o size={size} refused: "
                        f"{r.stderr.strip() or r.returncode}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
