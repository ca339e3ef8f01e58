"""Reporting: JSON Lines metric logs, SVG loss curves, fan-out, and the progress bar.

Pure Python: nothing here loads the native library.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from riftco_transformer.reporting import (
    JsonlMetricSink,
    LossCurveSink,
    MetricFanout,
    ProgressBar,
    loss_curve_svg,
    metric_record,
    write_loss_curve_svg,
)

SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class Metric:
    """The shape of training.TrainingMetric, without importing the training loop."""

    phase: str
    step: int
    loss: float
    perplexity: float = math.inf
    loss_average: float | None = None
    gradient_norm: float | None = None
    clip_scale: float | None = None
    tokens_per_second: float | None = None
    elapsed_seconds: float | None = None


def train(step: int, loss: float) -> Metric:
    return Metric("train", step, loss, math.exp(loss) if loss < 700 else math.inf, loss, 1.0)


def validation(step: int, loss: float) -> Metric:
    return Metric("validation", step, loss, math.exp(loss) if loss < 700 else math.inf)


def reject_constant(name: str) -> None:
    raise AssertionError(f"non-standard JSON constant {name}")


# ---- records and JSON Lines ----------------------------------------------------------------


def test_metric_record_of_a_dataclass_a_mapping_and_a_plain_object():
    assert metric_record(Metric("train", 3, 2.5))["step"] == 3
    assert metric_record({"phase": "train", "step": 1}) == {"phase": "train", "step": 1}
    assert metric_record(SimpleNamespace(phase="validation", loss=1.5)) == {
        "phase": "validation",
        "loss": 1.5,
    }
    with pytest.raises(TypeError, match="metric"):
        metric_record(42)


def test_jsonl_lines_are_compact_sorted_and_parse_back(tmp_path):
    path = tmp_path / "metrics.jsonl"
    metrics = [
        Metric("train", 1, 3.25, 25.79, 3.25, 0.5, 1.0, 12345.5, 0.25),
        Metric("validation", 1, 3.5, 33.1),
    ]
    with JsonlMetricSink(path) as sink:
        for metric in metrics:
            sink(metric)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    for line, metric in zip(lines, metrics):
        record = json.loads(line, parse_constant=reject_constant)
        assert record == metric_record(metric)
        assert line == json.dumps(record, sort_keys=True, separators=(",", ":"))
        assert list(record) == sorted(record)
    assert json.loads(lines[1])["loss_average"] is None


def test_jsonl_non_finite_floats_are_strings(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonlMetricSink(path) as sink:
        sink(Metric("train", 2, math.nan, math.inf, gradient_norm=-math.inf))
        sink({"phase": "train", "nested": [math.inf, {"value": math.nan}], "label": "naïve"})
    first, second = (
        json.loads(line, parse_constant=reject_constant)
        for line in path.read_text(encoding="utf-8").splitlines()
    )
    assert (first["loss"], first["perplexity"], first["gradient_norm"]) == ("nan", "inf", "-inf")
    assert math.isinf(float(first["perplexity"])) and math.isnan(float(first["loss"]))
    assert second["nested"] == ["inf", {"value": "nan"}]
    assert second["label"] == "naïve"
    assert "Infinity" not in path.read_text(encoding="utf-8")


def test_jsonl_flushes_each_line_and_truncates(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("stale contents\n", encoding="utf-8")
    sink = JsonlMetricSink(path)
    assert path.read_text(encoding="utf-8") == ""
    sink(train(1, 2.0))
    assert len(path.read_text(encoding="utf-8").splitlines()) == 1  # before close
    sink(SimpleNamespace(phase="train", step=2, loss=1.5))
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[1])["step"] == 2
    sink.close()
    assert sink.path == path


def test_jsonl_close_is_idempotent_and_a_closed_sink_refuses(tmp_path):
    sink = JsonlMetricSink(tmp_path / "metrics.jsonl")
    assert not sink.closed
    sink.close()
    sink.close()
    assert sink.closed
    with pytest.raises(RuntimeError, match="closed"):
        sink(train(1, 2.0))
    with JsonlMetricSink(tmp_path / "other.jsonl") as inside:
        pass
    assert inside.closed


def test_jsonl_unencodable_value_writes_nothing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonlMetricSink(path) as sink:
        with pytest.raises(TypeError):
            sink({"phase": "train", "value": object()})
        sink(train(1, 2.0))
    assert len(path.read_text(encoding="utf-8").splitlines()) == 1


def test_jsonl_path_errors(tmp_path):
    with pytest.raises(TypeError):
        JsonlMetricSink(3)
    with pytest.raises(IsADirectoryError):
        JsonlMetricSink(tmp_path)
    with pytest.raises(FileNotFoundError):
        JsonlMetricSink(tmp_path / "missing" / "metrics.jsonl")


# ---- SVG loss curve ------------------------------------------------------------------------


def by_class(root: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return [element for element in root.iter() if element.get("class") == name]


def tick_labels(root: ElementTree.Element, axis: str) -> list[str]:
    (group,) = by_class(root, axis)
    return [text.text for text in group.iter(f"{SVG}text") if text.get("class") == "tick"]


def polyline_points(group: ElementTree.Element) -> list[tuple[float, float]]:
    (polyline,) = group.iter(f"{SVG}polyline")
    return [tuple(map(float, pair.split(","))) for pair in polyline.get("points").split()]


def run_metrics() -> list[Metric]:
    metrics = [validation(0, 4.5)]
    for step in range(1, 201):
        metrics.append(train(step, 1.2 + 3.0 * math.exp(-step / 50)))
        if step % 50 == 0:
            metrics.append(validation(step, 1.4 + 3.0 * math.exp(-step / 50)))
    return metrics


def test_svg_has_both_series_axes_legend_and_title():
    text = loss_curve_svg(run_metrics(), title="Run 7")
    root = ElementTree.fromstring(text)
    assert root.tag == f"{SVG}svg"
    assert root.find(f"{SVG}title").text == "Run 7"
    assert [element.text for element in by_class(root, "title")] == ["Run 7"]

    (train_group,) = by_class(root, "series-train")
    (validation_group,) = by_class(root, "series-validation")
    assert len(polyline_points(train_group)) == 200
    assert len(list(validation_group.iter(f"{SVG}circle"))) == 5  # a marker per point
    train_colour = next(train_group.iter(f"{SVG}polyline")).get("stroke")
    validation_colour = next(validation_group.iter(f"{SVG}polyline")).get("stroke")
    assert train_colour != validation_colour

    titles = [element.text for element in by_class(root, "axis-title")]
    assert titles == ["step", "loss (nats/token)"]
    (legend,) = by_class(root, "legend")
    assert [element.text for element in legend.iter(f"{SVG}text")] == ["train", "validation"]


def test_svg_ticks_are_round_and_cover_the_data():
    root = ElementTree.fromstring(loss_curve_svg(run_metrics()))
    assert tick_labels(root, "axis-x") == ["0", "50", "100", "150", "200"]
    y_values = [float(label) for label in tick_labels(root, "axis-y")]
    assert y_values == sorted(y_values) and len(y_values) >= 3
    assert y_values[0] <= 1.2 + 3.0 * math.exp(-4) and y_values[-1] >= 4.5
    spacings = {round(b - a, 9) for a, b in zip(y_values, y_values[1:])}
    assert len(spacings) == 1
    (spacing,) = spacings
    mantissa = spacing / 10 ** math.floor(math.log10(spacing))
    assert round(mantissa, 6) in (1.0, 2.0, 5.0)


def test_svg_points_lie_inside_the_frame():
    root = ElementTree.fromstring(loss_curve_svg(run_metrics()))
    (frame,) = by_class(root, "frame")
    left, top = float(frame.get("x")), float(frame.get("y"))
    right, bottom = left + float(frame.get("width")), top + float(frame.get("height"))
    (train_group,) = by_class(root, "series-train")
    points = polyline_points(train_group)
    assert all(left <= x <= right and top <= y <= bottom for x, y in points)
    assert points == sorted(points)  # steps increase left to right
    assert points[0][1] < points[-1][1]  # the loss falls: y (pointing down) grows


def test_svg_escapes_the_title():
    title = 'Run <1> & "quoted" \x01'
    text = loss_curve_svg(run_metrics(), title=title)
    assert "&lt;1&gt; &amp;" in text and "<1>" not in text
    root = ElementTree.fromstring(text)
    assert root.find(f"{SVG}title").text == 'Run <1> & "quoted" '
    with pytest.raises(TypeError, match="title"):
        loss_curve_svg([], title=None)


def test_svg_is_self_contained_and_deterministic():
    text = loss_curve_svg(run_metrics())
    assert text == loss_curve_svg(iter(run_metrics()))
    lowered = text.lower()
    for forbidden in ("<script", "href", "<style", "url(", "@import", "onload"):
        assert forbidden not in lowered
    assert "nan" not in lowered and "inf" not in lowered


def test_svg_without_data_says_so():
    for metrics in ([], [train(1, math.nan), validation(2, math.inf)], [Metric("test", 1, 2.0)]):
        root = ElementTree.fromstring(loss_curve_svg(metrics, title="Empty"))
        assert [element.text for element in by_class(root, "no-data")] == ["no data"]
        assert not by_class(root, "series-train") and not by_class(root, "series-validation")
        assert root.find(f"{SVG}title").text == "Empty"


def test_svg_skips_non_finite_losses_and_odd_steps():
    metrics = [
        train(1, 3.0),
        train(2, math.nan),
        train(3, math.inf),
        train(4, 2.0),
        Metric("train", None, 1.0),
        SimpleNamespace(phase="train", step=5, loss=1.5),  # duck-typed
        SimpleNamespace(phase="train", step=6),  # no loss
        validation(4, -math.inf),
    ]
    root = ElementTree.fromstring(loss_curve_svg(metrics))
    (train_group,) = by_class(root, "series-train")
    assert train_group.get("data-points") == "3"
    assert len(polyline_points(train_group)) == 3
    assert not by_class(root, "series-validation")
    (legend,) = by_class(root, "legend")
    assert [element.text for element in legend.iter(f"{SVG}text")] == ["train"]


def test_svg_of_one_point():
    root = ElementTree.fromstring(loss_curve_svg([validation(0, 2.5)]))
    (group,) = by_class(root, "series-validation")
    assert list(group.iter(f"{SVG}polyline")) == []
    assert len(list(group.iter(f"{SVG}circle"))) == 1
    assert len(tick_labels(root, "axis-x")) >= 2 and len(tick_labels(root, "axis-y")) >= 2
    root = ElementTree.fromstring(loss_curve_svg([train(7, 2.5)]))
    (group,) = by_class(root, "series-train")
    assert len(list(group.iter(f"{SVG}circle"))) == 1


def test_svg_of_a_constant_loss():
    text = loss_curve_svg([train(step, 1.75) for step in range(1, 11)])
    root = ElementTree.fromstring(text)
    labels = tick_labels(root, "axis-y")
    assert len(set(labels)) == len(labels) >= 2
    (group,) = by_class(root, "series-train")
    ys = {y for _, y in polyline_points(group)}
    assert len(ys) == 1
    assert "nan" not in text.lower() and "inf" not in text.lower()
    # A constant zero loss and a single step with several losses work too.
    for metrics in ([train(step, 0.0) for step in range(3)], [train(5, 1.0), validation(5, 2.0)]):
        ElementTree.fromstring(loss_curve_svg(metrics))


def test_write_loss_curve_svg_is_atomic(tmp_path):
    path = tmp_path / "loss.svg"
    path.write_text("old", encoding="utf-8")
    written = write_loss_curve_svg(str(path), run_metrics(), title="Run")
    assert written == path and isinstance(written, Path)
    assert path.read_text(encoding="utf-8") == loss_curve_svg(run_metrics(), title="Run")
    assert os.listdir(tmp_path) == ["loss.svg"]  # no temporary file left behind
    with pytest.raises(IsADirectoryError):
        write_loss_curve_svg(tmp_path, [])
    assert os.listdir(tmp_path) == ["loss.svg"]


def test_loss_curve_sink_collects_and_writes(tmp_path):
    sink = LossCurveSink(title="Collected")
    assert sink.metrics == ()
    metrics = run_metrics()
    for metric in metrics:
        sink(metric)
    assert sink.metrics == tuple(metrics)
    assert isinstance(sink.metrics, tuple)
    path = sink.write(tmp_path / "curve.svg")
    assert path.read_text(encoding="utf-8") == loss_curve_svg(metrics, title="Collected")
    assert sink.svg() == loss_curve_svg(metrics, title="Collected")
    with pytest.raises(TypeError):
        LossCurveSink(title=3)


def test_metric_fanout_calls_sinks_in_order(tmp_path):
    seen = []
    curve = LossCurveSink()
    with JsonlMetricSink(tmp_path / "m.jsonl") as log:
        fanout = MetricFanout(
            lambda metric: seen.append(("a", metric.step)),
            log,
            curve,
            lambda metric: seen.append(("b", metric.step)),
        )
        fanout(train(1, 2.0))
        fanout(train(2, 1.0))
    assert seen == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert len(curve.metrics) == 2
    assert len((tmp_path / "m.jsonl").read_text(encoding="utf-8").splitlines()) == 2
    assert len(fanout.sinks) == 4
    MetricFanout()(train(1, 1.0))  # no sinks: nothing happens
    with pytest.raises(TypeError, match="sink 1"):
        MetricFanout(print, "not callable")


# ---- progress bar --------------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TerminalStream(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def columns(monkeypatch):
    """Set the terminal width shutil.get_terminal_size reports (through $COLUMNS)."""

    def set_columns(count: int) -> None:
        monkeypatch.setenv("COLUMNS", str(count))

    set_columns(120)
    return set_columns


def frames(output: str) -> list[str]:
    """The successive redraws of an interactive bar (trailing padding removed)."""
    assert output.startswith("\r")
    return [frame.rstrip(" \n") for frame in output.split("\r")[1:]]


def test_interactive_redraws_one_line_and_ends_it_on_close(columns):
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(200, stream, label="train", interactive=True, clock=clock)
    for step in range(1, 13):
        clock.advance(0.5)
        bar.update(step, loss=3.21401, tokens_per_second=12345.4)
    assert "\n" not in stream.getvalue()
    bar.close()
    output = stream.getvalue()
    assert output.endswith("\n") and output.count("\n") == 1
    last = frames(output)[-1]
    assert re.fullmatch(
        r"train \[#*\.*\]  12/200   6% ETA 0:01:34 2\.00 step/s loss 3\.2140 tok/s 12,345", last
    ), last
    bar_text = re.search(r"\[([#.]*)\]", last).group(1)
    assert len(bar_text) == 40 and bar_text.count("#") == 12 * 40 // 200
    bar.close()  # idempotent
    assert stream.getvalue() == output
    with pytest.raises(RuntimeError, match="closed"):
        bar.update(13)


def test_interactive_bar_keeps_its_width_and_fills_at_the_end(columns):
    clock, stream = FakeClock(), io.StringIO()
    with ProgressBar(100, stream, interactive=True, clock=clock, minimum_interval=0) as bar:
        for step in (1, 9, 10, 99, 100):
            clock.advance(1)
            bar.update(step)
    drawn = frames(stream.getvalue())
    assert len(drawn) == 5
    assert len({len(re.search(r"\[[#.]*\]", frame).group()) for frame in drawn}) == 1
    assert re.fullmatch(r"\[#+\] 100/100 100% ETA 0:00:00 20\.00 step/s", drawn[-1])
    assert drawn[0].startswith("[")  # no label, no leading space


def test_interactive_fits_a_narrow_terminal(columns):
    for width in (60, 40, 20):
        columns(width)
        clock, stream = FakeClock(), io.StringIO()
        with ProgressBar(1000, stream, label="epoch", interactive=True, clock=clock) as bar:
            clock.advance(1)
            bar.update(10, loss=2.0, tokens_per_second=1e6)
        assert all(len(frame) <= width - 1 for frame in frames(stream.getvalue()))


def test_interactive_pads_over_a_longer_previous_line(columns):
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(10, stream, interactive=True, clock=clock, minimum_interval=0)
    clock.advance(1)
    bar.update(1, loss=2.0, validation_loss=2.5, tokens_per_second=100.0)
    clock.advance(1)
    bar.update(2, validation_loss=None, tokens_per_second=None)
    first, second = stream.getvalue().split("\r")[1:]
    assert len(second) == len(first) and second.endswith(" ")
    assert "loss 2.0000" in second and "val_loss" not in second and "tok/s" not in second


def test_interactive_throttles_but_always_draws_the_first_and_final(columns):
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(10, stream, interactive=True, clock=clock, minimum_interval=1.0)
    for step in range(1, 11):
        clock.advance(0.25)
        bar.update(step)
    counts = [re.search(r"(\d+)/10", frame).group(1) for frame in frames(stream.getvalue())]
    assert counts == ["1", "5", "9", "10"]  # first, every second, the final one


def test_interactive_close_draws_a_throttled_update(columns):
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(10, stream, interactive=True, clock=clock, minimum_interval=60)
    for step in range(1, 6):
        clock.advance(1)
        bar.update(step)
    assert len(frames(stream.getvalue())) == 1
    bar.close()
    drawn = frames(stream.getvalue())
    assert len(drawn) == 2 and " 5/10 " in drawn[-1]
    assert stream.getvalue().endswith("\n")


def test_eta_formatting(columns):
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(10_001, stream, interactive=False, clock=clock, plain_interval=0)
    bar.update(0)  # no progress: unknown
    clock.advance(1)
    bar.update(1)  # 1 step/s, 10,000 s left
    clock.advance(0.5)
    bar.update(10_000)  # the remaining step is ~0.00015 s away
    lines = stream.getvalue().splitlines()
    assert lines == [
        "0/10001 (0%) eta --:--",
        "1/10001 (0%) eta 2:46:40 1.00 step/s",
        "10000/10001 (99%) eta 0:00:00 6666.67 step/s",
    ]
    clock2, stream2 = FakeClock(), io.StringIO()
    bar2 = ProgressBar(
        5, stream2, interactive=False, clock=clock2, unit="batch", plain_interval=0
    )
    bar2.update(1)  # no time has passed: unknown
    assert stream2.getvalue() == "1/5 (20%) eta --:--\n"
    clock2.advance(2)
    bar2.update(4)  # half a second left rounds up, not down to zero
    assert stream2.getvalue().splitlines()[-1] == "4/5 (80%) eta 0:00:01 2.00 batch/s"


def test_plain_lines_throttled_with_first_and_last():
    clock, stream = FakeClock(), io.StringIO()
    with ProgressBar(20, stream, label="train", interactive=False, clock=clock) as bar:
        for step in range(1, 21):
            clock.advance(1)
            bar.update(step, loss=3.21401, tokens_per_second=12345.4)
    lines = stream.getvalue().splitlines()
    counts = [int(re.match(r"train (\d+)/20", line).group(1)) for line in lines]
    assert counts == [1, 6, 11, 16, 20]
    assert stream.getvalue().endswith("\n") and "\r" not in stream.getvalue()
    assert lines[0] == "train 1/20 (5%) eta 0:00:19 1.00 step/s loss 3.2140 tok/s 12345"
    assert lines[-1] == "train 20/20 (100%) eta 0:00:00 1.00 step/s loss 3.2140 tok/s 12345"


def test_plain_close_writes_the_last_throttled_update():
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(100, stream, interactive=False, clock=clock)
    for step in range(1, 8):
        clock.advance(1)
        bar.update(step, validation_loss=3.1)
    bar.close()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["1/100", "6/100", "7/100"]
    assert lines[-1].endswith("val_loss 3.1000")


def test_plain_line_format_matches_the_documented_example():
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(200, stream, label="label", interactive=False, clock=clock)
    clock.advance(6)
    bar.update(12, loss=3.214, tokens_per_second=12345.0)
    assert stream.getvalue() == (
        "label 12/200 (6%) eta 0:01:34 2.00 step/s loss 3.2140 tok/s 12345\n"
    )


def test_fields_persist_until_replaced_or_cleared():
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(10, stream, interactive=False, clock=clock, plain_interval=0)
    clock.advance(1)
    bar.update(1, loss=2.5, validation_loss=2.75)
    clock.advance(1)
    bar.update(2, loss=2.25)
    clock.advance(1)
    bar.update(3, validation_loss=None)
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("loss 2.5000 val_loss 2.7500")
    assert lines[1].endswith("loss 2.2500 val_loss 2.7500")
    assert lines[2].endswith("loss 2.2500")


def test_completed_beyond_total_is_clamped():
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(200, stream, interactive=False, clock=clock)
    clock.advance(10)
    bar.update(250)
    assert bar.completed == 200
    assert stream.getvalue().startswith("200/200 (100%) eta 0:00:00")


def test_initial_progress_does_not_count_towards_the_rate():
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(200, stream, interactive=False, clock=clock, initial=100)
    clock.advance(10)
    bar.update(110)
    assert stream.getvalue() == "110/200 (55%) eta 0:01:30 1.00 step/s\n"


def test_interactive_defaults_to_isatty_and_stream_to_stderr(capsys):
    assert not ProgressBar(5, io.StringIO()).interactive
    assert ProgressBar(5, TerminalStream()).interactive
    assert not ProgressBar(5, TerminalStream(), interactive=False).interactive
    with ProgressBar(3, label="default", clock=FakeClock()) as bar:
        bar.update(3)
    captured = capsys.readouterr()
    assert captured.out == "" and "default 3/3 (100%)" in captured.err


def test_context_manager_ends_the_line_on_an_exception(columns):
    stream = TerminalStream()
    with pytest.raises(KeyError):
        with ProgressBar(10, stream, clock=FakeClock()) as bar:
            bar.update(3)
            raise KeyError("stop")
    assert bar.closed and stream.getvalue().endswith("\n")
    untouched = TerminalStream()
    ProgressBar(10, untouched).close()  # never drawn: nothing to end
    assert untouched.getvalue() == ""


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"total": 0}, ValueError),
        ({"total": -3}, ValueError),
        ({"total": 2.0}, TypeError),
        ({"total": True}, TypeError),
        ({"total": "10"}, TypeError),
        ({"total": 10, "label": 3}, TypeError),
        ({"total": 10, "unit": ""}, ValueError),
        ({"total": 10, "interactive": 1}, TypeError),
        ({"total": 10, "minimum_interval": -0.1}, ValueError),
        ({"total": 10, "minimum_interval": math.nan}, ValueError),
        ({"total": 10, "plain_interval": "5"}, TypeError),
        ({"total": 10, "clock": 3.0}, TypeError),
        ({"total": 10, "initial": 11}, ValueError),
    ],
)
def test_constructor_validation(arguments, error):
    with pytest.raises(error):
        ProgressBar(stream=io.StringIO(), **arguments)


def test_update_validation():
    stream = io.StringIO()
    bar = ProgressBar(10, stream, interactive=False, clock=FakeClock())
    with pytest.raises(ValueError, match="completed"):
        bar.update(-1)
    with pytest.raises(TypeError, match="completed"):
        bar.update(1.5)
    with pytest.raises(TypeError, match="completed"):
        bar.update(True)
    with pytest.raises(TypeError, match="unexpected field 'los'"):
        bar.update(1, los=2.0)
    with pytest.raises(TypeError, match="loss"):
        bar.update(1, loss="2.0")
    assert stream.getvalue() == ""  # nothing was recorded by the failed calls
    bar.update(1, loss=math.inf)
    assert stream.getvalue().endswith("loss inf\n")


def test_the_curve_draws_the_learning_rate_on_its_own_axis_when_metrics_carry_it():
    from riftco_transformer.reporting import loss_curve_svg
    from riftco_transformer.training import TrainingMetric

    # A warmup then a decay: 0.5e-3, 1e-3, then down to 0.25e-3.
    rates = [0.5e-3, 1e-3, 0.75e-3, 0.5e-3, 0.25e-3]
    metrics = [TrainingMetric("train", step, 3.0 - 0.2 * step, 1.0, learning_rate=rate)
               for step, rate in enumerate(rates, start=1)]
    metrics.append(TrainingMetric("validation", 5, 2.5, 1.0))
    svg = loss_curve_svg(metrics)
    assert 'class="series-rate" data-points="5"' in svg
    assert ">learning rate</text>" in svg and 'class="axis-rate"' in svg
    # The rate axis runs from 0 to a round value at or above 1e-3, labelled on the right.
    assert ">0.0000</text>" in svg and ">0.0010</text>" in svg
    import re

    (points,) = re.findall(r'<g class="series-rate"[^>]*>\s*<polyline points="([^"]+)"', svg)
    ys = [float(point.split(",")[1]) for point in points.split()]
    assert ys[1] == min(ys) and ys[4] == max(ys)  # the peak is highest, the floor lowest
    assert all(0 <= float(p.split(",")[0]) <= 720 for p in points.split())
    # Without rates (older metrics files), the chart is what it was.
    plain = loss_curve_svg([TrainingMetric("train", 1, 3.0, 1.0),
                            TrainingMetric("train", 2, 2.0, 1.0)])
    assert "series-rate" not in plain and "learning rate" not in plain
