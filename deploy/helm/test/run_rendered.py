#!/usr/bin/python3
"""Runs the master and storage pods of a rendered chart as local processes.

  run_rendered.py --manifests FILE --bin hymcache-master=PATH
                  --bin hymcache-storage=PATH --probe PATH --workdir DIR

What a kubelet would do with the rendered StatefulSet and DaemonSet, minus
the container: each container's command + args are run as they are, with

  * $(VAR) expanded from the container's env as the kubelet does (NODE_IP is
    127.0.0.1, NODE_NAME rendered-node-0: the downward API's values here);
  * every volumeMount's path mapped to a directory under --workdir (the
    Secret's items written there with the volume's defaultMode, so the
    daemons read the identities and node token the chart generated);
  * the one network difference: 0.0.0.0 becomes 127.0.0.1 and every port 0
    (tests run in parallel), the daemons' printed addresses are used
    instead, and the master's Service name becomes the master's address.

Before rewriting, the probes are checked against the flags: each grpc probe
port is the daemon's gRPC port (--listen / --control_port), named ports
are the container's ports, the storage node's --master names the master
Service and its port. Then the probes run: grpc_probe (a grpc.health.v1 Check
like the kubelet's) on the master (startup/readiness/liveness: SERVING) and
on the storage node's control port until SERVING (readiness: registered with
the master through the Secret's node token), a TCP connect for the node's
liveness probe, GET /metrics on the metrics ports when rendered. Last, SIGTERM
(storage first) and each must exit 0 within its pod's
terminationGracePeriodSeconds.

A rendering with several masters (master.replicas > 1) runs as a three-host
install would: every etcd member of the chart's etcd StatefulSet (each pod's
$(POD_NAME) its own), every master pod and the storage pod, each pod's
Service DNS names (NAME-N.NAME.NAMESPACE.svc:PORT) mapped to a loopback
port of its own. The master probes are then TCP checks of --listen's port;
one master must lead (grpc health SERVING, its "listening on ... epoch=N"),
the others stand by; the node registers (readiness SERVING). Then the
leader's "host" is lost: its master and the etcd member of the same ordinal
are SIGKILLed. Another master must lead with a higher epoch and count the
storage node alive (hymcache_master_node_up 1 on its /metrics: the
rendering needs metrics.enabled), and the node must be SERVING again.
"""

import argparse
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import yaml

DEADLINE_S = 30


class Failure(Exception):
    pass


def find(docs, kind, suffix):
    for d in docs:
        if d.get("kind") == kind and d["metadata"]["name"].endswith(suffix):
            return d
    raise Failure("no %s *%s rendered" % (kind, suffix))


def flag(args, name):
    for a in args:
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
    return None


def port_of(hostport):
    return int(hostport.rsplit(":", 1)[1])


def expand_env(arg, env):
    # The kubelet's $(VAR) expansion; $$(VAR) escapes.
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  arg)


def prepare(workload, docs, workdir, env_values):
    """Returns (argv, container, pod spec) with env and volumes applied."""
    pod = workload["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    env = {}
    for e in ctr.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = env_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
    argv = [expand_env(a, env) for a in (ctr.get("command") or []) + (ctr.get("args") or [])]
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for c in workload["spec"].get("volumeClaimTemplates") or []:
        volumes[c["metadata"]["name"]] = {"name": c["metadata"]["name"], "pvc": True}
    mounts = {}
    name = workload["metadata"]["name"]
    for m in ctr.get("volumeMounts") or []:
        v = volumes.get(m["name"])
        if v is None:
            raise Failure("%s mounts volume %s, which the pod does not have" %
                          (name, m["name"]))
        d = os.path.join(workdir, name, m["name"])
        os.makedirs(d, exist_ok=True)
        if "secret" in v:
            secret = find(docs, "Secret", "-auth")
            if secret["metadata"]["name"] != v["secret"]["secretName"]:
                raise Failure("%s mounts Secret %s, the chart made %s" %
                              (name, v["secret"]["secretName"], secret["metadata"]["name"]))
            data = secret.get("stringData") or {}
            for item in v["secret"]["items"]:
                if item["key"] not in data:
                    raise Failure("Secret has no key %s" % item["key"])
                p = os.path.join(d, item["path"])
                with open(p, "w") as f:
                    f.write(data[item["key"]])
                os.chmod(p, v["secret"].get("defaultMode", 0o644))
        mounts[m["mountPath"].rstrip("/")] = d
    out = []
    for a in argv:
        for mp, d in mounts.items():
            a = re.sub(r"(=)%s(/|$)" % re.escape(mp), lambda m: m.group(1) + d + m.group(2), a)
        out.append(a)
    return out, ctr, pod


def named_port(ctr, name):
    for p in ctr.get("ports") or []:
        if p.get("name") == name:
            return p["containerPort"]
    raise Failure("container %s has no port named %s" % (ctr["name"], name))


def probe_port(ctr, probe, handler):
    p = ctr.get(probe) or {}
    if handler not in p:
        raise Failure("%s: %s is not a %s probe" % (ctr["name"], probe, handler))
    port = p[handler]["port"]
    return named_port(ctr, port) if isinstance(port, str) else port


class Daemon:
    """A started process; stdout lines go to a queue, stderr to a file."""

    def __init__(self, name, argv, workdir):
        self.name = name
        self.log = os.path.join(workdir, name + ".log")
        self.lines = queue.Queue()
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err,
                                         text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, pattern):
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise Failure("%s exited %d before printing /%s/:\n%s" %
                                  (self.name, self.proc.returncode, pattern, self.tail()))
                continue
            m = re.search(pattern, line)
            if m:
                return m
        raise Failure("%s printed no /%s/ in %d s:\n%s" %
                      (self.name, pattern, DEADLINE_S, self.tail()))

    def tail(self):
        with open(self.log) as f:
            return "".join(f.readlines()[-30:])

    def stop(self, grace_s):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise Failure("%s still running %d s after SIGTERM (the kubelet "
                          "would SIGKILL it)" % (self.name, grace_s))
        if rc != 0:
            raise Failure("%s exited %d after SIGTERM:\n%s" % (self.name, rc, self.tail()))


def grpc_probe(probe, addr, want_serving_within=None):
    end = time.monotonic() + (want_serving_within or 0)
    while True:
        r = subprocess.run([probe, addr, "", "1000"], capture_output=True, text=True)
        if r.returncode == 0:
            return
        if time.monotonic() >= end:
            raise Failure("grpc probe of %s: %s" % (addr, (r.stdout + r.stderr).strip()))
        time.sleep(0.2)


def get_metrics(addr, series):
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=5) as r:
        body = r.read().decode()
    if series not in body:
        raise Failure("%s/metrics has no %s" % (addr, series))


def loopback(args, names):
    """0.0.0.0 -> 127.0.0.1 and port 0 for the flags in `names`."""
    out = []
    for a in args:
        k, eq, v = a.partition("=")
        if eq and k[2:] in names:
            if ":" in v:
                v = "127.0.0.1:0"
            else:
                v = "0"
        elif eq and v == "0.0.0.0":
            v = "127.0.0.1"
        out.append(k + eq + v)
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


SVC_RE = re.compile(r"([a-z0-9.-]+\.svc):([0-9]+)")


def map_svc(arg, names):
    """NAME.svc:PORT -> the loopback address `names` gives it."""
    def sub(m):
        key = (m.group(1), int(m.group(2)))
        if key not in names:
            raise Failure("%r names %s:%s, which no rendered pod serves" %
                          (arg, key[0], key[1]))
        return names[key]
    return SVC_RE.sub(sub, arg)


def wait_tcp(addr, what):
    host, port = addr.rsplit(":", 1)
    end = time.monotonic() + DEADLINE_S
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            if time.monotonic() >= end:
                raise Failure("%s: nothing accepts on %s" % (what, addr))
            time.sleep(0.1)


def wait_leader(masters, not_epoch_below, deadline_s=DEADLINE_S):
    """(index, address, epoch) of the master that prints it leads."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for i, m in enumerate(masters):
            if m is None:
                continue
            try:
                line = m.lines.get(timeout=0.05)
            except queue.Empty:
                continue
            r = re.search(r"hymcache-master listening on (\S+) epoch=([0-9]+)", line)
            if r and int(r.group(2)) >= not_epoch_below:
                return i, r.group(1), int(r.group(2))
    raise Failure("no master leads within %d s:\n%s" % (deadline_s, "\n".join(
        m.tail() for m in masters if m is not None)))


def metric_value(addr, pattern):
    try:
        with urllib.request.urlopen("http://%s/metrics" % addr, timeout=2) as r:
            body = r.read().decode()
    except OSError:
        return None
    m = re.search(pattern, body, re.M)
    return m.group(1) if m else None


def run_ha(a, docs, bins):
    master_sts = find(docs, "StatefulSet", "-master")
    storage_ds = find(docs, "DaemonSet", "-storage")
    ns_pods = []  # (workload, pod name, ordinal)
    etcd_sts = [d for d in docs if d.get("kind") == "StatefulSet" and
                d["metadata"]["name"].endswith("-etcd")]
    svc_of = master_sts["spec"]["serviceName"]
    names = {}  # (NAME-N.SVC.NS.svc, port) -> 127.0.0.1:PORT
    ns = None
    for sts in etcd_sts + [master_sts]:
        svc = find(docs, "Service", "-" + sts["metadata"]["name"].rsplit("-", 1)[1])
        if svc["spec"].get("clusterIP") != "None":
            raise Failure("%s's Service is not headless" % sts["metadata"]["name"])
        ctr = sts["spec"]["template"]["spec"]["containers"][0]
        for i in range(sts["spec"]["replicas"]):
            pod = "%s-%d" % (sts["metadata"]["name"], i)
            ns_pods.append((sts, pod, i))
            for p in ctr.get("ports") or []:
                args = " ".join(ctr.get("args") or [])
                r = re.search(r"\.%s\.([a-z0-9-]+)\.svc" % re.escape(sts["spec"]["serviceName"]), args)
                if r:
                    ns = r.group(1)
                host = "%s.%s.%s.svc" % (pod, sts["spec"]["serviceName"], ns)
                names[(host, p["containerPort"])] = "127.0.0.1:%d" % free_port()
    daemons = {}
    try:
        # etcd members, then masters: each pod with its own name and volumes.
        etcd, masters, maddrs, metrics = [], [], [], []
        for sts, pod, i in ns_pods:
            env = {"metadata.name": pod, "status.hostIP": "127.0.0.1",
                   "spec.nodeName": "rendered-node-%d" % i}
            argv, ctr, podspec = prepare(sts, docs, os.path.join(a.workdir, pod), env)
            host = "%s.%s.%s.svc" % (pod, sts["spec"]["serviceName"], ns)
            binary = bins[os.path.basename(argv[0])]
            out = []
            for x in argv[1:]:
                k, eq, v = x.partition("=")
                # What the pod listens on: its own mapped ports.
                for p in ctr.get("ports") or []:
                    v = v.replace("0.0.0.0:%d" % p["containerPort"],
                                  names[(host, p["containerPort"])])
                if k == "--metrics_listen":
                    v = "127.0.0.1:%d" % free_port()
                    metrics.append(v)
                out.append(k + eq + map_svc(v, names))
            if sts is master_sts:
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe_port(ctr, probe, "tcpSocket") != port_of(flag(argv, "listen")):
                        raise Failure("master %s is not a TCP check of --listen's port" % probe)
                d = Daemon(pod, [binary] + out, a.workdir)
                d.expect(r"hymcache-master standing by on")
                masters.append(d)
                maddrs.append(flag(out, "listen"))
                if flag(out, "advertise_address") != maddrs[-1]:
                    raise Failure("%s advertises %s, not its own name" % (pod, flag(argv, "advertise_address")))
            else:
                d = Daemon(pod, [binary] + out, a.workdir)
                etcd.append(d)
            daemons[pod] = d
        for d, (sts, pod, i) in zip(etcd, ns_pods):
            wait_tcp(flag([x for x in d.proc.args], "listen-client-urls").split("//")[1], pod)
        print("etcd: %d members accept clients" % len(etcd))
        for m, addr in zip(masters, maddrs):
            wait_tcp(addr, m.name)
        li, laddr, epoch = wait_leader(masters, 1)
        grpc_probe(a.probe, laddr, want_serving_within=DEADLINE_S)
        print("masters: %s leads (epoch %d, grpc health SERVING); %d stand by, "
              "TCP probes pass on all" % (masters[li].name, epoch, len(masters) - 1))

        sctr_args = prepare(storage_ds, docs, a.workdir,
                            {"status.hostIP": "127.0.0.1", "spec.nodeName": "rendered-node-0"})[0]
        listed = flag(sctr_args, "master").split(",")
        if sorted(map_svc(x, names) for x in listed) != sorted(maddrs):
            raise Failure("storage --master=%s does not list every master" % ",".join(listed))
        s_args = [map_svc(x, names) if x.startswith("--master=") else x for x in
                  loopback(sctr_args[1:], {"data_port", "control_port", "metrics_listen"})]
        storage = Daemon("storage", [bins["hymcache-storage"]] + s_args, a.workdir)
        daemons["storage"] = storage
        control = storage.expect(r"hymcache-storage data=\S+ control=(\S+)").group(1)
        grpc_probe(a.probe, control, want_serving_within=DEADLINE_S)
        print("storage: %s SERVING (registered with the leader)" % control)

        # The leader's host is lost: its master and its etcd member.
        lost = li
        t0 = time.monotonic()
        masters[lost].proc.kill()
        if lost < len(etcd):
            etcd[lost].proc.kill()
        dead = masters[lost]
        masters[lost] = None
        ni, naddr, nepoch = wait_leader(masters, epoch + 1, deadline_s=60)
        t1 = time.monotonic()
        if naddr == laddr:
            raise Failure("the killed master leads again")
        grpc_probe(a.probe, naddr, want_serving_within=DEADLINE_S)
        up = None
        end = time.monotonic() + 60
        while time.monotonic() < end:
            up = metric_value(metrics[ni], r"^hymcache_master_node_up\{[^}]*\} ([0-9.]+)$")
            if up == "1":
                break
            time.sleep(0.2)
        if up != "1":
            raise Failure("the new leader %s does not count the node alive" % naddr)
        t2 = time.monotonic()
        grpc_probe(a.probe, control, want_serving_within=DEADLINE_S)
        print("host of %s lost (master and etcd member SIGKILLed): %s leads at "
              "epoch %d after %.1f s; the node is alive there after %.1f s and "
              "SERVING" % (dead.name, masters[ni].name, nepoch, t1 - t0, t2 - t0))
        storage.stop(storage_ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
        grace = master_sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for m in masters:
            if m is not None:
                m.stop(grace)
        print("storage and masters: SIGTERM, exit 0 within their grace periods")
    finally:
        for d in daemons.values():
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()


def run(a):
    with open(a.manifests) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    bins = dict(b.split("=", 1) for b in a.bin)
    if find(docs, "StatefulSet", "-master")["spec"]["replicas"] > 1:
        return run_ha(a, docs, bins)
    env_values = {"status.hostIP": "127.0.0.1", "spec.nodeName": "rendered-node-0"}
    master_sts = find(docs, "StatefulSet", "-master")
    storage_ds = find(docs, "DaemonSet", "-storage")
    master_svc = find(docs, "Service", "-master")
    m_argv, m_ctr, m_pod = prepare(master_sts, docs, a.workdir, env_values)
    s_argv, s_ctr, s_pod = prepare(storage_ds, docs, a.workdir, env_values)

    # The probes and Service against the flags, as rendered.
    listen_port = port_of(flag(m_argv, "listen"))
    control_port = int(flag(s_argv, "control_port"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe_port(m_ctr, probe, "grpc") != listen_port:
            raise Failure("master %s does not probe --listen's port" % probe)
    if probe_port(s_ctr, "readinessProbe", "grpc") != control_port:
        raise Failure("storage readiness probe does not probe --control_port")
    if probe_port(s_ctr, "livenessProbe", "tcpSocket") != control_port:
        raise Failure("storage liveness probe does not probe --control_port")
    if named_port(m_ctr, "grpc") != listen_port or \
            named_port(s_ctr, "data") != int(flag(s_argv, "data_port")):
        raise Failure("container ports differ from the daemons' ports")
    svc_host, svc_port = flag(s_argv, "master").rsplit(":", 1)
    if svc_host.split(".")[0] != master_svc["metadata"]["name"]:
        raise Failure("--master=%s is not the master Service %s" %
                      (svc_host, master_svc["metadata"]["name"]))
    sp = [p for p in master_svc["spec"]["ports"] if p["name"] == "grpc"][0]
    if sp["port"] != int(svc_port) or sp["targetPort"] != "grpc":
        raise Failure("--master's port %s is not the Service's grpc port" % svc_port)
    for name, argv in (("hymcache-master", m_argv), ("hymcache-storage", s_argv)):
        if os.path.basename(argv[0]) != name:
            raise Failure("container runs %s, not %s" % (argv[0], name))
    metrics = flag(m_argv, "metrics_listen") is not None

    master = Daemon("master", [bins["hymcache-master"]] +
                    loopback(m_argv[1:], {"listen", "metrics_listen"}), a.workdir)
    storage = None
    try:
        maddr = master.expect(r"hymcache-master listening on (\S+)").group(1)
        grpc_probe(a.probe, maddr, want_serving_within=DEADLINE_S)
        print("master: %s SERVING (startup/readiness/liveness probe)" % maddr)
        if metrics:
            mm = master.expect(r"hymcache-master metrics on (\S+)").group(1)
            get_metrics(mm, "hymcache_master_build_info")
            print("master: metrics on %s" % mm)
        s_args = loopback(s_argv[1:], {"data_port", "control_port", "metrics_listen"})
        s_args = [("--master=" + maddr) if x.startswith("--master=") else x for x in s_args]
        storage = Daemon("storage", [bins["hymcache-storage"]] + s_args, a.workdir)
        m = storage.expect(r"hymcache-storage data=(\S+) control=(\S+)(?: metrics=(\S+))?")
        control = m.group(2)
        grpc_probe(a.probe, control, want_serving_within=DEADLINE_S)
        print("storage: %s SERVING (readiness probe: registered)" % control)
        host, port = control.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        print("storage: %s accepts TCP (liveness probe)" % control)
        if metrics:
            if not m.group(3):
                raise Failure("storage node printed no metrics address")
            get_metrics(m.group(3), "hymcache_storage_build_info")
            print("storage: metrics on %s" % m.group(3))
        storage.stop(s_pod["terminationGracePeriodSeconds"])
        print("storage: SIGTERM, exit 0 within %d s" % s_pod["terminationGracePeriodSeconds"])
        storage = None
        master.stop(m_pod["terminationGracePeriodSeconds"])
        print("master: SIGTERM, exit 0 within %d s" % m_pod["terminationGracePeriodSeconds"])
        master = None
    finally:
        for d in (storage, master):
            if d is not None and d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--manifests", required=True)
    p.add_argument("--bin", action="append", default=[])
    p.add_argument("--probe", required=True)
    p.add_argument("--workdir", required=True)
    a = p.parse_args(argv[1:])
    try:
        run(a)
    except Failure as e:
        print("run_rendered: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
