"""What every bench/ run writes: a JSON of ``meta`` and ``rows``, rewritten after
each case so that a run cut short still leaves what it measured."""

from __future__ import annotations

import datetime
import json
import os
import platform

import torch


def run_meta(module: str, argv: list[str], **extra) -> dict:
    """The run's exact command, date, device and versions, plus ``extra``."""
    return {"command": " ".join([f"python -m {module}", *argv]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "python": platform.python_version(), **extra}


def save_rows(path: str | None, meta: dict, rows: list[dict]) -> None:
    """Writes ``{"meta": meta, "rows": rows}`` to ``path`` (nothing when it is empty)."""
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
