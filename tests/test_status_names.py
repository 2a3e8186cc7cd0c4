"""Status::ToString names every status code (it used to index an 11-name array with the 13
codes of Status, reading past its end for ReadOnly and Stale)."""

from __future__ import annotations

import subprocess
import sys

CODES = ["OK", "UnknownFeature", "FeatureExists", "Schema", "InvalidArgument", "TooLarge", "NotAStore",
         "Corruption", "Locked", "Closed", "IOError", "ReadOnly", "Stale"]


def test_every_status_code_has_its_name():
    # In a child: reading past the array may crash the interpreter instead of failing.
    code = (
        "from recflash.reader import testing\n"
        f"for i in range({len(CODES)}):\n"
        "    print(testing.status_to_string(i, 'msg'))\n"
    )
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # OK prints as "OK" alone (LevelDB's convention, as the generated ToString does)
    assert r.stdout.splitlines() == ["OK"] + [f"{name}: msg" for name in CODES[1:]]
