"""The consumer child talks to the parent only in reply, so it never blocks on a full pipe."""

import asyncio
import multiprocessing

from bench.consumers import serve_parent
from bench.pacing import Window
from bench.tally import Tally


def test_the_child_sends_nothing_unasked() -> None:
    parent, child = multiprocessing.Pipe()
    tally = Tally(Window(0, 0))
    tally.received = 7
    for _ in range(1000):  # far more loop turns than a socket buffer holds reports
        serve_parent(child, tally, asyncio.Event())
    assert not parent.poll()


def test_a_progress_request_gets_the_count_received() -> None:
    parent, child = multiprocessing.Pipe()
    tally = Tally(Window(0, 0))
    tally.received = 42
    parent.send(("progress",))
    serve_parent(child, tally, asyncio.Event())
    assert parent.recv() == ("progress", 42)
    assert not parent.poll()


def test_window_and_stop_commands_take_effect() -> None:
    parent, child = multiprocessing.Pipe()
    tally = Tally(Window(0, 0))
    stop = asyncio.Event()
    parent.send(("window", 10, 20))
    parent.send(("stop",))
    serve_parent(child, tally, stop)
    assert tally.window == Window(10, 20)
    assert stop.is_set()
