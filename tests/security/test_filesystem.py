"""Hostile file access from all three kinds of guest: paths out of the grant, links, writes
through read-only grants, a swap between check and use, guessed descriptors, /proc and /etc.

Each case asserts what the guest saw (the errno for C guests, the exception for Python) and
that the host is untouched afterwards (`Guarded.assert_untouched`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import wasmbox
from wasmbox._capabilities import wasi_files as _wasi_files
from wasmbox._capabilities.wasi_files import MAX_OPEN_FILES

from .conftest import Guarded, leaks_secret, security_wat

EPERM, ENOENT, ENOTDIR, EBADF = (
    "Operation not permitted", "No such file or directory", "Not a directory", "Bad file descriptor",
)  # fmt: skip
PYTHON_EXCEPTION = {EPERM: "PermissionError", ENOENT: "FileNotFoundError", ENOTDIR: "NotADirectoryError"}
KINDS = ["command", "core", "python"]

# The operations hostile_ops.h knows, as Python statements for the Python guest.
PYTHON_OP: dict[str, Callable[..., str]] = {
    "read": lambda p: f"open({p!r}).read()",
    "write": lambda p, t: f"open({p!r}, 'w').write({t!r})",
    "append": lambda p, t: f"open({p!r}, 'a').write({t!r})",
    "mkdir": lambda p: f"os.mkdir({p!r})",
    "rmdir": lambda p: f"os.rmdir({p!r})",
    "unlink": lambda p: f"os.unlink({p!r})",
    "rename": lambda a, b: f"os.rename({a!r}, {b!r})",
    "symlink": lambda t, p: f"os.symlink({t!r}, {p!r})",
    "link": lambda a, b: f"os.link({a!r}, {b!r})",
    "truncate": lambda p, n: f"os.truncate({p!r}, {n})",
}


def attempt(guarded: Guarded, kind: str, op: tuple[str, ...], writable: bool = False) -> str:
    """Run `op` in a guest of `kind`; what the guest saw: "done", or the errno's text."""
    if kind == "python":
        statement = PYTHON_OP[op[0]](*op[1:])
        code = (f"import os\ntry:\n    {statement}\n    seen = 'done'\n"
                "except OSError as e:\n    seen = type(e).__name__\nseen")  # fmt: skip
        result = guarded.python(code, writable=writable)
        assert result.ok, result.error
        by_name = {v: k for k, v in PYTHON_EXCEPTION.items()}
        return by_name.get(result.value, result.value)
    if kind == "command":
        result = guarded.command(*op, writable=writable)
        code = result.value["exit_code"] if result.ok else None
    else:
        result = guarded.core(*op, writable=writable)
        code = result.value
    assert result.ok and code in (0, 1), (result.error, result.stdout)
    assert not leaks_secret(result)
    return "done" if code == 0 else result.stdout.removeprefix("error: ").strip()


READS_OUT = [
    ("/data/../outside/secret.txt", EPERM),
    ("/data/sub/../../outside/secret.txt", EPERM),
    ("/data//..//outside/secret.txt", EPERM),
    ("//data/../outside/secret.txt", EPERM),
    ("/data/../granted/inside.txt", EPERM),  # even back into the grant: no '..' past its root
    ("/data/inside.txt/../../outside/secret.txt", ENOTDIR),
    ("/data/abs_link", EPERM),  # host-made symlink, absolute target outside
    ("/data/rel_link", EPERM),  # host-made symlink, relative target outside
    ("/data/dir_link/secret.txt", EPERM),  # through a symlinked directory
    ("/outside/secret.txt", ENOENT),
    ("../outside/secret.txt", ENOENT),  # no ambient cwd
    ("secret.txt", ENOENT),
    ("HOST_PATH", ENOENT),  # the secret's real host path
    ("/etc/passwd", ENOENT),
    ("/etc/hostname", ENOENT),
    ("/proc/self/environ", ENOENT),
    ("/proc/self/cmdline", ENOENT),
    ("/proc/self/fd/0", ENOENT),
    ("/proc/1/root/etc/passwd", ENOENT),
    ("/sys/kernel/hostname", ENOENT),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("path", "errno"), READS_OUT, ids=[p for p, _ in READS_OUT])
def test_reads_outside_the_grant_are_refused(guarded: Guarded, kind: str, path: str, errno: str) -> None:
    if path == "HOST_PATH":
        path = str(guarded.secret)
    assert attempt(guarded, kind, ("read", path)) == errno
    guarded.assert_untouched()


READ_ONLY_WRITES = [
    ("write", "/data/new.txt", "pwned"),
    ("write", "/data/inside.txt", "pwned"),
    ("append", "/data/inside.txt", "pwned"),
    ("truncate", "/data/inside.txt", "0"),
    ("mkdir", "/data/newdir"),
    ("rmdir", "/data/sub"),
    ("unlink", "/data/inside.txt"),
    ("unlink", "/data/abs_link"),
    ("rename", "/data/inside.txt", "/data/moved.txt"),
    ("symlink", "inside.txt", "/data/new_link"),
    ("link", "/data/inside.txt", "/data/new_hard_link"),
    ("write", "/data/abs_link", "pwned"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", READ_ONLY_WRITES, ids=["-".join(op[:2]) for op in READ_ONLY_WRITES])
def test_writes_to_a_read_only_grant_are_refused(guarded: Guarded, kind: str, op: tuple[str, ...]) -> None:
    assert attempt(guarded, kind, op) == EPERM
    guarded.assert_untouched()  # the granted tree too


WRITABLE_ESCAPES = [
    ("write", "/data/../outside/secret.txt", "pwned"),
    ("write", "/data/../escape.txt", "pwned"),
    ("write", "/data/abs_link", "pwned"),
    ("write", "/data/rel_link", "pwned"),
    ("append", "/data/rel_link", "pwned"),
    ("write", "/data/dir_link/new.txt", "pwned"),
    ("truncate", "/data/abs_link", "0"),
    ("mkdir", "/data/../newdir"),
    ("unlink", "/data/../outside/secret.txt"),
    ("rmdir", "/data/../outside"),
    ("rename", "/data/inside.txt", "/data/../outside/moved.txt"),
    ("rename", "/data/../outside/secret.txt", "/data/stolen.txt"),
    ("link", "/data/../outside/secret.txt", "/data/stolen.txt"),  # a hard link out
    ("symlink", "/etc/passwd", "/data/etc_link"),  # absolute targets are refused outright
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", WRITABLE_ESCAPES, ids=["-".join(op[:2]) for op in WRITABLE_ESCAPES])
def test_writable_grant_cannot_reach_outside(guarded: Guarded, kind: str, op: tuple[str, ...]) -> None:
    assert attempt(guarded, kind, op, writable=True) == EPERM
    assert sorted(os.listdir(guarded.granted)) == ["abs_link", "dir_link", "inside.txt", "rel_link", "sub"]
    guarded.assert_untouched(granted_too=False)


@pytest.mark.parametrize("kind", ["command", "core"])
def test_wasi_guests_cannot_make_symlinks(guarded: Guarded, kind: str) -> None:
    """`path_symlink` is refused, pointing out of the grant or not: no link is left for the
    host to follow later."""
    for target in ("../outside/secret.txt", "/etc/passwd", "inside.txt"):
        assert attempt(guarded, kind, ("symlink", target, "/data/planted"), True) == EPERM
    assert not os.path.lexists(guarded.granted / "planted")
    guarded.assert_untouched()


@pytest.mark.parametrize("kind", KINDS)
def test_guest_made_links_out_cannot_be_followed(guarded: Guarded, kind: str) -> None:
    """A guest may hard-link a host-made symlink that points out of its writable grant (it is
    an entry inside the grant), and a Python guest may create a relative symlink that points
    out (a known gap, SECURITY.md), but neither it nor the next call can follow them."""
    planted = ["/data/copied"]
    assert attempt(guarded, kind, ("link", "/data/abs_link", "/data/copied"), True) == "done"
    if kind == "python":
        assert attempt(guarded, kind, ("symlink", "../outside/secret.txt", "/data/planted"), True) == "done"
        assert os.readlink(guarded.granted / "planted") == "../outside/secret.txt"
        planted.append("/data/planted")
    for path in planted:
        assert attempt(guarded, kind, ("read", path), True) == EPERM
        assert attempt(guarded, kind, ("write", path, "pwned"), True) == EPERM
    guarded.assert_untouched(granted_too=False)


@pytest.mark.parametrize("kind", KINDS)
def test_host_made_hard_link_is_the_file_and_stays_read_only(guarded: Guarded, kind: str) -> None:
    """A hard link is the file itself, so one the host puts in a grant is granted content (a
    file outside that the host hard-links in is readable); a read-only grant still refuses
    every write to it."""
    shared = guarded.root / "shared.txt"
    shared.write_text("shared\n")
    os.link(shared, guarded.granted / "hard_link")
    guarded._record()
    assert attempt(guarded, kind, ("write", "/data/hard_link", "pwned")) == EPERM
    assert attempt(guarded, kind, ("truncate", "/data/hard_link", "0")) == EPERM
    assert shared.read_text() == "shared\n"
    shared.unlink()  # so the tree beside the grant is as assert_untouched expects
    guarded.assert_untouched()


def _swapper(granted: Path, secret: Path, stop: threading.Event) -> None:
    """Swap granted/target between a file and a symlink to the secret, atomically, until told."""
    file, link, target = granted / ".file", granted / ".link", granted / "target"
    while not stop.is_set():
        file.write_text("public")
        os.replace(file, target)
        os.symlink(secret, link)
        os.replace(link, target)


@pytest.mark.parametrize("kind", KINDS)
def test_symlink_swapped_in_between_check_and_use(guarded: Guarded, kind: str) -> None:
    """While the host swaps a granted path between a file and a symlink out, a guest that
    opens it over and over reads the file or is refused, never the secret."""
    (guarded.granted / "target").write_text("public")
    stop = threading.Event()
    swapper = threading.Thread(target=_swapper, args=(guarded.granted, guarded.secret, stop))
    swapper.start()
    try:
        if kind == "python":
            code = ("out = []\nfor _ in range(300):\n    try:\n        out.append(open('/data/target').read())\n"
                    "    except OSError as e:\n        out.append(type(e).__name__)\nsorted(set(out))")  # fmt: skip
            result = guarded.python(code, limits={"fuel": 10**9, "timeout": "5s"})
            assert set(result.value) <= {"public", "PermissionError", "FileNotFoundError"}, result.value
        else:
            run = guarded.command if kind == "command" else guarded.core
            result = run("readloop", "/data/target", "300")
            assert result.ok, result.error
            seen = set(result.stdout.splitlines())
            assert seen <= {"public", f"({EPERM})", f"({ENOENT})"}, seen
    finally:
        stop.set()
        swapper.join()
    assert not leaks_secret(result)
    for name in ("target", ".file", ".link"):
        (guarded.granted / name).unlink(missing_ok=True)
    guarded.assert_untouched()


FD_PROBES = [
    (("fdscan",), "0\n1\n2\n3\n4\n"),  # stdio, the one preopen, the empty hidden root: nothing of the host's
    (("prestat",), "3: /data\n4: /\n"),
    (("fdread", "3"), f"error: {EBADF}\n"),  # the preopen is a directory: no bytes
    (("fdread", "4"), f"error: {EBADF}\n"),
    (("fdread", "7"), f"error: {EBADF}\n"),  # host fds of the same number mean nothing here
    (("fdread", "255"), f"error: {EBADF}\n"),
    (("fdread", "1023"), f"error: {EBADF}\n"),
    (("fdread", "-1"), f"error: {EBADF}\n"),
    (("fdread", "0"), ""),  # stdin is the call's, and empty
    (("fdwrite", "3", "pwned"), f"error: {EBADF}\n"),
    (("fdwrite", "9", "pwned"), f"error: {EBADF}\n"),
]


@pytest.mark.parametrize("kind", ["command", "core"])
@pytest.mark.parametrize(("op", "stdout"), FD_PROBES, ids=["-".join(op) for op, _ in FD_PROBES])
def test_guessed_descriptors_lead_nowhere(
    guarded: Guarded, kind: str, op: tuple[str, ...], stdout: str
) -> None:
    run = guarded.command if kind == "command" else guarded.core
    result = run(*op)
    assert result.ok and result.stdout == stdout, (result.error, result.stdout)
    guarded.assert_untouched()


def test_python_guessed_descriptors_lead_nowhere(guarded: Guarded) -> None:
    code = """import os
found = {}
for fd in range(256):
    try:
        os.fstat(fd)
    except OSError:
        continue
    try:
        found[fd] = os.read(fd, 100)
    except OSError as e:
        found[fd] = type(e).__name__
found"""
    result = guarded.python(code)
    assert result.ok, result.error
    assert set(result.value) <= set(range(8)), result.value  # stdio and the preopens
    assert result.value[0] == b""  # stdin: the call's (empty)
    assert not leaks_secret(result)
    guarded.assert_untouched()


@pytest.mark.parametrize("kind", ["command", "core"])
def test_a_guest_opening_thousands_of_files_is_capped(guarded: Guarded, kind: str) -> None:
    run = guarded.command if kind == "command" else guarded.core
    result = run("openmany", "/data/inside.txt", "5000")
    assert result.stdout, result  # the guest reports how many opens succeeded, then the errno
    opened, error = result.stdout.split("\n")[:2]
    assert int(opened) == MAX_OPEN_FILES and error == "error: No file descriptors available"
    guarded.assert_untouched()


@pytest.mark.xfail(reason="wasmtime-py cannot guard wasi:filesystem (SECURITY.md, known gaps)", strict=True)
def test_python_open_files_are_capped(guarded: Guarded) -> None:
    code = ("import os\nopened = 0\ntry:\n    for _ in range(5000):\n"
            "        os.open('/data/inside.txt', os.O_RDONLY)\n        opened += 1\n"
            "except OSError:\n    pass\nopened")  # fmt: skip
    result = guarded.python(code)
    assert result.ok, result.error
    assert result.value == MAX_OPEN_FILES, f"{result.value} opens: no per-call cap on open files"


def test_an_interrupt_in_the_bookkeeping_loses_no_budget(
    guarded: Guarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C between taking budget for an open and recording the descriptor reaches the
    caller, and the call's budget still comes back in full."""
    budget = _wasi_files._budget
    take = budget.take

    def take_then_interrupt(files: _wasi_files.OpenFiles) -> bool:
        take(files)
        raise KeyboardInterrupt

    monkeypatch.setattr(budget, "take", take_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        guarded.command("openmany", "/data/inside.txt", "5")
    assert budget.held == 0
    monkeypatch.undo()
    guarded.assert_untouched()


@pytest.mark.parametrize("kind", ["command", "core"])
def test_closed_files_do_not_count_against_the_cap(guarded: Guarded, kind: str) -> None:
    run = guarded.command if kind == "command" else guarded.core
    result = run("readloop", "/data/inside.txt", str(3 * MAX_OPEN_FILES))  # open, read, close
    assert result.stdout == "inside\n\n" * (3 * MAX_OPEN_FILES)  # each read, then a newline
    guarded.assert_untouched()


def test_the_open_file_guard_keeps_wasi_semantics(guarded: Guarded) -> None:
    """Opens forwarded to Wasmtime's WASI fail as they did unforwarded: no memory export, or
    arguments WASI cannot represent, trap; an open during instantiation (a start section) works."""
    result = guarded.command(module=security_wat("open_no_memory"))
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.TRAP
    assert "missing required memory export" in result.error.message
    result = guarded.command(module=security_wat("open_in_start"))
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.TRAP, result
    assert "path_open" in result.error.message and "Rights" in result.error.message
    assert result.stdout == ""  # the trap stopped the guest: nothing after it ran
    guarded.assert_untouched()


def test_closing_stdio_or_renumbering_does_not_raise_the_cap(guarded: Guarded) -> None:
    """Only descriptors the call opened count: closing stdin/stdout/stderr (in-memory streams,
    not host descriptors) frees no place, a file moved by fd_renumber still counts, and
    closing it under its new number frees exactly one (opens: the cap, then one more)."""
    result = guarded.command(module=security_wat("open_tricks"))
    assert result.value == {"exit_code": MAX_OPEN_FILES + 1 - 100}, result
    guarded.assert_untouched()


def test_all_calls_together_stay_within_the_process_budget(
    guarded: Guarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside the per-call cap, the calls of a process together may hold at most
    `process_budget()` descriptors (half the process's limit); a call's are given back when it
    ends, however it ends."""
    budget = _wasi_files._budget
    assert budget.held == 0
    monkeypatch.setattr(budget, "limit", 40)
    monkeypatch.setattr(budget, "held", 10)  # as if other calls held 10
    result = guarded.command("openmany", "/data/inside.txt", "5000")
    assert result.stdout.split("\n")[:2] == ["30", "error: No file descriptors available"]
    assert budget.held == 10
    monkeypatch.setattr(budget, "held", 0)
    killed = guarded.command(module=security_wat("open_in_start"))  # holds one when it traps
    assert killed.error is not None and budget.held == 0
    guarded.assert_untouched()


def test_no_preopen_sees_no_filesystem_at_all(guarded: Guarded) -> None:
    result = guarded.command("fdscan", preopens=[])
    assert result.stdout == "0\n1\n2\n3\n"  # stdio and the empty hidden root
    listing = guarded.command("ls", "/", preopens=[])
    assert listing.value == {"exit_code": 1} and listing.stdout == f"error: {ENOENT}\n"
    guarded.assert_untouched()


def test_host_root_cannot_be_granted(guarded: Guarded) -> None:
    with pytest.raises(wasmbox.ManifestError, match="root directory"):
        guarded.command("ls", "/", preopens=[{"host": "/", "guest": "/"}])
    guarded.assert_untouched()


# -- the hidden root: a core module's empty read-only preopen at / ---------------------------

# What hidden_root.wat tries on the hidden root, in order, and the errno each must get
HIDDEN_ROOT_ATTEMPTS = [
    ("create a file", 44),  # ENOENT, as with no preopen at /
    ("mkdir", 44),
    ("open .. as a directory", 44),
    ("open / itself", 44),
    ("unlink", 44),
    ("rename", 44),
    ("hard link", 44),
    ("set times by path", 44),
    ("set the directory's own times", 63),  # EPERM: Wasmtime's, a read-only preopen
    ("move it onto descriptor 0", 0),  # the guest may; the root is still refused under 0
    ("create a file through 0", 44),
    ("list it", 0),
]


def test_the_hidden_root_cannot_be_written_climbed_out_of_or_listed(guarded: Guarded) -> None:
    """A raw guest that calls WASI on the hidden root itself (descriptor 3: nothing granted)
    gets ENOENT for every path call, even after moving it to another descriptor, cannot change
    the directory's times, and lists nothing; the host's directory stays empty and unchanged."""
    empty = guarded.box._scratch_space.empty
    before = os.stat(empty)
    result = guarded.command(module=security_wat("hidden_root"), preopens=[])
    assert result.ok, result.error
    seen = result.stdout_bytes if result.stdout_bytes is not None else result.stdout.encode()
    errnos = dict(zip([what for what, _ in HIDDEN_ROOT_ATTEMPTS], seen))
    assert errnos == dict(HIDDEN_ROOT_ATTEMPTS)
    assert seen[len(HIDDEN_ROOT_ATTEMPTS) :] == b""  # the listing: no entries at all
    assert "no preopen covers '/pwned'" in result.stderr
    after = os.stat(empty)
    assert os.listdir(empty) == [] and after.st_mode & 0o777 == 0o500
    assert (after.st_mtime_ns, after.st_ctime_ns) == (
        before.st_mtime_ns,
        before.st_ctime_ns,
    )  # (reads set atime)
    guarded.assert_untouched()


THROUGH_THE_ROOT = [
    ("write", "/pwned", "x"),
    ("append", "/pwned", "x"),
    ("mkdir", "/newdir"),
    ("rmdir", "/olddir"),
    ("unlink", "/pwned"),
    ("rename", "/data/inside.txt", "/moved.txt"),  # out of a grant onto the root
    ("link", "/data/inside.txt", "/linked.txt"),
    ("truncate", "/pwned", "0"),
    ("read", "/../outside/secret.txt"),
    ("read", "/.."),
    ("ls", "/"),
    ("ls", "/.."),
]


@pytest.mark.parametrize("kind", ["command", "core"])
@pytest.mark.parametrize("op", THROUGH_THE_ROOT, ids=["-".join(op[:2]) for op in THROUGH_THE_ROOT])
def test_paths_no_grant_covers_still_fail_as_missing(
    guarded: Guarded, kind: str, op: tuple[str, ...]
) -> None:
    """Through wasi-libc, every path outside the grants lands on the hidden root and fails
    as it did with no preopen at / (ENOENT), even next to a writable grant."""
    assert attempt(guarded, kind, op, writable=True) == ENOENT
    assert os.listdir(guarded.box._scratch_space.empty) == []
    guarded.assert_untouched()
