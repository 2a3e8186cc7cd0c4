"""The Criteo click-log layout (Kaggle Display Advertising Challenge and Criteo 1TB).

One sample per line, tab-separated: ``label`` (0/1), 13 integer features ``I1..I13``, 26
categorical features ``C1..C26`` (32-bit hashes written as 8 hex digits). Any field may be
empty. The Kaggle test set has no label (39 fields). Day files of the 1TB set are gzipped.

In the store every column is a feature: ``label`` float32, ``I1..I13`` int64, ``C1..C26``
int64 (the parsed hash). An empty field is an absent key of that feature; the
:class:`~recflash.ingest.preprocess.Preprocessor` fills it.
"""

from __future__ import annotations

import pyarrow as pa

LABEL = "label"
INT_NAMES = [f"I{i}" for i in range(1, 14)]
CAT_NAMES = [f"C{i}" for i in range(1, 27)]
FEATURE_NAMES = [LABEL, *INT_NAMES, *CAT_NAMES]
N_FIELDS = len(FEATURE_NAMES)  # 40

STORE_TYPES: dict[str, str] = {LABEL: "float32", **{n: "int64" for n in INT_NAMES}, **{n: "int64" for n in CAT_NAMES}}

# Arrow types the text parser produces (categoricals stay bytes until the hex parser).
PARSE_TYPES: dict[str, pa.DataType] = {LABEL: pa.float32(), **{n: pa.int64() for n in INT_NAMES},
                                       **{n: pa.binary() for n in CAT_NAMES}}

# Kaggle train.txt figures, used by the synthetic generator: distinct values per categorical
# feature and the share of empty fields per column.
KAGGLE_CARDINALITIES = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
                        27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
KAGGLE_INT_MISSING = [0.454, 0.0, 0.215, 0.217, 0.026, 0.224, 0.043, 0.0005, 0.043, 0.454, 0.043, 0.765, 0.217]
KAGGLE_CAT_MISSING = [0.0, 0.0, 0.034, 0.034, 0.0, 0.121, 0.0, 0.0, 0.0, 0.0, 0.0, 0.034, 0.0, 0.0, 0.0, 0.034,
                      0.0, 0.0, 0.440, 0.440, 0.034, 0.763, 0.0, 0.034, 0.440, 0.440]
KAGGLE_POSITIVE_RATE = 0.256
# floor(lognormal(mu, sigma)) per integer column: rough fits of the Kaggle value ranges
KAGGLE_INT_LOGNORMAL = [(0.6, 1.3), (2.0, 2.2), (2.0, 1.6), (1.4, 1.0), (7.5, 2.3), (3.0, 2.0), (1.5, 1.6),
                        (2.0, 1.0), (3.6, 1.6), (-0.7, 0.9), (0.6, 1.1), (-1.0, 1.4), (1.4, 1.1)]


def layout(n_fields: int, no_label: bool) -> list[str] | None:
    """Column names for a line with ``n_fields`` fields, or None if that is not Criteo."""
    if n_fields == N_FIELDS and not no_label:
        return list(FEATURE_NAMES)
    if n_fields == N_FIELDS - 1 and no_label:
        return [*INT_NAMES, *CAT_NAMES]
    return None
