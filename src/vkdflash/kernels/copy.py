"""Plain buffer copy: the bandwidth yardstick for `vkdflash bench kernels`."""
from __future__ import annotations

import struct

WORKGROUP = 8  # lavapipe streams best with few, narrow workgroups (docs/design.md section 9)
# lavapipe stops any invocation after 65535 loop iterations in total: never ask more of one lane.
MAX_ITERATIONS = 65535


def copy(graph, src, dst, nbytes: int, groups: int = 1, workgroup: int = WORKGROUP) -> None:
    assert nbytes % 16 == 0, "copy moves whole vec4s"
    n = nbytes // 16
    groups = max(groups, -(-n // (workgroup * MAX_ITERATIONS)))
    pipe = graph.ctx.pipeline("copy", 2, 4, (workgroup,))
    graph.dispatch(pipe, [src, dst], (groups,), struct.pack("<I", n), label="copy")
