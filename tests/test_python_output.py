"""Python calls' output and results under the limits: what a stopped call printed, big results.

A call that runs out of fuel or time traps, and its instance never runs again, so whatever the
guest still buffers is lost: the driver's streams are line-buffered, so every line it ended
reaches the host as it is printed. A result over the output cap (or over what one transfer
from the component can carry) is reported by its size, never sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._wasmtime.component_io import REPLY_MAX

PRINTS_THEN_SPINS = (
    "import sys\nprint('step 1')\nprint('step 2', file=sys.stderr)\nprint('step 3')\nwhile True:\n    pass\n"
)
# Stops by fuel (50M: the default is sized to the deadline, and which of the two came first
# would be the machine's speed) or by a deadline with fuel to spare.
STOPS = {
    "out_of_fuel": {"fuel": 50_000_000},
    "timeout": {"fuel": 10**15, "timeout": "300ms"},
}


def grants(**limits: Any) -> dict[str, Any]:
    return {"name": "snippet", "runtime": "python", "limits": limits}


def kind(result: wasmbox.CallResult) -> str:
    return result.error.kind.value if result.error else "ok"


@pytest.mark.parametrize("stop", STOPS)
def test_a_snippet_keeps_what_it_printed_when_it_is_stopped(box: wasmbox.Sandbox, stop: str) -> None:
    result = box.run_python(PRINTS_THEN_SPINS, grants(**STOPS[stop]))
    assert kind(result) == stop
    assert result.stdout == "step 1\nstep 3\n" and result.stderr == "step 2\n"


@pytest.mark.parametrize("stop", STOPS)
def test_a_tool_keeps_what_it_printed_when_it_is_stopped(
    box: wasmbox.Sandbox, tmp_path: Path, stop: str
) -> None:
    source = tmp_path / "spin.py"
    source.write_text(
        "import sys\n\ndef main(n):\n    for i in range(n):\n        print('row', i)\n"
        "    sys.stderr.write('looping\\n')\n    while True:\n        pass\n"
    )
    tool = box.load({"name": "spin", "runtime": "python", "source": str(source), "limits": STOPS[stop]})
    result = tool.call({"n": 50})
    assert kind(result) == stop
    assert result.stdout == "".join(f"row {i}\n" for i in range(50)) and result.stderr == "looping\n"


def test_an_unfinished_line_is_kept_but_for_its_last_16_kib(box: wasmbox.Sandbox) -> None:
    """The documented granularity: text not yet ended by a newline waits in two 8 KiB buffers."""
    code = "import sys\nfor i in range(4000):\n    sys.stdout.write('%04d,' % i)\nwhile True:\n    pass\n"
    result = box.run_python(code, grants(fuel=50_000_000))
    assert kind(result) == "out_of_fuel"
    written = "".join(f"{i:04d}," for i in range(4000))
    assert len(result.stdout) >= len(written) - 16384 and written.startswith(result.stdout)


def test_output_after_the_stop_point_still_obeys_the_cap(box: wasmbox.Sandbox) -> None:
    """Lines go out as they are printed, and the cap still cuts them exactly: the print that
    passes it fails in the guest, and the cut is what is reported."""
    code = "for i in range(2000):\n    print('x' * 99)\nwhile True:\n    pass\n"
    result = box.run_python(code, grants(output="8KiB"))
    assert kind(result) == "output_limit" and result.truncated
    assert result.stdout == ("x" * 99 + "\n") * 81 + "x" * 92


@pytest.mark.parametrize("size", [3_000_000, 10_000_000])
def test_a_big_result_is_an_output_limit(box: wasmbox.Sandbox, size: int) -> None:
    result = box.run_python(f"b'v' * {size}", grants(fuel=10**9, memory="256MiB"))
    assert kind(result) == "output_limit"
    assert result.error.message == f"result of {size + 9} bytes exceeds the 64KiB output cap"  # type: ignore[union-attr]


@pytest.mark.parametrize("size", [3_000_000, 10_000_000])
def test_a_big_result_under_a_raised_cap_is_a_clear_output_limit(box: wasmbox.Sandbox, size: int) -> None:
    """Over 2,796,202 bytes a list<u8> cannot leave the component through Wasmtime's C API
    (it would trap): the driver says so and the host reports it, naming the limit."""
    result = box.run_python(f"b'v' * {size}", grants(fuel=10**9, memory="256MiB", output="16MiB"))
    assert kind(result) == "output_limit"
    message = result.error.message  # type: ignore[union-attr]
    assert message.startswith(f"result of {size + 9} bytes exceeds the {REPLY_MAX} bytes a Python call")


def test_the_largest_result_a_python_call_can_return(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """A tool's value that fits a raised cap arrives whole, up to the transfer limit exactly."""
    source = tmp_path / "blob.py"
    source.write_text("def main(n):\n    return b'w' * n\n")
    limits = {"fuel": 10**9, "memory": "256MiB", "output": "16MiB"}
    tool = box.load({"name": "blob", "runtime": "python", "source": str(source), "limits": limits})
    largest = REPLY_MAX - 9  # {"ok": <bin 32>} takes 9 bytes around the value
    assert tool.call({"n": largest}).unwrap() == b"w" * largest
    over = tool.call({"n": largest + 1})
    assert kind(over) == "output_limit" and str(REPLY_MAX) in over.error.message  # type: ignore[union-attr]


def test_a_guest_that_lifts_the_drivers_check_gets_the_hosts_verdict(box: wasmbox.Sandbox) -> None:
    """Guest code can change the driver's cap (it is its own interpreter): a result over the
    transfer limit then traps in Wasmtime, which the host reports as output_limit; one over the
    output cap is refused by the host; one the driver withholds though it fits is a bad_response."""
    lift = "import wasmbox_driver\nwasmbox_driver._output_cap = 10**9\n"
    trapped = box.run_python(lift + "b'v' * 3_000_000", grants(fuel=10**9, memory="256MiB", output="16MiB"))
    assert kind(trapped) == "output_limit" and "Wasmtime copies" in trapped.error.message  # type: ignore[union-attr]
    refused = box.run_python(lift + "b'v' * 100_000", grants())
    assert kind(refused) == "output_limit" and "64KiB output cap" in refused.error.message  # type: ignore[union-attr]
    withheld = box.run_python("import wasmbox_driver\nwasmbox_driver._output_cap = 0\n1", grants())
    assert kind(withheld) == "bad_response"


def test_printing_costs_a_bounded_amount_of_fuel(box: wasmbox.Sandbox) -> None:
    """Fuel is deterministic: 1,000 line-buffered prints (each line goes to the host) stay
    under 21k fuel a print net of the bare loop (~18.6k measured: `bench/print_fuel.py`; 4.6k
    of it is print's own, as to an io.StringIO, ~7k the driver's sliced stdout writer)."""
    loop = box.run_python("for i in range(1000):\n    pass\n")
    prints = box.run_python("for i in range(1000):\n    print('x')\n")
    assert prints.ok and prints.stdout == "x\n" * 1000
    assert prints.fuel_used - loop.fuel_used < 21_000 * 1000
