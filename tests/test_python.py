"""The CPython runtime: Python tools and snippets in the same sandbox, limits and error kinds.

The runtime is built from scratch once per test session (componentize-py, then compiled).
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._manifest import PYTHON_FUEL

from .conftest import CAPABILITIES, outlast_the_deadline

SALES = CAPABILITIES / "data" / "sales.csv"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "numbers.txt").write_text("1\n2\n3\n")
    (tmp_path / "secret.txt").write_text("top secret")
    return folder


def grants(data: Path | None = None, **fields: Any) -> dict[str, Any]:
    """A run_python grant set; `data` is preopened read-only at /data."""
    manifest: dict[str, Any] = {"name": "snippet", "runtime": "python", **fields}
    if data is not None:
        manifest["preopens"] = [{"host": str(data), "guest": "/data"}]
    return manifest


def kind(result: wasmbox.CallResult) -> str:
    return result.error.kind.value if result.error else "ok"


# -- tools ------------------------------------------------------------------------------


def test_python_tool_reads_a_preopened_csv(box: wasmbox.Sandbox) -> None:
    tool = box.load(CAPABILITIES / "csv_stats.toml")
    assert tool.kind is wasmbox.ToolKind.PYTHON
    value = tool.call({"path": "/data/sales.csv", "group_by": "region"}).unwrap()
    import csv
    import statistics

    rows = list(csv.DictReader(SALES.open()))
    units = [float(r["units"]) for r in rows]
    assert value["rows"] == len(rows)
    assert value["all"]["sum"] == sum(units)
    assert value["all"]["median"] == statistics.median(units)
    assert set(value["by_region"]) == {r["region"] for r in rows}


@pytest.mark.parametrize("path", ["/etc/passwd", "/data/../../etc/passwd", "/python/os.py/../../etc"])
def test_python_tool_refused_outside_its_preopen(box: wasmbox.Sandbox, path: str) -> None:
    result = box.load(CAPABILITIES / "csv_stats.toml").call({"path": path})
    assert kind(result) == "guest_error"
    assert "Error" in result.error.message  # type: ignore[union-attr]


def test_python_tool_args_are_checked(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "add.py"
    source.write_text("def main(a: int, b: int = 1):\n    return a + b\n")
    tool = box.load({"name": "add", "runtime": "python", "source": str(source)})
    assert tool.call({"a": 2}).unwrap() == 3
    assert kind(tool.call({"b": 2})) == "invalid_arguments"  # a is missing
    assert kind(tool.call({"a": 1, "c": 2})) == "invalid_arguments"
    assert kind(tool.call({"a": 1}, argv=["--flag"])) == "invalid_arguments"  # commands only
    schema_tool = box.load(CAPABILITIES / "csv_stats.toml")
    assert kind(schema_tool.call({"path": 5})) == "invalid_arguments"
    missing = tool.call({"b": 2}).error
    assert missing is not None and missing.message == "args: missing required property 'a'"


# Whatever a tool's entry is, it is called straight away; a TypeError is bad arguments only when
# the call itself raised it, before any of the tool's Python code ran, and the arguments do not
# fit the entry's signature.
_TYPED = (
    "import functools\n"
    "def logged(f):\n"
    "    @functools.wraps(f)\n"
    "    def wrapper(*args, **kwargs):\n"
    "        return f(*args, **kwargs)\n"
    "    return wrapper\n"
    "def helper(x):\n"
    "    return x\n"
    "def main(a: int):\n"
    "    if a == 1:\n"
    "        return a + 'text'\n"
    "    return helper(a, a)\n"
    "wrapped = logged(main)\n"
)  # fmt: skip
_RETRYING = (  # a wrapper's own parameters are the wrapper's to take
    "import functools\n"
    "from typing import TYPE_CHECKING\n"
    "if TYPE_CHECKING:\n"
    "    from decimal import Decimal\n"
    "def retry(f):\n"
    "    @functools.wraps(f)\n"
    "    def wrapper(*args, retries: int = 1, **kwargs):\n"
    "        return [retries, f(*args, **kwargs)]\n"
    "    return wrapper\n"
    "@retry\n"
    "def main(x: 'Decimal') -> int:\n"
    "    return int(x)\n"
)  # fmt: skip
_KINDS = (  # entries that are not plain functions
    "import dataclasses, functools\n"
    "class Cls:\n"
    "    def __init__(self, a, b=1):\n"
    "        self.value = a + b\n"
    "@dataclasses.dataclass\n"
    "class Data:\n"
    "    a: int\n"
    "def add(a, b):\n"
    "    return a + b\n"
    "partial = functools.partial(add, b=5)\n"
    "class Callable:\n"
    "    def __call__(self, a):\n"
    "        return a\n"
    "instance = Callable()\n"
    "method = Callable().__call__\n"
    "def logged(f):\n"
    "    @functools.wraps(f)\n"
    "    def wrapper(a, *args, **kwargs):\n"
    "        return f(a, *args, **kwargs)\n"
    "    return wrapper\n"
    "wrapped_add = logged(add)\n"
    "def inject(f):\n"
    "    @functools.wraps(f)\n"
    "    def wrapper(*args, **kwargs):\n"
    "        return f(*args, ctx=10, **kwargs)\n"
    "    return wrapper\n"
    "def retry(f):\n"
    "    @functools.wraps(f)\n"
    "    def wrapper(*args, retries=1, **kwargs):\n"
    "        return f(*args, **kwargs)\n"
    "    return wrapper\n"
    "@logged\n"
    "@retry\n"
    "@inject\n"
    "def stacked(a, ctx):\n"
    "    return a + ctx\n"
    "import enum\n"
    "class Level(enum.IntEnum):\n"
    "    LOW = 1\n"
    "def labelled(f):\n"
    "    @functools.wraps(f)\n"
    "    def wrapper(*args, **kwargs):\n"
    "        return 'result: ' + f(*args, ctx=10, **kwargs)\n"
    "    return wrapper\n"
    "@labelled\n"
    "def posted(a, ctx):\n"
    "    return a + ctx\n"
)  # fmt: skip


def _tool_of(box: wasmbox.Sandbox, tmp_path: Path, source: str, entry: str = "main") -> wasmbox.Tool:
    path = tmp_path / "tool.py"
    path.write_text(source)
    return box.load({"name": f"tool_{entry}", "runtime": "python", "source": str(path), "entry": entry})


@pytest.mark.parametrize("args", [{"a": 1}, {"a": 2}], ids=["its-own", "from-a-nested-call"])
def test_a_type_error_raised_in_a_tools_code_is_a_guest_error(
    box: wasmbox.Sandbox, tmp_path: Path, args: dict[str, int]
) -> None:
    result = _tool_of(box, tmp_path, _TYPED).call(args)
    assert kind(result) == "guest_error" and "TypeError" in result.error.message  # type: ignore[union-attr]


def test_args_a_wrapper_refuses_are_a_guest_error(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    wrapped = _tool_of(box, tmp_path, _TYPED, entry="wrapped")
    misfit = wrapped.call({"b": 1})  # refused inside the wrapper, which ran: reported as such
    assert kind(misfit) == "guest_error" and "unexpected keyword argument 'b'" in misfit.error.message  # type: ignore[union-attr]
    assert kind(wrapped.call({"a": 1})) == "guest_error"


def test_a_wrappers_own_parameters_are_the_wrappers_to_take(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    retried = _tool_of(box, tmp_path, _RETRYING)
    assert retried.call({"x": 2, "retries": 3}).value == [3, 2]  # Decimal is never imported
    assert "unexpected keyword argument 'y'" in retried.call({"x": 2, "y": 3}).error.message  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("entry", "args", "value"),
    [
        ("Cls", {"a": 1}, None),  # it ran: an instance comes back, which cannot be sent
        ("Data", {"a": 1}, {"a": 1}),  # (a dataclass's fields can)
        ("partial", {"a": 1}, 6),
        ("instance", {"a": 1}, 1),
        ("method", {"a": 1}, 1),
        ("wrapped_add", {"a": 1, "b": 2}, 3),
        ("stacked", {"a": 1, "retries": 3}, 11),
        ("Level", {"value": 1}, 1),
    ],
)
def test_an_entry_that_is_not_a_plain_function_is_checked_then_called(
    box: wasmbox.Sandbox, tmp_path: Path, entry: str, args: dict[str, int], value: object
) -> None:
    tool = _tool_of(box, tmp_path, _KINDS, entry=entry)
    result = tool.call(args)
    if value is None:
        assert "cannot be sent" in result.error.message, result.error  # type: ignore[union-attr]
    else:
        assert result.value == value, result.error
    assert kind(tool.call({"zzz": 1})) == "invalid_arguments"


def test_a_wrappers_type_error_after_the_function_returned_is_a_guest_error(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    bug = _tool_of(box, tmp_path, _KINDS, entry="posted").call({"a": 1})
    assert kind(bug) == "guest_error" and "can only concatenate" in bug.error.message  # type: ignore[union-attr]


def test_a_c_wrappers_type_error_is_a_guest_error_and_misfit_args_are_invalid(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    """functools.lru_cache is a C wrapper: its TypeError comes from no Python frame."""
    cached = _tool_of(
        box, tmp_path, "import functools\n@functools.lru_cache\ndef main(items):\n    return len(items)\n"
    )
    unhashable = cached.call({"items": [1]})
    assert kind(unhashable) == "guest_error" and "unhashable" in unhashable.error.message  # type: ignore[union-attr]
    assert kind(cached.call({"zzz": 1})) == "invalid_arguments"


def test_python_tool_exception_is_a_guest_error_with_its_traceback(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    source = tmp_path / "boom.py"
    source.write_text("def helper(x):\n    return 1 / x\n\ndef main(x):\n    return helper(x)\n")
    result = box.load({"name": "boom", "runtime": "python", "source": str(source)}).call({"x": 0})
    assert kind(result) == "guest_error"
    message = result.error.message  # type: ignore[union-attr]
    assert 'File "boom.py", line 2, in helper' in message
    assert "return 1 / x" in message and "ZeroDivisionError" in message
    assert "wasmbox_driver" not in message


def test_python_tool_syntax_error_and_bad_entry(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def main(:\n")
    with pytest.raises(wasmbox.ManifestError, match="broken.py"):
        box.load({"name": "broken", "runtime": "python", "source": str(broken)})
    ok = tmp_path / "ok.py"
    ok.write_text("def main():\n    return 1\n")
    with pytest.raises(wasmbox.ManifestError, match="binds no 'run' at its top level; its functions: 'main'"):
        box.load({"name": "wrong_entry", "runtime": "python", "source": str(ok), "entry": "run"})


def test_python_tool_unsendable_return_value(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "obj.py"
    source.write_text("def main():\n    return object()\n")
    result = box.load({"name": "obj", "runtime": "python", "source": str(source)}).call({})
    assert kind(result) == "guest_error" and "cannot be sent" in result.error.message  # type: ignore[union-attr]


def test_python_tool_is_compiled_by_the_runtimes_python(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """Load checks the source with the guest's CPython 3.14, whatever the host runs: PEP 758's
    unparenthesized `except A, B` is 3.14 syntax (the host's compile() refused it)."""
    source = tmp_path / "modern.py"
    source.write_text(
        "def main[T](x: T) -> list[T]:\n"
        "    try:\n"
        "        return [x, 1 / 0]\n"
        "    except ValueError, ZeroDivisionError:\n"
        "        return [x, x]\n"
    )  # fmt: skip
    tool = box.load({"name": "modern", "runtime": "python", "source": str(source)})
    assert tool.call({"x": 3}).value == [3, 3]


def test_loading_a_python_tool_runs_none_of_it(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "loud.py"
    source.write_text("raise RuntimeError('module code ran')\n\ndef main():\n    return 1\n")
    tool = box.load({"name": "loud", "runtime": "python", "source": str(source)})  # compiled only
    result = tool.call({})
    assert kind(result) == "guest_error" and "module code ran" in result.error.message  # type: ignore[union-attr]
    assert "loud.py" in result.error.message  # type: ignore[union-attr]  # the source travels for tracebacks


def test_a_python_tool_cannot_change_what_its_later_calls_run(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """Calls share the bytecode made at load, never anything a call made: tampering with the
    driver's compiling and loading in one call reaches no other."""
    source = tmp_path / "tamper.py"
    source.write_text(
        "import marshal, zlib, wasmbox_driver\n"
        "def main():\n"
        "    seen = getattr(wasmbox_driver, 'TAMPERED', False)\n"
        "    wasmbox_driver.TAMPERED = True\n"
        "    wasmbox_driver._compile_tool = lambda *args: b'evil'\n"
        "    marshal.loads = zlib.decompress = None\n"
        "    return seen\n"
    )  # fmt: skip
    tool = box.load({"name": "tamper", "runtime": "python", "source": str(source)})
    assert [tool.call({}).value for _ in range(3)] == [False, False, False]


def test_compiling_a_tool_has_limits_of_its_own(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """Compiling can cost more fuel than a call, and the bytecode can be bigger than the tool's
    output cap: neither is held against the tool, whose calls skip compiling."""
    source = tmp_path / "long.py"
    source.write_text(
        f'"""{tmp_path} ' + "documentation " * 1000 + '"""\n'  # new to the cache: compiled here
        "def main():\n    return [\n" + "        1,\n" * 300 + "    ]\n"
    )  # fmt: skip
    limits = {"fuel": 6_000_000, "output": "4KiB"}  # a call takes ~4.4M, compiling ~9M
    tool = box.load({"name": "long", "runtime": "python", "source": str(source), "limits": limits})
    assert tool.call({}).value == [1] * 300


def test_a_tool_that_cannot_be_compiled_now_is_not_blamed_on_its_source(
    cache_dir: Path, tmp_path: Path
) -> None:
    """A compile that fails for the Sandbox's reasons (here: every pool slot busy) is a
    WasmboxError to retry, not a ManifestError about the source."""
    source = tmp_path / "later.py"
    source.write_text(f"def main():\n    return 'later'  # {tmp_path}\n")  # not cached yet
    manifest = {"name": "later", "runtime": "python", "source": str(source)}
    started, release = threading.Event(), threading.Event()
    settings = wasmbox.EngineSettings(pool_slots=4)  # room for one Python instance
    with wasmbox.Sandbox(cache_dir=cache_dir, settings=settings) as box:
        box.register_host_function("test.hold", lambda: started.set() or release.wait(10))
        box.prepare_python()
        holding = grants(host_functions=["test.hold"], limits={"timeout": "20s"})
        busy = threading.Thread(
            target=box.run_python, args=("import wasmbox_guest\nwasmbox_guest.call_host('test.hold')", holding)
        )  # fmt: skip
        busy.start()
        try:
            assert started.wait(10)
            with pytest.raises(wasmbox.WasmboxError, match="could not compile") as refused:
                box.load(manifest)
            assert not isinstance(refused.value, wasmbox.ManifestError)
        finally:
            release.set()
            busy.join()
        for _ in range(100):  # the Sandbox serves again once freed slots are back in the pool
            try:
                result = box.load(manifest, replace=True).call({})
            except wasmbox.WasmboxError:
                continue
            finally:
                time.sleep(0.05)
            if result.ok or kind(result) != "host_error":
                break
        assert result.value == "later", result.error


def test_syntax_warnings_surface_at_load(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "warns.py"
    source.write_text(f"def main():\n    return '\\d'  # {tmp_path}\n")
    manifest = {"name": "warns", "runtime": "python", "source": str(source)}
    with warnings.catch_warnings():  # as errors: the load fails, and nothing is cached
        warnings.simplefilter("error", SyntaxWarning)
        with pytest.raises(SyntaxWarning):
            box.load(manifest)
    with pytest.warns(SyntaxWarning, match=r"warns.py.*invalid escape sequence") as caught:
        tool = box.load(manifest)
    assert caught[0].filename == __file__  # it points at the caller's load
    result = tool.call({})
    assert result.value == "\\d" and result.stderr == ""  # not again in every call


def test_tools_and_snippets_are_real_modules(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """Dataclasses (with or without postponed annotations), pickle and typing look a class's
    module up in sys.modules; the driver's own `from __future__` does not leak into them."""
    body = (
        "import dataclasses, pickle, typing\n"
        "@dataclasses.dataclass\n"
        "class Point:\n"
        "    x: int\n"
        "    y: typing.ClassVar[int] = 0\n"
        "def main():\n"
        "    point = pickle.loads(pickle.dumps(Point(3)))\n"
        "    return [point.x, type(Point.__annotations__['x']).__name__]\n"
    )  # fmt: skip
    for future in ("", "from __future__ import annotations\n"):
        source = tmp_path / "points.py"
        source.write_text(future + body)
        value = (
            box.load({"name": "points", "runtime": "python", "source": str(source)}, replace=True)
            .call({})
            .value
        )
        assert value == [3, "str" if future else "type"]
    snippet = box.run_python(body + "main()")
    assert snippet.value == [3, "type"], snippet.error


# -- the code interpreter ---------------------------------------------------------------


def test_run_python_returns_the_last_expression_and_output(box: wasmbox.Sandbox) -> None:
    result = box.run_python("import statistics\nprint('hello')\nstatistics.mean([1, 2, 3])")
    assert result.ok and result.value == 2
    assert result.stdout == "hello\n"
    assert box.run_python("x = 1").value is None
    assert box.run_python("import sys\nprint('oops', file=sys.stderr)").stderr == "oops\n"
    assert box.run_python("{1, 2}").value in ([1, 2], [2, 1])  # sets travel as lists
    assert box.run_python("object()").value.startswith("<object object")  # others as repr
    lone = box.run_python("# a lone expression\n\nprint('hi') or 5\n")
    assert (lone.value, lone.stdout) == (5, "hi\n")


@pytest.mark.parametrize(
    ("code", "value"),
    [
        ("x = 1\nx", 1),
        ("max(\n    1,\n    2,\n)", 2),  # one expression over several lines
        ("m = max(\n    1,\n    2,\n)", None),
        ("a = 1; a", 1),
        ("[x\nfor x in range(3)]", [0, 1, 2]),  # a line at column 0 inside brackets
        ('"""\nx = 1 # """', "\nx = 1 # "),  # a line at column 0 inside a string
        ("s = 2 + \\\n3\ns", 5),  # a continued line
        ("if 1:\n    y = 5\nelse:\n    y = 6\ny", 5),
        ("for i in range(2):\n    pass\ni", 1),
        ("def f():\n    return 7\n\nf()\n\n# done\n", 7),
        ("@staticmethod\ndef g():\n    pass\ntype(g).__name__", "staticmethod"),
        ("from __future__ import annotations\nx: undefined_name = 1\nx", 1),
        ("x = 1\nif x:\n    x = 2", None),
    ],
)
def test_a_snippets_value_is_its_last_statements_when_an_expression(
    box: wasmbox.Sandbox, code: str, value: object
) -> None:
    result = box.run_python(code)
    assert result.ok, result.error
    assert result.value == value


def test_a_snippets_errors_keep_their_lines_and_its_annotations_are_one_set(box: wasmbox.Sandbox) -> None:
    failing = box.run_python("a = 1\n\nb = undefined_name\nb")
    assert 'File "<code>", line 3' in failing.error.message  # type: ignore[union-attr]
    raised = box.run_python("x = 1\n\n\n1 / x / 0")
    assert 'File "<code>", line 4' in raised.error.message  # type: ignore[union-attr]
    unclosed = box.run_python("x = 1\ny = (")
    assert "SyntaxError" in unclosed.error.message and "line 2" in unclosed.error.message  # type: ignore[union-attr]
    session = box.session()  # a run's names annotated before and in its last statement
    assert session.run("a: int = 1\nif True:\n    b: str = 'x'").ok
    assert session.run("import sys\nsorted(sys.modules['__main__'].__annotations__)").value == ["a", "b"]


def test_run_python_errors(box: wasmbox.Sandbox) -> None:
    syntax = box.run_python("def (")
    assert kind(syntax) == "guest_error" and "SyntaxError" in syntax.error.message  # type: ignore[union-attr]
    failing = box.run_python("1 / 0")
    assert kind(failing) == "guest_error" and 'File "<code>", line 1' in failing.error.message  # type: ignore[union-attr]
    exit_ = box.run_python("import sys\nsys.exit(3)")
    assert kind(exit_) == "guest_error" and "SystemExit" in exit_.error.message  # type: ignore[union-attr]
    recursion = box.run_python("def f():\n    return f()\nf()")
    assert kind(recursion) == "guest_error" and "RecursionError" in recursion.error.message  # type: ignore[union-attr]
    assert len(recursion.error.message) < 10_000  # type: ignore[union-attr]


def test_state_does_not_survive_between_calls(box: wasmbox.Sandbox) -> None:
    first = box.run_python("import json, builtins\njson.MARK = 1\nbuiltins.LEAK = 'x'\nGLOBAL = 5\n1")
    assert first.value == 1
    second = box.run_python(
        "import json, builtins\n[hasattr(json, 'MARK'), hasattr(builtins, 'LEAK'), 'GLOBAL' in globals()]"
    )
    assert second.value == [False, False, False]


def test_random_is_seeded_per_call(box: wasmbox.Sandbox) -> None:
    values = {box.run_python("import random\nrandom.random()").value for _ in range(3)}
    assert len(values) == 3


@pytest.mark.parametrize(
    "read",
    [
        "random.getstate()[1][:8]",  # the state itself, before any number is drawn
        "[random.getrandbits(64), random.randbytes(8).hex()]",
        "sorted(random.sample(range(10**9), 4))",
        # a name taken from the module before the first draw is drawn for too
        "(lambda draw: [draw(), draw()])(__import__('random').random)",
    ],
)
def test_random_state_is_drawn_before_anything_reads_it(box: wasmbox.Sandbox, read: str) -> None:
    """The snapshot's state is the same in every instance; each call's is its own."""
    values = [box.run_python(f"import random\n{read}") for _ in range(3)]
    assert all(v.ok for v in values), values[0].error
    assert len({repr(v.value) for v in values}) == 3


def test_a_seeded_sequence_is_the_seeds_own_in_every_call(box: wasmbox.Sandbox) -> None:
    """`seed(x)` and `setstate` are draws too: nothing draws again over them."""
    expected = random.Random(42)
    want = [expected.random() for _ in range(3)]
    for _ in range(2):
        seeded = box.run_python("import random\nrandom.seed(42)\n[random.random() for _ in range(3)]")
        assert seeded.value == want
    state = random.Random(7).getstate()
    restored = box.run_python(f"import random\nrandom.setstate({state!r})\nrandom.random()")
    assert restored.value == random.Random(7).random()


def test_a_call_that_uses_no_random_number_draws_no_state(box: wasmbox.Sandbox) -> None:
    """Drawing a state (the Mersenne Twister's set-up) costs a call fuel, so only calls that
    use `random` pay it; componentize-py's `random.seed()` at an instance's first call is left
    to the first use too. Both snippets take the same one-line path."""
    unused = box.run_python("__import__('random').__name__")
    used = box.run_python("__import__('random').random()")
    assert unused.ok and used.ok
    assert used.fuel_used - unused.fuel_used > 50_000


def test_stdlib_beyond_the_snapshot_imports_lazily(box: wasmbox.Sandbox) -> None:
    result = box.run_python(
        "import colorsys, shlex\n[colorsys.rgb_to_hsv(1, 0, 0), shlex.split('a \"b c\"')]"
    )
    assert result.value == [[0.0, 1.0, 1], ["a", "b c"]]
    for big in ("pickle", "argparse", "shutil", "tarfile", "configparser"):  # their .pyc are
        imported = box.run_python(f"import {big}\n{big}.__name__")  # bigger than a WASI write
        assert imported.value == big, imported.error  # compiling pickle took ~300M fuel
    assert box.run_python(
        "import sqlite3\nsqlite3.connect(':memory:').execute('select 2').fetchone()"
    ).value == [2]


# -- grants -----------------------------------------------------------------------------


def test_read_only_preopen_refuses_python_writes(box: wasmbox.Sandbox, data: Path) -> None:
    read = box.run_python("open('/data/numbers.txt').read()", grants(data))
    assert read.value == "1\n2\n3\n"
    for code in ["open('/data/new.txt', 'w')", "open('/data/numbers.txt', 'a')",
                 "import os\nos.mkdir('/data/d')", "import os\nos.remove('/data/numbers.txt')"]:  # fmt: skip
        result = box.run_python(code, grants(data))
        assert kind(result) == "guest_error" and "PermissionError" in result.error.message, code  # type: ignore[union-attr]
    assert sorted(os.listdir(data)) == ["numbers.txt"]


def test_no_grant_no_files(box: wasmbox.Sandbox, data: Path) -> None:
    for path in ["/data/numbers.txt", str(data / "numbers.txt"), "../secret.txt", "/etc/passwd"]:
        result = box.run_python(f"open({path!r}).read()")
        assert kind(result) == "guest_error", path
    escape = box.run_python("open('/data/../secret.txt').read()", grants(data))
    assert kind(escape) == "guest_error" and "top secret" not in escape.error.message  # type: ignore[union-attr]


def test_stdlib_preopen_is_read_only(box: wasmbox.Sandbox) -> None:
    result = box.run_python("open('/python/json/__init__.py', 'a')")
    assert kind(result) == "guest_error" and "PermissionError" in result.error.message  # type: ignore[union-attr]


def test_python_manifest_may_not_claim_the_stdlib_path(box: wasmbox.Sandbox, data: Path) -> None:
    with pytest.raises(wasmbox.ManifestError, match="reserved"):
        box.run_python("1", {"name": "x", "runtime": "python",
                             "preopens": [{"host": str(data), "guest": "/python"}]})  # fmt: skip


def test_host_env_is_invisible_to_python(box: wasmbox.Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WASMBOX_TEST_SECRET", "hunter2")
    assert box.run_python("import os\ndict(os.environ)").value == {}
    assert box.run_python("import os\ndict(os.environ)", grants(env={"TZ": "UTC"})).value == {"TZ": "UTC"}


def test_python_cannot_connect_to_a_loopback_listener(box: wasmbox.Sandbox) -> None:
    accepted: list[object] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    attempts = [
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
        f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))",
    ]
    results = [box.run_python(code) for code in attempts]
    thread.join()
    server.close()
    assert [kind(r) for r in results] == ["guest_error", "guest_error"]
    assert "gaierror" in results[0].error.message  # type: ignore[union-attr]
    assert "PermissionError" in results[1].error.message  # type: ignore[union-attr]
    assert accepted == []


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("import subprocess\nsubprocess.run(['ls'])", "does not support processes"),
        ("import os\nos.system('ls')", "has no attribute 'system'"),
        ("import threading\nthreading.Thread(target=print).start()", "can't start new thread"),
        ("import ctypes", "No module named '_ctypes'"),
    ],
)
def test_processes_threads_and_ctypes_fail_cleanly(box: wasmbox.Sandbox, code: str, words: str) -> None:
    result = box.run_python(code)
    assert kind(result) == "guest_error"
    assert words in result.error.message  # type: ignore[union-attr]


# -- host functions ---------------------------------------------------------------------

ROUND_TRIP = {"nested": {"list": [1, 2.5, None, True], "bytes": b"\x00\xff"}, "n": -(2**40)}


@pytest.fixture
def echo_box(box: wasmbox.Sandbox) -> wasmbox.Sandbox:
    @box.host_function("echo.back")
    def echo_back(value: Any) -> Any:
        return value

    @box.host_function("secret.get")
    def secret_get() -> str:
        return "hunter2"

    return box


def test_host_function_round_trip(echo_box: wasmbox.Sandbox) -> None:
    code = "import wasmbox_guest\nwasmbox_guest.call_host('echo.back', value=VALUE)".replace(
        "VALUE", repr(ROUND_TRIP)
    )
    result = echo_box.run_python(code, grants(host_functions=["echo.back"]))
    assert result.value == ROUND_TRIP
    assert [(r.name, r.verdict) for r in result.host_calls] == [("echo.back", "ok")]


def test_ungranted_host_function_is_refused(echo_box: wasmbox.Sandbox) -> None:
    caught = echo_box.run_python(
        "import wasmbox_guest\ntry:\n    wasmbox_guest.call_host('secret.get')\n    msg = None\n"
        "except wasmbox_guest.HostCallError as e:\n    msg = str(e)\nmsg",
        grants(host_functions=["echo.back"]),
    )
    assert caught.ok and "not granted" in caught.value
    assert [(r.name, r.verdict) for r in caught.host_calls] == [("secret.get", "denied")]
    uncaught = echo_box.run_python("import wasmbox_guest\nwasmbox_guest.call_host('secret.get')")
    assert kind(uncaught) == "capability_denied"
    assert "hunter2" not in json.dumps(uncaught.model_dump(), default=str)


def test_host_call_cap_applies_to_python(echo_box: wasmbox.Sandbox) -> None:
    code = "import wasmbox_guest\nfor i in range(10):\n    wasmbox_guest.call_host('echo.back', value=i)"
    result = echo_box.run_python(code, grants(host_functions=["echo.back"], limits={"host_calls": 3}))
    assert kind(result) == "host_error"
    assert [r.verdict for r in result.host_calls] == ["ok"] * 3 + ["limit"]


# -- limits -----------------------------------------------------------------------------


def test_infinite_loop_runs_out_of_fuel(box: wasmbox.Sandbox) -> None:
    # the default fuel; a deadline far beyond it, so that fuel, not the machine's speed, decides
    assert kind(box.run_python("while True:\n    pass", grants(limits={"timeout": "60s"}))) == "out_of_fuel"


def test_python_defaults_let_ordinary_code_finish_and_stay_finite(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    # fib(22): ~70M fuel and ~10 ms, over the core default of 50M fuel (a model-style program)
    code = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nfib(22)"
    result = box.run_python(code)
    assert result.ok and result.value == 17711, result.error
    assert result.fuel_used > wasmbox.Limits().fuel
    source = tmp_path / "fib.py"
    source.write_text(code.replace("fib(22)", "def main(n: int) -> int:\n    return fib(n)\n"))
    tool = box.load({"name": "fib", "runtime": "python", "source": str(source)})
    assert tool.manifest.limits.fuel == PYTHON_FUEL
    assert tool.call({"n": 22}).value == 17711
    # finite, and only where nothing was set: an explicit fuel, and core modules, keep theirs
    assert PYTHON_FUEL < 2**63 - 1
    assert wasmbox.Manifest.load(grants(limits={"fuel": 1000})).limits.fuel == 1000
    assert (
        wasmbox.Manifest.load({"name": "m", "module": __file__}).limits.fuel
        == wasmbox.Limits().fuel
        == 50_000_000
    )
    assert kind(box.run_python(code, grants(limits={"fuel": 50_000_000}))) == "out_of_fuel"


def test_infinite_loop_times_out(box: wasmbox.Sandbox) -> None:
    result = box.run_python("while True:\n    pass", grants(limits={"fuel": 10**15, "timeout": "300ms"}))
    assert kind(result) == "timeout"


def test_huge_allocation_is_a_memory_limit(box: wasmbox.Sandbox) -> None:
    result = box.run_python("x = bytearray(1 << 30)")
    assert kind(result) == "memory_limit"


def test_huge_print_is_cut_at_the_output_cap(box: wasmbox.Sandbox) -> None:
    result = box.run_python("print('x' * 10_000_000)", grants(limits={"output": "8KiB", "fuel": 10**9}))
    assert kind(result) == "output_limit"
    assert result.truncated and len(result.stdout) == 8192


def test_large_output_under_the_cap_arrives_whole(box: wasmbox.Sandbox) -> None:
    result = box.run_python("print('y' * 100_000)", grants(limits={"output": "1MiB"}))
    assert result.ok and result.stdout == "y" * 100_000 + "\n"


def test_result_over_the_output_cap(box: wasmbox.Sandbox) -> None:
    result = box.run_python("'z' * 100_000", grants(limits={"output": "16KiB"}))
    assert kind(result) == "output_limit"


# -- concurrency and processes ----------------------------------------------------------


def test_concurrent_python_calls(box: wasmbox.Sandbox) -> None:
    results: dict[int, object] = {}

    def worker(i: int) -> None:
        for j in range(5):
            results[i * 10 + j] = box.run_python(f"sum(range({i * 10 + j}))").value

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {n: sum(range(n)) for n in results} and len(results) == 20


def test_new_process_neither_rebuilds_nor_recompiles(
    box: wasmbox.Sandbox, cache_dir: Path, tmp_path: Path
) -> None:
    """Nor compiles a Python tool again: its bytecode is cached beside the compiled modules."""
    source = tmp_path / "answer.py"
    source.write_text(f"def main():\n    return 6 * 7  # {tmp_path}\n")  # new to the cache
    manifest = {"name": "answer", "runtime": "python", "source": str(source)}
    compiles = box.cache_stats.compiles
    box.load(manifest)
    assert box.cache_stats.compiles == compiles + 1
    script = (
        "import json, sys, wasmbox\n"
        "box = wasmbox.Sandbox(cache_dir=sys.argv[1])\n"
        "value = box.run_python('6 * 7').value\n"
        "tool = box.load(json.loads(sys.argv[2]))\n"
        "print(json.dumps({'values': [value, tool.call({}).value], 'compiles': box.cache_stats.compiles}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(cache_dir), json.dumps(manifest)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout) == {"values": [42, 42], "compiles": 0}
    assert "building" not in out.stderr and "compiling" not in out.stderr


@pytest.fixture(autouse=True, scope="module")
def _runtime_built_once(cache_dir: Path) -> Iterator[None]:
    """Build the runtime once, up front, so the first test's timings are not the build's."""
    with wasmbox.Sandbox(cache_dir=cache_dir) as sandbox:
        sandbox.prepare_python()
    yield


def test_python_host_function_interrupt_and_slow_host(box: wasmbox.Sandbox) -> None:

    @box.host_function("stop.now")
    def stop_now() -> None:
        raise KeyboardInterrupt

    calls: list[int] = []

    @box.host_function("slow.fn")
    def slow_fn() -> int:
        calls.append(1)
        outlast_the_deadline()
        return 1

    with pytest.raises(KeyboardInterrupt):
        box.run_python("import wasmbox_guest\nwasmbox_guest.call_host('stop.now')",
                       grants(host_functions=["stop.now"]))  # fmt: skip
    code = "import wasmbox_guest\nfor i in range(3):\n    wasmbox_guest.call_host('slow.fn')"
    result = box.run_python(code, grants(host_functions=["slow.fn"], limits={"timeout": "1s"}))
    assert kind(result) == "timeout"
    assert len(calls) == 1


# -- the fast paths keep the guarantees -------------------------------------------------


def test_spare_instances_keep_grants_apart(box: wasmbox.Sandbox, data: Path) -> None:
    """Spares are prepared per grant set: one made for a manifest with a preopen must never
    serve a call under a manifest without it (and the other way round)."""
    with_data = wasmbox.Manifest.load(grants(data))
    without = wasmbox.Manifest.load(grants())
    read = "open('/data/numbers.txt').read()"
    for _ in range(5):  # alternate, so each call could find the other's spare
        assert box.run_python(read, with_data).value == "1\n2\n3\n"
        assert kind(box.run_python(read, without)) == "guest_error"
        assert kind(box.run_python(read)) == "guest_error"


def test_spare_instances_get_full_fuel_and_a_fresh_deadline(box: wasmbox.Sandbox) -> None:
    import time

    manifest = wasmbox.Manifest.load(grants(limits={"fuel": 3_000_000, "timeout": "60s"}))
    spares = box._runtimes.python()._spares
    for _ in range(3):
        box.run_python("1", manifest)  # a spare for the next call under these grants is made
        stop = time.monotonic() + 30  # (only so that a broken run cannot hang)
        while spares.wanted(manifest.digest()):
            assert time.monotonic() < stop, "no spare was made"
            time.sleep(0.01)
        # the engine's clock moves past the spare's first deadline: its call must get a fresh
        # one (epochs, not wall time, so that a slow machine cannot decide this)
        for _ in range(box._ticker.ticks(60) + 1):
            box.engine.increment_epoch()
        result = box.run_python("sum(range(1000))", manifest)
        assert result.ok, result.error
        assert result.fuel_used < 3_000_000
    assert kind(box.run_python("while True:\n    pass", manifest)) == "out_of_fuel"


def test_spare_instances_are_fresh(box: wasmbox.Sandbox) -> None:
    manifest = wasmbox.Manifest.load(grants())
    for i in range(10):
        assert box.run_python("import json\nhasattr(json, 'MARK')\n", manifest).value is False
        box.run_python(f"import json\njson.MARK = {i}", manifest)


def test_spares_follow_the_manifest_content_not_the_object(box: wasmbox.Sandbox) -> None:
    # a fresh dict each call (as a router would send) still finds the spare made for its twin
    for _ in range(3):
        assert box.run_python("6 * 7", grants(env={"A": "1"})).value == 42
    assert box.run_python("import os\nos.environ['A']", grants(env={"A": "2"})).value == "2"


def test_run_python_grant_sets_may_not_nest_writable_dirs(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "pub").mkdir(parents=True)
    writer = grants(preopens=[{"host": str(shared), "guest": "/w", "writable": True}])
    reader = grants(preopens=[{"host": str(shared / "pub"), "guest": "/pub"}])
    assert box.run_python("1", writer).ok
    with pytest.raises(wasmbox.CapabilityError, match="contains another granted directory"):
        box.run_python("1", reader)


def test_vanished_preopen_is_capability_denied(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    manifest = wasmbox.Manifest.load(grants(preopens=[{"host": str(folder), "guest": "/g"}]))
    assert box.run_python("1", manifest).ok  # and a spare is prepared for the next call
    folder.rmdir()
    for _ in range(3):
        assert kind(box.run_python("1", manifest)) == "capability_denied"
    assert box.run_python("2").value == 2  # the housekeeping thread survived


def test_copied_manifest_never_gets_the_originals_spare(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    alice.mkdir()
    bob.mkdir()
    (alice / "secret.txt").write_text("alice's")
    original = wasmbox.Manifest.load(grants(preopens=[{"host": str(alice), "guest": "/d"}]))
    assert original.digest() and box.run_python("1", original).ok  # spare made for alice
    copy = original.model_copy(update={"preopens": (wasmbox.Preopen.model_validate(
        {"host": str(bob), "guest": "/d"}),)})  # fmt: skip
    assert copy.digest() != original.digest()
    assert box.run_python("import os\nos.listdir('/d')", copy).value == []


def test_ungranted_host_calls_count_against_the_cap(echo_box: wasmbox.Sandbox) -> None:
    code = (
        "import wasmbox_guest\nfor i in range(1000):\n    try:\n"
        "        wasmbox_guest.call_host('x' * 100000)\n"
        "    except wasmbox_guest.HostCallError:\n        pass"
    )
    result = echo_box.run_python(code, grants(limits={"host_calls": 5}))
    assert kind(result) == "host_error"
    assert len(result.host_calls) == 6
    assert all(len(r.name) < 200 for r in result.host_calls)


def test_a_driver_refusal_raised_by_the_guest_is_a_guest_error(box: wasmbox.Sandbox) -> None:
    code = "import wasmbox_driver\nraise wasmbox_driver._Refusal('invalid_arguments', 'not me')"
    result = box.run_python(code)
    assert kind(result) == "guest_error" and "not me" in result.error.message  # type: ignore[union-attr]


def test_closed_sandboxes_release_their_engine(cache_dir: Path) -> None:
    def vm_size() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
        return 0

    before = vm_size()
    for _ in range(4):
        with wasmbox.Sandbox(cache_dir=cache_dir) as sandbox:
            assert sandbox.run_python("1").ok
    import gc

    gc.collect()
    assert vm_size() - before < 3 * 2**40  # each leaked engine held ~2 TiB of reservations


@pytest.mark.parametrize(
    "code",
    [
        "import time\ntime.sleep(30)",
        "import select\nselect.select([], [], [], 30)",
        "import time\ntime.sleep(0.01)",
    ],
)
def test_sleeping_is_refused_at_once(box: wasmbox.Sandbox, code: str) -> None:
    import time

    started = time.perf_counter()
    result = box.run_python(code, grants(limits={"timeout": "1s"}))
    assert kind(result) == "guest_error" and "sleeping" in result.error.message  # type: ignore[union-attr]
    assert time.perf_counter() - started < 10  # it asked for 30 s (or was refused at once)
    assert box.run_python("import time\ntime.monotonic() > 0").value is True  # clocks still work


def test_exit_without_close_is_quiet(cache_dir: Path, data: Path, tmp_path: Path) -> None:
    """Spare instances and the housekeeping thread must not make interpreter exit noisy; the
    stores left at exit are only forgotten (`_store.exiting`), but their calls' scratch
    folders are removed all the same."""
    script = (
        "import sys, wasmbox\n"
        "box = wasmbox.Sandbox(cache_dir=sys.argv[1])\n"
        "grants = {'name': 'g', 'runtime': 'python', 'preopens': [{'host': sys.argv[2], 'guest': '/d'}]}\n"
        "print(box.run_python('6 * 7').value, box.run_python('len(open(\"/d/numbers.txt\").read())', grants).value)\n"
    )
    temp = tmp_path / "temp"
    temp.mkdir()
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", script, str(cache_dir), str(data)],
            capture_output=True, text=True, env={**os.environ, "TMPDIR": str(temp)},
        )  # fmt: skip
        assert out.returncode == 0 and out.stdout == "42 6\n" and out.stderr == ""
        assert list(temp.iterdir()) == []


def _python_threads() -> int:
    return sum(t.name == "wasmbox-python" for t in threading.enumerate())


def test_dropped_sandbox_is_released_without_close(cache_dir: Path) -> None:
    import gc

    before = _python_threads()
    for _ in range(3):
        sandbox = wasmbox.Sandbox(cache_dir=cache_dir)
        assert sandbox.run_python("1 + 1").value == 2
        del sandbox
        gc.collect()
    # runner, housekeeper and engine went with it (a housekeeper that ran the finalizer itself
    # ends just after, so allow it a moment)
    waited = 0
    while _python_threads() != before and waited < 500:
        time.sleep(0.01)
        waited += 1
    assert _python_threads() == before


def test_close_inside_a_call_and_use_after_close(cache_dir: Path) -> None:
    sandbox = wasmbox.Sandbox(cache_dir=cache_dir)

    @sandbox.host_function("box.close")
    def close_it() -> None:
        sandbox.close()

    result = sandbox.run_python(
        "import wasmbox_guest\nwasmbox_guest.call_host('box.close')",
        grants(host_functions=["box.close"]),
    )
    assert kind(result) == "host_error"
    assert "inside a call" in (result.host_calls[0].detail or "")
    sandbox.close()
    before = _python_threads()
    with pytest.raises(wasmbox.WasmboxError, match="closed"):
        sandbox.run_python("1")
    assert _python_threads() == before
