"""engine/faults.py's `slow` kind: each reach of its point from the nth on takes SLOW_S longer."""
import time

from engine import faults


def test_a_slow_point_sleeps_each_time_from_the_nth_on():
    injected = faults.Faults("step@3:slow")
    took = []
    for _ in range(5):
        t0 = time.monotonic()
        injected.inject("step")
        took.append(time.monotonic() - t0)
    assert all(t < faults.SLOW_S / 2 for t in took[:2]) and all(t >= faults.SLOW_S for t in took[2:])
    injected.inject("reset")  # (a point it does not name: nothing)
