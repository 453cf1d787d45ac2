"""A migration preview as Markdown, for a CI job's summary: ``accrewrite migrate --format json``
on standard input, Markdown on standard output (what the GitHub Action in action.yml appends
to ``$GITHUB_STEP_SUMMARY``). With ``--verify [URL]``, the events of ``accrewrite verify --format
json`` instead: its verdict, its steps, and a link to its HTML report where URL is given.

    accrewrite migrate --check --format json src/ | python -m accrewrite.step_summary
    accrewrite verify train.py --format json --report r.html | python -m accrewrite.step_summary --verify URL
"""

from __future__ import annotations

import json
import re
import sys

from accrewrite.plural import counted


def _fenced(text: str, language: str) -> str:
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def _inline(text: str) -> str:
    """Text inside a table cell or list item: no line breaks, no table pipes."""
    return " ".join(text.split()).replace("|", "\\|")


def markdown(document: dict) -> str:
    files, summary = document["files"], document["summary"]
    pending = [f for f in files if f["changed"] and f["diff"]]
    files_checked = counted(summary["files"], "file")
    if summary["errors"]:
        title = f"{summary['errors']} of {files_checked} could not be migrated"
    elif pending:
        title = f"{len(pending)} of {files_checked} {'needs' if len(pending) == 1 else 'need'} migrating"
    else:
        title = f"{files_checked} checked: nothing to migrate"
    parts = [f"## accrewrite (target {document['target']}): {title}"]
    if pending:
        parts.append("Run `accrewrite migrate --in-place` on these paths to apply the diff below.")
    for f in pending:
        parts.append(f"<details><summary><code>{_inline(f['path'])}</code>: {counted(len(f['fixes']), 'fix', 'fixes')}</summary>\n\n"
                     f"{_fenced(f['diff'], 'diff')}\n\n</details>")
    findings = [
        f"- `{_inline(f['path'])}:{d['line']}:{d['col'] + 1}` **{d['code']}** {_inline(d['message'])}"
        for f in files for d in f["diagnostics"]
    ]
    if findings:
        parts.append("### Diagnostics (`accrewrite explain CODE` says why and what to do)\n\n" + "\n".join(findings))
    errors = [f"- `{_inline(f['path'])}`: {_inline(f['error']['message'])}" for f in files if f["error"]]
    if errors:
        parts.append("### Errors\n\n" + "\n".join(errors))
    return "\n\n".join(parts) + "\n"


def verify_markdown(events: list[dict], url: str) -> str:
    """The result of a verify (its last event) and a link to its report."""
    result = next((event for event in reversed(events) if event.get("event") == "result"), None)
    if result is None:
        return "## accrewrite verify: no result (verify was stopped before it ended)\n"
    parts = [f"## accrewrite verify: {result['verdict']}", _inline(result["message"])]
    if url:
        parts.append(f"[The report]({url}): the loss curves of every side with the tolerance band, the deviations "
                     "and the verdict, as one HTML page.")
    rows = result["steps"]
    if rows:
        first, second = result["sides"]
        table = [f"| step | {first} loss | {second} loss | loss dev | loss tol | checksum dev | checksum tol |",
                 "|---:|---:|---:|---:|---:|---:|---:|"]
        table += [f"| {row['step']} | {_value(row['loss'][0])} | {_value(row['loss'][1])} | "
                  f"{_share(row['loss_deviation'])} | {_share(row['loss_tolerance'])} | "
                  f"{_share(row['checksum_deviation'])} | {_share(row['checksum_tolerance'])} |" for row in rows]
        parts.append(f"<details><summary>{counted(len(rows), 'step')}</summary>\n\n" + "\n".join(table) +
                     "\n\n</details>")
    return "\n\n".join(parts) + "\n"


def _value(value) -> str:
    return "-" if value is None else value if isinstance(value, str) else f"{value:.6g}"


def _share(value) -> str:
    return value if isinstance(value, str) else f"{value:.3%}"  # a NaN or an infinity is named


def main() -> int:
    verify = sys.argv[1:2] == ["--verify"]
    try:
        if verify:
            events = [json.loads(line) for line in sys.stdin if line.strip()]
        else:
            document = json.load(sys.stdin)
    except json.JSONDecodeError as exc:
        print(f"error: standard input is not accrewrite's JSON output ({exc})", file=sys.stderr)
        return 2
    sys.stdout.write(verify_markdown(events, "".join(sys.argv[2:3])) if verify else markdown(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
