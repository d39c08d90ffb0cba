"""A failing device or exhausted memory: one line naming the problem, nothing leaked, no crash.
Failures are simulated by making one Vulkan call raise the error the `vulkan` package raises."""
from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest
import vulkan
from click.testing import CliRunner

from vkdflash.cli import main

COUNTED = {"vkAllocateMemory": "+mem", "vkFreeMemory": "-mem", "vkCreateBuffer": "+buf",
           "vkDestroyBuffer": "-buf", "vkCreateDevice": "+dev", "vkDestroyDevice": "-dev"}


@pytest.fixture
def model(tmp_path):
    from gguf_fixtures import write_model
    return write_model(tmp_path / "m.gguf", "llama", n_embd=64, n_ff=128, n_head=2, n_head_kv=1, head_dim=32)


def fail(monkeypatch, name: str, error, when=lambda n, frame: n == 1):
    """Make vulkan.<name> raise `error` on the calls `when(call number, caller's frame)` picks;
    returns a counter of the objects made and destroyed."""
    counts = collections.Counter()
    for fn, key in COUNTED.items():
        real = getattr(vulkan, fn)
        monkeypatch.setattr(vulkan, fn, lambda *a, _r=real, _k=key, **k: (counts.update([_k]), _r(*a, **k))[1])
    real, n = getattr(vulkan, name), [0]

    def failing(*args, **kwargs):
        n[0] += 1
        if when(n[0], sys._getframe(1)):
            raise error("simulated")
        return real(*args, **kwargs)
    monkeypatch.setattr(vulkan, name, failing)
    return counts


def generate(model):
    return CliRunner().invoke(main, ["generate", "-m", str(model), "-p", "hello", "-n", "4", "--temp", "0",
                                     "-c", "64"])


def one_line_error(res) -> str:
    assert res.exit_code == 1, (res.output, res.exception)
    errors = [line for line in res.output.splitlines() if line.startswith("vkdflash: error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    return errors[0]


def balanced(counts) -> None:
    assert counts["+mem"] == counts["-mem"] and counts["+buf"] == counts["-buf"], counts
    assert counts["+dev"] == counts["-dev"], counts


def test_out_of_memory_at_kv_cache_names_the_cache_and_the_remedy(model, monkeypatch):
    owned = lambda n, frame: getattr(frame.f_locals.get("self"), "owner", None) is not None  # noqa: E731
    counts = fail(monkeypatch, "vkAllocateMemory", vulkan.VkErrorOutOfDeviceMemory, owned)
    line = one_line_error(generate(model))
    assert "out of device memory" in line and "target KV cache" in line and "-c" in line, line
    balanced(counts)


def test_out_of_host_memory_is_not_called_device_memory(model, monkeypatch):
    counts = fail(monkeypatch, "vkAllocateMemory", vulkan.VkErrorOutOfHostMemory, lambda n, f: n == 3)
    line = one_line_error(generate(model))
    assert "out of host memory" in line and "device memory" not in line, line
    balanced(counts)


@pytest.mark.parametrize("name", ["vkBindBufferMemory", "vkMapMemory"])
def test_a_buffer_failing_after_its_allocation_frees_it(model, monkeypatch, name):
    counts = fail(monkeypatch, name, vulkan.VkErrorOutOfDeviceMemory, lambda n, f: n == 3)
    one_line_error(generate(model))
    balanced(counts)


def test_device_lost_at_submit_is_one_line(model, monkeypatch):
    counts = fail(monkeypatch, "vkQueueSubmit", vulkan.VkErrorDeviceLost, lambda n, f: n == 3)
    line = one_line_error(generate(model))
    assert "device was lost" in line, line
    balanced(counts)


def test_device_lost_while_waiting_is_one_line_not_a_crash(model):
    """The wait fails with the work still queued: freeing its buffers and descriptor pools then
    crashed lavapipe (a segfault), so this runs in a process of its own."""
    script = f"""
import sys, vulkan
sys.path.insert(0, {str(Path(__file__).parent)!r})
from click.testing import CliRunner
from vkdflash.cli import main
real, n = vulkan.vkWaitForFences, [0]
def failing(*a, **k):
    n[0] += 1
    if n[0] == 2:
        raise vulkan.VkErrorDeviceLost("simulated")
    return real(*a, **k)
vulkan.vkWaitForFences = failing
res = CliRunner().invoke(main, ["generate", "-m", {str(model)!r}, "-p", "hello", "-n", "4", "--temp", "0", "-c", "64"])
print("EXIT", res.exit_code, repr(res.exception))
print(res.output)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EXIT 1" in proc.stdout and "device was lost" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["vkCreateCommandPool", "vkCreateFence"])
def test_a_device_that_fails_to_open_is_destroyed(model, monkeypatch, name):
    counts = fail(monkeypatch, name, vulkan.VkErrorOutOfDeviceMemory)
    line = one_line_error(generate(model))
    assert "opening device" in line, line
    balanced(counts)


def test_command_buffer_allocation_failure_is_one_line(model, monkeypatch):
    fail(monkeypatch, "vkAllocateCommandBuffers", vulkan.VkErrorOutOfHostMemory)
    assert "out of host memory" in one_line_error(generate(model))


def test_a_lost_device_still_closes(monkeypatch):
    from vkdflash.runtime.context import Context
    ctx = Context()
    ctx.buffer(1024)
    counts = fail(monkeypatch, "vkDeviceWaitIdle", vulkan.VkErrorDeviceLost, lambda n, f: True)
    ctx.close()  # raised VkErrorDeviceLost, leaving the buffer and the device behind
    assert ctx.device is None and counts["-mem"] == 1 and counts["-dev"] == 1, counts


@pytest.mark.parametrize("at", [1, 10, 18, 25, 34])
def test_out_of_memory_anywhere_is_one_line_and_frees_everything(model, monkeypatch, at):
    counts = fail(monkeypatch, "vkAllocateMemory", vulkan.VkErrorOutOfDeviceMemory, lambda n, f: n == at)
    assert "out of device memory: a buffer of" in one_line_error(generate(model))
    balanced(counts)


@pytest.mark.parametrize("name", ["vkCreateComputePipelines", "vkCreateDescriptorPool"])
def test_a_vulkan_call_no_path_words_is_still_one_line(model, monkeypatch, name):
    """A pipeline or a graph's descriptor pool failing reached the user as a traceback; the CLI words
    any Vulkan error it is handed (and frees what was made, as for the others)."""
    counts = fail(monkeypatch, name, vulkan.VkErrorOutOfHostMemory)
    line = one_line_error(generate(model))
    assert "out of host memory" in line and "a Vulkan call failed" in line, line
    balanced(counts)
