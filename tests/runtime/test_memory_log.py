"""The export's memory log: resident memory and time per step, the peak credited to the step that
reached it, the longest step named."""
import logging

from specdeploy.runtime import memory_log


def test_the_peak_is_credited_to_the_first_step_after_which_it_was_seen(monkeypatch):
    readings = iter([(100.0, 120.0), (900.0, 2500.0), (400.0, 2500.0)])
    clock = iter([0.0, 2.0, 3.5, 40.0])
    monkeypatch.setattr(memory_log, "_resident_mb", lambda: next(readings))
    monkeypatch.setattr(memory_log.time, "monotonic", lambda: next(clock))
    log = memory_log.MemoryLog()
    for step in ("loading the model", "tracing the graphs", "validating"):
        log.mark(step)
    assert [m.seconds for m in log.marks] == [2.0, 1.5, 36.5]
    assert log.summary() == ("peak resident memory 2,500 MB, reached while tracing the graphs; "
                             "the longest step validating, 36.5 s")


def test_each_step_is_logged_and_the_readings_are_this_process(caplog):
    log = memory_log.MemoryLog()
    with caplog.at_level(logging.INFO, logger="specdeploy"):
        log.mark("a step")
    mark = log.marks[0]
    assert 0 < mark.resident_mb <= mark.peak_mb and mark.seconds >= 0 and "memory after a step (" in caplog.text
    assert memory_log.MemoryLog().summary() == "peak resident memory not measured"


def test_steps_mark_the_log_a_command_records_and_nothing_otherwise():
    memory_log.mark("outside any command")  # a no-op
    with memory_log.recording() as outer:
        memory_log.mark("loading")
        with memory_log.recording() as inner:  # quantizing inside an export: one log
            memory_log.mark("quantizing")
        assert inner is outer
    assert [m.step for m in outer.marks] == ["loading", "quantizing"]
    with memory_log.recording() as fresh:
        assert fresh is not outer and fresh.marks == []
