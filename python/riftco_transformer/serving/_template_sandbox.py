"""The jinja2 environment chat templates render in: jinja2's immutable sandbox with limits.

A chat template comes with a model file (GGUF metadata, ``tokenizer_config.json``), so its
text is untrusted code. jinja2's sandbox keeps it away from Python internals, but not from
spending time or memory: nested loops, ``'a' * 10**9`` or a string doubled thirty times run
for minutes or exhaust memory. Here every way to spend them goes through a per-rendering
budget of ``chat_templates.TemplateLimits`` (which says what each limit counts):

* a syntax-tree pass routes every ``{% for %}`` iterable, ``~`` concatenation, list, tuple
  and dict literal, and piece of the template's own text through hooks (filters that
  count and measure);
* the sandbox's hooks count and measure calls, the operators ``+ * ** %``, slices and
  every output expression (``finalize``); each filter is wrapped likewise;
* a value's size is its expanded size: a list holding the same list twice counts it twice,
  so no value (however shared) can print, compare or hash beyond the output limit.

Operations that could build a large value in one step are checked before they run (``*``
and ``**``, printf-style ``%`` and ``str.format`` widths, ``center``/``ljust``/``rjust``/
``zfill``/``expandtabs``/``replace``/``join``/``translate``, the filters ``center``,
``indent``, ``format``, ``replace``, ``join``, ``batch``, ``slice``, ``wordwrap``,
``tojson``); a value converted to text is measured first. The filters ``striptags`` and
``urlize`` (superlinear regular expressions) and the global ``lipsum`` are not available,
a namespace cannot be converted to text, and ``sum`` adds numbers only.

Nothing of a template runs at load: the hooks refuse to work outside a rendering, so
jinja2's constant folding leaves every expression they guard to the rendering.

:class:`TemplateLimitError` is what a limit raises, :class:`TemplateRaisedError` what the
template's ``raise_exception`` raises; :mod:`.chat_templates` turns them (and any other
failure of the template's code) into a ``ChatTemplateError`` naming the template.
Importing this module imports jinja2 (3.0 or newer).
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import threading
import time

from jinja2 import nodes
from jinja2.runtime import LoopContext, Namespace, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import pass_context
from jinja2.visitor import NodeTransformer

from ..native._validation import describe_value

# The largest integer an operator may make, in bits (formatting one takes quadratic time).
INTEGER_BITS = 1 << 16
# How many steps pass between two looks at the CPU clock.
_CLOCK_EVERY = 256
# The most indentation tojson may add per level.
_TOJSON_INDENT = 64


class TemplateLimitError(Exception):
    """A template reached one of its limits (the message names the TemplateLimits field)."""


class TemplateRaisedError(Exception):
    """A template called ``raise_exception(message)`` (Hugging Face's global for refusing a
    conversation, e.g. roles that do not alternate)."""


def _raise_exception(message):
    raise TemplateRaisedError(message)


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "riftco_chat_template_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:
        # jinja2's constant folding calls the hooks at load: nothing is evaluated then.
        raise TemplateLimitError("template code runs only while rendering")
    return budget


_SEQUENCES = (str, list, tuple)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


class _Budget:
    """One rendering's account: steps left, characters produced, the CPU deadline, and the
    expanded size of each container met (kept with the container, so an id is never
    reused while the rendering runs)."""

    def __init__(self, limits, steps: int) -> None:
        self.limits = limits
        self.step_limit = steps
        self.steps_left = steps
        self.produced = 0
        self.countdown = _CLOCK_EVERY
        self.deadline = time.thread_time() + limits.cpu_seconds
        self.sizes: dict[int, tuple[object, int, bool]] = {}

    # ---- the counters

    def step(self) -> None:
        self.steps_left -= 1
        if self.steps_left < 0:
            raise TemplateLimitError(
                f"it took more than {self.step_limit:,} steps (loop iterations, calls, filters, "
                f"operators and output pieces; TemplateLimits.steps and steps_per_message)")
        self.countdown -= 1
        if self.countdown == 0:
            self.countdown = _CLOCK_EVERY
            if time.thread_time() > self.deadline:
                raise TemplateLimitError(
                    f"it used more than {self.limits.cpu_seconds:g} s of CPU time "
                    f"(TemplateLimits.cpu_seconds)")

    def produce(self, size: int) -> None:
        self.produced += size
        if self.produced > self.limits.produced_chars:
            raise TemplateLimitError(
                f"it built more than {self.limits.produced_chars:,} characters in all "
                f"(TemplateLimits.produced_chars)")

    def check_size(self, size: int, what: str) -> None:
        if size > self.limits.output_chars:
            raise TemplateLimitError(
                f"{what} would be {size:,} characters, more than the limit "
                f"{self.limits.output_chars:,} (TemplateLimits.output_chars)")

    # ---- sizes of values

    def size(self, value) -> tuple[int, bool]:
        """``(expanded size, holds a namespace)``: an upper bound on the length of the
        value's text and on the work of traversing it (comparing, hashing, converting),
        counting a shared part once per place it appears."""
        leaf = _leaf_size(value)
        if leaf is not None:
            return leaf
        known = self.sizes.get(id(value))
        if known is not None and known[0] is value:
            return known[1], known[2]
        # Post-order over the containers not measured yet; the sandbox cannot make a cycle
        # (its containers are immutable), but data passed in might.
        pending = [(value, False)]
        open_ids = set()
        while pending:
            container, children_done = pending.pop()
            key = id(container)
            if key in self.sizes and self.sizes[key][0] is container:
                continue
            children = _children(container)
            if not children_done:
                open_ids.add(key)
                pending.append((container, True))
                for child in children:
                    if _leaf_size(child) is None:
                        if id(child) in open_ids:
                            raise TemplateLimitError("a value contains itself")
                        pending.append((child, False))
                continue
            total, namespace = 2, False
            for child in children:
                child_size = _leaf_size(child)
                if child_size is None:
                    entry = self.sizes[id(child)]
                    child_size = entry[1], entry[2]
                total += child_size[0] + 2
                namespace = namespace or child_size[1]
            open_ids.discard(key)
            self.sizes[key] = (container, total, namespace)
        entry = self.sizes[id(value)]
        return entry[1], entry[2]

    def record(self, container, size: int, namespace: bool = False) -> None:
        """A new container's size, computed from its parts' (``a + b``, ``a * n``)."""
        self.sizes[id(container)] = (container, size, namespace)

    def text_size(self, value, what: str) -> int:
        """The bound on the length of ``str(value)``, checked against the limit."""
        size, namespace = self.size(value)
        if namespace:
            raise TemplateLimitError(f"{what} holds a namespace, which a chat template may not "
                                     "convert to text")
        self.check_size(size, what)
        return size

    def account(self, value, what: str) -> None:
        """A value the template just made (a call's, a filter's): checked and counted."""
        if isinstance(value, str):
            self.check_size(len(value), what)
            self.produce(len(value))
        elif isinstance(value, _CONTAINERS):
            self.check_size(self.size(value)[0], what)
            self.produce(len(value))


def _leaf_size(value) -> tuple[int, bool] | None:
    """The size of a value that holds no other values (None for a container)."""
    if isinstance(value, str):
        return len(value) + 2, False
    if isinstance(value, _CONTAINERS) or isinstance(value, _VIEWS):
        return None
    if isinstance(value, (bytes, bytearray)):
        return len(value) + 3, False
    if isinstance(value, bool) or value is None:
        return 5, False
    if isinstance(value, int):
        return value.bit_length() // 3 + 2, False
    if isinstance(value, Namespace):
        return 16, True
    return 32, False  # numbers, undefined values, macros, loops: short texts


def _children(container) -> list:
    if isinstance(container, dict):
        return [part for pair in container.items() for part in pair]
    if isinstance(container, type({}.items())):
        return [part for pair in container for part in pair]
    return list(container)


# ---- checks before an operation that can build a large value in one step --------------------

_DIGITS = re.compile(r"\d+")
_NESTED_SPEC = re.compile(r":[^{}]*\{")


def _width_bound(fmt: str, values, star: bool) -> int:
    """What the widths and precisions of a format string can add: its digit runs, and the
    int arguments where a width comes from an argument (``*``, or ``{:{}}``)."""
    total = 0
    for run in _DIGITS.findall(fmt):
        total += int(run) if len(run) <= 12 else 10 ** 12
    if star:
        total += sum(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0)
    return total


def _printf_size(budget: _Budget, fmt: str, arguments, what: str) -> int:
    if isinstance(arguments, dict):
        values = list(arguments.values())
    elif isinstance(arguments, tuple):
        values = list(arguments)
    else:
        values = [arguments]
    size = len(fmt) + _width_bound(fmt, values, "*" in fmt)
    for value in values:
        size += budget.text_size(value, what)
    return size


def _format_size(budget: _Budget, fmt: str, args, kwargs, what: str) -> int:
    values = [*args, *kwargs.values()]
    size = len(fmt) + _width_bound(fmt, values, bool(_NESTED_SPEC.search(fmt)))
    for value in values:
        size += budget.text_size(value, what)
    return size


def _positive(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _replace_size(text: str, old, new, count) -> int:
    if not (isinstance(old, str) and isinstance(new, str)):
        return len(text)
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(len(new) - len(old), 0)


def _string_method_size(budget: _Budget, text: str, name: str, args, kwargs):
    """``(size bound, args)`` for the str methods that can grow a string (args may be
    replaced: ``join`` reads its iterable once, here). None when the method cannot grow."""
    what = f"str.{name}'s result"
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        return max(len(text), _positive(width)), args
    if name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        return len(text) + text.count("\t") * _positive(tabsize), args
    if name == "replace":
        old = args[0] if len(args) > 0 else kwargs.get("old")
        new = args[1] if len(args) > 1 else kwargs.get("new")
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        return _replace_size(text, old, new, count), args
    if name == "join" and args:
        items = list(args[0])
        size = len(text) * max(len(items) - 1, 0)
        for item in items:
            size += budget.text_size(item, what)
        return size, (items, *args[1:])
    if name in ("format", "format_map"):
        if name == "format_map" and args and isinstance(args[0], dict):
            return _format_size(budget, text, (), args[0], what), args
        return _format_size(budget, text, args, kwargs, what), args
    if name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        return len(text) * max(longest, 1), args
    return None


# ---- filters ----------------------------------------------------------------------------------

# Filters that turn their value into text: the value is measured first.
_TEXT_FILTERS = frozenset({
    "capitalize", "center", "e", "escape", "filesizeformat", "forceescape", "format",
    "indent", "lower", "pprint", "replace", "safe", "string", "title", "tojson", "trim",
    "truncate", "upper", "urlencode", "wordcount", "wordwrap", "xmlattr",
})
_REMOVED_FILTERS = frozenset({"striptags", "urlize"})


def _argument(args, kwargs, index: int, name: str, default):
    return args[index] if len(args) > index else kwargs.get(name, default)


def _check_filter(budget: _Budget, name: str, value, args, kwargs):
    """Checks a filter's arguments before it runs; returns the (possibly replaced) value."""
    what = f"the result of filter {name}"
    if name in _TEXT_FILTERS:
        size = budget.text_size(value, f"the value of filter {name}")
        text = value if isinstance(value, str) else None
        if name == "center":
            budget.check_size(max(size, _positive(_argument(args, kwargs, 0, "width", 80))), what)
        elif name == "indent":
            width = _argument(args, kwargs, 0, "width", 4)
            step = len(width) if isinstance(width, str) else _positive(width)
            lines = (text.count("\n") if text is not None else size) + 1
            budget.check_size(size + lines * step, what)
        elif name == "format":
            budget.check_size(_printf_size(budget, str(value), kwargs or tuple(args), what), what)
        elif name == "replace" and text is not None:
            budget.check_size(_replace_size(text, _argument(args, kwargs, 0, "old", None),
                                            _argument(args, kwargs, 1, "new", None),
                                            _argument(args, kwargs, 2, "count", None)), what)
        elif name == "wordwrap":
            wrapstring = _argument(args, kwargs, 2, "wrapstring", None)
            budget.check_size(size * (1 + (len(wrapstring) if isinstance(wrapstring, str)
                                           else 1)), what)
        elif name == "tojson":
            indent = _argument(args, kwargs, 0, "indent", None)
            width = len(indent) if isinstance(indent, str) else _positive(indent)
            if width > _TOJSON_INDENT:
                raise TemplateLimitError(f"filter tojson's indent is at most {_TOJSON_INDENT} "
                                         f"here, got {describe_value(indent)}")
        return value
    if name == "join":
        items = list(value)
        separator = _argument(args, kwargs, 0, "d", "")
        size = (len(separator) if isinstance(separator, str) else 0) * max(len(items) - 1, 0)
        for item in items:
            size += budget.text_size(item, "an item of filter join")
        budget.check_size(size, what)
        return items
    if name in ("batch", "slice"):
        count = _positive(_argument(args, kwargs, 0, "linecount" if name == "batch" else "slices",
                                    0))
        budget.check_size(count, f"filter {name}'s count")
        budget.produce(count)
        return value
    if name == "sum":
        start = _argument(args, kwargs, 1, "start", 0)
        if isinstance(start, bool) or not isinstance(start, (int, float)):
            raise TemplateLimitError(f"filter sum adds numbers only in a chat template (start "
                                     f"is {describe_value(start)})")
    return value


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None,
            sort_keys: bool = False) -> str:
    """The tojson filter as Hugging Face's chat templates see it: ``json.dumps`` with its
    options, nothing escaped for HTML."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _limited_filter(name: str, function):
    offset = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(function)
    def limited(*args, **kwargs):
        budget = _budget()
        budget.step()
        if len(args) > offset:
            value = _check_filter(budget, name, args[offset], args[offset + 1:], kwargs)
            if value is not args[offset]:
                args = (*args[:offset], value, *args[offset + 1:])
        result = function(*args, **kwargs)
        budget.account(result, f"the result of filter {name}")
        return result

    return limited


def _iterate(budget: _Budget, iterable):
    for item in iterable:
        budget.step()
        yield item


@pass_context
def _loop_filter(context, iterable):
    """Wraps every ``{% for %}``'s iterable: one step per iteration."""
    return _iterate(_budget(), iterable)


@pass_context
def _concat_filter(context, parts):
    """Replaces ``a ~ b``: the parts' text is measured before it is joined."""
    budget = _budget()
    budget.step()
    size = 0
    for part in parts:
        size += budget.text_size(part, "a ~ concatenation") - 2
    budget.check_size(size, "a ~ concatenation")
    budget.produce(size)
    return (markup_join if context.eval_ctx.autoescape else str_join)(parts)


@pass_context
def _literal_filter(context, container):
    """Wraps every list, tuple and dict literal: its expanded size is checked."""
    budget = _budget()
    budget.step()
    budget.check_size(budget.size(container)[0], "a literal")
    budget.produce(len(container))
    return container


@pass_context
def _finalize(context, value):
    """Every output piece (expressions and the template's own text)."""
    budget = _budget()
    budget.step()
    if isinstance(value, str):
        size = len(value)
    else:
        size = budget.text_size(value, "an output value")
    budget.produce(size)
    return value


class _Instrument(NodeTransformer):
    """Routes loops, ``~``, literals and template text through the hooks above."""

    @staticmethod
    def _wrap(node, name: str):
        wrapped = nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)
        return wrapped

    def visit_For(self, node):
        self.generic_visit(node)
        node.iter = self._wrap(node.iter, "__rt_loop")
        return node

    def visit_Concat(self, node):
        self.generic_visit(node)
        return self._wrap(nodes.List(node.nodes, lineno=node.lineno), "__rt_concat")

    def visit_List(self, node):
        self.generic_visit(node)
        return self._wrap(node, "__rt_literal")

    def visit_Dict(self, node):
        self.generic_visit(node)
        return self._wrap(node, "__rt_literal")

    def visit_Tuple(self, node):
        self.generic_visit(node)
        return node if node.ctx != "load" else self._wrap(node, "__rt_literal")

    def visit_Output(self, node):
        self.generic_visit(node)
        node.nodes = [
            nodes.MarkSafeIfAutoescape(nodes.Const(child.data, lineno=child.lineno),
                                       lineno=child.lineno)
            if isinstance(child, nodes.TemplateData) else child
            for child in node.nodes
        ]
        return node


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, ``trim_blocks`` and ``lstrip_blocks`` as Hugging Face
    renders chat templates, with every way to spend time or memory routed through a
    per-rendering budget (:func:`render`)."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=_finalize)
        self.filters = {name: _limited_filter(name, function)
                        for name, function in self.filters.items()
                        if name not in _REMOVED_FILTERS}
        # Hugging Face's tojson, not jinja2's: no HTML escaping, keys in their order, and
        # non-ASCII text as it is (templates render tool schemas with it).
        self.filters["tojson"] = _limited_filter("tojson", _tojson)
        self.filters["__rt_loop"] = _loop_filter
        self.filters["__rt_concat"] = _concat_filter
        self.filters["__rt_literal"] = _literal_filter
        self.globals.pop("lipsum", None)
        self.globals["raise_exception"] = _raise_exception

    def compile_template(self, text: str):
        """The template of ``text``, instrumented (jinja2's errors propagate)."""
        tree = self.parse(text)
        tree = _Instrument().visit(tree)
        tree.set_environment(self)
        return self.from_string(tree)

    # ---- the sandbox's hooks

    def call_binop(self, context, operator_name: str, left, right):
        budget = _budget()
        budget.step()
        what = f"the result of {operator_name}"
        if operator_name == "+" and isinstance(left, str) and isinstance(right, str):
            # The common case first. Markup + str escapes the str: up to 6 characters each.
            size = (len(left) + len(right)) * (1 if type(left) is type(right) else 6)
            budget.check_size(size, what)
            budget.produce(size)
            return left + right
        if operator_name == "*":
            for sequence, count in ((left, right), (right, left)):
                if isinstance(sequence, _SEQUENCES) and isinstance(count, int):
                    times = max(int(count), 0)
                    parts = budget.size(sequence)
                    size = (len(sequence) if isinstance(sequence, str) else parts[0]) * times
                    budget.check_size(size, what)
                    budget.produce(len(sequence) * times)
                    result = left * right
                    if not isinstance(result, str):
                        budget.record(result, size, parts[1])
                    return result
            if _is_int(left) and _is_int(right):
                _check_bits(left.bit_length() + right.bit_length(), what)
        elif operator_name == "**":
            if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
                _check_bits(left.bit_length() * right if right < INTEGER_BITS else
                            INTEGER_BITS + 1, what)
        elif operator_name == "+":
            if any(isinstance(left, kind) and isinstance(right, kind) for kind in (list, tuple)):
                left_size, right_size = budget.size(left), budget.size(right)
                budget.check_size(left_size[0] + right_size[0], what)
                budget.produce(len(left) + len(right))
                result = left + right
                budget.record(result, left_size[0] + right_size[0], left_size[1] or right_size[1])
                return result
        elif operator_name == "%" and isinstance(left, str):
            size = _printf_size(budget, left, right, what)
            budget.check_size(size, what)
            budget.produce(size)
        return self.binop_table[operator_name](left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's signature
        budget = _budget()
        budget.step()
        target = getattr(__obj, "__wrapped__", __obj)
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            checked = _string_method_size(budget, owner, getattr(target, "__name__", ""), args,
                                          kwargs)
            if checked is not None:
                budget.check_size(checked[0], f"the result of str.{target.__name__}")
                args = checked[1]
        elif isinstance(__obj, LoopContext) and args:
            args = (_iterate(budget, args[0]), *args[1:])  # a recursive loop's next level
        result = super().call(__context, __obj, *args, **kwargs)
        budget.account(result, "the result of a call")
        return result

    def getitem(self, obj, argument):
        if isinstance(argument, slice):
            budget = _budget()
            result = super().getitem(obj, argument)
            if isinstance(result, _SEQUENCES):
                budget.produce(len(result))
                if not isinstance(result, str) and isinstance(obj, _SEQUENCES):
                    budget.record(result, budget.size(obj)[0], budget.size(obj)[1])
            return result
        return super().getitem(obj, argument)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_bits(bits: int, what: str) -> None:
    if bits > INTEGER_BITS:
        raise TemplateLimitError(f"{what} would be an integer of about {bits:,} bits, more than "
                                 f"{INTEGER_BITS:,}")


_ENVIRONMENT: LimitedEnvironment | None = None
_ENVIRONMENT_LOCK = threading.Lock()


def environment() -> LimitedEnvironment:
    """The one LimitedEnvironment (its templates share nothing but their configuration)."""
    global _ENVIRONMENT
    with _ENVIRONMENT_LOCK:
        if _ENVIRONMENT is None:
            _ENVIRONMENT = LimitedEnvironment()
        return _ENVIRONMENT


def render(template, context: dict, limits, message_count: int) -> str:
    """``template`` (from :meth:`LimitedEnvironment.compile_template`) rendered with
    ``context`` under ``limits`` (a ``chat_templates.TemplateLimits``): TemplateLimitError
    when one is reached, TemplateRaisedError from ``raise_exception``, and whatever else the
    template's code raises."""
    budget = _Budget(limits, limits.step_budget(message_count))
    token = _BUDGET.set(budget)
    try:
        pieces, length = [], 0
        for piece in template.generate(**context):
            length += len(piece)
            if length > limits.output_chars:
                raise TemplateLimitError(
                    f"the rendered text is more than {limits.output_chars:,} characters "
                    f"(TemplateLimits.output_chars)")
            pieces.append(piece)
        return "".join(pieces)
    finally:
        _BUDGET.reset(token)
        budget.sizes.clear()
