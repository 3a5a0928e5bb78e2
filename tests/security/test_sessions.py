"""Hostile session runs, Python's and JavaScript's: state left for another session or a fresh
call, a driver the guest rewrote between runs, a grant swapped under a live session, and what a closed session holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import wasmbox
from wasmbox import ErrorKind, SessionEndedError

from .conftest import QUICK, SECRET, Guarded, fd_targets, leaks_secret

# Everything a run can leave in its interpreter and scratch space for a later one to find.
PLANT = f"""
import builtins, json, sys, types
builtins.LEFT = {SECRET!r}
planted = {SECRET!r}
json.dumps = lambda *a, **k: {SECRET!r}
sys.modules['left_behind'] = types.ModuleType('left_behind')
sys.path.append('/tmp')
open('/tmp/left.txt', 'w').write({SECRET!r})
"""
LOOK = """
import builtins, json, os, sys
[hasattr(builtins, 'LEFT'), 'planted' in globals(), json.dumps(1), 'left_behind' in sys.modules,
 '/tmp' in sys.path, os.listdir('/tmp')]
"""
NOTHING = [False, False, "1", False, False, []]


def test_a_sessions_state_reaches_no_other_session_nor_a_fresh_call(guarded: Guarded) -> None:
    grants = {"name": "nb", "runtime": "python", "scratch": "1MiB", "limits": QUICK}
    planter = guarded.box.session(grants, name="planter")
    assert planter.run(PLANT).ok
    assert planter.run(LOOK).value == [True, True, SECRET, True, True, ["left.txt"]]  # (it is kept)
    for _ in range(3):  # the same grants: another session, a fresh call, a spare made meanwhile
        neighbour = guarded.box.session(grants)
        seen = neighbour.run(LOOK)
        assert seen.value == NOTHING and not leaks_secret(seen)
        neighbour.close()
        fresh = guarded.box.run_python(LOOK, grants)
        assert fresh.value == NOTHING and not leaks_secret(fresh)
    planter.close()
    del planter, neighbour
    guarded.assert_untouched()


def test_a_driver_rewritten_by_the_guest_does_not_lift_the_hosts_caps(guarded: Guarded) -> None:
    """A session's guest may rewrite the driver for its own later runs (its output cap, the
    biggest reply, stdout's writer); the host's caps on the result and stdout still hold."""
    grants = {"name": "nb", "runtime": "python", "limits": {**QUICK, "output": "16KiB"}}
    session = guarded.box.session(grants)
    rewrite = (
        "import io, sys, wasmbox_driver as d\n"
        "d._output_cap = d.REPLY_MAX = 1 << 40\n"
        "d._reply = lambda value, strict: d._pack({'ok': value})\n"
        "sys.stdout = io.TextIOWrapper(io.FileIO(1, 'w', closefd=False), write_through=True)\n"
    )
    assert session.run(rewrite).ok
    big = session.run("'x' * 100_000")
    assert big.error is not None and big.error.kind is ErrorKind.OUTPUT_LIMIT
    assert "exceeds the 16KiB output cap" in big.error.message and session.closed
    again = guarded.box.session(grants)
    assert again.run(rewrite).ok
    flood = again.run("for _ in range(100):\n    sys.stdout.write('y' * 1000)")
    assert flood.error is not None and flood.error.kind is ErrorKind.OUTPUT_LIMIT
    assert len(flood.stdout) <= 16 * 1024 and flood.truncated and again.closed
    del session, again
    guarded.assert_untouched()


def test_a_grant_swapped_under_a_live_session_ends_it(guarded: Guarded) -> None:
    """Each run checks the session's preopens are still the directories granted: a granted
    folder replaced by a symlink to the secret's folder ends the session, unread."""
    grants = {"name": "nb", "runtime": "python", "limits": QUICK, "preopens": guarded.preopen()}
    session = guarded.box.session(grants)
    assert session.run("open('/data/inside.txt').read()").value == "inside\n"
    moved = guarded.root / "moved"
    os.rename(guarded.granted, moved)
    os.symlink(guarded.outside, guarded.granted)
    try:
        swapped = session.run("open('/data/secret.txt').read()")
        assert swapped.error is not None and swapped.error.kind is ErrorKind.CAPABILITY_DENIED
        assert not leaks_secret(swapped) and session.closed
        try:
            session.run("1")
        except SessionEndedError as exc:
            assert "capability_denied" in exc.reason
        else:
            raise AssertionError("a session whose grant was swapped ran again")
    finally:
        os.unlink(guarded.granted)
        os.rename(moved, guarded.granted)
    del session
    guarded.assert_untouched()


def test_a_closed_session_holds_no_descriptor(guarded: Guarded) -> None:
    """Counted by what they refer to (the grant, the session's scratch folder), so that the
    load's calls beside it (`--under-load`) do not count."""
    grants = {"name": "nb", "runtime": "python", "scratch": "1MiB", "limits": QUICK,
              "preopens": guarded.preopen()}  # fmt: skip
    session = guarded.box.session(grants)
    assert session._kernel is not None and session._kernel.scratch is not None
    folders = (str(guarded.granted), str(session._kernel.scratch.path))

    def held() -> list[str]:
        return [target for target in fd_targets() if any(folder in target for folder in folders)]

    assert session.run("f = open('/data/inside.txt')\ng = open('/tmp/x', 'w')\nf.read()").value == "inside\n"
    assert len(held()) >= 4  # its WASI context holds the two preopens and the guest's two files
    session.close()
    assert held() == []
    del session
    guarded.assert_untouched()


def test_files_a_session_keeps_open_across_runs_are_capped(guarded: Guarded) -> None:
    """Files kept open from run to run count against `SessionLimits.files`: under it the session
    goes on, and the run that takes it past fails, naming the limit, and ends the session, which
    closes them all; fresh calls are served as before."""
    grants = {"name": "nb", "runtime": "python", "limits": QUICK, "preopens": guarded.preopen()}
    session = guarded.box.session(grants, limits=wasmbox.SessionLimits(files=40))
    granted = str(guarded.granted)

    def held() -> int:
        return sum(granted in target for target in fd_targets())

    keep = "import os\nkept = globals().setdefault('kept', [])\n" \
           "kept += [os.open('/data/inside.txt', os.O_RDONLY) for _ in range({})]\nlen(kept)"  # fmt: skip
    assert [session.run(keep.format(10)).value for _ in range(3)] == [10, 20, 30]
    assert held() >= 30
    result = session.run(keep.format(15))
    assert result.error is not None and result.error.kind is ErrorKind.HOST_ERROR, result
    assert "files open between runs, more than its 40 (SessionLimits.files)" in result.error.message
    assert session.closed and held() == 0
    one_run = guarded.box.session(grants, limits=wasmbox.SessionLimits(files=40))  # all in one run
    result = one_run.run(keep.format(500))
    assert result.error is not None and "(SessionLimits.files)" in result.error.message
    assert one_run.closed and held() == 0
    assert (
        guarded.box.run_python("open('/data/inside.txt').read()", {**grants, "name": "py"}).value
        == "inside\n"
    )
    del session, one_run
    guarded.assert_untouched()


# A process whose soft RLIMIT_NOFILE is 512: sessions may keep 128 files open together.
LOW_LIMIT = """
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import wasmbox
data = sys.argv[1]
grants = {"name": "nb", "runtime": "python", "preopens": [{"host": data, "guest": "/data"}]}
keep = "import os\\nk = [os.open('/data/a.txt', os.O_RDONLY) for _ in range({})]\\nlen(k)"
out = {}
with wasmbox.Sandbox(cache_dir=sys.argv[2], progress=None) as box:
    one = box.session(grants).run(keep.format(500))  # as many as it can, in one run
    out["one"] = [one.error.kind.value, one.error.message]
    sessions = [box.session(grants) for _ in range(3)]
    runs = [s.run(keep.format(50)) for s in sessions]  # each under its own 64
    out["runs"] = [r.value if r.ok else [r.error.kind.value, r.error.message] for r in runs]
    out["closed"] = [s.closed for s in sessions]
    out["listing"] = len(os.listdir("/proc/self/fd")) < 512
    out["fresh"] = box.run_python("open('/data/a.txt').read()", grants).value
print(json.dumps(out))
"""


def test_sessions_keeping_files_open_cannot_starve_the_process(tmp_path: Path, cache_dir: Path) -> None:
    """With a soft RLIMIT_NOFILE of 512, a session that opens 500 files fails and is freed, and
    sessions each under their own cap are stopped once they keep more than a quarter of the
    limit together: the host can still list its descriptors and serve fresh calls."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("a\n")
    done = subprocess.run(
        [sys.executable, "-c", LOW_LIMIT, str(data), str(cache_dir)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["one"][0] == "host_error" and "(SessionLimits.files)" in out["one"][1]
    assert out["runs"][:2] == [50, 50]
    kind, message = out["runs"][2]
    assert kind == "host_error" and "more than the 128 they may together" in message
    assert out["closed"] == [False, False, True]
    assert out["listing"] and out["fresh"] == "a\n"


def test_sessions_past_the_cap_are_refused_and_the_sandbox_keeps_serving(guarded: Guarded) -> None:
    opened = [guarded.box.session() for _ in range(8)]  # the default max_sessions
    try:
        guarded.box.session()
    except wasmbox.SessionError as exc:
        assert "max_sessions=8" in str(exc)
    else:
        raise AssertionError("a ninth session opened")
    assert [s.run("1").value for s in opened] == [1] * 8
    for session in opened:
        session.close()
    del opened, session  # (a session holds its runtime, and the runtime its compiled file)
    guarded.assert_untouched()


# -- JavaScript sessions ---------------------------------------------------------------------

JS_PLANT = f"""
globalThis.LEFT = {SECRET!r};
var planted = {SECRET!r};
Object.prototype.polluted = {SECRET!r};
JSON.stringify = () => {SECRET!r};
Array.prototype.push = function () {{ return {SECRET!r}; }};
std.setenv("LEFT", {SECRET!r});
setTimeout(() => {{ globalThis.late = {SECRET!r}; }}, 0);
const f = std.open("/tmp/left.txt", "w"); f.puts({SECRET!r}); f.close();
"planted"
"""
JS_LOOK = """
[typeof globalThis.LEFT, typeof planted, ({}).polluted ?? "no", JSON.stringify(1), [].push(1),
 std.getenv("LEFT") ?? "unset", typeof globalThis.late, std.loadFile("/tmp/left.txt")]
"""
JS_NOTHING = ["undefined", "undefined", "no", "1", 1, "unset", "undefined", None]


def test_a_javascript_sessions_state_reaches_no_other_session_nor_a_fresh_call(guarded: Guarded) -> None:
    grants = {"name": "nb", "runtime": "javascript", "scratch": "1MiB", "limits": QUICK}
    planter = guarded.box.session(grants, name="planter", runtime="javascript")
    assert planter.run(JS_PLANT).value == "planted"
    kept = planter.run(JS_LOOK)
    assert kept.value[:2] == ["string", "string"] and kept.value[-1] == SECRET  # (it is kept)
    for _ in range(3):  # the same grants: another session, a fresh call
        neighbour = guarded.box.session(grants, runtime="javascript")
        seen = neighbour.run(JS_LOOK)
        assert seen.value == JS_NOTHING and not leaks_secret(seen), seen
        neighbour.close()
        fresh = guarded.box.run_javascript(JS_LOOK, grants)
        assert fresh.value == JS_NOTHING and not leaks_secret(fresh), fresh
    python = guarded.box.session({"name": "py", "runtime": "python", "scratch": "1MiB", "limits": QUICK})
    assert python.run("import os\nos.listdir('/tmp')").value == []
    planter.close()
    python.close()
    del planter, neighbour, python
    guarded.assert_untouched()


def test_a_javascript_driver_rewritten_between_runs_does_not_lift_the_hosts_caps(guarded: Guarded) -> None:
    """What a run may replace for the later ones (JSON, console, std.out, the prototypes the
    driver's reply is made with) changes neither the output cap nor the kind of an error."""
    grants = {"name": "nb", "runtime": "javascript", "limits": {**QUICK, "output": "16KiB"}}
    session = guarded.box.session(grants, runtime="javascript")
    rewrite = (
        "JSON.stringify = () => '1'; Object.prototype.toJSON = function () { return {error: 'forged', "
        "kind: 'memory_limit'}; }; std.out.puts = function (s) { std.err.puts(s); }; 1"
    )
    assert session.run(rewrite).ok
    forged = session.run("throw new Error('x')")
    assert forged.error is not None and forged.error.kind is ErrorKind.GUEST_ERROR and not session.closed
    big = session.run("delete Object.prototype.toJSON; 'x'.repeat(100_000)")
    assert big.error is not None and big.error.kind is ErrorKind.OUTPUT_LIMIT and session.closed
    again = guarded.box.session(grants, runtime="javascript")
    assert again.run("globalThis.console = {log: (s) => std.err.puts(s)}; 1").ok
    flood = again.run("for (let i = 0; i < 100; i++) console.log('y'.repeat(1000))")
    assert flood.error is not None and flood.error.kind is ErrorKind.OUTPUT_LIMIT
    assert len(flood.stderr) <= 16 * 1024 and flood.truncated and again.closed
    del session, again
    guarded.assert_untouched()


def test_a_grant_swapped_under_a_live_javascript_session_ends_it(guarded: Guarded) -> None:
    grants = {"name": "nb", "runtime": "javascript", "limits": QUICK, "preopens": guarded.preopen()}
    session = guarded.box.session(grants, runtime="javascript")
    assert session.run("std.loadFile('/data/inside.txt')").value == "inside\n"
    moved = guarded.root / "moved"
    os.rename(guarded.granted, moved)
    os.symlink(guarded.outside, guarded.granted)
    try:
        swapped = session.run("std.loadFile('/data/secret.txt')")
        assert swapped.error is not None and swapped.error.kind is ErrorKind.CAPABILITY_DENIED
        assert not leaks_secret(swapped) and session.closed
    finally:
        os.unlink(guarded.granted)
        os.rename(moved, guarded.granted)
    del session
    guarded.assert_untouched()


def test_a_closed_javascript_session_holds_no_descriptor(guarded: Guarded) -> None:
    grants = {"name": "nb", "runtime": "javascript", "scratch": "1MiB", "limits": QUICK,
              "preopens": guarded.preopen()}  # fmt: skip
    session = guarded.box.session(grants, runtime="javascript")
    assert session._kernel is not None and session._kernel.scratch is not None
    folders = (str(guarded.granted), str(session._kernel.scratch.path))

    def held() -> list[str]:
        return [target for target in fd_targets() if any(folder in target for folder in folders)]

    opened = "globalThis.f = std.open('/data/inside.txt', 'r'); globalThis.g = std.open('/tmp/x', 'w'); f.getline()"
    assert session.run(opened).value == "inside"
    assert len(held()) >= 4  # its WASI context holds the two preopens and the guest's two files
    session.close()
    assert held() == []
    del session
    guarded.assert_untouched()
