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
