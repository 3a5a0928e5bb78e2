"""Running a model's tool calls and answering in its provider's format (`Sandbox.dispatch`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from . import _call, _schema, _telemetry
from ._admission import Gate
from ._budget import Budget
from ._content import Content, result_content
from ._errors import ErrorKind, SessionEndedError, SessionError
from ._formats import RUN_JAVASCRIPT, RUN_JAVASCRIPT_SCHEMA, RUN_PYTHON, RUN_PYTHON_SCHEMA, prepare_args
from ._manifest import CallLimits, ManifestSource
from ._results import CallResult
from ._tool import on_the_loop
from ._wasmtime import output as _output
from ._wasmtime.output import OutputListener

if TYPE_CHECKING:
    from ._sandbox import Sandbox


class Caller(Protocol):
    """What `dispatch` runs calls on: a Sandbox, or a pool of them (`integrations.ray`).
    Its tools have `call(args)` and `parameters`; its executor runs the calls, each admitted by
    its gate before it is queued."""

    @property
    def _executor(self) -> Executor: ...

    @property
    def _gate(self) -> Gate: ...

    @property
    def tools(self) -> Mapping[str, Any]: ...

    def run_python(self, code: str, manifest: ManifestSource | None = None) -> CallResult: ...

    def run_javascript(self, code: str, manifest: ManifestSource | None = None) -> CallResult: ...


CallFormat = Literal["openai", "openai-responses", "anthropic"]
CALL_FORMATS: tuple[str, ...] = ("openai", "openai-responses", "anthropic")
_LISTED = 20  # tool names an unknown-tool error lists
_NAME_SHOWN = 100  # characters of an unknown name it repeats (a model may send megabytes)


@dataclass
class _Job:
    """One call: its id and name, and either its result already (refused before running) or
    what runs it."""

    call_id: str
    name: str
    result: CallResult | None = None
    run: Callable[..., CallResult] | None = None  # called with no args, or `limits=`
    started: bool = field(default=False)
    in_session: bool = False  # a run_python call of the dispatch's session


@dataclass(frozen=True, slots=True)
class Options:
    """A dispatch's options, as `Sandbox.dispatch` takes them (and the Ray pool's, without
    `session`): which snippet tools are routed, the caps on the turn, its calls' budget and
    limits."""

    python: bool | ManifestSource = False
    max_calls: int | None = None
    deadline_s: float | None = None
    session: str | None = None
    javascript: bool | ManifestSource = False
    budget: Budget | None = None
    limits: CallLimits | Mapping[str, Any] | None = None


def dispatch(box: Caller, calls: Any, format: str, options: Options) -> list[dict[str, Any]]:
    """See `Sandbox.dispatch`."""
    deadline_s, budget = options.deadline_s, options.budget
    deadline = _deadline(deadline_s)
    jobs = _jobs(box, calls, format, options, deadline)
    runnable = [job for job in jobs if job.result is None and job.run is not None]
    if (len(runnable) == 1 and deadline is None) or _call.inside_call():
        # no thread hop for the common single call; and from inside a call (a host function),
        # one by one on this thread: waiting on the workers from one of them could deadlock
        for job in runnable:
            job.result = _run(job, deadline, budget)
    elif runnable:
        futures = [
            (
                job,
                box._gate.submit(box._executor, _call.carried(partial(_run, job, deadline, budget))),
            )
            for job in runnable
        ]
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        wait([future for _, future in futures], timeout=timeout)
        for job, future in futures:
            if future.done() and not future.cancelled():
                job.result = future.result()
            else:
                future.cancel()
                job.result = _late(job, deadline_s)
    return [_reply(job, format, deadline_s) for job in jobs]


async def adispatch(box: Caller, calls: Any, format: str, options: Options) -> list[dict[str, Any]]:
    """See `Sandbox.adispatch`."""
    import asyncio  # lazily, as in Tool.acall

    deadline_s, budget = options.deadline_s, options.budget
    deadline = _deadline(deadline_s)
    jobs = _jobs(box, calls, format, options, deadline)
    runnable = [job for job in jobs if job.result is None and job.run is not None]
    if not runnable:
        return [_reply(job, format, deadline_s) for job in jobs]
    tasks = [
        asyncio.wrap_future(
            box._gate.submit(box._executor, _call.carried(partial(_run, job, deadline, budget)))
        )
        for job in runnable
    ]
    if deadline is None:  # (what acall's callers would do: no wait() and its bookkeeping)
        results = [await tasks[0]] if len(tasks) == 1 else await asyncio.gather(*tasks)
        for job, result in zip(runnable, results, strict=True):
            job.result = result
    else:
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        for job, task in zip(runnable, tasks, strict=True):
            if task.done() and not task.cancelled():
                job.result = task.result()
            else:
                task.cancel()
                job.result = _late(job, deadline_s)
    return [_reply(job, format, deadline_s) for job in jobs]


def call_one(
    box: Sandbox,
    name: str,
    args: Any,
    *,
    python: bool | ManifestSource = False,
    session: str | None = None,
    javascript: bool | ManifestSource = False,
    budget: Budget | None = None,
    limits: CallLimits | Mapping[str, Any] | None = None,
) -> CallResult:
    """One model tool call by name, with `dispatch`'s rules (the adapters' path: MCP,
    pydantic-ai, LangChain, Agents each get calls one at a time). `args`: a mapping, JSON
    text, or None. Never raises for the call's own faults."""
    job = _Job("", name)
    _check_session(session, python, javascript)
    # ("openai": JSON text is parsed); the tool table is read, not copied
    _plan(job, args, "openai", box._tools, box, python, session, javascript)
    if job.result is not None:
        return job.result
    _bind_limits(job, box._tools.get(name), limits)
    return _run(job, None, budget)


async def acall_one(
    box: Sandbox,
    name: str,
    args: Any,
    *,
    python: bool | ManifestSource = False,
    session: str | None = None,
    javascript: bool | ManifestSource = False,
    budget: Budget | None = None,
    on_output: OutputListener | None = None,
) -> CallResult:
    """`call_one` on the Sandbox's worker threads, admitted before it is queued for them;
    `on_output` (called on the event loop) gets the call's stdout and stderr as they are written."""
    import asyncio  # lazily, as in Tool.acall

    call = partial(
        call_one, box, name, args, python=python, session=session, javascript=javascript, budget=budget
    )
    if on_output is not None:
        call = partial(_streamed, on_the_loop(asyncio.get_running_loop(), on_output), call)
    return await box._gate.offload(box._executor, _call.carried(call))


def _streamed(listener: OutputListener, call: Callable[[], CallResult]) -> CallResult:
    """`call()` with what it writes sent to `listener` (the tool, interpreter or session it
    runs takes the listener of the thread it starts on)."""
    with _output.streaming(listener):
        return call()


def _deadline(deadline_s: float | None) -> float | None:
    if deadline_s is None:
        return None
    if not deadline_s > 0:
        raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")
    return time.monotonic() + deadline_s


def _run(job: _Job, deadline: float | None, budget: Budget | None = None) -> CallResult:
    """`job`'s call, unless the dispatch deadline has passed or `budget` does not admit it."""
    if deadline is not None and time.monotonic() >= deadline:
        return _not_started(job)
    if budget is None:
        return _started(job)
    return budget.run(job.name, partial(_started, job))


def _started(job: _Job) -> CallResult:
    job.started = True
    assert job.run is not None
    if _telemetry.active is not None and job.call_id:  # the model's id, for the call's span
        token = _telemetry.model_call_id.set(job.call_id)
        try:
            return job.run()
        finally:
            _telemetry.model_call_id.reset(token)
    return job.run()


def _late(job: _Job, deadline_s: float | None) -> CallResult:
    if not job.started:
        return _not_started(job)
    return CallResult.failed(
        job.name,
        ErrorKind.TIMEOUT,
        f"the dispatch deadline ({deadline_s} s) passed before this call finished; it may still "
        "complete, but its result is discarded",
    )


def _not_started(job: _Job) -> CallResult:
    return CallResult.failed(
        job.name, ErrorKind.TIMEOUT, "not run: the dispatch deadline passed before this call started"
    )


def _jobs(box: Caller, calls: Any, format: str, options: Options, deadline: float | None) -> list[_Job]:
    """The planned calls; raises ValueError for bad options, LimitsError when `limits` would
    loosen a called tool's (before any call runs)."""
    python, session, javascript = options.python, options.session, options.javascript
    max_calls, limits = options.max_calls, options.limits
    _check_session(session, python, javascript)
    if format not in CALL_FORMATS:
        raise ValueError(f"unknown call format {format!r}; one of {', '.join(CALL_FORMATS)}")
    if max_calls is not None and (
        isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 0
    ):
        raise ValueError(f"max_calls must be a non-negative integer, got {max_calls!r}")
    parsed = [_parse(call, format) for call in _calls(calls, format)]
    tools = box.tools
    jobs = []
    for index, (call_id, name, raw) in enumerate(parsed):
        job = _Job(call_id, name)
        if max_calls is not None and index >= max_calls:
            job.result = CallResult.failed(
                name,
                ErrorKind.HOST_ERROR,
                f"not run: at most {max_calls} tool calls are run per turn and this one is call "
                f"{index + 1} of {len(parsed)}; ask for it again in a later turn",
            )
        else:
            _plan(job, raw, format, tools, box, python, session, javascript)
            _bind_limits(job, tools.get(name), limits)
        jobs.append(job)
    if session is not None:
        _in_order([job for job in jobs if job.in_session and job.run is not None], deadline)
    return jobs


def _bind_limits(job: _Job, tool: Any, limits: CallLimits | Mapping[str, Any] | None) -> None:
    """Run `job` under `limits`, checked now against its tool's (LimitsError: before any call
    of the dispatch runs; a run_python grant set's are checked when it runs)."""
    if limits is None or job.run is None:
        return
    if tool is not None and hasattr(tool, "limits_for"):
        tool.limits_for(limits)
    job.run = partial(job.run, limits=limits)


def _check_session(
    session: str | None, python: bool | ManifestSource, javascript: bool | ManifestSource = False
) -> None:
    if session is None:
        return
    if not isinstance(session, str) or not session:
        raise ValueError(f"session must be a non-empty str naming the conversation, got {session!r}")
    if python is False and javascript is False:
        raise ValueError(
            "session= routes run_python and run_javascript calls to sessions: give python= or javascript= too"
        )
    if javascript is not False and len(javascript_session(session)) > _SESSION_NAME:
        raise ValueError(
            f"session must be at most {_SESSION_NAME - len(_JS_SESSION)} characters with javascript="
        )


_SESSION_NAME = 200  # (`Sandbox.session`'s longest name)
_JS_SESSION = "#javascript"


def javascript_session(session: str) -> str:
    """The name of a conversation's JavaScript session (its Python session has the name itself):
    each runtime's session of one conversation is a session of its own."""
    return session + _JS_SESSION


def _in_order(jobs: list[_Job], deadline: float | None) -> None:
    """A session's calls of one turn run one after another, in the order the model sent them
    (the first job runs them all; the others wait without a run of their own)."""
    if len(jobs) < 2:
        return
    head, followers = jobs[0], jobs[1:]
    runs = [(job, job.run) for job in followers]
    first = head.run
    assert first is not None

    def run_all() -> CallResult:
        result = first()
        for job, run in runs:
            if deadline is not None and time.monotonic() >= deadline:
                break  # (left without a result: not started)
            job.started = True
            assert run is not None
            job.result = run()
        return result

    head.run = run_all
    for job in followers:
        job.run = None


def _plan(
    job: _Job,
    raw: Any,
    format: str,
    tools: Mapping[str, Any],
    box: Caller,
    python: bool | ManifestSource,
    session: str | None = None,
    javascript: bool | ManifestSource = False,
) -> None:
    """Decide how `job` runs, or its error result: arguments that are not a JSON object,
    an unknown tool."""
    args, problem = _arguments(raw, parse=format != "anthropic")
    if problem is not None:
        job.result = CallResult.failed(job.name, ErrorKind.INVALID_ARGUMENTS, problem)
        return
    tool = tools.get(job.name)
    if tool is not None and "model" in tool.manifest.callers:
        job.run = partial(tool.call, prepare_args(args, tool.parameters))
        return
    if tool is not None:
        job.result = CallResult.failed(
            job.name,
            ErrorKind.INVALID_ARGUMENTS,
            f"tool {job.name!r} is called from code only: call tools.{job.name}(...) in run_python's code",
        )
        return
    if job.name == RUN_PYTHON and python is not False:
        args = prepare_args(args, RUN_PYTHON_SCHEMA)
        grants = None if python is True else python  # read when the job runs, on its thread
        if session is None:  # checked by the interpreter Tool, like any tool's args
            job.run = partial(_run_python, box, grants, args)
            return
        problem = _schema.validate(args, RUN_PYTHON_SCHEMA)
        if problem is not None:
            job.result = CallResult.failed(job.name, ErrorKind.INVALID_ARGUMENTS, problem)
        elif not hasattr(box, "session"):
            job.result = CallResult.failed(job.name, ErrorKind.INVALID_ARGUMENTS, "sessions need a Sandbox")
        else:
            job.run = partial(_session_run, cast("Sandbox", box), session, grants, args["code"])
            job.in_session = True
        return
    if job.name == RUN_JAVASCRIPT and javascript is not False:
        args = prepare_args(args, RUN_JAVASCRIPT_SCHEMA)
        grants = None if javascript is True else javascript
        if session is None:
            job.run = partial(_run_javascript, box, grants, args)
            return
        problem = _schema.validate(args, RUN_JAVASCRIPT_SCHEMA)
        if problem is not None:
            job.result = CallResult.failed(job.name, ErrorKind.INVALID_ARGUMENTS, problem)
        elif not hasattr(box, "session"):
            job.result = CallResult.failed(job.name, ErrorKind.INVALID_ARGUMENTS, "sessions need a Sandbox")
        else:
            box_ = cast("Sandbox", box)
            job.run = partial(
                _session_run, box_, javascript_session(session), grants, args["code"], tool=RUN_JAVASCRIPT
            )
            job.in_session = True
        return
    names = sorted(name for name, tool in tools.items() if "model" in tool.manifest.callers)
    names += [RUN_PYTHON] if python is not False else []
    names += [RUN_JAVASCRIPT] if javascript is not False else []
    listed = ", ".join(names[:_LISTED]) + (", ..." if len(names) > _LISTED else "")
    job.result = CallResult.failed(
        job.name,
        ErrorKind.INVALID_ARGUMENTS,
        f"no tool named {job.name[:_NAME_SHOWN]!r}; the tools are: {listed or '(none)'}",
    )


def _run_python(
    box: Caller, grants: ManifestSource | None, args: dict[str, Any], limits: Any = None
) -> CallResult:
    if hasattr(box, "interpreter"):  # a Sandbox: the interpreter Tool checks the args
        return cast("Sandbox", box).interpreter(grants).call(args, limits=limits)
    more = {"limits": limits} if limits is not None else {}
    return box.run_python(args.get("code"), grants, **more)  # type: ignore[arg-type]  # (the pool checks)


def _run_javascript(
    box: Caller, grants: ManifestSource | None, args: dict[str, Any], limits: Any = None
) -> CallResult:
    if hasattr(box, "interpreter"):  # a Sandbox: the interpreter Tool checks the args
        return cast("Sandbox", box).interpreter(grants, runtime="javascript").call(args, limits=limits)
    more = {"limits": limits} if limits is not None else {}
    return box.run_javascript(args.get("code"), grants, **more)  # type: ignore[arg-type]  # (the pool checks)


def _session_run(
    box: Sandbox,
    name: str,
    grants: ManifestSource | None,
    code: str,
    limits: Any = None,
    tool: str = RUN_PYTHON,
) -> CallResult:
    """A run of the conversation's session `name` (opened if there is none) for `tool`
    (run_python, or run_javascript: a JavaScript session). When the session ended without a
    run's result saying so (a total spent, idle), this call gets an error result that says so,
    once, and the next call opens a new session."""
    ended = box._sessions.take_unreported_end(name)
    runtime: Literal["python", "javascript"] = "javascript" if tool == RUN_JAVASCRIPT else "python"
    try:
        if ended is None:
            return box.session(grants, name=name, runtime=runtime).run(code, limits=limits)
    except SessionEndedError as exc:  # (a total spent, found as this run began)
        ended = exc.reason
    except SessionError as exc:  # too many sessions
        return CallResult.failed(tool, ErrorKind.HOST_ERROR, f"not run: {exc}")
    return CallResult.failed(
        tool,
        ErrorKind.HOST_ERROR,
        f"not run: the session ended ({ended}); its variables and files are gone, and the next "
        f"{tool} call starts a new session",
    )


def _arguments(raw: Any, parse: bool) -> tuple[dict[str, Any], str | None]:
    if type(raw) is not str and isinstance(raw, Mapping):
        return dict(raw), None
    if raw is None:
        return {}, None
    if not isinstance(raw, (str, bytes, bytearray)) or not parse:  # (Anthropic's input is parsed)
        return {}, f"arguments must be a JSON object, got {_schema._json_type(raw)}"
    if not raw.strip():
        return {}, None  # (a call of a tool without parameters may carry "")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return {}, f"arguments are not valid JSON ({exc}); send a JSON object"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {_schema._json_type(value)}"
    return value, None


def _calls(calls: Any, format: str) -> list[Any]:
    """The tool calls in `calls`: a list of them, or the message/response holding them
    (OpenAI's `message.tool_calls`, Responses' `response.output`, Anthropic's
    `message.content`), as SDK objects or dicts. Other items (text, reasoning) are skipped."""
    holder = {"openai": "tool_calls", "openai-responses": "output", "anthropic": "content"}[format]
    items: Any = calls
    if isinstance(calls, Mapping) and holder in calls:
        items = calls[holder] or ()
    elif not isinstance(calls, Mapping) and hasattr(calls, holder):
        items = getattr(calls, holder) or ()
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"dispatch takes a list of {format} tool calls (or the message holding them)")
    wanted = {"openai": None, "openai-responses": "function_call", "anthropic": "tool_use"}[format]
    return [item for item in items if wanted is None or _get(item, "type") == wanted]


def _parse(call: Any, format: str) -> tuple[str, str, Any]:
    """(id, name, arguments as sent) of one call. TypeError for an object that is not a call
    of this format at all (the caller's wiring, not the model's arguments)."""
    if format == "openai":
        call_id, function = _get(call, "id"), _get(call, "function")
        name, raw = _get(function, "name"), _get(function, "arguments")
    elif format == "openai-responses":
        call_id, name, raw = _get(call, "call_id"), _get(call, "name"), _get(call, "arguments")
    else:
        call_id, name, raw = _get(call, "id"), _get(call, "name"), _get(call, "input")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise TypeError(f"not a {format} tool call (no string id and name): {call!r}"[:300])
    return call_id, name, raw


def _get(obj: Any, name: str) -> Any:
    if type(obj) is dict or isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _reply(job: _Job, format: str, deadline_s: float | None = None) -> dict[str, Any]:
    if job.result is None:  # a session's call its turn's deadline left unrun (`_in_order`)
        job.result = _late(job, deadline_s)
    content = result_content(job.result)
    if format == "openai":  # (a tool message's content is text parts only)
        return {"role": "tool", "tool_call_id": job.call_id, "content": content.text}
    if format == "openai-responses":
        return {"type": "function_call_output", "call_id": job.call_id, "output": _responses_output(content)}
    return {
        "type": "tool_result",
        "tool_use_id": job.call_id,
        "content": _anthropic_content(content),
        "is_error": content.is_error,
    }


def _anthropic_content(content: Content) -> str | list[dict[str, Any]]:
    """The text, or, with images or PDFs among the parts, a text block and one image or
    document block each (base64); other parts are in the text (`result_content`)."""
    blocks: list[dict[str, Any]] = []
    for part in content.parts:
        source = {"type": "base64", "media_type": part.media_type, "data": part.base64()}
        if part.is_image:
            blocks.append({"type": "image", "source": source})
        elif part.is_pdf:
            blocks.append({"type": "document", "source": source, "title": part.name})
    return [{"type": "text", "text": content.text}, *blocks] if blocks else content.text


def _responses_output(content: Content) -> str | list[dict[str, Any]]:
    """The text, or, with images or PDFs among the parts, an `input_text` item and one
    `input_image` or `input_file` item each (data URLs)."""
    items: list[dict[str, Any]] = []
    for part in content.parts:
        if part.is_image:
            items.append({"type": "input_image", "image_url": part.data_url()})
        elif part.is_pdf:
            items.append({"type": "input_file", "filename": part.filename, "file_data": part.data_url()})
    return [{"type": "input_text", "text": content.text}, *items] if items else content.text
