"""Generates ndp_pb2.py / ndp_pb2_grpc.py from ndp.proto with grpcio-tools.

    python ndp/proto/generate.py            # rewrite the committed files
    python ndp/proto/generate.py --out DIR  # write them into DIR (the up-to-date test)

The proto is compiled under the virtual path recflash/ndp/proto/, so the generated service
module imports ``recflash.ndp.proto.ndp_pb2`` (a package import) instead of a top-level
``ndp_pb2``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUTS = ("ndp_pb2.py", "ndp_pb2_grpc.py")


def generate(out_dir: str) -> list:
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main(["protoc", f"-I{include}", f"-Irecflash/ndp/proto={HERE}",
                          f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                          "recflash/ndp/proto/ndp.proto"])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {HERE}/ndp.proto (exit {rc})")
        os.makedirs(out_dir, exist_ok=True)
        written = []
        for name in OUTPUTS:
            dst = os.path.join(out_dir, name)
            shutil.copyfile(os.path.join(tmp, "recflash", "ndp", "proto", name), dst)
            written.append(dst)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args(argv)
    for p in generate(args.out):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
