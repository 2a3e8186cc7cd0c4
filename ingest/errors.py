"""Errors of the import path. :class:`BadInputError` means the input (a file, its schema, a
line, an option) is wrong: the CLI exits with code 2. Anything else is an internal failure
(exit code 1)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BadLine:
    """One rejected input line (text formats) or row (Parquet / Arrow)."""

    file: str
    line: int | None  # 1-based line number in the file (text formats)
    column: str | None
    reason: str
    row: int | None = None  # 0-based row index in the file (Parquet / Arrow)

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
        elif self.row is not None:
            where += f": row {self.row}"
        col = f": column {self.column}" if self.column else ""
        return f"{where}{col}: {self.reason}"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class BadInputError(Exception):
    """Wrong input: exit code 2. ``bad_line`` is set when one line or row is at fault."""

    def __init__(self, message: str, bad_line: BadLine | None = None):
        super().__init__(message)
        self.bad_line = bad_line

    @classmethod
    def from_line(cls, bad: BadLine, hint: str = "") -> "BadInputError":
        msg = f"bad input at {bad}"
        if hint:
            msg += f" ({hint})"
        return cls(msg, bad)
