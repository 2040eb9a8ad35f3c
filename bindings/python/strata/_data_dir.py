"""Where strata keeps data nobody named a place for: the per-user default directory and the
temporary stores made in it (e.g. by strata.torch optimizers given neither store nor path).

Thread-safety: the functions may be called from any thread and process at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile

#: the default directory, per user (a directory shared by all users would take the first
#: user's ownership and umask); $STRATA_DIR replaces it
DEFAULT_DIR_TEMPLATE = "/var/tmp/strata-{uid}"


def default_data_dir() -> str:
    """The directory strata uses when not given one, created if missing: ``$STRATA_DIR``
    when set (created with the umask's mode; the caller's choice is not checked further),
    else ``/var/tmp/strata-<uid>``, created mode 0700 (an existing one of this user that
    others may read or write is made 0700).

    :returns: the directory's path (str).
    :raises PermissionError: the default directory exists but belongs to another user
        (naming it, its owner and $STRATA_DIR), or is a symbolic link or not a directory.
    :raises OSError: the directory cannot be created.
    """
    env = os.environ.get("STRATA_DIR")
    if env:
        os.makedirs(env, exist_ok=True)
        return env
    uid = os.getuid()
    path = DEFAULT_DIR_TEMPLATE.format(uid=uid)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a directory"
        raise PermissionError(
            errno.EACCES,
            f"strata's default directory {path} is {what} owned by uid {st.st_uid}, not by "
            f"this user (uid {uid}); remove it or set STRATA_DIR to a directory of yours")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def reclaim_stale_temp_dirs(base: str, prefix: str) -> list:
    """Removes the temporary stores ``<base>/<prefix><pid>-*`` that their process left
    behind (it died without closing them: SIGKILL, a crash): those of this user whose
    process ``pid`` no longer exists and whose store lock (``LOCK``, an flock held while a
    store is open) is free. The lock is held while the directory is removed, so a store
    that someone opens meanwhile is never removed.

    :returns: the paths removed (list of str).
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for e in entries:
        m = pattern.match(e.name)
        if not m or not e.is_dir(follow_symlinks=False):
            continue
        pid = int(m.group(1))
        try:
            if e.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if pid == os.getpid() or _pid_alive(pid):
            continue
        lock = os.path.join(e.path, "LOCK")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # killed before its store was opened
            fd = None
        except OSError:
            continue
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # open in some process
                    continue
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.path)
        finally:
            if fd is not None:
                os.close(fd)
    return removed


def make_temp_dir(prefix: str) -> str:
    """A new empty directory ``<default_data_dir()>/<prefix><pid>-XXXXXXXX`` (mode 0700)
    for a temporary store of this process, after reclaiming the stale ones of that prefix
    (:func:`reclaim_stale_temp_dirs`). The caller removes it when done.

    :raises: as :func:`default_data_dir`.
    """
    base = default_data_dir()
    reclaim_stale_temp_dirs(base, prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)
