"""Narrow egress rules: what one `[network] allow` entry lets a request do beyond reaching its
host:port, and the secret it attaches (`Manifest.network`, used by `fetch.py`).

A rule may limit the methods, the paths (patterns: `*` is any run of characters within one
segment, a last segment `**` is any rest), the query's parameter names, the headers the guest
sets (an allow list, and names it may never set), the body's size, and the requests sent under
it per call. A plain `"host:port"` entry is a rule with none of these. Under a rule with
`paths`, the path is checked in one canonical form and sent in that form: percent-decoded once,
with `.`/`..` segments, empty segments, `;`, `\\`, `%` (double encoding), an encoded `/`,
control characters and text that Unicode compatibility normalization (NFKC) would change all
refused; under a rule with `query`, the query is decoded, its names checked, and re-encoded.

A rule's secret (a header such as `Authorization`) is added by the host to each request the
rule admits, after every check; the guest may not set that header itself under the rule.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._units import format_size
from .allowlist import IPAddress, NameRule, Rule, parse_rule, verdict

if TYPE_CHECKING:
    from .._manifest import EgressRule

HEADER_NAME = r"^[!#-'*+.^-z|~0-9A-Za-z-]+$"  # an HTTP token (RFC 9110)
_HEADER_NAME = re.compile(HEADER_NAME)
_METHOD = re.compile(r"^[A-Z]{1,16}$")
# Headers only the host sets (framing and routing), whatever the rule.
HOST_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade", "te"})
# Headers that ask a server to treat a request as another method: refused under a rule that
# limits its methods.
METHOD_OVERRIDES = frozenset({"x-http-method-override", "x-http-method", "x-method-override"})
_BAD_PATH_CHARS = re.compile(r"[\x00-\x1f\x7f\\;%]")
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PATH_SAFE = "/:@!$&'()*+,="  # sent unencoded in a canonical path (with letters, digits, -._~)
# A secret's value with its prefix must be a valid header value: no control characters (CR and
# LF would split the request), Latin-1 only (what http.client sends).
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*$")


@dataclass(frozen=True, eq=False)
class SecretSource:
    """Where a rule's secret comes from: the host's environment (`env`) or the Sandbox's
    `secrets` (`sandbox`); `key` is the header's name as `header_key` makes it."""

    header: str
    key: str
    prefix: str
    env: str | None
    sandbox: str | None

    def describe(self) -> str:
        return f"${self.env}" if self.env is not None else f"Sandbox secret {self.sandbox!r}"


@dataclass(frozen=True, eq=False)
class CompiledRule:
    """One `allow` entry, compiled: where it reaches (`dest`) and what it lets a request do
    there (None: no limit)."""

    index: int
    entry: str  # the host text as written
    dest: Rule
    methods: frozenset[str] | None = None
    paths: tuple[str, ...] | None = None
    path_pattern: re.Pattern[str] | None = None
    query: frozenset[str] | None = None
    headers: frozenset[str] | None = None  # as `header_key` makes them
    forbidden: frozenset[str] = frozenset()  # the rule's, its secret's, overrides (`header_key`)
    max_body: int | None = None
    max_calls: int | None = None
    secret: SecretSource | None = None

    @property
    def label(self) -> str:
        return f"network.allow[{self.index}] ({self.entry})"

    @property
    def plain(self) -> bool:
        """A plain `host:port` entry: nothing but where it reaches."""
        return (
            self.methods is None
            and self.path_pattern is None
            and self.query is None
            and self.headers is None
            and not self.forbidden
            and self.max_body is None
            and self.max_calls is None
            and self.secret is None
        )

    def reaches(self, host: str, port: int) -> bool:
        """Whether a request for `host:port` may fall under this rule (for an address rule and
        a host name, that depends on what the name resolves to: `fetch` checks that next)."""
        dest = self.dest
        if isinstance(dest, NameRule):
            return dest.host == host and dest.port == port
        if dest.port not in (None, port):
            return False
        try:
            address = ipaddress.ip_address(host.strip("[]").split("%")[0])
        except ValueError:
            return True
        return verdict((dest,), host, port, address) is None

    def covers(self, host: str, port: int, addresses: Sequence[IPAddress]) -> bool:
        """Whether this rule alone allows connecting to every one of `addresses`."""
        return all(verdict((self.dest,), host, port, address) is None for address in addresses)


@functools.lru_cache(maxsize=256)
def compile_rules(allow: tuple[str | EgressRule, ...]) -> tuple[CompiledRule, ...]:
    """The rules of an allow list (compiled once per distinct list). ValueError names the
    entry and what is wrong with it."""
    return tuple(_compile(index, entry) for index, entry in enumerate(allow))


def _compile(index: int, entry: str | EgressRule) -> CompiledRule:
    if isinstance(entry, str):
        return CompiledRule(index, entry, parse_rule(entry))
    where = f"[{index}] ({entry.host})"
    try:
        dest = parse_rule(entry.host)
        methods = frozenset(_method(m) for m in entry.methods) if entry.methods is not None else None
        pattern = _path_pattern(entry.paths) if entry.paths is not None else None
        headers = frozenset(_header(h) for h in entry.headers) if entry.headers is not None else None
        forbidden = {_header(h) for h in entry.forbid_headers}
        secret = None
        if entry.secret is not None:
            name = _header(entry.secret.header)
            if headers is not None and name in headers:
                raise ValueError(f"headers: {entry.secret.header!r} is the secret's header, set by the host")
            secret = SecretSource(
                entry.secret.header, name, entry.secret.prefix, entry.secret.env, entry.secret.sandbox
            )
            forbidden.add(name)
        if methods is not None:
            forbidden |= METHOD_OVERRIDES
        for name in entry.query or ():
            if not name or any(c in name for c in "&=#\0"):
                raise ValueError(f"query: {name!r} is not a parameter name")
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return CompiledRule(
        index,
        entry.host,
        dest,
        methods,
        entry.paths,
        pattern,
        frozenset(entry.query) if entry.query is not None else None,
        headers,
        frozenset(forbidden),
        entry.max_body,
        entry.max_calls,
        secret,
    )


def _method(text: str) -> str:
    if not _METHOD.match(text):
        raise ValueError(f"methods: {text!r} is not an HTTP method in upper case, e.g. GET")
    return text


def header_key(name: str) -> str:
    """How header names are compared: in lower case, and with '_' as '-' (CGI and WSGI servers
    read `X_Api_Key` as `X-Api-Key`)."""
    return name.lower().replace("_", "-")


def _header(text: str) -> str:
    if not _HEADER_NAME.match(text):
        raise ValueError(f"{text!r} is not a header name")
    if header_key(text) in HOST_HEADERS:
        raise ValueError(f"{text!r} is set by the host, never by the guest")
    return header_key(text)


def _path_pattern(paths: Sequence[str]) -> re.Pattern[str]:
    """One regular expression for a rule's `paths`: each a path with `*` for any run of
    characters within one segment and, as its last segment only, `**` for any rest."""
    if not paths:
        raise ValueError("paths: give at least one, e.g. '/v1/**'")
    alternatives = []
    for path in paths:
        if not path.startswith("/"):
            raise ValueError(f"paths: {path!r} must start with '/'")
        segments = path.split("/")[1:]
        canonical, problem = canonical_path(path.replace("*", "x"))
        if problem is not None or canonical != path.replace("*", "x"):
            raise ValueError(f"paths: {path!r} {problem or 'is not in canonical form (no %-escapes)'}")
        parts = []
        for number, segment in enumerate(segments):
            if segment == "**":
                if number != len(segments) - 1:
                    raise ValueError(f"paths: {path!r}: '**' may only be the last segment")
                parts.append("(?:/.*)?")
            elif "**" in segment:
                raise ValueError(f"paths: {path!r}: '**' must be a whole segment")
            elif segment == "*":  # a whole segment: not an empty one
                parts.append("/[^/]+")
            else:
                parts.append("/" + "[^/]*".join(re.escape(piece) for piece in segment.split("*")))
        alternatives.append("".join(parts) if parts else "/")
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


def canonical_path(raw: str) -> tuple[str, str | None]:
    """The path `raw` (as in a URL, percent-encoded) decoded once, or why it is refused under
    a rule with `paths`: the second item is None when it is fine."""
    path = raw or "/"
    if not path.startswith("/"):
        return path, "does not start with '/'"
    if _PERCENT.search(path):
        return path, "has a malformed %-escape"
    try:
        decoded = urllib.parse.unquote(path, errors="strict")
    except UnicodeDecodeError:
        return path, "is not UTF-8 once decoded"
    if decoded.count("/") != path.count("/"):
        return path, "has an encoded '/' (%2F)"
    if _BAD_PATH_CHARS.search(decoded):
        return path, "has a control character, '\\', ';' or a '%' once decoded"
    if not decoded.isascii() and unicodedata.normalize("NFKC", decoded) != decoded:
        return path, "has characters that Unicode normalization (NFKC) changes"
    segments = decoded.split("/")[1:]
    if any(segment in (".", "..") for segment in segments):
        return path, "has a '.' or '..' segment"
    if any(segment == "" for segment in segments[:-1]):
        return path, "has an empty segment ('//')"
    return decoded, None


class Request:
    """What the guest asks one fetch hop to send, for checking against rules (the decoded
    path and query are worked out once, when a rule first needs them)."""

    def __init__(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes | None
    ) -> None:
        self.method, self.raw_path, self.raw_query, self.body = method, path, query, body
        self.header_names = [(header_key(name), name) for name in headers]

    @functools.cached_property
    def path(self) -> tuple[str, str | None]:
        return canonical_path(self.raw_path)

    @functools.cached_property
    def query(self) -> tuple[list[tuple[str, str]], str | None]:
        try:
            pairs = urllib.parse.parse_qsl(self.raw_query, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            return [], "is not UTF-8 once decoded"
        return pairs, None

    def target(self, rule: CompiledRule | None) -> str:
        """The request target sent: as the guest wrote it, except the parts `rule` checked in
        canonical form (the path under `paths`, the query under `query`)."""
        path, query = self.raw_path or "/", self.raw_query
        if rule is not None and rule.path_pattern is not None:
            path = urllib.parse.quote(self.path[0], safe=_PATH_SAFE)
        if rule is not None and rule.query is not None:
            query = urllib.parse.urlencode(self.query[0], quote_via=urllib.parse.quote)
        return f"{path}?{query}" if query else path


def refusal(rule: CompiledRule, request: Request) -> str | None:
    """Why `rule` does not admit `request`, or None if it does (where it goes is checked apart)."""
    if rule.methods is not None and request.method not in rule.methods:
        return f"method {request.method} is not one of its methods ({', '.join(sorted(rule.methods))})"
    if rule.path_pattern is not None:
        path, problem = request.path
        if problem is not None:
            return f"path {request.raw_path!r} {problem}"
        if not rule.path_pattern.fullmatch(path):
            return f"path {path!r} matches none of its paths ({', '.join(rule.paths or ())})"
    if rule.query is not None:
        pairs, problem = request.query
        if problem is not None:
            return f"the query {problem}"
        for name, _ in pairs:
            if name not in rule.query:
                allowed = ", ".join(sorted(rule.query)) or "none"
                return f"query parameter {name!r} is not one of its query names ({allowed})"
    for key, name in request.header_names:
        if rule.secret is not None and key == rule.secret.key:
            return f"header {name!r} is set by the host (the rule's secret), never by the guest"
        if key in rule.forbidden:
            return f"header {name!r} may not be set under it"
        if rule.headers is not None and key not in rule.headers:
            return f"header {name!r} is not one of its headers ({', '.join(sorted(rule.headers)) or 'none'})"
    size = len(request.body or b"")
    if rule.max_body is not None and size > rule.max_body:
        return f"the body ({format_size(size)}) is larger than its max_body ({format_size(rule.max_body)})"
    return None


def header_value_ok(value: str) -> bool:
    """Whether `value` can be sent as a header value as it is."""
    return _HEADER_VALUE.match(value) is not None
