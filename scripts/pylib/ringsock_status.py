"""The one reader of `ringsock-ctl status --json` for the Python scripts
(bench, soak, shim-compare): runs the CLI and returns one typed `Conn` per
reported connection end, parsed with the json module. The field names are
the CLI's (ctl/README.md, `status`)."""

import json
import subprocess
from dataclasses import dataclass, field
from typing import Dict, List, Optional


class StatusError(Exception):
    """The listing could not be had (no daemon, CLI failed or timed out) or
    was not the expected JSON."""


@dataclass(frozen=True)
class Conn:
    session: int
    pid: int
    uid: int
    fd: int
    exe: str
    local: str
    peer: str
    transport: str  # "shm", "rdma" or "tcp"
    reason: str  # why it is on tcp; empty for rings
    ring: Optional[int]  # the ring's id, if it has one
    stats: Dict[str, int] = field(default_factory=dict)  # ring counters

    @property
    def on_ring(self):
        return self.transport in ("shm", "rdma")

    @property
    def key(self):
        """The end's identity across samples."""
        return (self.pid, self.fd, self.local, self.peer)


def parse(text) -> List[Conn]:
    """The connection ends in one `status --json` listing."""
    try:
        listing = json.loads(text)
        out = []
        for c in listing["connections"]:
            ring = c["ring"] or {}
            out.append(Conn(session=int(c["session"]), pid=int(c["pid"]), uid=int(c["uid"]),
                            fd=int(c["fd"]), exe=str(c["exe"]), local=str(c["local"]),
                            peer=str(c["peer"]), transport=str(c["transport"]),
                            reason=str(c["reason"]), ring=ring.get("id"),
                            stats={str(k): int(v) for k, v in (ring.get("stats") or {}).items()}))
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise StatusError(f"not a status listing ({e!r}): {text[:300]!r}") from None


def status(ctl, sock, env=None, timeout=10) -> List[Conn]:
    """`ctl status --json --socket sock`, parsed; `env` is the CLI's
    environment (it must not preload the shim)."""
    try:
        p = subprocess.run([ctl, "status", "--json", "--socket", sock], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StatusError(f"ringsock-ctl status: {e}") from None
    if p.returncode != 0:
        raise StatusError(f"ringsock-ctl status exited {p.returncode}: {p.stderr.strip()}")
    return parse(p.stdout)


if __name__ == "__main__":
    # Self-check against a listing shaped as the CLI writes it.
    sample = ('{"connections":[{"session":16,"pid":42,"uid":0,"fd":7,"exe":"/x","local":"127.0.0.1:1",'
              '"peer":"[::1]:2","transport":"shm","reason":"","ring":{"id":3,"stats":{"c2s_bytes":9}}},'
              '{"session":17,"pid":43,"uid":0,"fd":8,"exe":"","local":"127.0.0.1:3","peer":"127.0.0.1:4",'
              '"transport":"tcp","reason":"no listener","ring":null}]}\n')
    a, b = parse(sample)
    assert (a.pid, a.ring, a.stats, a.on_ring) == (42, 3, {"c2s_bytes": 9}, True), a
    assert (b.ring, b.stats, b.on_ring, b.reason) == (None, {}, False, "no listener"), b
    for bad in ("", "{}", '{"connections":[{"pid":1}]}'):
        try:
            parse(bad)
        except StatusError:
            continue
        raise AssertionError(f"accepted {bad!r}")
    print("ok")
