"""Enterprise Gateway configuration that deploy/gateway/start always loads (--config).

Kernel websockets without Nagle's algorithm: tornado batches a websocket's small writes
unless its handler calls ``set_nodelay(True)``, which Enterprise Gateway 3.3 (on
jupyter_server 1.24) does not.  A reply then waits for the client's delayed ACK, about
40 ms per request on Linux, which is most of a trivial op's round trip through the gateway.
"""

from enterprise_gateway.services.kernels.handlers import ZMQChannelsHandler

_open = ZMQChannelsHandler.open


def _open_without_nagle(self, *args, **kwargs):
    self.set_nodelay(True)
    return _open(self, *args, **kwargs)


ZMQChannelsHandler.open = _open_without_nagle
