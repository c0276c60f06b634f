"""Real HyMCache daemons for the Python tests and benchmarks.

Starts //master:hymcache-master and //storage_node:hymcache-storage from the
runfiles as child processes on 127.0.0.1 with port 0 and reads the bound
addresses from the one line each prints when it is serving (as
tests/daemon.cc does for the C++ tests). Logs go to files in the cluster's
directory (under TEST_TMPDIR).

    with Cluster(nodes=1) as c:
        client = hymcache.Client([c.address], transport="tcp")
"""

import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import hymcache
from runfiles import runfile  # noqa: F401 (tests use it from here)


class Daemon:
    """A child process that prints one line when it is serving."""

    def __init__(self, argv, log_path, timeout=30.0):
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=self._log)
        self.ready_line = self._read_line(timeout, argv[0])

    def _read_line(self, timeout, name):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RuntimeError(f"{name} did not report ready: {line!r}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            c = os.read(fd, 1)
            if not c:
                self.kill()
                raise RuntimeError(f"{name} exited before it was ready "
                                   f"(log: {self._log.name})")
            line += c
        return line.decode().strip()

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def pause(self, timeout=10.0):
        """SIGSTOPs the daemon and waits until it is stopped (a signal is
        delivered asynchronously: a busy machine lets it run on a moment)."""
        self.signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state in ("T", "t"):
                return
            time.sleep(0.001)
        raise RuntimeError(f"pid {self.proc.pid} did not stop")

    def resume(self):
        self.signal(signal.SIGCONT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A one-member etcd cluster (Debian's etcd-server) on loopback, as
    tests/etcd_cluster.h starts for the C++ tests; `endpoint` is its client
    address, host:port."""

    def __init__(self, timeout=30.0):
        self.dir = tempfile.mkdtemp(prefix="hymcache-etcd-",
                                    dir=os.environ.get("TEST_TMPDIR"))
        client, peer = _free_port(), _free_port()
        self.endpoint = f"127.0.0.1:{client}"
        self._log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            ["/usr/bin/etcd", "--name", "m0",
             "--data-dir", os.path.join(self.dir, "m0"),
             "--listen-client-urls", f"http://{self.endpoint}",
             "--advertise-client-urls", f"http://{self.endpoint}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"m0=http://127.0.0.1:{peer}",
             "--heartbeat-interval", "50", "--election-timeout", "500",
             "--logger", "zap", "--log-level", "warn"],
            stdout=self._log, stderr=self._log)
        # Serving once its client port accepts (a master retries its first
        # campaign until etcd answers).
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.close()
                raise RuntimeError("etcd exited; log in " + self.dir)
            try:
                socket.create_connection(("127.0.0.1", client), 1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("etcd did not listen; log in " +
                                       self.dir)
                time.sleep(0.02)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Cluster:
    """A master and `nodes` storage nodes (DRAM devices of `dram_bytes`).
    With `etcd` (an endpoint), the master campaigns to lead cluster
    `cluster_name` there (docs/ha.md) and the cluster waits until it leads."""

    def __init__(self, nodes=1, dram_bytes=256 << 20, master_flags=(),
                 node_flags=(), etcd=None, cluster_name="default"):
        self.dir = tempfile.mkdtemp(prefix="hymcache-py-",
                                    dir=os.environ.get("TEST_TMPDIR"))
        self.nodes = {}
        self._dram_bytes = dram_bytes
        self._node_flags = list(node_flags)
        prefix = "hymcache-master listening on "
        if etcd is not None:
            prefix = "hymcache-master standing by on "
            master_flags = [f"--etcd={etcd}", f"--cluster={cluster_name}",
                            "--lease_ttl_s=1", *master_flags]
        self.master = Daemon(
            [runfile("master/hymcache-master"),
             f"--db_path={self.dir}/master", "--listen=127.0.0.1:0",
             "--logtostderr", *master_flags],
            os.path.join(self.dir, "master.log"))
        if not self.master.ready_line.startswith(prefix):
            self.close()
            raise RuntimeError(f"master said {self.master.ready_line!r}")
        self.address = self.master.ready_line[len(prefix):]
        try:
            for i in range(nodes):
                self.add_node(f"node-{i}")
            self.wait_alive(nodes)
        except Exception:
            self.close()
            raise

    def add_node(self, name):
        self.nodes[name] = Daemon(
            [runfile("storage_node/hymcache-storage"),
             f"--master={self.address}", f"--name={name}", "--data_port=0",
             "--control_port=0", f"--dram_bytes={self._dram_bytes}",
             "--logtostderr", *self._node_flags],
            os.path.join(self.dir, f"{name}.log"))
        return self.nodes[name]

    def wait_alive(self, count, timeout=30.0):
        """Waits until the master lists `count` live nodes."""
        with hymcache.Client([self.address], transport="tcp") as c:
            deadline = time.monotonic() + timeout
            alive = 0
            while time.monotonic() < deadline:
                try:
                    alive = sum(n["alive"] for n in c.stats()["nodes"])
                    if alive == count:
                        return
                except (hymcache.Unavailable, hymcache.Cancelled):
                    # Cancelled: a call in flight while an elected master
                    # takes its port over from its standby server can end
                    # so (seen under asan; the standby now answers the calls
                    # it took before it closes, but not every such call is
                    # one it took).
                    pass
                time.sleep(0.02)
        raise RuntimeError(f"{alive} live nodes, expected {count}")

    def node_name(self, client, node_id):
        for n in client.stats()["nodes"]:
            if n["node_id"] == node_id:
                return n["name"]
        raise KeyError(node_id)

    def hymctl(self, *args):
        return subprocess.run(
            [runfile("tools/hymctl/hymctl"), f"--master={self.address}",
             *args], check=True, capture_output=True, text=True).stdout

    def close(self):
        for d in self.nodes.values():
            d.kill()
        self.master.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def store_until_stored(client, keys, buffers, parent_key=None, timeout=30.0):
    """Stores until every key is stored: a node accepts writes a moment
    after the master lists it alive (once it applied its registration)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = client.store(keys, buffers, parent_key=parent_key).result()
            if r.stored + r.skipped == len(keys):
                return r
            why = f"{r} {r.errors}"
        except hymcache.Error as e:
            why = repr(e)
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not store: {why}")
        time.sleep(0.02)
