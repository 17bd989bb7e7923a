"""The API's uvicorn server, with vLLM's shutdown: on SIGTERM (or Ctrl-C) it stops taking
connections, lets the requests in flight run for `--shutdown-timeout` seconds (vLLM's flag;
0 by default), then ends the ones still open with a 503 (a stream with an error event), so
the process exits at once instead of waiting for the longest answer to finish."""

import asyncio

import uvicorn

from pagedllm.engine.protocol import EngineClient
from pagedllm.logger import init_logger

logger = init_logger(__name__)


class APIServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: EngineClient, shutdown_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout

    async def shutdown(self, sockets: list | None = None) -> None:
        """uvicorn's shutdown (close the listeners, wait for the connections), while the
        engine's open requests are ended once `shutdown_timeout` has passed."""
        ender = asyncio.ensure_future(self._end_requests_after(self.shutdown_timeout))
        try:
            await super().shutdown(sockets)
        finally:
            ender.cancel()

    async def _end_requests_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        logger.info("shutting down: ending the requests still open (--shutdown-timeout)")
        await self.engine.shutdown()
