#!/usr/bin/python3
"""Checks one rendering of the HyMCache chart (deploy/helm/chart_test.sh).

  chart_check.py --schema values.schema.json --values values.json --values_only
  chart_check.py --schema values.schema.json --values values.json
                 --help_file hymcache-master=FILE
                 --help_file hymcache-storage=FILE [--help_file etcd=FILE]
                 [--expect REGEX]... [--expect_not REGEX]... manifests.yaml

  * the coalesced values (render --values_out) satisfy values.schema.json
    (JSON Schema draft-07, as Helm validates them);
  * every manifest passes k8s_check (the Kubernetes API schemas);
  * no number anywhere in the manifests is in exponent form (1.7e+10: Helm
    printed a float64), in a YAML value or inside a command-line argument;
  * each daemon container's arguments are flags its binary defines (parsed
    from its --helpfull; etcd's from its --help), with values of the flag's
    type: integers for
    int32/int64/uint32/uint64, true/false for bools, byte sizes in the
    daemons' syntax for *_bytes flags;
  * chart policy: a hostNetwork pod uses dnsPolicy ClusterFirstWithHostNet;
    every pod runs as non-root (runAsNonRoot: true and a runAsUser other
    than 0) with the RuntimeDefault seccomp profile, and only an init
    container may run as root, with no capability but CHOWN; every daemon
    container has a startup, a readiness and a liveness probe, and a
    memory limit; with --require_pdb, every StatefulSet/Deployment with
    more than one replica and every DaemonSet is covered by a
    PodDisruptionBudget selecting its pods;
  * --expect / --expect_not: regular expressions the manifests must (not)
    contain, for the scenario at hand.
"""

import argparse
import json
import os
import re
import sys

import jsonschema
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_check  # noqa: E402

EXPONENT_RE = re.compile(r"(?<![\w.])[0-9]+(\.[0-9]+)?[eE][+-]?[0-9]+(?![\w.])")
BYTES_RE = re.compile(r"^[0-9]+([KkMmGgTt]([Ii]?[Bb])?|[Bb])?$")
INT_RE = re.compile(r"^-?[0-9]+$")
FLAG_RE = re.compile(r"^    -([A-Za-z0-9_]+) \(", re.M)
TYPE_RE = re.compile(r"type: (\w+)")
# etcd --help: "  --name 'default'" (pflag style, no types).
ETCD_FLAG_RE = re.compile(r"^  --([a-z0-9-]+)(?: |$)", re.M)


def parse_help(text):
    """{flag: gflags type} from a --helpfull output; etcd's --help gives
    {flag: "etcd"} (its flags' names only)."""
    if "etcd [flags]" in text:
        return {m.group(1): "etcd" for m in ETCD_FLAG_RE.finditer(text)}
    flags = {}
    starts = list(FLAG_RE.finditer(text))
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        t = TYPE_RE.search(text, m.end(), end)
        if t:
            flags[m.group(1)] = t.group(1)
    return flags


def check_arg(binary, arg, flags, report):
    if not arg.startswith("--"):
        report("%s: argument %r is not a --flag" % (binary, arg))
        return
    name, eq, value = arg[2:].partition("=")
    if name not in flags:
        report("%s: flag --%s is not defined by the binary" % (binary, name))
        return
    t = flags[name]
    if t == "etcd":
        if not eq or not value:
            report("%s: --%s has no value" % (binary, name))
        return
    if not eq:
        if t != "bool":
            report("%s: --%s (%s) has no value" % (binary, name, t))
        return
    if "$(" in value:
        return  # expanded by the kubelet from the container's env
    if t in ("int32", "int64", "uint32", "uint64"):
        if not INT_RE.match(value):
            report("%s: --%s=%s is not an integer (%s)" % (binary, name, value, t))
    elif t == "bool":
        if value not in ("true", "false"):
            report("%s: --%s=%s is not true/false" % (binary, name, value))
    elif t == "double":
        try:
            float(value)
        except ValueError:
            report("%s: --%s=%s is not a number" % (binary, name, value))
    elif name.endswith("_bytes") or name.endswith("_bytes_per_s"):
        if not BYTES_RE.match(value):
            report("%s: --%s=%s is not a byte size" % (binary, name, value))


def check_pod_security(doc, report):
    if doc.get("kind") not in ("StatefulSet", "DaemonSet", "Deployment"):
        return
    where = "%s/%s" % (doc["kind"], doc["metadata"]["name"])
    pod, ctrs = containers(doc)
    sc = pod.get("securityContext") or {}
    if sc.get("runAsNonRoot") is not True:
        report("%s: pod securityContext without runAsNonRoot: true" % where)
    if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        report("%s: pod securityContext without seccompProfile RuntimeDefault"
               % where)
    if sc.get("runAsUser", 0) == 0:
        report("%s: pod securityContext runs as uid 0 (or none: the image's "
               "user is a name the kubelet cannot check)" % where)
    for init in (False, True):
        for c in pod.get("initContainers" if init else "containers") or []:
            csc = c.get("securityContext") or {}
            root = csc.get("runAsUser") == 0 or csc.get("runAsNonRoot") is False
            if not root:
                continue
            caps = set((csc.get("capabilities") or {}).get("add") or [])
            if not init:
                report("%s: container %s runs as root" % (where, c.get("name")))
            elif not caps <= {"CHOWN"} or "ALL" not in (
                    (csc.get("capabilities") or {}).get("drop") or []):
                report("%s: root init container %s has capabilities %s beyond "
                       "CHOWN" % (where, c.get("name"), sorted(caps)))


def check_disruption_budgets(docs, report):
    pdbs = [d for d in docs if d.get("kind") == "PodDisruptionBudget"]
    for doc in docs:
        if doc.get("kind") not in ("StatefulSet", "DaemonSet", "Deployment"):
            continue
        if doc["kind"] != "DaemonSet" and (doc["spec"].get("replicas") or 1) < 2:
            continue
        labels = doc["spec"]["template"]["metadata"].get("labels") or {}
        if not any(all(labels.get(k) == v for k, v in
                       ((p["spec"].get("selector") or {}).get("matchLabels")
                        or {}).items()) for p in pdbs):
            report("%s/%s: no PodDisruptionBudget selects its pods" %
                   (doc["kind"], doc["metadata"]["name"]))


def containers(doc):
    spec = (((doc.get("spec") or {}).get("template") or {}).get("spec")) or {}
    return spec, spec.get("containers") or []


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--schema", required=True)
    p.add_argument("--values", required=True)
    p.add_argument("--help_file", action="append", default=[],
                   help="BINARY=FILE holding BINARY --helpfull")
    p.add_argument("--expect", action="append", default=[])
    p.add_argument("--expect_not", action="append", default=[])
    p.add_argument("--require_pdb", action="store_true",
                   help="every replicated workload has a PodDisruptionBudget")
    p.add_argument("--values_only", action="store_true",
                   help="only validate the values against the schema")
    p.add_argument("manifests", nargs="?")
    a = p.parse_args(argv[1:])
    errors = []
    report = errors.append

    with open(a.schema) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    with open(a.values) as f:
        values = json.load(f)
    for e in jsonschema.Draft7Validator(schema).iter_errors(values):
        report("values.schema.json: %s: %s" %
               ("/".join(str(x) for x in e.absolute_path), e.message))

    if a.values_only:
        for e in errors:
            print(e)
        return 1 if errors else 0
    with open(a.manifests) as f:
        text = f.read()
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if not docs:
        report("no manifests rendered")
    errors.extend(k8s_check.check_documents(docs, os.path.basename(a.manifests)))

    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        if EXPONENT_RE.search(line):
            report("line %d: a number in exponent form: %s" % (n, line.strip()))

    helps = {}
    for h in a.help_file:
        binary, _, path = h.partition("=")
        with open(path) as f:
            helps[binary] = parse_help(f.read())
        if len(helps[binary]) < 10:
            report("%s: could not parse its --helpfull" % binary)
    daemons = 0
    for doc in docs:
        pod, ctrs = containers(doc)
        where = "%s/%s" % (doc.get("kind"), (doc.get("metadata") or {}).get("name"))
        if pod.get("hostNetwork") and pod.get("dnsPolicy") != "ClusterFirstWithHostNet":
            report("%s: hostNetwork without dnsPolicy: ClusterFirstWithHostNet" % where)
        for c in ctrs:
            argv_ = list(c.get("command") or []) + list(c.get("args") or [])
            if not argv_:
                report("%s: container %s has no command" % (where, c.get("name")))
                continue
            binary = os.path.basename(argv_[0])
            if binary not in helps:
                report("%s: container runs %s, which has no --help to check "
                       "against" % (where, argv_[0]))
                continue
            daemons += 1
            for arg in argv_[1:]:
                check_arg(binary, arg, helps[binary], report)
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if not c.get(probe):
                    report("%s: %s has no %s" % (where, binary, probe))
            # (Kubernetes defaults the requests to the limits.)
            if "memory" not in ((c.get("resources") or {}).get("limits") or {}):
                report("%s: %s has no memory limit" % (where, binary))
    for doc in docs:
        check_pod_security(doc, report)
    if a.require_pdb:
        check_disruption_budgets(docs, report)
    if daemons < 2:
        report("expected a master and a storage container, found %d" % daemons)

    for rx in a.expect:
        if not re.search(rx, text, re.M):
            report("expected /%s/ in the manifests" % rx)
    for rx in a.expect_not:
        if re.search(rx, text, re.M):
            report("unexpected /%s/ in the manifests" % rx)

    for e in errors:
        print("%s: %s" % (a.manifests, e))
    print("chart_check %s: %d manifests, %d daemon containers, %d findings" %
          (os.path.basename(a.manifests), len(docs), daemons, len(errors)),
          file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
