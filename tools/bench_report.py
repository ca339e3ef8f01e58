"""Report helpers shared by the benchmark scripts in tools/ (status line, aligned tables)."""
import sys


def progress(text: str) -> None:
    """A one-line status on a terminal's stderr (nothing when stderr is not a terminal)."""
    if sys.stderr.isatty():
        print(f"\r{text:<70}", end="" if text else "\r", file=sys.stderr, flush=True)


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    numeric = [all(is_number(row[i]) for row in rows) if rows else False
               for i in range(len(headers))]

    def line(cells):
        return "  ".join(str(cell).rjust(width) if numeric[i] else str(cell).ljust(width)
                         for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()

    print(line(headers))
    print("  ".join("-" * width for width in widths))
    for row in rows:
        print(line(row))


def is_number(text: str) -> bool:
    try:
        float(str(text).replace(",", "").rstrip("x%"))
        return True
    except ValueError:
        return str(text) in ("-", "")
