"""Plug-in registries: a plain dict per decision kind (policies, routers, MoE balancers),
filled by decorators; one machinery for all of them.

A policy is named in config and CLI by its registry key (``"fcfs"``) or, for third-party code,
by qualified name (``"mylab.sched:MyPolicy"``). The same string appears in results.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import traceback
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetsim.configutil import from_dict
from fleetsim.errors import FleetsimInputError

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySpec:
    """A policy chosen by name, with its own arguments."""

    name: str
    """Registry key (e.g. ``"fcfs"``) or qualified name ``"package.module:Object"``."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for the policy; unknown keys fail when the policy is built."""


def make_registry(kind: str) -> tuple[dict[str, Any], Callable[[str], Callable[[T], T]]]:
    """A registry dict for ``kind`` and its ``register(name)`` decorator."""
    registry: dict[str, Any] = {}

    def register(name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in registry:
                raise ValueError(f"duplicate {kind} policy {name!r}")
            registry[name] = obj
            return obj

        return deco

    return registry, register


def import_qualname(name: str, where: str) -> Any:
    """Import ``"package.module:Object"``; a one-line input error if it cannot be found."""
    module_name, _, attr = name.partition(":")
    if not attr:
        raise FleetsimInputError(where, name, "use a registered name or 'package.module:Object'")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as err:
        raise FleetsimInputError(where, name, f"could not import it ({err})") from None
    except SyntaxError as err:
        raise FleetsimInputError(where, name, f"its module has a syntax error ({err.msg}, "
                                 f"{err.filename} line {err.lineno}); fix it") from None
    except Exception as err:  # noqa: BLE001 - user code failing on import is bad input
        raise FleetsimInputError(where, name, f"importing it raised {type(err).__name__}: "
                                 f"{err}; fix the module") from None


def lookup(registry: Mapping[str, Any], name: str, where: str) -> Any:
    """The registered object, or the imported qualified name, or a helpful error."""
    if name in registry:
        return registry[name]
    if ":" in name:
        obj = import_qualname(name, where)
        if not callable(obj):  # every plug-in kind is a class or a key function
            raise FleetsimInputError(
                where, name, f"it is not callable (a {type(obj).__name__} value); name "
                f"the policy class (or, for an ordering or eviction key, the function) in "
                f"'package.module:Object'")
        return obj
    known = ", ".join(sorted(registry))
    raise FleetsimInputError(where, name, f"known policies: {known} (or 'package.module:Object')")


def build(cls: type[T], args: Mapping[str, Any], where: str) -> T:
    """Instantiate a policy class with ``args``; unknown, missing or ill-typed keys fail with
    one line naming ``<where>.args.<key>``.

    A dataclass policy's args are checked against its field annotations (as config fields
    are, bounds included), so both builds see the same values: ``"no"`` is not a bool.
    """
    if not isinstance(args, Mapping):
        raise FleetsimInputError(f"{where}.args", args, "expected a table of policy arguments")
    try:
        if dataclasses.is_dataclass(cls) and _has_resolvable_hints(cls):
            policy: T = from_dict(cls, args, f"{where}.args")
            return policy
        return cls(**args)
    except FleetsimInputError:
        raise
    except TypeError as err:
        raise FleetsimInputError(f"{where}.args", dict(args),
                                 f"{_qualname(cls)} rejected them ({err}); give the arguments "
                                 f"its constructor takes under {where}.args") from None
    except ValueError as err:
        raise FleetsimInputError(f"{where}.args", dict(args), str(err)) from None
    except Exception as err:  # noqa: BLE001 - a plug-in's constructor failing is bad input
        line = _last_line(err)
        raise FleetsimInputError(
            where, _qualname(cls), f"its constructor raised {type(err).__name__}: {err}{line};"
            f" fix {_qualname(cls)}.__init__, or give it the arguments it needs under "
            f"{where}.args") from None


def _qualname(obj: Any) -> str:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(obj)


def _last_line(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    return f" (line {frames[-1].lineno} of {frames[-1].filename})" if frames else ""


def _has_resolvable_hints(cls: type) -> bool:
    try:
        typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a plug-in's annotations may name anything
        return False
    return True


def plugin_error(err: BaseException, names_by_field: Mapping[str, str]
                 ) -> FleetsimInputError | None:
    """The one-line input error for ``err`` if it was raised inside a user plug-in named in
    ``names_by_field`` (config field -> ``"pkg.mod:Object"``), naming that field; else None."""
    files = {}
    for where, name in names_by_field.items():
        module = sys.modules.get(name.partition(":")[0])
        if ":" in name and module is not None and getattr(module, "__file__", None):
            files[module.__file__] = (where, name)
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if frame.filename in files:
            where, name = files[frame.filename]
            return FleetsimInputError(
                where, name, f"the plug-in raised {type(err).__name__}: {err} (line "
                f"{frame.lineno} of {frame.filename}); fix the plug-in")
    return None
