"""An asyncio event loop for the sandbox: asyncio's default loop wants a
self-pipe socket pair, which the sandbox refuses. This loop has no
selector: it runs ready callbacks and sleeps until the next timer, so
coroutines, tasks, `gather`, queues, events and `asyncio.sleep` work; I/O
watchers (sockets, pipes) do not exist in the sandbox anyway."""

import asyncio
import asyncio.base_events
import time
import warnings


class _NoSelector:
    def select(self, timeout=None):
        if timeout:
            time.sleep(timeout)
        return []

    def close(self):
        pass


class SandboxEventLoop(asyncio.base_events.BaseEventLoop):
    """A selector-free event loop."""

    def __init__(self):
        super().__init__()
        self._selector = _NoSelector()

    def _process_events(self, event_list):
        pass

    def _write_to_self(self):
        pass


class _Policy(asyncio.DefaultEventLoopPolicy):
    _loop_factory = SandboxEventLoop


def install():
    """Makes `asyncio.run`, `asyncio.new_event_loop` and friends use the
    sandbox loop, and runs `async def` initialize/execute/finalize on one."""
    import tern_plugin

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop_policy(_Policy())
    loops = []

    def run(coro):
        if not loops:
            loops.append(SandboxEventLoop())
        return loops[0].run_until_complete(coro)

    tern_plugin._event_loop_runner = run
