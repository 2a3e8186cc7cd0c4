"""The last step every benchmark program shares: write the result JSON, draw its plot and
print each target's verdict."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional


def write_report(res: dict, json_path: str, plot_path: Optional[str], plot: Callable[[Path, dict], None],
                 log: Callable[[str], None], number: str = ",.2f") -> None:
    """res["targets"]: {name: {"target", "measured", "met", ...}}; the plot goes to plot_path or
    next to the JSON with a .png suffix."""
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(res, indent=1, default=float) + "\n")
    log(f"results in {json_path}")
    png = Path(plot_path) if plot_path else Path(json_path).with_suffix(".png")
    try:
        plot(png, res)
        log(f"plot in {png}")
    except ImportError:
        log("matplotlib missing: no plot")
    for name, t in res.get("targets", {}).items():
        log(f"target {name}: {format(t['measured'], number)} vs {format(t['target'], number)} -> "
            f"{'met' if t['met'] else 'MISSED'}")


def remove_workdir(work: Path, parent_too: bool) -> None:
    """Deletes a benchmark's working directory, and its parent when the benchmark created that
    too (the default /tmp/<benchmark>/run-PID layout) and it is now empty."""
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    if parent_too:
        try:
            work.parent.rmdir()
        except OSError:
            pass
