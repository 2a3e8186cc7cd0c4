"""recflash — SSD data-path middleware for recommendation models.

Subpackages: ``recflash.reader`` (the feature-arranged SSD store), ``recflash.ingest``,
``recflash.ndp`` and ``recflash.torchrec_ext``; ``recflash.cli`` is the ``recflash`` command.
"""

__version__ = "0.1.0"
