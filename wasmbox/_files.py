"""Reading the host files a manifest names: the manifest, a module, a Python source.

Only regular files: a FIFO would block the reader forever, and a device such as /dev/zero
never ends. The file is opened non-blocking and the descriptor read from is the one checked,
so nothing can be swapped in between a check and the read.
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}
_CHUNK = 1024**2


def read_regular_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed). Raises OSError, at once,
    for anything else (a FIFO, a device, a directory), and ValueError for a NUL in `path`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a file")
            raise OSError(errno.EINVAL, f"not a regular file ({kind})", os.fspath(path))
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
