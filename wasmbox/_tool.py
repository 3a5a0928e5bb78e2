"""A loaded tool: a checked, compiled module plus its manifest. Immutable and thread-safe."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from . import _abi, _call, _formats, _outcome, _replay, _schema, _telemetry
from ._admission import Gate
from ._audit import Auditor
from ._budget import Budget
from ._call import CallInput
from ._capabilities import scratch as _scratch
from ._command import CommandMapping
from ._errors import ErrorKind, ManifestError
from ._formats import SpecFormat, StrictMode
from ._inspect import ModuleInfo, ToolKind
from ._manifest import CallLimits, Limits, Manifest
from ._results import CallResult
from ._stats import CallCounts
from ._wasmtime import output as _output
from ._wasmtime.output import OutputListener

_ids = itertools.count(1)
_TAKES_FILES = frozenset({ToolKind.PYTHON, ToolKind.JAVASCRIPT})  # the runners that write `files`
_open = threading.local()  # the ids of the calls running on this thread, outermost first


@contextlib.contextmanager
def _call_ids() -> Iterator[tuple[str, str | None]]:
    """A new call's id, and the id of the call running on this thread that it is made from (a
    tool called by code through `tools`, on the caller's thread), if any."""
    stack: list[str] = getattr(_open, "ids", None) or []
    _open.ids = stack
    call_id = f"{os.getpid()}-{next(_ids)}"
    parent = stack[-1] if stack else None
    stack.append(call_id)
    try:
        yield call_id, parent
    finally:
        stack.pop()


class Runner(Protocol):
    """What runs a tool's calls: a core module, or the CPython runtime."""

    @property
    def kind(self) -> ToolKind: ...

    def call(self, call: CallInput) -> CallResult: ...


@dataclass(frozen=True, slots=True)
class _Asked:
    """What one call asks, as its caller gave it (checked in `Tool._call`), and the limits it
    runs under."""

    args: Any
    argv: Any
    stdin: Any
    limits: Limits | None
    files: Any


class Tool:
    """One tool, ready to call. Get it from `Sandbox.load`; call it from any thread."""

    def __init__(
        self,
        manifest: Manifest,
        runner: Runner,
        executor: Executor,
        auditor: Auditor,
        *,
        manifest_digest: str,
        code_digest: str,
        info: ModuleInfo | None = None,
        signature_schema: dict[str, Any] | None = None,
        return_schema: dict[str, Any] | None = None,
        args_schema: dict[str, Any] | None = None,
        docstring: str = "",
        counts: CallCounts | None = None,
        gate: Gate | None = None,
    ) -> None:
        """ManifestError when the manifest's `examples` break the args schema, or it gives a WASI
        command an `output_schema` (a command's value is its exit code)."""
        self.manifest = manifest
        self.info = info  # the module's imports and exports; None for Python tools
        self.manifest_digest = manifest_digest  # `manifest.digest()`: names its grant set
        self.code_digest = (
            code_digest  # the wasm module's or Python source's sha256 (run_python: the runtime's build)
        )
        self._signature_schema = signature_schema  # a Python tool's, from its entry's signature
        # checked and shown like `input_schema` when the manifest has none (run_python's)
        self._args_schema = args_schema
        checked = manifest.input_schema or args_schema or signature_schema
        # compiled once: every call is checked against what `parameters` shows the model
        self._validator = _schema.compile(checked) if checked is not None else None
        # what a successful call's value must be: the manifest's, else a Python entry's annotation
        self.output_schema: dict[str, Any] | None = manifest.output_schema or return_schema
        self._output_validator = _schema.compile(self.output_schema) if self.output_schema else None
        self._docstring = docstring  # the summary of a Python tool's entry's docstring
        self._runner = runner
        self._counts = counts
        self._gate = gate  # the Sandbox's admission control
        self._executor = executor
        self._auditor = auditor
        command = manifest.command
        self._mapping = (
            CommandMapping.parse(command.argv, command.stdin, manifest.input_schema)
            if command is not None and command.mapped
            else None
        )
        # a command tool without a mapping takes argv/stdin, and args would go nowhere
        self._refuses_args = self._mapping is None and runner.kind is ToolKind.COMMAND
        self._check_contract()

    def _check_contract(self) -> None:
        name = self.manifest.name
        if self.manifest.output_schema is not None and self.kind is ToolKind.COMMAND:
            raise ManifestError(
                f"{name}: output_schema describes a call's value, and a WASI command's value is "
                '{"exit_code": n} (its output is stdout): check stdout in the caller, or make the '
                'module an ABI v1 tool or a [reactor] with result = "json"'
            )
        for index, example in enumerate(self.manifest.examples):
            problem = self._validator.problem(example, "args") if self._validator is not None else None
            if problem is not None:
                raise ManifestError(f"{name}: examples[{index}] breaks the args schema: {problem}")

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def kind(self) -> ToolKind:
        return self._runner.kind

    @property
    def description(self) -> str:
        """The manifest's `description`; for a Python tool without one, its entry's docstring
        summary."""
        return self.manifest.description or self._docstring

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the args a model is shown: the manifest's `input_schema`; for a
        Python tool without one, derived from its entry's signature; else `{"type": "object"}`.
        Calls are checked against it."""
        return self.manifest.input_schema or self._args_schema or self._signature_schema or {"type": "object"}

    def spec(self, format: SpecFormat = "generic", *, strict: StrictMode = False) -> dict[str, Any]:
        """The tool's definition in a provider's format: "generic" `{name, description,
        parameters}` (and `output_schema`, `examples`, `defer_loading` when the tool has them),
        "openai" (Chat Completions), "openai-responses", "anthropic", "mcp".
        `strict=True` converts the schema to strict mode's subset (docs/tool-calling.md, "Strict mode") and
        raises StrictSchemaError when it has none; "auto" then sends it non-strict with a
        StrictSchemaWarning that says why. ValueError for an unknown format."""
        return _formats.spec_of(self, format, strict)

    def call(
        self,
        args: Mapping[str, Any] | None = None,
        *,
        argv: list[str] | tuple[str, ...] = (),
        stdin: bytes | str = b"",
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """Run one call in a fresh instance. Never raises for guest behaviour: see `CallResult`.

        `args` go to ABI v1 and Python tools, and to command tools whose manifest maps them to
        argv and stdin (`[command]`); they are checked against `input_schema`. Other command
        tools take `argv` (appended to the manifest's `args`) and `stdin` instead. With
        `budget`, the call starts only if the budget admits it (else `over_budget`), and is
        charged to it. `limits` (a `CallLimits`, or a mapping like a manifest's `[limits]`)
        tighten the manifest's for this call; raises LimitsError for limits that would
        loosen them or are malformed. A call the Sandbox's admission control refuses is
        `overloaded`. `files` (path below /tmp/in → bytes or str) are written there before the
        guest starts, for a Python or JavaScript tool whose manifest has `inputs` (bad names or
        sizes: `invalid_arguments`). `on_output(stream, text)` gets what the guest writes to
        "stdout" and "stderr" as it writes it (within the output cap), one write at a time in the
        order written (on the calling thread or one of Wasmtime's); the result holds it all the
        same. A listener that raises is told nothing more (logged); a slow one slows the call,
        whose deadline runs on.
        """
        asked = _Asked(args, argv, stdin, self.limits_for(limits), files)
        if on_output is not None or (_output.listening() and _call.inside_call()):
            # (a call made by a host function of a streamed call streams only its own listener's)
            with _output.streaming(on_output):
                return self._traced(asked, budget)
        return self._traced(asked, budget)

    def _traced(self, asked: _Asked, budget: Budget | None) -> CallResult:
        telemetry = _telemetry.active
        if telemetry is not None:  # (off: this one check)
            return telemetry.tool_call(self.name, self.kind.value, partial(self._counted, asked, budget))
        return self._counted(asked, budget)

    def limits_for(self, limits: CallLimits | Mapping[str, Any] | None) -> Limits | None:
        """The limits a call with `limits` runs under (None: the manifest's, unchanged).
        Raises LimitsError as `call` does."""
        if limits is None:
            return None
        return CallLimits.of(limits).applied_to(self.manifest.limits, self.name)

    def _counted(self, asked: _Asked, budget: Budget | None) -> CallResult:
        """The call under its budget, taped while a recording or replay is open (the
        outermost call only), audited (with its id and its caller's) and counted."""
        if _replay.open_tapes and not _call.inside_call():
            with _replay.taping(
                self.name, self._given(asked), asked.files, self.manifest.preopens
            ) as reference:
                result = self._audited(asked, budget, reference)
        else:
            result = self._audited(asked, budget, None)
        if self._counts is not None:
            self._counts.add(result)
        return result

    def _given(self, asked: _Asked) -> Any:
        """What a call was given, as its audit record and its tape digest it."""
        return (asked.args, asked.argv, asked.stdin) if self.kind is ToolKind.COMMAND else asked.args

    def _audited(self, asked: _Asked, budget: Budget | None, recording: str | None) -> CallResult:
        if not self._auditor.enabled:  # (ids only for records: nothing to do without sinks)
            return self._budgeted(asked, budget)
        with _call_ids() as (call_id, parent_id):
            result = self._budgeted(asked, budget)
        self._auditor.record(
            result,
            self.manifest_digest,
            self.code_digest,
            self._given(asked),
            asked.limits or self.manifest.limits,
            call_id=call_id,
            parent_id=parent_id,
            recording=recording,
        )
        return result

    def _budgeted(self, asked: _Asked, budget: Budget | None) -> CallResult:
        """The call if the Sandbox admits it (first: its bound protects the host) and then its
        budget does."""
        call = partial(self._call, asked)
        if budget is not None:
            call = partial(budget.run, self.name, call)
        gate = self._gate
        return call() if gate is None else gate.run(self.name, call)

    def _call(self, asked: _Asked) -> CallResult:
        start = time.perf_counter()
        args, argv, stdin, files = asked.args, asked.argv, asked.stdin, asked.files
        problem = self._check(args, argv, stdin)
        inputs: Mapping[str, bytes] = {}
        if problem is None and files is not None:
            inputs, problem = self._inputs(files)
        if problem is None and self._mapping is not None:
            try:
                argv, stdin = self._mapping.render(args or {})
            except (TypeError, ValueError) as exc:
                problem = f"args cannot be passed to the command: {exc}"
        if problem is not None:
            result = CallResult.failed(
                self.name, ErrorKind.INVALID_ARGUMENTS, problem, time.perf_counter() - start
            )
        else:
            data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
            result = self._runner.call(
                CallInput(args or {}, tuple(argv), data, files=inputs, limits=asked.limits)
            )
            if result.ok and self._output_validator is not None:
                result = self._checked_value(result, self._output_validator)
        return result

    @staticmethod
    def _checked_value(result: CallResult, validator: _schema.Validator) -> CallResult:
        """`result`, or when its value breaks the output schema, the same call failed."""
        problem = validator.value_problem(result.value, "result")
        if problem is None:
            return result
        error = _outcome.broken_output(problem)
        return result.model_copy(update={"ok": False, "value": None, "error": error})

    async def acall(
        self,
        args: Mapping[str, Any] | None = None,
        *,
        argv: list[str] | tuple[str, ...] = (),
        stdin: bytes | str = b"",
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """`call` on the Sandbox's worker threads, so the event loop keeps running; admitted (or
        refused as `overloaded`) before it is queued for them (limits are checked here, before:
        LimitsError as `call`); `on_output` is called on the event loop, in the order written."""
        import asyncio  # lazily: most callers are sync and need not pay for its import

        self.limits_for(limits)
        loop = asyncio.get_running_loop()
        listener = on_the_loop(loop, on_output) if on_output is not None else None
        work = _call.carried(
            partial(
                self.call,
                args,
                argv=argv,
                stdin=stdin,
                budget=budget,
                limits=limits,
                files=files,
                on_output=listener,
            )
        )
        if self._gate is not None:
            return await self._gate.offload(self._executor, work)
        return await loop.run_in_executor(self._executor, work)

    def _inputs(self, files: object) -> tuple[Mapping[str, bytes], str | None]:
        """The call's input files, checked against the manifest's `inputs`, or why not."""
        if self.kind not in _TAKES_FILES and files:
            return {}, "files are for Python and JavaScript calls"
        return _scratch.check_inputs(files, self.manifest.inputs)

    def _check(self, args: object, argv: object, stdin: object) -> str | None:
        if args is not None and not isinstance(args, Mapping):
            return f"args must be a mapping, got {type(args).__name__}"
        if not isinstance(argv, (list, tuple)) or (argv and not all(isinstance(a, str) for a in argv)):
            return "argv must be a list of strings"
        if argv and any("\0" in a for a in argv):
            return "argv contains a NUL byte"
        if not isinstance(stdin, (bytes, bytearray, memoryview, str)):
            return "stdin must be bytes or str"
        if (argv or stdin) and self.kind is not ToolKind.COMMAND:
            return "argv and stdin are for WASI command tools"
        if (argv or stdin) and self._mapping is not None:
            return "this tool builds its argv and stdin from args: pass args only"
        if args and self._refuses_args:
            return "this command tool takes argv and stdin, not args (its manifest maps none)"
        if args and not all(isinstance(k, str) for k in args):
            return "args keys must be strings"
        if self._validator is not None:
            values = dict(args or {})
            try:  # the schema check never sees deeper args than a result may be
                _abi.check_depth(values)
            except _abi.FramingError as exc:
                return f"args are {exc}"
            return self._validator.problem(values)
        return None

    def __repr__(self) -> str:
        return f"<Tool {self.name!r} {self.kind.value}>"


def on_the_loop(loop: Any, listener: OutputListener) -> OutputListener:
    """`listener` called on the event loop `loop` (from the worker thread a call runs on)."""

    def forward(stream: str, text: str) -> None:
        loop.call_soon_threadsafe(listener, stream, text)

    return forward
