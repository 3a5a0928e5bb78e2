"""The `--under-load` harness itself: its valid calls are checked, so a wrong one fails."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import wasmbox
from wasmbox._capabilities.hostfuncs import HostFunction

from .conftest import Load


def test_a_wrong_result_of_the_load_fails_the_case(
    hostile_guests: Path, cache_dir: Path, tmp_path: Path
) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        load = Load(box, tmp_path)
        # the Python and JavaScript calls of load.twice now get a wrong value (the core tool linked
        # the right one); whichever comes first is the first wrong result
        box._host_functions["load.twice"] = HostFunction("load.twice", lambda n: 2 * n + 1)
        stop = time.monotonic() + 60  # (only so that a broken run cannot hang)
        while not load.wrong:
            assert time.monotonic() < stop, "the load never noticed"
            time.sleep(0.01)
        with pytest.raises(AssertionError, match="valid calls went wrong"):
            load.stop()
    # the first wrong one is a call of the swapped function: the Python tool's or the JavaScript one's
    assert "expected [" in load.wrong[0] or "tool='load_js'" in load.wrong[0], load.wrong[0]
