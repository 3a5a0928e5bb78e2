"""A Model Context Protocol server for a Sandbox's tools (`pip install wasmbox[mcp]`).

    server = wasmbox.integrations.mcp.build_server(box, python=True)
    await wasmbox.integrations.mcp.serve_stdio(box)            # or serve_http(box, port=8000)

Built on the official `mcp` SDK's low-level `Server`: the manifests carry their own JSON
Schema, which is listed as is and checked by wasmbox at call time. A failed call, bad
arguments included, is a result with `isError: true` (the model reads why and may retry); a
name that is no tool is a protocol error (`-32602`). Each call is run as `Sandbox.dispatch`
runs one (the same argument handling, `run_python` routing, limits and audit records) on the
Sandbox's worker threads, so calls are served concurrently, up to its `max_workers`.
Results are `result_content`'s text, then its binary parts: an `ImageContent` per PNG, JPEG,
GIF or WebP, an `EmbeddedResource` blob per other binary output. A tool with an `output_schema`
lists it as `outputSchema` and returns its value as `structuredContent` too (a value that is not
an object wrapped as `{"result": value}`, as MCP before 2026-07-28 takes only objects).

With `sessions=True`, `run_python` and `run_javascript` take an optional `session`: a call
without one opens a `Sandbox.session` (of the JavaScript runtime for run_javascript) and its
result ends with a text block `session: <name>`; calls that pass that name run in that
interpreter (a run_javascript call passing a name run_python was told runs in that
conversation's JavaScript session, a session of its own). (The SDK serves each request of the 2026-07 protocol on a
connection of its own, so there is no client connection to tie a session to.) Names are
random tokens the server issued: a client cannot reach another's session without being told
its name. A session ends as `Sandbox.session`'s do (idle, totals, a failed run).

A client that sends a progress token with a `tools/call` gets what the call prints as it
prints it: each write to stdout or stderr is one progress notification, its text the
`message` (stderr's prefixed "stderr: "), all sent before the result.

Over HTTP, `auth_token` makes every request need `Authorization: Bearer <token>` (the SDK's
resource-server side: its bearer middleware over a `TokenVerifier` that compares the token in
constant time); a request without it, or with another, is a 401 with `WWW-Authenticate:
Bearer`. A non-loopback `host` needs `allow_remote` and a token. `allowed_hosts` and
`allowed_origins` are the `Host` and `Origin` values the SDK's DNS-rebinding check lets
through, beside loopback's own.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import secrets
import signal
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

try:
    import mcp_types as types
    from mcp.server import Server, ServerRequestContext
    from mcp.server.auth.provider import AccessToken
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.stdio import stdio_server
    from mcp.server.transport_security import TransportSecuritySettings
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("wasmbox.integrations.mcp needs the mcp SDK: pip install 'wasmbox[mcp]'") from exc

from .. import _dispatch
from .._budget import Budget
from .._content import Content, result_content
from .._formats import (
    RUN_JAVASCRIPT,
    RUN_JAVASCRIPT_SCHEMA,
    RUN_PYTHON,
    RUN_PYTHON_SCHEMA,
    mcp_structured,
)
from .._manifest import ManifestSource
from .._results import CallResult
from .._sandbox import Sandbox

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def build_server(
    box: Sandbox,
    *,
    python: bool | ManifestSource = False,
    name: str = "wasmbox",
    sessions: bool = False,
    javascript: bool | ManifestSource = False,
    budget: Budget | None = None,
) -> Server[Any]:
    """An MCP `Server` that lists `box`'s loaded tools and calls them; `python` (True, or a
    grants manifest as `Sandbox.run_python` takes) adds `run_python`, and `sessions` lets its
    calls keep state in sessions (see the module docstring); `javascript` (the same) adds
    `run_javascript`. Tools loaded later are listed from then on. With `budget`, every call
    the server takes is charged to it (one not admitted is an `over_budget` result). ValueError when `python` or
    `javascript` is given and a loaded tool has the name it adds, or `sessions` without `python`."""
    if python is not False and RUN_PYTHON in box.tools:
        raise ValueError(f"a loaded tool is named {RUN_PYTHON!r}; it cannot be served beside run_python")
    if javascript is not False and RUN_JAVASCRIPT in box.tools:
        raise ValueError(
            f"a loaded tool is named {RUN_JAVASCRIPT!r}; it cannot be served beside run_javascript"
        )
    if sessions and python is False and javascript is False:
        raise ValueError(
            "sessions=True serves run_python and run_javascript sessions: give python= or javascript= too"
        )
    issued = _IssuedSessions() if sessions else None

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        specs = box.specs("mcp", python=python, javascript=javascript, session=issued is not None)
        if issued is not None:
            specs = [_session_spec(spec) for spec in specs]
        return types.ListToolsResult(tools=[types.Tool.model_validate(spec) for spec in specs])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments, session = params.arguments or {}, None
        if issued is not None and params.name in (RUN_PYTHON, RUN_JAVASCRIPT):
            arguments = dict(arguments)
            session, problem = issued.resolve(arguments.pop("session", None))
            if problem is not None:
                return types.CallToolResult(content=[types.TextContent(text=problem)], is_error=True)
        progress = _Progress(ctx)  # (sent only to a client that asked: the SDK drops the rest)
        result = await _call(box, params.name, arguments, python, session, javascript, budget, progress)
        await progress.sent()
        content = result_content(result)
        blocks = _blocks(content)
        if session is not None:
            blocks.append(types.TextContent(text=f"session: {session}"))
        tool = box.tools.get(params.name)
        if result.ok and tool is not None and tool.output_schema is not None:
            # the value, checked against the tool's output_schema already, as `outputSchema` lists it
            structured = mcp_structured(result.value, tool.output_schema)
            return types.CallToolResult(content=blocks, structured_content=structured, is_error=False)
        return types.CallToolResult(content=blocks, is_error=content.is_error)

    return Server(name, version=_version(), on_list_tools=list_tools, on_call_tool=call_tool)


def _blocks(content: Content) -> list[types.ContentBlock]:
    """The text, then an image per raster image part and an embedded blob resource per other
    part (`wasmbox:<name>`, e.g. `wasmbox:/tmp/out.pdf`, `wasmbox:stdout`), standard base64."""
    blocks: list[types.ContentBlock] = [types.TextContent(text=content.text)]
    for part in content.parts:
        if part.is_image:
            blocks.append(types.ImageContent(data=part.base64(), mime_type=part.media_type))
        else:
            uri = "wasmbox:" + quote(part.name, safe="/")
            blob = types.BlobResourceContents(uri=uri, mime_type=part.media_type, blob=part.base64())
            blocks.append(types.EmbeddedResource(resource=blob))
    return blocks


async def _call(
    box: Sandbox,
    name: str,
    arguments: Mapping[str, Any],
    python: bool | ManifestSource,
    session: str | None,
    javascript: bool | ManifestSource,
    budget: Budget | None,
    progress: _Progress | None = None,
) -> CallResult:
    listed = name in box.tools or (python is not False and name == RUN_PYTHON)
    if not listed and not (javascript is not False and name == RUN_JAVASCRIPT):
        # the client asked for something never listed: a protocol error, not the model's result
        raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}")
    return await _dispatch.acall_one(
        box,
        name,
        arguments,
        python=python,
        session=session,
        javascript=javascript,
        budget=budget,
        on_output=progress.line if progress is not None else None,
    )


class _Progress:
    """A call's stdout and stderr, as written, as progress notifications of the request (for a
    client that sent a progress token): each write's text is one notification's `message`,
    its count the `progress` (stderr's prefixed "stderr: ")."""

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self._session = ctx.session
        self._count = 0
        self._sending: list[asyncio.Task[None]] = []

    def line(self, stream: str, text: str) -> None:
        """On the event loop (`acall_one` forwards it there), in the order written."""
        self._count += 1
        message = text if stream == "stdout" else f"stderr: {text}"
        self._sending.append(asyncio.ensure_future(self._session.report_progress(self._count, None, message)))

    async def sent(self) -> None:
        """Wait until every notification is sent, before the result goes out (after them)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)


class _IssuedSessions:
    """The session names this server gave its clients. A name is a random token: a client
    reaches a session only with the name it was told, never one it made up or guessed."""

    def __init__(self) -> None:
        self._issued: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def resolve(self, given: object) -> tuple[str | None, str | None]:
        """(the session's name, None), a new one when `given` is None; or (None, why not)."""
        with self._lock:
            if given is None:
                name = f"mcp-{secrets.token_urlsafe(16)}"
                self._issued[name] = None
                while len(self._issued) > _ISSUED_KEPT:
                    self._issued.popitem(last=False)
                return name, None
            if isinstance(given, str) and given in self._issued:
                self._issued.move_to_end(given)
                return given, None
        return None, "unknown session: pass the `session` a run_python result named, or none to start one"


_ISSUED_KEPT = 10_000
_SESSION_SCHEMA = {
    **RUN_PYTHON_SCHEMA,
    "properties": {
        **RUN_PYTHON_SCHEMA["properties"],
        "session": {
            "type": "string",
            "description": "The session a previous run_python result named, to run in its interpreter "
            "(its variables, imports and /tmp files); omit it to start a new session",
        },
    },
}


_JAVASCRIPT_SESSION_SCHEMA = {
    **RUN_JAVASCRIPT_SCHEMA,
    "properties": {
        **RUN_JAVASCRIPT_SCHEMA["properties"],
        "session": {
            "type": "string",
            "description": "The session a previous run_javascript result named, to run in its context "
            "(its global variables and functions, its /tmp files); omit it to start a new session",
        },
    },
}


def _session_spec(spec: dict[str, Any]) -> dict[str, Any]:
    schema = {RUN_PYTHON: _SESSION_SCHEMA, RUN_JAVASCRIPT: _JAVASCRIPT_SESSION_SCHEMA}.get(spec["name"])
    if schema is None:
        return spec
    return {**spec, "inputSchema": schema}  # (described as a session's by `specs`)


async def serve_stdio(
    box: Sandbox,
    *,
    python: bool | ManifestSource = False,
    sessions: bool = False,
    javascript: bool | ManifestSource = False,
) -> None:
    """Serve `build_server(box, python=python, sessions=sessions, javascript=javascript)` over
    this process's stdin and stdout until stdin closes."""
    server = build_server(box, python=python, sessions=sessions, javascript=javascript)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(
    box: Sandbox,
    *,
    python: bool | ManifestSource = False,
    host: str = "127.0.0.1",
    port: int = 8000,
    allow_remote: bool = False,
    on_listening: Callable[[str], None] | None = None,
    sessions: bool = False,
    javascript: bool | ManifestSource = False,
    auth_token: str | None = None,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
) -> None:
    """Serve `build_server(box, python=python, sessions=sessions, javascript=javascript)` over streamable HTTP at
    `http://host:port/mcp` until the process gets SIGINT or SIGTERM, then return. `port=0` takes a free port;
    `on_listening(url)` is called once the socket listens. With `auth_token` (see `read_token`) every request
    must carry it as a bearer token. ValueError when `host` is not loopback and `allow_remote` or
    `auth_token` is missing, when the token is unusable, or an allowed host or origin is malformed."""
    import uvicorn  # a dependency of the mcp SDK

    if not is_loopback(host):
        if not allow_remote:
            raise ValueError(
                f"{host!r} is not a loopback address: binding the MCP server to a network is "
                "refused unless allow_remote=True (and an auth_token) say it is meant"
            )
        if auth_token is None:
            raise ValueError(
                f"{host!r} is not a loopback address: anyone who can reach it could call the tools, "
                "so serving it needs an auth_token (clients send it as a bearer token)"
            )
    if auth_token is not None:
        _check_token(auth_token, "auth_token")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    security = transport_security(host, allowed_hosts, allowed_origins)
    server = build_server(box, python=python, sessions=sessions, javascript=javascript)
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(128)
        url = f"http://{shown}:{listener.getsockname()[1]}/mcp"
        auth: dict[str, Any] = {}
        if auth_token is not None:
            # the resource-server side only: no authorization server issues this token, so no
            # protected-resource metadata is published (`issuer_url` is required by the model
            # and unused without an auth server provider or a resource_server_url)
            auth = {
                "auth": AuthSettings(issuer_url=url, resource_server_url=None),
                "token_verifier": _StaticToken(auth_token),
            }
        app = server.streamable_http_app(host=host, transport_security=security, **auth)
        if on_listening is not None:
            on_listening(url)
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        await _uvicorn_server()(config).serve(sockets=[listener])
    finally:
        listener.close()


def read_token(*, file: Path | None = None, env: str | None = None) -> str:
    """The bearer token in `file` (its first line) or in the environment variable `env`, for
    `serve_http(auth_token=...)`. ValueError when neither or both are given, the file cannot be
    read, the variable is unset, or the token is shorter than 32 characters or holds a
    character a header cannot carry (a space, a control character, non-ASCII)."""
    if (file is None) == (env is None):
        raise ValueError("give the token's file or its environment variable, one of them")
    if file is not None:
        try:
            with open(file, encoding="utf-8") as handle:  # the operator's file, opened as given
                token, where = handle.readline().strip(), f"the token file {file}"
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"cannot read the token file {file}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
    else:
        assert env is not None
        if env not in os.environ:
            raise ValueError(f"the environment variable {env} (the token) is not set")
        token, where = os.environ[env].strip(), f"the environment variable {env}"
    _check_token(token, where)
    return token


MIN_TOKEN_LENGTH = 32  # characters: e.g. `secrets.token_urlsafe(32)` gives 43


def _check_token(token: str, where: str) -> None:
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{where}: the token has {len(token)} characters; give at least {MIN_TOKEN_LENGTH} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if not all("!" <= char <= "~" for char in token):
        raise ValueError(f"{where}: the token may hold only printable ASCII without spaces")


class _StaticToken:
    """The SDK's `TokenVerifier` for one shared token, compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        given = token.encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, self._token):
            return None
        return AccessToken(token="", client_id="wasmbox-token", scopes=[])  # the token is not kept


def transport_security(
    host: str, allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = ()
) -> TransportSecuritySettings | None:
    """The SDK's DNS-rebinding check for a server bound to `host`: on loopback, loopback names
    and the allowed ones; off it, the allowed ones, or no check when none are given (the token
    then guards). A bare host name allows it on any port. ValueError naming a malformed entry,
    or origins without hosts off loopback."""
    hosts: set[str] = set()
    for given in allowed_hosts:
        if not given or any(char in given for char in "/ @") or given.startswith("http"):
            raise ValueError(f"allowed host {given!r}: give a Host header value, e.g. 'mcp.example.com:8443'")
        hosts |= (
            {given} if given.rsplit(":", 1)[-1].isdigit() or given.endswith(":*") else {given, f"{given}:*"}
        )
    origins: set[str] = set()
    for given in allowed_origins:
        if not given.startswith(("http://", "https://")) or given.count("/") != 2:
            raise ValueError(
                f"allowed origin {given!r}: give an Origin header value, e.g. 'https://app.example.com'"
            )
        origins.add(given)
    if is_loopback(host):  # DNS rebinding: refuse a Host or Origin that is not this machine
        shown = f"[{host}]" if ":" in host else host
        local = {"127.0.0.1:*", "localhost:*", "[::1]:*", f"{shown}:*"}
        hosts |= local
        origins |= {f"http://{name}" for name in local}
    elif not hosts:
        if origins:
            raise ValueError("allowed origins are checked with the Host: give allowed hosts too")
        return None
    return TransportSecuritySettings(allowed_hosts=sorted(hosts), allowed_origins=sorted(origins))


def _uvicorn_server() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a SIGINT or SIGTERM stops it and `serve` returns, so the caller
        closes its Sandbox (flushing the audit log); uvicorn's own raises the signal again once
        it has stopped, which kills the process first."""

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

    return Server


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, "localhost")."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _version() -> str:
    from .. import __version__

    return __version__
