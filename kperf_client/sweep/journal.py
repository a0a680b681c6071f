"""The sweep's output file, which is also its resume journal.

One JSON line per answered input line, written whole and flushed as it arrives. A rerun reads
the file back and skips every input line already recorded with the same content digest, so
a killed sweep resumes without redoing finished shapes and no line is ever answered twice.
A process killed mid-write leaves at most one torn last line: it is cut off before resuming.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self


class JournalLocked(RuntimeError):
    """Another sweep is writing the same output file."""


@dataclass
class Journal:
    path: Path
    #: status ("ok" or "error") of every input line already answered, by (line, digest)
    done: dict[tuple[int, str], str] = field(default_factory=dict)
    _file: IO[str] | None = None

    def __enter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until __exit__
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise JournalLocked(
                f"{self.path} is being written by another sweep; wait for it or choose "
                "another --output"
            ) from None
        self._file = handle
        self._recover()
        return self

    def _recover(self) -> None:
        """Read what earlier runs recorded; drop a torn last line."""
        assert self._file is not None
        self._file.seek(0)
        text = self._file.read()
        keep = len(text) if text.endswith("\n") or not text else text.rfind("\n") + 1
        for raw in text[:keep].splitlines():
            try:
                record = json.loads(raw)
                slot = (int(record["line"]), str(record["input_digest"]))
                self.done[slot] = str(record["status"])
            except (ValueError, KeyError, TypeError):
                continue  # not ours (or damaged): that line will simply be answered again
        if keep != len(text):
            self._file.truncate(len(text[:keep].encode("utf-8")))
        self._file.seek(0, os.SEEK_END)

    def record(self, document: dict[str, Any]) -> None:
        """Append one answer: a single write of one line, flushed to the OS at once."""
        assert self._file is not None, "use the journal inside 'with'"
        self._file.write(json.dumps(document, separators=(",", ":")) + "\n")
        self._file.flush()
        self.done[(int(document["line"]), str(document["input_digest"]))] = document["status"]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
