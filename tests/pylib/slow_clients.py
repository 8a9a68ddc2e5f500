"""Idle and slowloris clients against an HTTP front door (docs/reliability.md, "Idle and slow
clients"): used by tests/apps/idle_clients_test.py and bench/idle_clients_soak.py.

IdleClients opens N TCP connections that send nothing; Slowloris keeps M connections that send
a request head one header line every `interval_s` seconds and never finish it, reopening any the
server closes (as a slowloris attacker does). Python standard library only.
"""

import resource
import socket
import threading
import time


def raise_nofile(want):
    """Raises this process's soft RLIMIT_NOFILE to at least `want` (at most the hard limit);
    returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(max(soft, want), hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _connect(host, port, timeout=10.0):
    s = socket.create_connection((host, port), timeout=timeout)
    s.setblocking(False)
    return s


class IdleClients:
    """`n` connections to host:port that send nothing; counts those the server closed."""

    def __init__(self, host, port, n):
        self.socks = []
        self.failed = 0
        for _ in range(n):
            try:
                self.socks.append(_connect(host, port))
            except OSError:
                self.failed += 1

    def closed_by_server(self):
        """How many of the connections the server has closed (or answered) so far."""
        n = 0
        for s in self.socks:
            try:
                s.recv(1, socket.MSG_PEEK)  # b"": closed; bytes: answered (503 over the cap)
                n += 1
            except BlockingIOError:
                pass
            except OSError:
                n += 1
        return n

    def close(self):
        for s in self.socks:
            s.close()
        self.socks = []


class Slowloris:
    """`n` connections sending `GET / HTTP/1.1` then one header line every `interval_s`, never
    the blank line; a connection the server closes is reopened. `answers` counts what the server
    sent before closing, by status line (e.g. {"408": 12})."""

    def __init__(self, host, port, n, interval_s=2.0):
        self.host, self.port, self.interval_s = host, port, interval_s
        self.socks = [self._open() for _ in range(n)]
        self.reopened = 0
        self.answers = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self):
        try:
            s = _connect(self.host, self.port)
            s.send(b"GET /health HTTP/1.1\r\nHost: slow\r\n")
            return s
        except OSError:
            return None

    def _run(self):
        line = 0
        while not self._stop.wait(self.interval_s):
            line += 1
            for i, s in enumerate(self.socks):
                if s is not None:
                    try:
                        head = s.recv(64)  # the server answered or closed: reopen
                        if head.startswith(b"HTTP/1.1 "):
                            code = head[9:12].decode()
                            self.answers[code] = self.answers.get(code, 0) + 1
                    except BlockingIOError:
                        try:
                            s.send(b"X-Slow-%d: %d\r\n" % (line, line))
                            continue
                        except OSError:
                            pass
                    except OSError:
                        pass
                    s.close()
                self.socks[i] = self._open()
                self.reopened += 1

    def close(self):
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            if s is not None:
                s.close()


def timed_get(host, port, path, timeout):
    """GET `path` on a fresh connection: (status or 0, milliseconds)."""
    t0 = time.perf_counter()
    try:
        c = socket.create_connection((host, port), timeout=timeout)
        c.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = c.recv(4096)
            if not chunk:
                break
            data += chunk
        c.close()
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
    except (OSError, ValueError, IndexError):
        status = 0
    return status, (time.perf_counter() - t0) * 1e3
