"""Writing outputs so that nothing half-written is ever seen: atomic files, a run's outputs
moved into place as one unit with signals held, and the output folder checked first."""

import json
import os
import shutil
import signal
import tempfile


def write_json_atomic(path: str, data) -> None:
    """Write JSON through a temporary file and a rename: never a half-written file."""
    write_text_atomic(path, json_text(data))


def write_text_atomic(path: str, text: str) -> None:
    """Write through a temporary file in the same folder and a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def json_text(data) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def write_unit(out_dir: str, files: dict[str, str], folders: tuple[str, ...] = ()) -> None:
    """Write ``files`` (path relative to ``out_dir`` -> text) as one unit: all are written
    to a staging folder inside ``out_dir`` first, then moved into place with SIGINT and
    SIGTERM held back, so an interrupted run leaves the previous outputs or the new ones,
    never a mix and never a temporary file. Each of ``folders`` is replaced whole (no
    file of an earlier run stays in it). Refuses a path that would leave ``out_dir``."""
    for rel in files:
        parts = os.path.normpath(rel).split(os.sep)
        if os.path.isabs(rel) or ".." in parts or parts[0] in ("", "."):
            raise ValueError(f"output path {rel!r} is not inside the output folder")
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(dir=out_dir, prefix=".tmp-run-")
    try:
        for rel, text in files.items():
            path = os.path.join(staging, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o644)
        tops = dict.fromkeys(os.path.normpath(rel).split(os.sep)[0] for rel in files)
        with _signals_held():
            for folder in folders:
                if os.path.isdir(os.path.join(out_dir, folder)):
                    os.rename(os.path.join(out_dir, folder), os.path.join(staging, f".old-{folder}"))
            for top in tops:
                os.replace(os.path.join(staging, top), os.path.join(out_dir, top))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class _signals_held:
    """Hold SIGINT and SIGTERM back for the block (main thread only; elsewhere a no-op):
    a signal that arrives meanwhile is delivered when the block ends."""

    HELD = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        import threading

        self._held = threading.current_thread() is threading.main_thread()
        if self._held:
            self._before = signal.pthread_sigmask(signal.SIG_BLOCK, self.HELD)

    def __exit__(self, *exc):
        if self._held:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._before)
        return False


def check_output_folder(out_dir: str) -> None:
    """Raise ``OSError`` naming the problem unless ``out_dir`` is a folder that can be
    written, or can be made: checked before a run samples, so no run is thrown away for
    want of a place to write it. Creates nothing."""
    path = os.path.abspath(out_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"--out {out_dir}: exists and is not a folder")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise NotADirectoryError(f"--out {out_dir}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {out_dir}: {existing} is not writable")
