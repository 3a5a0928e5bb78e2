"""wasmbox: run LLM tool calls as WebAssembly under Wasmtime, with nothing ambient.

    box = wasmbox.Sandbox()
    tool = box.load("capabilities/word_count.toml")
    tool.call({"text": "a b c"}).unwrap()
"""

from ._audit import AuditLog, AuditRecord, Verification, verify_audit_log
from ._errors import (
    BadResponseError,
    CapabilityDeniedError,
    CapabilityError,
    ErrorKind,
    GuestError,
    HostError,
    InvalidArgumentsError,
    ManifestError,
    MemoryLimitError,
    OutOfFuelError,
    OutputLimitError,
    StrictSchemaError,
    StrictSchemaWarning,
    ToolError,
    ToolTimeoutError,
    TrapError,
    WasmboxError,
)
from ._inspect import ToolKind
from ._manifest import Limits, Manifest, Preopen
from ._results import CallError, CallResult, HostCallRecord
from ._sandbox import Sandbox
from ._tool import Tool
from ._wasmtime.engine import EngineSettings

__version__ = "0.1.0"

__all__ = [
    "AuditLog",
    "AuditRecord",
    "BadResponseError",
    "CallError",
    "CallResult",
    "CapabilityDeniedError",
    "CapabilityError",
    "EngineSettings",
    "ErrorKind",
    "GuestError",
    "HostCallRecord",
    "HostError",
    "InvalidArgumentsError",
    "Limits",
    "Manifest",
    "ManifestError",
    "MemoryLimitError",
    "OutOfFuelError",
    "OutputLimitError",
    "Preopen",
    "Sandbox",
    "StrictSchemaError",
    "StrictSchemaWarning",
    "Tool",
    "ToolError",
    "ToolKind",
    "ToolTimeoutError",
    "TrapError",
    "Verification",
    "WasmboxError",
    "verify_audit_log",
]
