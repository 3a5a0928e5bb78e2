"""Byte-compiles a folder inside the runtime: `precompile(root)` returns the .py files left
without bytecode. Run as a snippet by the host (`build.precompile_program`), whose last line
calls it.

WASI writes at most a few KiB at a time, and CPython writes a .pyc with one os.write that it
refuses to see cut short (leaving a bigger module without bytecode), so `write_atomic` loops
until all is written.
"""

import compileall
import importlib._bootstrap_external as bootstrap
import os


def write_atomic(path, data, mode=0o666):
    temporary = f"{path}.{id(path)}"
    fd = os.open(temporary, os.O_EXCL | os.O_CREAT | os.O_WRONLY, mode & 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if not written:
                    raise OSError(f"{temporary}: nothing written")
                view = view[written:]
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
        raise


def precompile(root):
    bootstrap._write_atomic = write_atomic
    compileall.compile_dir(root, quiet=1, workers=1)
    return [
        os.path.join(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".py")
        and not os.path.exists(bootstrap.cache_from_source(os.path.join(folder, name)))
    ]
