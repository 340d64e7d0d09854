"""Where a stream's store is: the Mooncake master's RPC port and its HTTP metadata server.

Written `HOST:RPC_PORT/METADATA_PORT` (one string for a command line: `--from-stream`,
`stream-put --to`), parsed once into a frozen `StreamAddress`; a bad one is a one-line error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import EngineError

_FORM = re.compile(r"^([A-Za-z0-9.\-]+):(\d{1,5})/(\d{1,5})$")


@dataclass(frozen=True)
class StreamAddress:
    host: str
    rpc_port: int
    metadata_port: int

    @classmethod
    def parse(cls, text: str, what: str = "--from-stream") -> StreamAddress:
        m = _FORM.match(text.strip())
        if m is None:
            raise EngineError(f"{what} {text!r}: expected HOST:RPC_PORT/METADATA_PORT (the "
                              "address `stream-master` prints)")
        host, rpc, meta = m.group(1), int(m.group(2)), int(m.group(3))
        for name, port in (("RPC_PORT", rpc), ("METADATA_PORT", meta)):
            if not 0 < port < 65536:
                raise EngineError(f"{what} {text!r}: {name} {port} is not a TCP port")
        return cls(host, rpc, meta)

    @property
    def master(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    def __str__(self) -> str:
        return f"{self.host}:{self.rpc_port}/{self.metadata_port}"
