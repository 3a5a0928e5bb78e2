"""wasmbox and the LLM stacks: tool definitions in each provider's format, and dispatch of a
model's tool calls (`Tool.spec`, `Sandbox.specs`, `Sandbox.dispatch`).

Importing this package imports no provider SDK; adapters for optional SDKs live in its
submodules and import theirs lazily.
"""

from .._content import Attachment, Content, result_content
from .._formats import FORMATS, SpecFormat, StrictMode, prepare_args, strict_schema

__all__ = [
    "FORMATS",
    "Attachment",
    "Content",
    "SpecFormat",
    "StrictMode",
    "prepare_args",
    "result_content",
    "strict_schema",
]
