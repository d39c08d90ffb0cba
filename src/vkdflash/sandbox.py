"""A jinja2 sandbox for templates that come from strangers (a GGUF's chat template is a program).

Compiling and rendering run under bounds on time, size and work, and every way a template can fail
is one VkdflashError. The size bound holds for every value the template builds, counting a part
shared by reference each time it occurs (`_weight`): then no single C-level step (str(), ==, hash,
join) can take long or allocate much, and the deadline, which only interrupts Python bytecode, can
stop everything else."""
from __future__ import annotations

import ctypes
import re
import threading
from functools import wraps

from jinja2 import TemplateSyntaxError
from jinja2.compiler import CodeGenerator
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import Namespace

from .errors import VkdflashError, quote

MAX_SECONDS = 2.0        # per compile or render: real templates take milliseconds, so this only stops hangs
MAX_SIZE = 1 << 22       # characters in any value and in the prompt: a million-token prompt is about 4 MB of text
MAX_PRODUCED = 1 << 26   # characters built in all by one render: 16 prompts' worth, so a loop cannot hoard memory
MAX_STEPS = 1_000_000    # loop items, calls and operators per render: real templates take hundreds
MAX_INT_BITS = 4096      # template numbers are counts and indexes; this keeps each operation on them microseconds
RETRY = 0.05             # seconds between injections of the timeout, should one be swallowed


class TemplateRaised(Exception):
    """raise_exception() in a template: the template refuses its input."""


def raise_exception(message):
    raise TemplateRaised(message)


class Refused(Exception):
    """A bound stopped the template; the message says which."""


class Timeout(BaseException):
    """Injected at the deadline; a BaseException so that no `except Exception` on the way swallows it."""


def _weight(value, limit: int, indent: int = 0) -> int:
    """About len(str(value)) (with indent: of its JSON indented so), a part shared by reference counted each
    time it occurs; counts no further once past limit, so it costs at most about limit steps."""
    total, todo = 0, [(value, 1)]
    while todo and total <= limit:
        x, depth = todo.pop()
        if isinstance(x, (str, bytes)):
            total += len(x)
        elif isinstance(x, int):
            total += x.bit_length() // 3 + 1
        elif isinstance(x, (dict, Namespace)):
            x = x._Namespace__attrs if isinstance(x, Namespace) else x   # where jinja keeps a namespace's attributes
            total += len(x) * (2 + indent * depth)
            if total <= limit:
                todo.extend((y, depth + 1) for item in x.items() for y in item)
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += len(x) * (1 + indent * depth)
            if total <= limit:
                todo.extend((y, depth + 1) for y in x)
        else:
            total += 1
    return total


def _size(value) -> int:
    """The characters or items a result allocated itself (its parts may be shared)."""
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


_FORMAT_FIELD = re.compile(r"%(?:\([^)]*\))?[-+ #0-9.*]*|\{[^{}]*\}")


def _format_size(fmt, args) -> int:
    """Bound on len(fmt % args) or fmt.format(*args): every field prints at most one argument, padded to the
    widest width written in fmt, or passed as an argument where fmt takes widths from them (`*`, `{:{}}`)."""
    fmt = fmt.decode("latin-1") if isinstance(fmt, bytes) else str(fmt)
    fields = _FORMAT_FIELD.findall(fmt)
    widths = [int(n) if len(n) < 10 else 10 ** 10 for n in re.findall(r"\d+", "".join(fields))]
    if "*" in fmt or re.search(r"\{[^{}]*\{", fmt):
        widths += [abs(a) for a in args if isinstance(a, int)]
    widest = max((_weight(a, MAX_SIZE) for a in args), default=0)
    return len(fmt) + len(fields) * (max(widths, default=0) + widest)


def _estimate(name: str, s, args: tuple, kwargs: dict) -> int:
    """Bound on the size of what str method `name` of s, or filter `|name` of value s, returns, for those whose
    result can be far bigger than their inputs; 0 for the rest, whose results are only checked afterwards."""
    def arg(i, key, default=None):
        return args[i] if len(args) > i else kwargs.get(key, default)

    bare = name.lstrip("|")
    if bare in ("format", "format_map"):
        return _format_size(s, args + tuple(kwargs.values()))
    if bare == "replace":
        old, new = arg(0, "old", ""), arg(1, "new", "")
        if not isinstance(s, bytes):
            s, old, new = str(s), str(old), str(new)
        return len(s) + (s.count(old) if old else len(s) + 1) * len(new)
    if bare == "join":   # the items are a list by now
        sep, items = (s, args[0]) if name == "join" else (arg(0, "d", ""), s)
        return len(str(sep)) * len(items) + _weight(items, MAX_SIZE)
    if name == "expandtabs":
        return len(s) * max(1, arg(0, "tabsize", 8))
    if name == "translate":
        return len(s) * (1 + _weight(arg(0, "table"), MAX_SIZE))
    if name == "|indent":
        width, s = arg(0, "width", 4), str(s)
        return len(s) + (s.count("\n") + 1) * (width if isinstance(width, int) else len(str(width)))
    if name in ("|wordwrap", "|urlize"):   # each may repeat its string arguments once per word
        return (len(str(s)) + 1) * (1 + _weight((args, kwargs), MAX_SIZE))
    if name in ("|batch", "|slice"):      # each may repeat fill_with once per item
        count = arg(0, "linecount" if name == "|batch" else "slices", 0)
        return (1 + _weight(arg(1, "fill_with"), MAX_SIZE)) * abs(count)
    if name in ("|tojson", "|pprint"):
        indent = arg(1, "indent") if name == "|tojson" else 1
        return _weight(s, MAX_SIZE, max(0, indent) if isinstance(indent, int) else len(str(indent or "")))
    if name == "|sum" and not isinstance(arg(1, "start", 0), (int, float)):
        return _weight(s, MAX_SIZE) ** 2   # adding sequences copies the sum so far each time: quadratic
    return 0


def fits(size: int, what: str):
    if size > MAX_SIZE:
        raise Refused(f"builds a value of more than {MAX_SIZE:,} characters (in {what})")


class _Budget(threading.local):
    steps = produced = 0


class _Namespace(Namespace):
    """namespace(): `{% set ns.x = ... %}` stores with no sandbox hook, so the namespace checks what it holds."""

    def __setitem__(self, name, value):
        super().__setitem__(name, value)
        fits(_weight(self, MAX_SIZE), f"namespace attribute {name!r}")


def _checked_literal(visit):
    def checked(self, node, frame):
        if getattr(node, "ctx", "load") != "load":   # a tuple assigned to, as in `{% for a, b in ... %}`
            return visit(self, node, frame)
        self.write("environment.checked(")
        visit(self, node, frame)
        self.write(")")
    return checked


class _CodeGenerator(CodeGenerator):
    """`~` and list, tuple and dict literals build values with no sandbox hook: route them through the checks."""

    def visit_Concat(self, node, frame):
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    visit_List = _checked_literal(CodeGenerator.visit_List)
    visit_Tuple = _checked_literal(CodeGenerator.visit_Tuple)
    visit_Dict = _checked_literal(CodeGenerator.visit_Dict)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with every operation that builds a value bounded."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})
    code_generator_class = _CodeGenerator

    def __init__(self, filters: dict, globals: dict, **options):
        super().__init__(**options)
        # jinja compiles filter calls directly, not through call(), so each filter is wrapped
        self.filters = {name: self._checked_filter(name, f) for name, f in {**self.filters, **filters}.items()}
        self.globals.update(globals, range=self._range, namespace=_Namespace, raise_exception=raise_exception)
        self.budget = _Budget()

    def spend(self, steps: int = 1, produced: int = 0):
        self.budget.steps += steps
        self.budget.produced += produced
        if self.budget.steps > MAX_STEPS:
            raise Refused(f"takes more than {MAX_STEPS:,} steps (loop items, calls and operators)")
        if self.budget.produced > MAX_PRODUCED:
            raise Refused(f"builds more than {MAX_PRODUCED:,} characters in all")

    def checked(self, value, what: str = "a literal"):
        self.spend(1, _size(value))
        fits(_weight(value, MAX_SIZE), what)
        return value

    def concat(self, pieces):   # `~`, and jinja's joining of a macro's or `{% set %}` block's output
        pieces = tuple(pieces)
        total = 0
        for piece in pieces:
            total += _weight(piece, MAX_SIZE - total)
            fits(total, "~ or a block's text")
        self.spend(1, total)
        return "".join(map(str, pieces))

    def _range(self, *args):
        rng = safe_range(*args)
        self.spend(len(rng))
        return rng

    @staticmethod
    def _check_ints(what: str, args, kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, int):   # a width or count: center(), zfill(), indent(), batch(), tojson(indent=)...
                fits(abs(a), what)

    def call_binop(self, context, operator, left, right):
        if operator == "%" and isinstance(left, (str, bytes)):
            fits(_format_size(left, right if isinstance(right, tuple) else (right,)), "%")
        elif operator == "*" and isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise Refused(f"computes a number of more than {MAX_INT_BITS} bits (in *)")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and n > 0 and isinstance(seq, (str, bytes, list, tuple)):
                    fits(n * _weight(seq, MAX_SIZE // n), "*")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if abs(left).bit_length() * right > MAX_INT_BITS:
                raise Refused(f"computes a number of more than {MAX_INT_BITS} bits (in **)")
        result = super().call_binop(context, operator, left, right)
        if operator == "+":   # sizes add up, but [x] + [x] doubles what x weighs
            return self.checked(result, "+")
        self.spend(1, _size(result))
        return result

    def call(self, context, obj, /, *args, **kwargs):
        name = obj.name if isinstance(obj, Macro) else getattr(obj, "__name__", type(obj).__name__)
        subject = getattr(getattr(obj, "__wrapped__", obj), "__self__", None)   # jinja wraps str.format
        what = f"{name.lstrip('_')}()"
        self._check_ints(what, args, kwargs)
        fits(_weight((args, kwargs), MAX_SIZE), what)   # a macro's varargs keep them all
        if isinstance(subject, (str, bytes)):
            if name == "join" and args:
                args = (list(args[0]), *args[1:])
            fits(_estimate(name, subject, args, kwargs), what)
        return self.checked(super().call(context, obj, *args, **kwargs), what)

    def _checked_filter(self, name: str, f):
        skip = 1 if getattr(f, "jinja_pass_arg", None) else 0   # the context or environment jinja passes first
        what = f"|{name}"

        @wraps(f)
        def checked(*args, **kwargs):
            head, value, rest = args[:skip], args[skip], args[skip + 1:]
            self._check_ints(what, rest, kwargs)
            if name in ("join", "sum"):
                value = list(value)
            fits(_estimate(what, value, rest, kwargs), what)
            return self.checked(f(*head, value, *rest, **kwargs), what)
        return checked


class Deadline:
    """Raises Timeout in this thread after `seconds`. jinja runs a {% for %} body with no hook that could look
    at a clock, so a watcher thread injects the exception, which CPython delivers at the next bytecode."""

    def __init__(self, seconds: float):
        self._seconds, self._thread = seconds, threading.get_ident()
        self._lock, self._done = threading.Lock(), threading.Event()

    @staticmethod
    def _inject(thread: int, exc):
        exc = None if exc is None else ctypes.py_object(exc)   # None: clear a pending one
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), exc)

    def _watch(self):
        # Again every RETRY seconds: CPython reports one that lands in a __del__ or weakref callback as ignored.
        wait = self._seconds
        while not self._done.wait(wait):
            with self._lock:
                if not self._done.is_set():
                    self._inject(self._thread, Timeout)
            wait = RETRY

    def start(self):
        # Not while another watcher may target this thread: CPython gives a new thread the id of the one that
        # starts it until it runs, so an exception injected meanwhile would land in the new thread too.
        threading.Thread(target=self._watch, name="template deadline", daemon=True).start()

    def stop(self):
        """Call it in a `finally` that also covers start(): a Timeout can land before start() returns. Until the
        watcher is stopped and a pending one cleared, one can land anywhere, in here too (so can Ctrl-C): retry
        until both are done, then raise what landed, so that nothing reaches the caller's later code."""
        landed = None
        while True:
            try:
                with self._lock:
                    self._done.set()
                self._inject(self._thread, None)
                break
            except (Timeout, KeyboardInterrupt) as exc:
                landed = exc
        if landed is not None:
            raise landed


def run(env: BoundedEnvironment, work, name: str):
    """work() (compiling or rendering in env) within the bounds; whatever goes wrong is one VkdflashError
    that starts with `name`."""
    env.budget.steps = env.budget.produced = 0
    deadline = Deadline(MAX_SECONDS)
    try:
        try:
            deadline.start()
            return work()
        finally:
            deadline.stop()
    except Timeout:
        problem = f"runs for more than {MAX_SECONDS:g} s"
    except Refused as exc:
        problem = str(exc)
    except TemplateRaised as exc:
        problem = f"refused the messages: {quote(exc)}"
    except TemplateSyntaxError as exc:
        problem = f"syntax error at line {exc.lineno}: {quote(exc.message)}"
    except Exception as exc:   # anything else the program does wrong: ZeroDivisionError, RecursionError, ...
        problem = f"failed: {type(exc).__name__}" + (f": {quote(exc)}" if str(exc) else "")
    raise VkdflashError(f"{name} {problem}")
