"""The stop decision of a one-process run, in this process: a real SIGTERM, no group."""

from __future__ import annotations

import signal

from trainer.preemption import StopRequests


def test_a_sigterm_is_agreed_at_the_next_step_and_exits_as_a_shell_reports_it() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    stops = StopRequests(group=None)
    try:
        stops.begin_step()
        assert not stops.agreed()
        stops.request()  # raises a real SIGTERM, which the handler records
        assert not stops.agreed(), "the step already under way decides on its own flag"
        stops.begin_step()
        assert stops.agreed()
        stopped = stops.stop(step=7)
        assert (stopped.signal_name, stopped.step, stopped.exit_code) == ("SIGTERM", 7, 143)
    finally:
        stops.close()
    assert signal.getsignal(signal.SIGTERM) is previous
