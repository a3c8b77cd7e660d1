"""Thread defaults follow the CPUs the process may run on (a container's CPU set, taskset)."""
import os

import pytest

from specdeploy.backends.base import usable_cpus


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_threads_default_to_the_cpus_the_process_may_use(monkeypatch):
    from specdeploy.backends.onnxruntime import session_options

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 7})
    assert usable_cpus() == 3
    assert session_options().intra_op_num_threads == 3
    assert session_options(threads=1).intra_op_num_threads == 1


def test_without_affinity_the_machine_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cpus() == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cpus() == 6
