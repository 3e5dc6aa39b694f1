"""Re-probing an unreachable MinerU server: on schedule, off the supervisor's thread, and
only "back" once the server answers with the model we need. The clock is ticked by hand."""

from __future__ import annotations

from daemon.config.settings import EngineHttpConfig
from daemon.engines.mineru.runtimes.http import ServerProbe
from daemon.supervisor.reprobe import Reprobe

SETTINGS = EngineHttpConfig(server_url="http://gpu:8000", model_name="mineru")


class Answers:
    """A probe function replaying what the server says, one answer per call."""

    def __init__(self, *answers: ServerProbe) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, settings: EngineHttpConfig) -> ServerProbe:
        self.calls += 1
        return self.answers.pop(0)


def settle(r: Reprobe) -> None:
    if r._thread is not None:
        r._thread.join(5)


def test_probes_once_per_interval_and_reports_back_only_with_the_model() -> None:
    down = ServerProbe("http://gpu:8000", reachable=False, error="cannot connect")
    wrong = ServerProbe("http://gpu:8000", reachable=True, healthy=True, models=("other",))
    up = ServerProbe("http://gpu:8000", reachable=True, healthy=True, models=("mineru",))
    answers = Answers(down, wrong, up)
    r = Reprobe(SETTINGS, interval=60, probe=answers)

    assert not r.back(0.0)  # the failed load was the first look: the next is due at 60
    assert not r.back(59.0)
    assert answers.calls == 0
    assert not r.back(60.0)
    settle(r)
    assert answers.calls == 1 and r.last_error == "cannot connect"
    assert not r.back(61.0)  # not due again before 120
    settle(r)
    assert answers.calls == 1
    r.back(120.0)
    settle(r)
    assert "no model 'mineru'" in (r.last_error or "") and "it serves: other" in r.last_error
    r.back(180.0)
    settle(r)
    assert r.back(181.0)
    assert answers.calls == 3
