"""Owned memory: buffers only their owner's code may bind in a dispatch (a KV cache's K and V);
read-only memory (weights): buffers no dispatch may bind where its kernel can store.

The owner records its own dispatches inside `graph.on_behalf_of(owner)`; any other dispatch
that binds owned memory is refused where it is recorded, with the call site in the message.
The owner also keeps a ledger of what it recorded into each graph, which the graph checks
again when it builds its command buffer: a dispatch of the owner's that was removed or changed,
or one binding owned memory that the owner never recorded, stops the graph there."""
from __future__ import annotations

import sys
import weakref

from ..errors import VkdflashError

_owners: "weakref.WeakSet[Owner]" = weakref.WeakSet()
_RUNTIME = ("vkdflash.runtime", "vkdflash.kernels")  # the recording machinery, not a call site


class Owner:
    def __init__(self, name: str):
        self.name = name  # e.g. "draft KV cache": what error messages call this memory
        self._ledger: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> [(dispatch, fields)]
        _owners.add(self)

    def approve(self, graph, dispatch) -> None:
        self._ledger.setdefault(graph, []).append((dispatch, fields(dispatch)))

    def approved(self, graph) -> list:
        return self._ledger.get(graph, [])


def fields(dispatch) -> tuple:
    return (dispatch.pipeline, dispatch.views, dispatch.groups, dispatch.push)


def owners_of(views) -> set:
    return {v.buffer.owner for v in views if v.buffer.owner is not None}


def read_only_written(pipeline, views) -> str | None:
    """Why a dispatch of `pipeline` binding `views` would change read-only memory (a weight: every
    strategy borrows the target's, and greedy output must stay plain decoding's), else None. The
    bindings a kernel can store to come from its SPIR-V (Pipeline.writes)."""
    for i in sorted(pipeline.writes):
        if i < len(views) and views[i].buffer.read_only:
            return f"would store into {views[i].buffer.read_only} (binding {i}), which is read only"
    return None


def call_site() -> str:
    """The first caller outside the runtime and kernel modules: the code that asked for a dispatch."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "?")
        if not module.startswith(_RUNTIME):
            return f"{module} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})"
        frame = frame.f_back
    return "?"


def check_recorded(graph, dispatches) -> None:
    """Before a graph becomes a command buffer: every owner's dispatches are there, unchanged,
    and nothing else binds owned memory."""
    present = {id(d) for d in dispatches}
    approved = set()
    for owner in list(_owners):
        for d, recorded in owner.approved(graph):
            if id(d) not in present or fields(d) != recorded:
                raise VkdflashError(f"the {owner.name}'s {d.label} dispatch was removed or changed after it "
                                    "was recorded: the graph does not run")
            approved.add(id(d))
    for d in dispatches:
        written = read_only_written(d.pipeline, d.views)
        if written:
            raise VkdflashError(f"a {d.label} dispatch put into the graph behind its back {written}: "
                                "the graph does not run")
        if id(d) not in approved and owners_of(d.views):
            names = ", ".join(sorted(o.name for o in owners_of(d.views)))
            raise VkdflashError(f"a {d.label} dispatch binding {names} memory was put into the graph "
                                "behind its owner's back: the graph does not run")
