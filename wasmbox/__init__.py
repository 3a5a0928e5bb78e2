"""wasmbox: run LLM tool calls as WebAssembly under Wasmtime, with nothing ambient.

box = wasmbox.Sandbox()
tool = box.load("capabilities/word_count.toml")
tool.call({"text": "a b c"}).unwrap()
"""

from ._admission import AdmissionLimits, AdmissionStats
from ._audit import AuditLog, AuditRecord, Verification, verify_audit_log
from ._backends.python.build import RuntimeBuildError
from ._backends.python.session import Session, SessionLimits
from ._budget import Budget
from ._cache import CacheStats
from ._errors import (
    BadResponseError,
    CapabilityDeniedError,
    CapabilityError,
    ErrorKind,
    GuestError,
    HostError,
    InvalidArgumentsError,
    LimitsError,
    ManifestError,
    MemoryLimitError,
    OutOfFuelError,
    OutputLimitError,
    OverBudgetError,
    OverloadedError,
    SessionEndedError,
    SessionError,
    StrictSchemaError,
    StrictSchemaWarning,
    ToolError,
    ToolTimeoutError,
    TrapError,
    UnknownToolError,
    WasmboxError,
)
from ._inspect import ModuleImport, ModuleInfo, ToolKind
from ._manifest import (
    Allocator,
    CallLimits,
    Command,
    EgressRule,
    EgressSecret,
    Inputs,
    Limits,
    Manifest,
    Network,
    OutputFile,
    Preopen,
    Reactor,
    ReactorParam,
)
from ._replay import CallTape, HostExchange, Recording, Replay, recording, replaying
from ._results import CallError, CallResult, HostCallRecord
from ._sandbox import Sandbox
from ._stats import SandboxStats
from ._tool import Tool
from ._wasmtime.engine import EngineSettings

__version__ = "0.1.0"

__all__ = [
    "AdmissionLimits",
    "AdmissionStats",
    "Allocator",
    "AuditLog",
    "AuditRecord",
    "BadResponseError",
    "Budget",
    "CacheStats",
    "CallError",
    "CallLimits",
    "CallResult",
    "CallTape",
    "CapabilityDeniedError",
    "CapabilityError",
    "Command",
    "EgressRule",
    "EgressSecret",
    "EngineSettings",
    "ErrorKind",
    "GuestError",
    "HostCallRecord",
    "HostError",
    "HostExchange",
    "Inputs",
    "InvalidArgumentsError",
    "Limits",
    "LimitsError",
    "Manifest",
    "ManifestError",
    "MemoryLimitError",
    "ModuleImport",
    "ModuleInfo",
    "Network",
    "OutOfFuelError",
    "OutputFile",
    "OutputLimitError",
    "OverBudgetError",
    "OverloadedError",
    "Preopen",
    "Reactor",
    "ReactorParam",
    "Recording",
    "Replay",
    "RuntimeBuildError",
    "Sandbox",
    "SandboxStats",
    "Session",
    "SessionEndedError",
    "SessionError",
    "SessionLimits",
    "StrictSchemaError",
    "StrictSchemaWarning",
    "Tool",
    "ToolError",
    "ToolKind",
    "ToolTimeoutError",
    "TrapError",
    "UnknownToolError",
    "Verification",
    "WasmboxError",
    "recording",
    "replaying",
    "verify_audit_log",
]
