"""TCP between network namespaces, for a program that runs inside a router's namespace as it would
on a router (no --netns) while Kafka and the test run in the root namespace:

    with Forward("dpk-A", ("127.0.0.1", 19092), None, ("127.0.0.1", 19092)):   # Kafka, seen from A
    fwd = Forward(None, ("127.0.0.1", 0), "dpk-A", ("127.0.0.1", 50051))       # the agent, from here
    fwd.port                                                                      # where it listens

The listening socket is opened in one namespace and each outgoing connection in the other
(agent.rtnl.in_netns: a thread that setns()s first; a socket keeps the namespace it was made in).
Threads of this process only: nothing outlives close().
"""

from __future__ import annotations

import socket
import threading

from agent.rtnl import in_netns


class Forward:
    def __init__(
        self, listen_ns: str | None, listen: tuple[str, int], connect_ns: str | None, connect: tuple[str, int]
    ):
        self.connect_ns, self.connect = connect_ns, connect

        def make_listener() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(listen)
            s.listen(64)
            return s

        self.listener = in_netns(listen_ns, make_listener)
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = in_netns(self.connect_ns, lambda: socket.create_connection(self.connect, timeout=5))
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.closed:
                    client.close()
                    upstream.close()
                    return
                self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            socks = list(self.socks)
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(timeout=5)

    def __enter__(self) -> "Forward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
