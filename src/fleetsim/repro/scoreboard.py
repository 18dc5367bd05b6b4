"""The scoreboard of ``fleetsim repro all`` (every reproduction run as an independent task
over the machine's cores or Ray, ``fleetsim.repro.cli``): ``{"entries": [document, ...]}`` as
JSON, an HTML page with each entry's key figure, and the "where each stands" table of
docs/reproductions.md, generated from a recorded scoreboard (docs/scoreboard.json).

Re-record after a change to any entry (a full run, 5-10 minutes on 2 busy cores)::

    make scoreboard

which runs ``fleetsim repro all --record docs/scoreboard.json`` and then
``python -m fleetsim.repro.scoreboard docs/scoreboard.json docs/reproductions.md`` (the
table alone, from the record).
"""

from __future__ import annotations

import html
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TABLE_BEGIN = "<!-- scoreboard table: generated from docs/scoreboard.json, do not edit -->"
TABLE_END = "<!-- end of scoreboard table -->"
RERECORD = ("re-record with `make scoreboard` (a full run of every entry), or regenerate the "
            "table from the record with `python -m fleetsim.repro.scoreboard "
            "docs/scoreboard.json docs/reproductions.md`")


def scoreboard(documents: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """The scoreboard document: the entries that ran (None: failed), in order."""
    return {"entries": [doc for doc in documents if doc is not None]}


# -- the table ---------------------------------------------------------------------------

def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _fleetsim_cell(doc: Mapping[str, Any]) -> str:
    ratio = doc["ratio"]
    if ratio is None:
        return "not measurable"
    return f"{ratio:.2f}x (a bound)" if doc["ratio_is_bound"] else f"{ratio:.2f}x"


def table_rows(board: Mapping[str, Any]) -> list[str]:
    """The docs table, as markdown lines: for each entry, the published value for the
    setting fleetsim runs, the paper's best, fleetsim's ratio and the ablations'."""
    lines = ["| entry | paper, this setting | paper, best (\"up to\") | fleetsim | ablations "
             "(ratio against the same baseline) |", "|---|---|---|---|---|"]
    for doc in board["entries"]:
        panel = _ratio(doc["paper_ratio"]) if doc["paper_ratio"] is not None else (
            "not recoverable")
        ablations = ", ".join(f"{k} {_ratio(v)}" for k, v in doc["attribution"].items())
        lines.append(f"| `{doc['name']}` ({doc['system']} vs {doc['baseline']}) | {panel} | "
                     f"{_ratio(doc['paper_best'])} | {_fleetsim_cell(doc)} | "
                     f"{ablations or 'none run'} |")
    return lines


def docs_table(docs_text: str) -> list[str]:
    """The generated table's lines as they stand in docs/reproductions.md."""
    begin, end = docs_text.index(TABLE_BEGIN), docs_text.index(TABLE_END)
    return docs_text[begin + len(TABLE_BEGIN):end].strip().splitlines()


def with_table(docs_text: str, board: Mapping[str, Any]) -> str:
    """``docs_text`` with the generated table replaced by ``board``'s."""
    begin, end = docs_text.index(TABLE_BEGIN), docs_text.index(TABLE_END)
    return (docs_text[:begin + len(TABLE_BEGIN)] + "\n" + "\n".join(table_rows(board)) + "\n"
            + docs_text[end:])


# -- the HTML page -----------------------------------------------------------------------

def write_html(path: Path, board: Mapping[str, Any], figures: Mapping[str, str]) -> None:
    """One page: the table, then each entry's figure, ratio and notes. ``figures``: entry
    -> the figure's path relative to the page (entries without one show none)."""
    esc = html.escape
    rows = []
    for doc in board["entries"]:
        panel = _ratio(doc["paper_ratio"])
        rows.append(f"<tr><td><a href='#{esc(doc['name'])}'>{esc(doc['name'])}</a></td>"
                    f"<td>{esc(panel)}</td><td>{esc(_ratio(doc['paper_best']))}</td>"
                    f"<td>{esc(_fleetsim_cell(doc))}</td><td>" + esc(", ".join(
                        f"{k} {_ratio(v)}" for k, v in doc["attribution"].items()) or "none run")
                    + "</td></tr>")
    sections = []
    for doc in board["entries"]:
        name = doc["name"]
        img = (f"<img src='{esc(figures[name])}' alt='{esc(name)} key figure'>"
               if name in figures else "")
        notes = "".join(f"<li>{esc(n)}</li>" for n in doc["notes"])
        sections.append(
            f"<section id='{esc(name)}'><h2>{esc(name)}: {esc(doc['paper']['title'])} "
            f"({esc(doc['paper']['id'])})</h2><p><b>claim:</b> {esc(doc['claim'])}</p>"
            f"<p><b>setup:</b> {esc(doc['setup'])}</p><p><b>{esc(doc['system'])} vs "
            f"{esc(doc['baseline'])}:</b> fleetsim {esc(_fleetsim_cell(doc))}, paper "
            f"{esc(_ratio(doc['paper_ratio']))} for this setting "
            f"({esc(doc['paper_ratio_source'])}); {esc(doc['ratio_definition'])}</p>"
            f"{img}<ul>{notes}</ul></section>")
    kind = "quick slices" if any(d["quick"] for d in board["entries"]) else "full runs"
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>fleetsim scoreboard</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}table{border-collapse:"
        "collapse}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style>"
        f"</head><body><h1>fleetsim reproductions ({kind})</h1><table><tr><th>entry</th>"
        "<th>paper, this setting</th><th>paper, best</th><th>fleetsim</th><th>ablations</th>"
        "</tr>" + "".join(rows) + "</table>" + "".join(sections) + "</body></html>\n",
        encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fleetsim.repro.scoreboard RECORD DOCS``: rewrite the table in DOCS from the
    recorded scoreboard RECORD."""
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m fleetsim.repro.scoreboard docs/scoreboard.json "
              "docs/reproductions.md", file=sys.stderr)
        return 2
    record, docs = Path(args[0]), Path(args[1])
    board = json.loads(record.read_text(encoding="utf-8"))
    docs.write_text(with_table(docs.read_text(encoding="utf-8"), board), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
