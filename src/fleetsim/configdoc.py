"""The config reference, generated from the config classes: every key, its type, default
and the attribute docstring under it (``fleetsim config --dump``, ``docs/config.md``)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
import typing
from typing import Any

from fleetsim.config import VLLM_ENGINE_ALIASES, SimConfig


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the string literal right under it in the class body."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, [*body[1:], None], strict=True):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _type_name(hint: Any) -> str:
    import re

    text = hint.__name__ if isinstance(hint, type) else str(hint)
    return re.sub(r"\b(?:[a-z_]+\.)+", "", text)


def rows(cls: type = SimConfig, prefix: str = "", default_obj: Any = None, *,
         expand_optional: bool = False) -> list[dict[str, Any]]:
    """One row per leaf key (nested config tables expanded), in declaration order;
    ``expand_optional``: also the keys of optional tables unset by default (the reference
    lists them; the TOML dump must not, or loading it back would set them)."""
    out: list[dict[str, Any]] = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    if default_obj is None:
        default_obj = cls()
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(default_obj, f.name)
        hint = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint) and dataclasses.is_dataclass(value):
            out.append({"key": key, "table": True,
                        "doc": docs.get(f.name) or (hint.__doc__ or "").strip().split("\n")[0]})
            out.extend(rows(hint, f"{key}.", value,  # type: ignore[arg-type]
                            expand_optional=expand_optional))
            continue
        section = _optional_section(hint) if expand_optional and value is None else None
        if section is not None:
            # An optional table with required keys (no default object to read): its keys
            # with their declared defaults.
            # (listed after all the other tables: ``deferred``)
            out.append({"key": key, "table": True, "deferred": True,
                        "doc": docs.get(f.name, "") + " Optional: unset by default."})
            out.extend({**r, "deferred": True} for r in _declared_rows(section, f"{key}."))
            continue
        out.append({"key": key, "type": _type_name(hint), "default": _plain(value),
                    "doc": docs.get(f.name, "")})
    return out


def _optional_section(hint: Any) -> type | None:
    """X when ``hint`` is ``X | None`` with X a config dataclass."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]) and type(None) in typing.get_args(
            hint):
        return args[0]  # type: ignore[return-value]
    return None


def _declared_rows(cls: type, prefix: str) -> list[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        has_factory = f.default_factory is not dataclasses.MISSING
        required = f.default is dataclasses.MISSING and not has_factory
        default = None if required else _plain(f.default_factory() if has_factory
                                               else f.default)
        out.append({"key": f"{prefix}{f.name}", "type": _type_name(hints[f.name]),
                    "default": default, "required": required,
                    "doc": docs.get(f.name, "")})
    return out


def _plain(value: Any) -> Any:
    from fleetsim.configutil import to_plain

    return to_plain(value)


def _toml_value(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()
                                if x is not None) + " }"
    return json.dumps(str(v))


def dump_toml() -> str:
    """The full default config as TOML: every key with its doc as a comment; keys whose
    default is unset are commented out. Each table's own keys come before its subtables."""
    lines = ["# fleetsim's default config (`fleetsim config --dump`): every key, its default",
             "# and what it means. Keys commented out are unset by default."]
    all_rows = rows()
    tables = [""] + [r["key"] for r in all_rows if r.get("table")]
    docs = {r["key"]: r["doc"] for r in all_rows if r.get("table")}
    for table in tables:
        if table:
            lines += ["", f"[{table}]" + (f"  # {docs[table]}" if docs[table] else "")]
        else:
            lines.append("")
        depth = table.count(".") + 1 if table else 0
        for r in all_rows:
            key = r["key"]
            if r.get("table") or key.count(".") != depth or (
                    table and not key.startswith(table + ".")):
                continue
            name = key.rsplit(".", 1)[-1]
            lines += [f"# {chunk}" for chunk in textwrap.wrap(r["doc"], 96)]
            if r["default"] is None:
                lines.append(f"# {name} =  ({r['type']}, unset)")
            else:
                lines.append(f"{name} = {_toml_value(r['default'])}")
    return "\n".join(lines) + "\n"


def config_markdown() -> str:
    """``docs/config.md``: the reference as Markdown tables, one per config table."""
    out = ["# Config reference", "",
           "Generated from the config classes (`fleetsim config --markdown`; a test checks "
           "this page is current). Every key can be set in a TOML file or with "
           "`--set key=value`; `fleetsim config --dump` prints the defaults as TOML.", "",
           "vLLM's engine names are accepted in `[engine]`: "
           + ", ".join(f"`{a}` (= `{b}`)" for a, b in VLLM_ENGINE_ALIASES.items())
           + ", and `enable_chunked_prefill` (= `policy.batching.args."
           "enable_chunked_prefill`). Models may be named by Hugging Face repo id "
           "(`meta-llama/Llama-3.1-8B-Instruct`).", ""]
    header = ["| key | type | default | meaning |", "|---|---|---|---|"]
    section = "top level"
    out += [f"## {section}", "", *header]
    every = rows(expand_optional=True)
    for r in [r for r in every if not r.get("deferred")] + [r for r in every
                                                             if r.get("deferred")]:
        if r.get("table"):
            out += ["", f"## `[{r['key']}]`", "", r["doc"], "", *header]
            continue
        default = ("required" if r.get("required") else "unset" if r["default"] is None
                   else f"`{_toml_value(r['default'])}`")
        doc = r["doc"].replace("|", "\\|")
        typ = r["type"].replace("|", "\\|")
        out.append(f"| `{r['key']}` | {typ} | {default} | {doc} |")
    return "\n".join(out) + "\n"
