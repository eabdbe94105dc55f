"""A fake clock for the bench's tests: no GPU, deterministic times."""

import contextlib


class FakeClock:
    """A call 'takes' ``seconds``; a graph replay ``graph_factor`` of that. Loops and captures are counted."""

    name = "fake"

    def __init__(self, seconds, graph_factor=0.5):
        self.seconds, self.graph_factor, self.loops, self.captures, self.syncs = seconds, graph_factor, [], 0, 0

    def on(self):
        return contextlib.nullcontext()

    def synchronize(self):
        self.syncs += 1

    def loop_seconds(self, fn, loop):
        for _ in range(loop):
            fn()
        self.loops.append(loop)
        return self.seconds * (self.graph_factor if getattr(fn, "replay", False) else 1.0)

    def capture(self, fn):
        self.captures += 1
        fn()

        def replay():
            fn()

        replay.replay = True
        return replay
