"""Plain buffer copy: the bandwidth yardstick for `vkdflash bench kernels`."""
from __future__ import annotations

import struct

WORKGROUP = 8  # lavapipe streams best with few, narrow workgroups (reference.md section 9)


def copy(graph, src, dst, nbytes: int, groups: int = 1, workgroup: int = WORKGROUP) -> None:
    assert nbytes % 16 == 0, "copy moves whole vec4s"
    pipe = graph.ctx.pipeline("copy", 2, 4, (workgroup,))
    graph.dispatch(pipe, [src, dst], (groups,), struct.pack("<I", nbytes // 16), label="copy")
