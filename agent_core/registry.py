"""Name resolution for pluggable parts: a key of an explicit name -> object dict, or a
'package.module:attribute' path to the user's own code (no import-time self-registration).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


class UnknownNameError(ValueError):
    """A configured name matches nothing; the message lists what does."""


def resolve(kind: str, name: str, table: Mapping[str, Any]) -> Any:
    """Return `table[name]`, or import 'module:attr'; raise UnknownNameError with the choices."""
    if name in table:
        return table[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UnknownNameError(
                f"{kind} {name!r}: cannot import {module_name!r} ({exc})"
            ) from exc
        if not hasattr(module, attr):
            raise UnknownNameError(f"{kind} {name!r}: module {module_name!r} has no {attr!r}")
        return getattr(module, attr)
    choices = ", ".join(sorted(table)) or "(none)"
    raise UnknownNameError(
        f"unknown {kind} {name!r}: choose one of {choices}, or give 'package.module:attribute'"
    )


def resolve_subclass(kind: str, name: str, table: Mapping[str, Any], base: type) -> type:
    """`resolve`, and check the result is a subclass of `base` (a clear TypeError otherwise)."""
    cls = resolve(kind, name, table)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(
            f"{kind} {name!r} resolves to {cls!r}, which is not a {base.__name__} subclass"
        )
    return cls
