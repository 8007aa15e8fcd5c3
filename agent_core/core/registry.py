"""Name resolution for pluggable parts: a key of an explicit name -> object dict, or a
'package.module:attribute' path to the user's own code (no import-time self-registration),
accepted only when it is of its role's type: a subclass of the role's base class, or a
function (or class) the user marked for the role with `@plugin(role)`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

# The function roles a config can name; a class role (env, tool, context policy) is a base class.
FUNCTION_ROLES = ("agent", "estimator", "reward", "summarizer")
ROLE_MARK = "__steprl_role__"

Marked = TypeVar("Marked")


class UnknownNameError(ValueError):
    """A configured name matches nothing; the message lists what does."""


class WrongRoleError(TypeError, ValueError):
    """A configured name is found but is not of its role's type (it is never called). Both a
    TypeError and a ValueError, so callers catching either (a bad config value) see it."""


@dataclass(frozen=True)
class ModuleAllowlist:
    """The only modules a 'module:attribute' name may come from (and their submodules), and
    what to tell the user who names another one."""

    modules: tuple[str, ...]
    how_to_allow: str

    def allows(self, module: str) -> bool:
        return any(module == m or module.startswith(f"{m}.") for m in self.modules)


# None = any module (a person at the keyboard chose the names); set by `only_modules`.
_ALLOWLIST: ContextVar[ModuleAllowlist | None] = ContextVar("steprl_allowlist", default=None)


@contextmanager
def only_modules(allowlist: ModuleAllowlist) -> Iterator[None]:
    """Within the block, a 'module:attribute' name outside `allowlist` is refused before
    anything is imported (importing a module runs its code)."""
    token = _ALLOWLIST.set(allowlist)
    try:
        yield
    finally:
        _ALLOWLIST.reset(token)


def plugin(role: str) -> Callable[[Marked], Marked]:
    """Mark a function (or class) of yours as a steprl `role` ("agent", "estimator", "reward"
    or "summarizer"), so a config may name it as 'package.module:attribute'. A function
    nobody marked (e.g. one of the standard library) is refused: a config only names code
    that was written to be called in that role."""
    if role not in FUNCTION_ROLES:
        raise ValueError(f"unknown plugin role {role!r}: choose one of {', '.join(FUNCTION_ROLES)}")

    def mark(obj: Marked) -> Marked:
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            raise TypeError(f"@plugin({role!r}) marks a function or a class, not {obj!r}")
        setattr(obj, ROLE_MARK, role)
        return obj

    return mark


def is_plugin(obj: Any, role: str) -> bool:
    """Whether `obj` is a function or class marked `@plugin(role)`; read from the objects' own
    dicts, so nothing of `obj` runs (no `__getattr__`, no descriptor)."""
    if inspect.isclass(obj):
        owners: Sequence[Any] = obj.__mro__
    elif inspect.isfunction(obj):
        owners = (obj,)
    else:
        return False
    return any(vars(owner).get(ROLE_MARK) == role for owner in owners)


def is_module_name(name: str) -> bool:
    """Whether `name` is a dotted module name (each part an identifier)."""
    return all(part.isidentifier() for part in name.split("."))


def _import_attribute(kind: str, name: str) -> Any:
    """The attribute a 'module:attribute' name points at, imported only when allowed."""
    module_name, _, attr = name.partition(":")
    if not (is_module_name(module_name) and attr.isidentifier()):
        raise UnknownNameError(
            f"{kind} {name!r}: give 'package.module:attribute' (dotted module, one attribute)"
        )
    allowlist = _ALLOWLIST.get()
    if allowlist is not None and not allowlist.allows(module_name):
        raise UnknownNameError(
            f"{kind} {name!r}: module {module_name!r} is not allowed here; "
            f"{allowlist.how_to_allow.format(module=module_name.split('.')[0])}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownNameError(f"{kind} {name!r}: cannot import {module_name!r} ({exc})") from exc
    found = inspect.getattr_static(module, attr, None)
    if found is None:
        raise UnknownNameError(f"{kind} {name!r}: module {module_name!r} has no {attr!r}")
    return found


def resolve(
    kind: str,
    name: str,
    table: Mapping[str, Any],
    accepts: Callable[[Any], bool] | None = None,
    wanted: str = "",
) -> Any:
    """`table[name]`, or the attribute a 'module:attr' name points at when it is of the role's
    type: `accepts(it)`, by default marked `@plugin(kind)`. Raises UnknownNameError listing
    the choices, or WrongRoleError for an attribute of another type (nothing of it is called)."""
    if name in table:
        return table[name]
    if ":" not in name:
        choices = ", ".join(sorted(table)) or "(none)"
        raise UnknownNameError(
            f"unknown {kind} {name!r}: choose one of {choices}, or give 'package.module:attribute'"
        )
    found = _import_attribute(kind, name)
    if not (accepts(found) if accepts is not None else is_plugin(found, kind)):
        wanted = wanted or (
            f"a function marked @plugin({kind!r}) (from agent_core.core.registry import plugin)"
        )
        raise WrongRoleError(f"{kind} {name!r} resolves to {found!r}, which is not {wanted}")
    return found


def resolve_subclass(kind: str, name: str, table: Mapping[str, Any], base: type) -> type:
    """`resolve`, accepting only a subclass of `base` (WrongRoleError otherwise)."""

    def accepts(found: Any) -> bool:
        return isinstance(found, type) and issubclass(found, base)

    return resolve(kind, name, table, accepts, f"a {base.__name__} subclass")
