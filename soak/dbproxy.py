"""The soak's cut-able database link (soak/run.py): testkit/servers.TcpProxy in a process of its
own, so that forwarding every query of the stack does not compete with the orchestrator for
one interpreter lock. SIGUSR1 cuts it (every connection dropped, new ones refused), SIGUSR2
restores it on the same port.

    python -m soak.dbproxy TARGET_HOST TARGET_PORT PORT_FILE
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from testkit.servers import TcpProxy


def main() -> None:
    proxy = TcpProxy(sys.argv[1], int(sys.argv[2]))
    up = [True]

    def switch(on: bool) -> None:  # a second cut, or a second restore, changes nothing
        if up[0] != on:
            up[0] = on
            (proxy.start if on else proxy.stop)()

    signal.signal(signal.SIGUSR1, lambda *_: switch(False))
    signal.signal(signal.SIGUSR2, lambda *_: switch(True))
    Path(sys.argv[3]).write_text(str(proxy.port))
    threading.Event().wait()


if __name__ == "__main__":
    main()
