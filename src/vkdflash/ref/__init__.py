"""Pure-numpy references for every kernel: the ground truth conformance compares with."""
