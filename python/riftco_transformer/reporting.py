"""Reporting of training metrics: JSON Lines logs, SVG loss curves and a progress bar.

Standard library only. A *metric sink* is any callable ``sink(metric) -> None``; the training
loop calls its sinks with one metric per train or validation measurement. The sinks here
duck-type the metric: they read the attributes of a
:class:`~riftco_transformer.training.TrainingMetric` (``phase``, ``step``, ``loss``, ...) with
``getattr`` and defaults, and turn a whole metric into a record with
:func:`dataclasses.asdict` when it is a dataclass instance (else ``vars``), so any object
with those attributes works.

* :class:`JsonlMetricSink`: one compact JSON object per line, flushed per metric.
* :func:`loss_curve_svg` and :func:`write_loss_curve_svg`: a self-contained SVG chart of the
  train and validation loss against the step; :class:`LossCurveSink` collects metrics and
  writes that chart.
* :class:`MetricFanout`: several sinks behind one.
* :class:`ProgressBar`: a one-line ``\\r``-redrawn bar on a terminal, plain throttled log
  lines elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO
from xml.sax.saxutils import escape

from ._files import atomic_write_bytes, destination_path

__all__ = [
    "JsonlMetricSink",
    "LossCurveSink",
    "MetricFanout",
    "ProgressBar",
    "loss_curve_svg",
    "metric_record",
    "write_loss_curve_svg",
]

MetricSink = Callable[[Any], None]


# ---- records -------------------------------------------------------------------------------


def metric_record(metric: object) -> dict[str, Any]:
    """``metric`` as a new dict of its fields.

    A dataclass instance goes through :func:`dataclasses.asdict`, a mapping is copied, any
    other object gives ``vars(metric)`` (TypeError when it has no ``__dict__``).
    """
    if dataclasses.is_dataclass(metric) and not isinstance(metric, type):
        return dataclasses.asdict(metric)
    if isinstance(metric, Mapping):
        return dict(metric)
    try:
        return dict(vars(metric))
    except TypeError:
        raise TypeError(
            f"a metric must be a dataclass instance, a mapping or an object with attributes, "
            f"not {type(metric).__name__}"
        ) from None


def _json_safe(value: object) -> object:
    """``value`` with every non-finite float replaced by ``"inf"``, ``"-inf"`` or ``"nan"``
    (JSON has no such numbers), recursively through dicts, lists and tuples."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Mapping):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


# ---- JSON Lines ----------------------------------------------------------------------------


class JsonlMetricSink:
    """A metric sink that writes each metric as one line of JSON (JSON Lines) to ``path``.

    The file is created or truncated, UTF-8. Each line is a compact object with sorted keys
    (``{"clip_scale":1.0,"elapsed_seconds":0.5,...}``), written and flushed per metric, so a
    crashed run keeps every line it reported. JSON has no infinities or NaN: a non-finite
    float (a perplexity of ``inf``, say) is written as the *string* ``"inf"``, ``"-inf"`` or
    ``"nan"``; ``float(value)`` reads either form back. A value JSON cannot encode otherwise
    raises TypeError and writes nothing.

    ``append=True`` keeps the file's lines and adds after them (a resumed run).

    Usable as a context manager; :meth:`close` is idempotent and a call after it raises
    RuntimeError.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False) -> None:
        if not isinstance(append, bool):
            raise TypeError(f"append must be a bool, not {type(append).__name__}")
        self._path = destination_path(path)
        self._stream: TextIO | None = open(self._path, "a" if append else "w", encoding="utf-8",
                                           newline="\n")

    @property
    def path(self) -> Path:
        """The file being written."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._stream is None

    def __call__(self, metric: object) -> None:
        """Append ``metric`` (see :func:`metric_record`) as one line and flush."""
        if self._stream is None:
            raise RuntimeError(f"JsonlMetricSink for {str(self._path)!r} is closed")
        line = json.dumps(
            _json_safe(metric_record(metric)),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
        self._stream.write(line + "\n")
        self._stream.flush()

    def close(self) -> None:
        """Close the file; later calls do nothing."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def __enter__(self) -> JsonlMetricSink:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()


# ---- SVG loss curve ------------------------------------------------------------------------

_WIDTH = 720
_HEIGHT = 420
_MARGIN_LEFT = 78
_MARGIN_RIGHT = 24
_MARGIN_TOP = 46
_MARGIN_BOTTOM = 56
_PLOT_HEIGHT = _HEIGHT - _MARGIN_TOP - _MARGIN_BOTTOM
_TRAIN_COLOUR = "#1f77b4"
_VALIDATION_COLOUR = "#d62728"
_TEXT_COLOUR = "#222222"
_GRID_COLOUR = "#e3e3e3"
_RATE_COLOUR = "#2ca02c"
_MARGIN_RIGHT_WITH_RATE = 78  # room for the learning-rate axis
_FONT = 'font-family="sans-serif"'
_TICK_TARGET = 6


def _finite_real(value: object) -> float | None:
    """``value`` as a finite float, or None when it is not a finite real number (or a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


_Points = list[tuple[float, float]]


def _series(metrics: Iterable[object]) -> tuple[_Points, _Points]:
    """The (step, loss) points of the train and validation phases, each sorted by step (ties
    keep their input order); points with a missing or non-finite step or loss are skipped."""
    train: _Points = []
    validation: _Points = []
    for metric in metrics:
        phase = getattr(metric, "phase", None)
        target = train if phase == "train" else validation if phase == "validation" else None
        if target is None:
            continue
        step = _finite_real(getattr(metric, "step", None))
        loss = _finite_real(getattr(metric, "loss", None))
        if step is not None and loss is not None:
            target.append((step, loss))
    train.sort(key=lambda point: point[0])
    validation.sort(key=lambda point: point[0])
    return train, validation


def _nice_number(value: float, rounded: bool) -> float:
    """A 1, 2 or 5 times a power of ten near ``value`` > 0 (Heckbert's "nice numbers"):
    the nearest when ``rounded``, else the smallest not below ``value``."""
    exponent = math.floor(math.log10(value))
    power = 10.0**exponent
    fraction = value / power
    if rounded:
        nice = 1 if fraction < 1.5 else 2 if fraction < 3 else 5 if fraction < 7 else 10
    else:
        nice = 1 if fraction <= 1 else 2 if fraction <= 2 else 5 if fraction <= 5 else 10
    return nice * power


def _format_fixed(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    if float(text) == 0.0:  # never "-0.00"
        text = f"{0.0:.{decimals}f}"
    return text


def _ticks(low: float, high: float, integer: bool) -> tuple[list[float], list[str]]:
    """Round tick values covering ``[low, high]`` (``low < high``) and their labels.

    The axis then runs from the first tick to the last. ``integer`` keeps the spacing at 1 or
    more (steps are whole numbers).
    """
    span = high - low
    if not math.isfinite(span) or span <= 0:
        return [low, high], [f"{low:.6g}", f"{high:.6g}"]
    spacing = _nice_number(_nice_number(span, False) / (_TICK_TARGET - 1), True)
    if integer:
        spacing = max(spacing, 1.0)
    first = math.floor(low / spacing)
    last = math.ceil(high / spacing)
    if last == first:
        last += 1
    values = [index * spacing for index in range(first, last + 1)]
    decimals = max(0, -math.floor(math.log10(spacing)))
    return values, [_format_fixed(value, decimals) for value in values]


def _padded_range(low: float, high: float, integer: bool) -> tuple[float, float]:
    """``[low, high]`` widened when it is a single value, so that it has a length."""
    if high > low:
        return low, high
    if integer:
        return (low - 1 if low >= 1 or low < 0 else low), high + 1
    pad = abs(low) * 0.1 or 1.0
    return low - pad, high + pad


def _coordinate(value: float) -> str:
    return _format_fixed(value, 2)


def _svg_text(text: str) -> str:
    """``text`` escaped for XML character data or an attribute, without the control
    characters XML 1.0 forbids."""
    cleaned = "".join(
        character for character in text if character in "\t\n\r" or ord(character) >= 0x20
    )
    return escape(cleaned, {'"': "&quot;"})


def _svg_open(title: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img">',
        f"<title>{_svg_text(title)}</title>",
        f'<rect width="{_WIDTH}" height="{_HEIGHT}" fill="#ffffff"/>',
        f'<text class="title" x="{_WIDTH / 2:.2f}" y="28.00" text-anchor="middle" {_FONT} '
        f'font-size="17" font-weight="bold" fill="{_TEXT_COLOUR}">{_svg_text(title)}</text>',
    ]


def _rates(metrics: Iterable[object]) -> _Points:
    """The (step, learning_rate) points of the train phase, sorted by step (metrics without a
    finite rate are skipped)."""
    rates: _Points = []
    for metric in metrics:
        if getattr(metric, "phase", None) != "train":
            continue
        step = _finite_real(getattr(metric, "step", None))
        rate = _finite_real(getattr(metric, "learning_rate", None))
        if step is not None and rate is not None:
            rates.append((step, rate))
    rates.sort(key=lambda point: point[0])
    return rates


def loss_curve_svg(metrics: Iterable[object], title: str = "Loss") -> str:
    """A self-contained SVG document plotting loss against step.

    The train series (metrics whose ``phase`` is ``"train"``) is a blue line, the validation
    series (``"validation"``) a dashed red line with a marker at every point; a series of
    one point is a single marker. Metrics with another phase, or a missing or non-finite
    step or loss, are skipped. Both axes have round tick values with labels, the titles
    ``step`` and ``loss (nats/token)``; a legend names the series drawn. When train metrics
    carry a ``learning_rate``, it is a dotted green line against a right-hand axis from 0
    (``learning rate``), so a warmup and a decay show beside the loss they shaped. Without any
    point the chart says "no data". ``title`` is escaped for XML. The output has no scripts,
    styles or external references, and coordinates are written with two decimals, so the same
    input always gives the same text.
    """
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, not {type(title).__name__}")
    metrics = list(metrics)
    train, validation = _series(metrics)
    rates = _rates(metrics) if train else []
    plot_width = _WIDTH - _MARGIN_LEFT - (_MARGIN_RIGHT_WITH_RATE if rates else _MARGIN_RIGHT)
    lines = _svg_open(title)
    points = train + validation
    if not points:
        lines.append(
            f'<text class="no-data" x="{_WIDTH / 2:.2f}" y="{_HEIGHT / 2:.2f}" '
            f'text-anchor="middle" {_FONT} font-size="15" fill="#777777">no data</text>'
        )
        lines.append("</svg>")
        return "\n".join(lines) + "\n"

    x_low, x_high = _padded_range(
        min(step for step, _ in points), max(step for step, _ in points), integer=True
    )
    y_low, y_high = _padded_range(
        min(loss for _, loss in points), max(loss for _, loss in points), integer=False
    )
    x_ticks, x_labels = _ticks(x_low, x_high, integer=True)
    y_ticks, y_labels = _ticks(y_low, y_high, integer=False)
    x_start, x_end = x_ticks[0], x_ticks[-1]
    y_start, y_end = y_ticks[0], y_ticks[-1]

    def x_pixel(step: float) -> float:
        return _MARGIN_LEFT + (step - x_start) / (x_end - x_start) * plot_width

    def y_pixel(loss: float) -> float:
        return _MARGIN_TOP + (y_end - loss) / (y_end - y_start) * _PLOT_HEIGHT

    plot_bottom = _MARGIN_TOP + _PLOT_HEIGHT
    plot_right = _MARGIN_LEFT + plot_width

    # Grid, ticks and tick labels.
    lines.append('<g class="axis-x">')
    for value, label in zip(x_ticks, x_labels, strict=True):
        x = _coordinate(x_pixel(value))
        lines.append(
            f'<line x1="{x}" y1="{_MARGIN_TOP}" x2="{x}" y2="{plot_bottom}" '
            f'stroke="{_GRID_COLOUR}" stroke-width="1"/>'
        )
        lines.append(
            f'<line x1="{x}" y1="{plot_bottom}" x2="{x}" y2="{plot_bottom + 5}" '
            f'stroke="{_TEXT_COLOUR}" stroke-width="1"/>'
        )
        lines.append(
            f'<text class="tick" x="{x}" y="{plot_bottom + 19}" text-anchor="middle" {_FONT} '
            f'font-size="12" fill="{_TEXT_COLOUR}">{label}</text>'
        )
    lines.append(
        f'<text class="axis-title" x="{_MARGIN_LEFT + plot_width / 2:.2f}" '
        f'y="{_HEIGHT - 12}" text-anchor="middle" {_FONT} font-size="13" '
        f'fill="{_TEXT_COLOUR}">step</text>'
    )
    lines.append("</g>")
    lines.append('<g class="axis-y">')
    for value, label in zip(y_ticks, y_labels, strict=True):
        y = _coordinate(y_pixel(value))
        lines.append(
            f'<line x1="{_MARGIN_LEFT}" y1="{y}" x2="{plot_right}" y2="{y}" '
            f'stroke="{_GRID_COLOUR}" stroke-width="1"/>'
        )
        lines.append(
            f'<line x1="{_MARGIN_LEFT - 5}" y1="{y}" x2="{_MARGIN_LEFT}" y2="{y}" '
            f'stroke="{_TEXT_COLOUR}" stroke-width="1"/>'
        )
        lines.append(
            f'<text class="tick" x="{_MARGIN_LEFT - 8}" y="{y}" dy="4" text-anchor="end" '
            f'{_FONT} font-size="12" fill="{_TEXT_COLOUR}">{label}</text>'
        )
    y_title = _coordinate(_MARGIN_TOP + _PLOT_HEIGHT / 2)
    lines.append(
        f'<text class="axis-title" x="18" y="{y_title}" text-anchor="middle" '
        f'transform="rotate(-90 18 {y_title})" {_FONT} font-size="13" '
        f'fill="{_TEXT_COLOUR}">loss (nats/token)</text>'
    )
    lines.append("</g>")
    lines.append(
        f'<rect class="frame" x="{_MARGIN_LEFT}" y="{_MARGIN_TOP}" width="{plot_width}" '
        f'height="{_PLOT_HEIGHT}" fill="none" stroke="{_TEXT_COLOUR}" stroke-width="1"/>'
    )

    # The series.
    def pixel_points(series: _Points) -> list[str]:
        """Each point as "x,y" in pixels, consecutive duplicates (after rounding) dropped."""
        drawn: list[str] = []
        for step, loss in series:
            point = f"{_coordinate(x_pixel(step))},{_coordinate(y_pixel(loss))}"
            if not drawn or drawn[-1] != point:
                drawn.append(point)
        return drawn

    if train:
        lines.extend(_line_series("series-train", len(train), pixel_points(train), _TRAIN_COLOUR,
                                  'stroke-width="1.6" stroke-linejoin="round"', 3.5))
    if validation:
        drawn = pixel_points(validation)
        lines.append(f'<g class="series-validation" data-points="{len(validation)}">')
        if len(drawn) > 1:
            lines.append(
                f'<polyline points="{" ".join(drawn)}" fill="none" '
                f'stroke="{_VALIDATION_COLOUR}" stroke-width="1.6" stroke-dasharray="6 3"/>'
            )
        for point in drawn:
            x, y = point.split(",")
            lines.append(
                f'<circle cx="{x}" cy="{y}" r="4" fill="#ffffff" '
                f'stroke="{_VALIDATION_COLOUR}" stroke-width="2"/>'
            )
        lines.append("</g>")

    if rates:
        lines.extend(_rate_axis_and_series(rates, x_pixel, plot_right))

    # The legend, in the plot's top right corner.
    entries = [
        (name, colour, dashed)
        for name, colour, dashed, present in (
            ("train", _TRAIN_COLOUR, False, bool(train)),
            ("validation", _VALIDATION_COLOUR, True, bool(validation)),
            ("learning rate", _RATE_COLOUR, False, bool(rates)),
        )
        if present
    ]
    legend_width = 118
    legend_x = plot_right - legend_width - 10
    legend_y = _MARGIN_TOP + 10
    lines.append('<g class="legend">')
    lines.append(
        f'<rect x="{legend_x}" y="{legend_y}" width="{legend_width}" '
        f'height="{10 + 20 * len(entries)}" fill="#ffffff" fill-opacity="0.9" '
        f'stroke="#bbbbbb" stroke-width="1"/>'
    )
    for index, (name, colour, dashed) in enumerate(entries):
        y = legend_y + 15 + 20 * index
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        lines.append(
            f'<line x1="{legend_x + 10}" y1="{y}" x2="{legend_x + 38}" y2="{y}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
        )
        if dashed:
            lines.append(
                f'<circle cx="{legend_x + 24}" cy="{y}" r="4" fill="#ffffff" '
                f'stroke="{colour}" stroke-width="2"/>'
            )
        lines.append(
            f'<text x="{legend_x + 46}" y="{y}" dy="4" {_FONT} font-size="12" '
            f'fill="{_TEXT_COLOUR}">{name}</text>'
        )
    lines.append("</g>")
    lines.append("</svg>")
    return "\n".join(lines) + "\n"


def _rate_axis_and_series(rates: _Points, x_pixel, plot_right: float) -> list[str]:
    """The right-hand learning-rate axis (0 to a round value above the largest rate) and the
    rate's dotted line."""
    top = max(rate for _, rate in rates)
    ticks, labels = _ticks(0.0, top if top > 0 else 1.0, integer=False)
    end = ticks[-1]

    def y_pixel(rate: float) -> float:
        return _MARGIN_TOP + (end - rate) / end * _PLOT_HEIGHT

    lines = ['<g class="axis-rate">']
    for value, label in zip(ticks, labels, strict=True):
        y = _coordinate(y_pixel(value))
        lines.append(
            f'<line x1="{plot_right}" y1="{y}" x2="{plot_right + 5}" y2="{y}" '
            f'stroke="{_RATE_COLOUR}" stroke-width="1"/>'
        )
        lines.append(
            f'<text class="tick" x="{plot_right + 8}" y="{y}" dy="4" text-anchor="start" '
            f'{_FONT} font-size="11" fill="{_RATE_COLOUR}">{label}</text>'
        )
    middle = _coordinate(_MARGIN_TOP + _PLOT_HEIGHT / 2)
    x_title = _coordinate(_WIDTH - 12)
    lines.append(
        f'<text class="axis-title" x="{x_title}" y="{middle}" text-anchor="middle" '
        f'transform="rotate(90 {x_title} {middle})" {_FONT} font-size="13" '
        f'fill="{_RATE_COLOUR}">learning rate</text>'
    )
    lines.append("</g>")
    drawn: list[str] = []
    for step, rate in rates:
        point = f"{_coordinate(x_pixel(step))},{_coordinate(y_pixel(rate))}"
        if not drawn or drawn[-1] != point:
            drawn.append(point)
    lines.extend(_line_series("series-rate", len(rates), drawn, _RATE_COLOUR,
                              'stroke-width="1.4" stroke-dasharray="2 2"', 3.0))
    return lines


def _line_series(name: str, count: int, drawn: list[str], colour: str, stroke: str,
                 radius: float) -> list[str]:
    """A series group: a polyline through the drawn "x,y" points, or one marker for one."""
    lines = [f'<g class="{name}" data-points="{count}">']
    if len(drawn) > 1:
        lines.append(f'<polyline points="{" ".join(drawn)}" fill="none" stroke="{colour}" '
                     f'{stroke}/>')
    else:
        x, y = drawn[0].split(",")
        lines.append(f'<circle cx="{x}" cy="{y}" r="{radius:g}" fill="{colour}"/>')
    lines.append("</g>")
    return lines


def write_loss_curve_svg(
    path: str | os.PathLike[str], metrics: Iterable[object], title: str = "Loss"
) -> Path:
    """Write :func:`loss_curve_svg` of ``metrics`` to ``path`` atomically (a reader sees the
    old file or the new one, whole); returns the path."""
    return atomic_write_bytes(path, loss_curve_svg(metrics, title).encode("utf-8"))


class LossCurveSink:
    """A metric sink that keeps every metric it is given, to chart them with :meth:`write`."""

    def __init__(self, title: str = "Loss") -> None:
        if not isinstance(title, str):
            raise TypeError(f"title must be a str, not {type(title).__name__}")
        self._title = title
        self._metrics: list[object] = []

    @property
    def title(self) -> str:
        """The chart's title."""
        return self._title

    @property
    def metrics(self) -> tuple[object, ...]:
        """The metrics collected so far, in the order they came."""
        return tuple(self._metrics)

    def __call__(self, metric: object) -> None:
        """Keep ``metric``."""
        self._metrics.append(metric)

    def svg(self) -> str:
        """:func:`loss_curve_svg` of the metrics collected so far."""
        return loss_curve_svg(self._metrics, self._title)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """:func:`write_loss_curve_svg` of the metrics collected so far; returns the path."""
        return write_loss_curve_svg(path, self._metrics, self._title)


class MetricFanout:
    """A metric sink that passes each metric to ``sinks``, in order (an exception from one
    propagates and the later sinks do not see that metric)."""

    def __init__(self, *sinks: MetricSink) -> None:
        for index, sink in enumerate(sinks):
            if not callable(sink):
                raise TypeError(f"sink {index} must be callable, not {type(sink).__name__}")
        self._sinks = sinks

    @property
    def sinks(self) -> tuple[MetricSink, ...]:
        """The sinks, in call order."""
        return self._sinks

    def __call__(self, metric: object) -> None:
        for sink in self._sinks:
            sink(metric)


# ---- progress bar --------------------------------------------------------------------------

_FIELDS = ("loss", "validation_loss", "tokens_per_second")
_MAXIMUM_BAR_WIDTH = 40
_MINIMUM_BAR_WIDTH = 5


def _format_duration(seconds: float | None) -> str:
    """``seconds`` as ``H:MM:SS`` (hours unbounded), or ``--:--`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "--:--"
    whole = int(seconds + 0.5)  # half up: 0.5 s left is "0:00:01", not "0:00:00"
    hours, rest = divmod(whole, 3600)
    minutes, remainder = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{remainder:02d}"


def _require_interval(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be finite and non-negative, got {number!r}")
    return number


def _require_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return int(value)


class ProgressBar:
    """Progress of a run of ``total`` steps, written to ``stream`` (default ``sys.stderr``).

    Interactive (``interactive=None`` means ``stream.isatty()``), one line is redrawn in
    place with ``\\r``, as wide as the terminal (:func:`shutil.get_terminal_size`, 80 columns
    when unknown; the bar is at most 40 characters, the count and percentage are padded to
    their final widths so that it does not jitter)::

        label [#####.......]  12/200   6% ETA 0:01:23 2.26 step/s loss 3.2140 tok/s 12,345

    at most once per ``minimum_interval`` seconds, except that the first update and one
    reaching ``total`` are always drawn; :meth:`close` draws the latest update if it was
    throttled, then ends the line. Otherwise each update writes a whole plain line::

        label 12/200 (6%) eta 0:01:23 2.26 step/s loss 3.2140 tok/s 12345

    at most once per ``plain_interval`` seconds, but always for the first update and the last
    (one reaching ``total``, or at :meth:`close` the latest one if it was throttled), so a
    log always shows where the run ended. A line identical to the last one written is not
    written again.

    The ETA and the rate (in ``unit`` per second) come from the progress since the bar was
    made, measured with ``clock``: ``initial`` steps (already done, say, by a resumed run)
    do not count towards the rate; before any progress the ETA is ``--:--``. ``completed``
    beyond ``total`` is clamped to it. The fields an update may show are ``loss``,
    ``validation_loss`` (as ``val_loss``) and ``tokens_per_second`` (as ``tok/s``); a field
    keeps its last value until an update passes a new one (None hides it).

    Usable as a context manager (closing on exit); :meth:`close` is idempotent and
    :meth:`update` after it raises RuntimeError.
    """

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        label: str = "",
        unit: str = "step",
        interactive: bool | None = None,
        minimum_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        *,
        plain_interval: float = 5.0,
        initial: int = 0,
    ) -> None:
        total = _require_count(total, "total")
        if total <= 0:
            raise ValueError(f"total must be positive, got {total}")
        initial = _require_count(initial, "initial")
        if not 0 <= initial <= total:
            raise ValueError(f"initial must be in [0, total={total}], got {initial}")
        if not isinstance(label, str):
            raise TypeError(f"label must be a str, not {type(label).__name__}")
        if not isinstance(unit, str):
            raise TypeError(f"unit must be a str, not {type(unit).__name__}")
        if not unit:
            raise ValueError("unit must not be empty")
        if interactive is not None and not isinstance(interactive, bool):
            raise TypeError(f"interactive must be a bool or None, not {type(interactive).__name__}")
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self._total = total
        self._stream = sys.stderr if stream is None else stream
        self._label = label
        self._unit = unit
        self._interactive = _isatty(self._stream) if interactive is None else interactive
        self._minimum_interval = _require_interval(minimum_interval, "minimum_interval")
        self._plain_interval = _require_interval(plain_interval, "plain_interval")
        self._clock = clock
        self._initial = initial
        self._start = float(clock())
        self._completed = initial
        self._fields: dict[str, float] = {}
        self._updated = False  # any update yet
        self._pending = False  # the latest update is not on the stream yet
        self._last_written: float | None = None  # clock time of the last line or redraw
        self._last_text: str | None = None
        self._drawn_length = 0  # interactive: the length of the line on screen
        self._closed = False

    @property
    def total(self) -> int:
        return self._total

    @property
    def completed(self) -> int:
        """The latest completed count (clamped to ``total``)."""
        return self._completed

    @property
    def interactive(self) -> bool:
        """Whether the bar redraws one line (else it writes plain lines)."""
        return self._interactive

    @property
    def closed(self) -> bool:
        return self._closed

    def update(self, completed: int, **fields: float | None) -> None:
        """Record that ``completed`` steps are done, with optional ``loss``,
        ``validation_loss`` and ``tokens_per_second`` to show; writes if not throttled."""
        if self._closed:
            raise RuntimeError("ProgressBar is closed")
        completed = _require_count(completed, "completed")
        if completed < 0:
            raise ValueError(f"completed must be non-negative, got {completed}")
        for name, value in fields.items():
            if name not in _FIELDS:
                raise TypeError(
                    f"unexpected field {name!r}; the fields are {', '.join(_FIELDS)}"
                )
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Real)
            ):
                raise TypeError(f"{name} must be a real number or None, not {type(value).__name__}")
        for name, value in fields.items():
            if value is None:
                self._fields.pop(name, None)
            else:
                self._fields[name] = float(value)
        self._completed = min(completed, self._total)
        now = float(self._clock())
        first = not self._updated
        self._updated = True
        self._pending = True
        interval = self._minimum_interval if self._interactive else self._plain_interval
        due = self._last_written is None or now - self._last_written >= interval
        if first or due or self._completed == self._total:
            self._write(now)

    def close(self) -> None:
        """Write the latest update if it was throttled and, interactive, end the line."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._write(float(self._clock()))
        if self._interactive and self._drawn_length:
            self._stream.write("\n")
            self._flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()

    # -- rendering --

    def _write(self, now: float) -> None:
        self._pending = False
        self._last_written = now
        text = self._render_interactive(now) if self._interactive else self._render_plain(now)
        if text == self._last_text:
            return
        self._last_text = text
        if self._interactive:
            padding = " " * max(0, self._drawn_length - len(text))
            self._stream.write("\r" + text + padding)
            self._drawn_length = len(text)
        else:
            self._stream.write(text + "\n")
        self._flush()

    def _flush(self) -> None:
        flush = getattr(self._stream, "flush", None)
        if flush is not None:
            flush()

    def _eta_and_rate(self, now: float) -> tuple[str, str | None]:
        elapsed = now - self._start
        progress = self._completed - self._initial
        remaining = self._total - self._completed
        if elapsed <= 0 or progress <= 0:
            return ("0:00:00" if remaining == 0 else "--:--"), None
        rate = progress / elapsed
        return _format_duration(remaining / rate), f"{rate:.2f} {self._unit}/s"

    def _field_parts(self, grouped: bool) -> list[str]:
        parts = []
        if "loss" in self._fields:
            parts.append(f"loss {self._fields['loss']:.4f}")
        if "validation_loss" in self._fields:
            parts.append(f"val_loss {self._fields['validation_loss']:.4f}")
        if "tokens_per_second" in self._fields:
            speed = self._fields["tokens_per_second"]
            parts.append(f"tok/s {speed:,.0f}" if grouped else f"tok/s {speed:.0f}")
        return parts

    def _percent(self) -> int:
        return self._completed * 100 // self._total

    def _render_plain(self, now: float) -> str:
        eta, rate = self._eta_and_rate(now)
        parts = [self._label] if self._label else []
        parts += [f"{self._completed}/{self._total}", f"({self._percent()}%)", f"eta {eta}"]
        parts += [rate] if rate else []
        return " ".join(parts + self._field_parts(grouped=False))

    def _render_interactive(self, now: float) -> str:
        eta, rate = self._eta_and_rate(now)
        columns = shutil.get_terminal_size((80, 24)).columns
        head = self._label
        # The count and percentage are padded to their final widths so the bar keeps its width.
        count = f"{self._completed:>{len(str(self._total))}}/{self._total}"
        tail = " ".join(
            [count, f"{self._percent():>3}%", f"ETA {eta}"]
            + ([rate] if rate else [])
            + self._field_parts(grouped=True)
        )
        # One column is left free: writing the last one makes some terminals wrap.
        room = columns - 1 - len(tail) - (len(head) + 1 if head else 0) - 3
        width = min(room, _MAXIMUM_BAR_WIDTH)
        parts = [head] if head else []
        if width >= _MINIMUM_BAR_WIDTH:
            filled = self._completed * width // self._total
            parts.append("[" + "#" * filled + "." * (width - filled) + "]")
        parts.append(tail)
        return " ".join(parts)[: max(1, columns - 1)]


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    if isatty is None:
        return False
    try:
        return bool(isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False

