"""Printing helpers shared by the commands: documents to files, aligned tables."""

import sys
from collections.abc import Sequence
from pathlib import Path

from pipestudio.planner.formats.documents import Document


def write_document(document: Document, output: str | None) -> None:
    """Write to ``output`` (saying so on stderr) or to stdout when no file is given."""
    if output is None or output == "-":
        sys.stdout.write(document.to_json() + "\n")
        return
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    document.save(output)
    print(f"wrote {output}", file=sys.stderr)


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None
) -> str:
    """Columns padded to their widest cell; ``right`` marks right-aligned columns."""
    right = right or [False] * len(headers)
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [
            str(cell).rjust(w) if r else str(cell).ljust(w)
            for cell, w, r in zip(row, widths, right, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
