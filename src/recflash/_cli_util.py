"""The CLI helpers moved to :mod:`recflash.reader._cli` (command groups of ``ingest`` and
``ndp`` sit on the reader and must not import the top package); this name re-exports them for
command modules written against it."""

from recflash.reader._cli import *  # noqa: F401,F403
from recflash.reader._cli import _features_table, _stats_table, _table  # noqa: F401
