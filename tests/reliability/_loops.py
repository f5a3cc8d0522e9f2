"""An event loop for sweeps that cancel a call at every iteration: it counts its
iterations (each a round of callbacks, however long it waited for I/O) and can run a
function at the start of a given one, so every point where the call could be cancelled is
hit, with no busy-waiting in between."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts its iterations and can run a function at the start of
    a given one, before that iteration's callbacks."""

    def __init__(self) -> None:
        super().__init__()
        self.iteration = 0
        self._due: tuple[int, Callable[[], object]] | None = None

    def at(self, iteration: int, fn: Callable[[], object]) -> None:
        self._due = (iteration, fn)

    def disarm(self) -> bool:
        """Forget the pending function; True if it had run already."""
        fired, self._due = self._due is None, None
        return fired

    def _run_once(self) -> None:
        self.iteration += 1
        due = self._due
        if due is not None and self.iteration >= due[0]:
            self._due = None
            due[1]()
        super()._run_once()  # type: ignore[misc]


async def on_counting_loop(main: Callable[[], Awaitable[None]]) -> None:
    """Run `main()` to its end on a `CountingLoop` of its own (in a worker thread)."""

    def run() -> None:
        with asyncio.Runner(loop_factory=CountingLoop) as runner:
            runner.run(main())

    await asyncio.to_thread(run)


def counting_loop() -> CountingLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, CountingLoop)
    return loop
