"""Generated gRPC code of the NDP device protocol (ndp.proto); regenerate with generate.py."""
