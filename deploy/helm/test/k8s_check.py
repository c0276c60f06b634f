#!/usr/bin/python3
"""Checks Kubernetes manifests against the API's schemas, without a cluster.

The schemas are the generated model classes of Debian's python3-kubernetes
(kubernetes.client.models.V1DaemonSet, ...): each class lists its fields
(`attribute_map`: Python name -> JSON name) and their types (`openapi_types`:
'str', 'int', 'bool', 'dict(str, str)', 'list[V1Container]', 'V1PodSpec',
'object' for IntOrString), and its constructor raises ValueError for a missing
required field (client_side_validation). For every manifest this walks the
document against the model of its apiVersion/kind and reports:

  * a field the type does not have (a typo, a field at the wrong level);
  * a value of the wrong JSON type: a float or a string where an int goes, a
    bool where a string goes (an unquoted `true` label), a list where a map
    goes, ...;
  * a missing required field;
  * a bad IntOrString (an int or a string) or Quantity ("18Gi", "500m", or a
    number, as Kubernetes' resource.Quantity accepts them);
  * a few checks the API server makes that the models do not: enum fields
    (dnsPolicy, protocol, imagePullPolicy, hostPath type, ...), label keys and
    values, a workload selector that does not match its pod template, one
    handler per probe, a named probe port its container does not declare, and
    a Service targetPort name no selected container declares.

python3-kubernetes 22.6 carries the Kubernetes 1.22 API. Newer fields the
chart uses are added by hand in EXTRA_FIELDS / HAND_TYPES (Probe.grpc, the
GRPCAction of Kubernetes 1.24+), as is the Prometheus Operator's
ServiceMonitor (monitoring.coreos.com/v1), for the fields it has that charts
use.

Usage: k8s_check.py FILE...   (multi-document YAML; "-" reads stdin)
Prints one line per finding and exits 1 if there is any.
"""

import re
import sys

import yaml
import kubernetes.client
from kubernetes.client import models

# apiVersion/kind -> model class name.
KINDS = {
    ("v1", "Service"): "V1Service",
    ("v1", "Secret"): "V1Secret",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "PersistentVolume"): "V1PersistentVolume",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "ServiceMonitor",
}

# Fields newer than the client's API (Kubernetes 1.22): model -> {json: type}.
EXTRA_FIELDS = {
    "V1Probe": {"grpc": "GRPCAction"},  # Kubernetes 1.24 (beta), 1.27 GA
}

# Hand-written types: name -> (fields {json name: type}, required json names).
DURATION = "duration"  # a Prometheus duration string such as 30s or 1m30s
HAND_TYPES = {
    "GRPCAction": ({"port": "int", "service": "str"}, ["port"]),
    # monitoring.coreos.com/v1 ServiceMonitor (prometheus-operator's CRD),
    # the fields this checker knows; anything else is reported as unknown.
    "ServiceMonitor": ({"apiVersion": "str", "kind": "str",
                        "metadata": "V1ObjectMeta",
                        "spec": "ServiceMonitorSpec"}, ["spec"]),
    "ServiceMonitorSpec": ({"jobLabel": "str",
                            "targetLabels": "list[str]",
                            "podTargetLabels": "list[str]",
                            "endpoints": "list[ServiceMonitorEndpoint]",
                            "selector": "V1LabelSelector",
                            "namespaceSelector": "NamespaceSelector",
                            "sampleLimit": "int"},
                           ["endpoints", "selector"]),
    "ServiceMonitorEndpoint": ({"port": "str",
                                "targetPort": "intorstr",
                                "path": "str",
                                "scheme": "str",
                                "params": "dict(str, list[str])",
                                "interval": DURATION,
                                "scrapeTimeout": DURATION,
                                "honorLabels": "bool",
                                "honorTimestamps": "bool",
                                "bearerTokenSecret": "V1SecretKeySelector",
                                "tlsConfig": "ServiceMonitorTLS"}, []),
    "ServiceMonitorTLS": ({"ca": "freeform", "cert": "freeform",
                           "keySecret": "V1SecretKeySelector",
                           "serverName": "str",
                           "insecureSkipVerify": "bool"}, []),
    "NamespaceSelector": ({"any": "bool", "matchNames": "list[str]"}, []),
}

# model.attribute -> kind of an 'object' (or 'str') field.
INT_OR_STRING = {
    ("V1ServicePort", "target_port"), ("V1HTTPGetAction", "port"),
    ("V1TCPSocketAction", "port"),
    ("V1NetworkPolicyPort", "port"),
    ("V1PodDisruptionBudgetSpec", "min_available"),
    ("V1PodDisruptionBudgetSpec", "max_unavailable"),
    ("V1RollingUpdateDaemonSet", "max_unavailable"),
    ("V1RollingUpdateDaemonSet", "max_surge"),
    ("V1RollingUpdateDeployment", "max_unavailable"),
    ("V1RollingUpdateDeployment", "max_surge"),
}
QUANTITY = {
    ("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "size_limit"),
    ("V1PersistentVolumeSpec", "capacity"), ("V1PodSpec", "overhead"),
}
ENUMS = {
    ("V1PodSpec", "dns_policy"): {"ClusterFirst", "ClusterFirstWithHostNet",
                                  "Default", "None"},
    ("V1PodSpec", "restart_policy"): {"Always", "OnFailure", "Never"},
    ("V1Container", "image_pull_policy"): {"Always", "IfNotPresent", "Never"},
    ("V1ContainerPort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1NetworkPolicyPort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1SeccompProfile", "type"): {"RuntimeDefault", "Localhost",
                                   "Unconfined"},
    ("V1NetworkPolicySpec", "policy_types"): {"Ingress", "Egress"},
    ("V1ServicePort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1ServiceSpec", "type"): {"ClusterIP", "NodePort", "LoadBalancer",
                                "ExternalName"},
    ("V1HostPathVolumeSource", "type"): {"", "DirectoryOrCreate", "Directory",
                                         "FileOrCreate", "File", "Socket",
                                         "CharDevice", "BlockDevice"},
    ("V1DaemonSetUpdateStrategy", "type"): {"RollingUpdate", "OnDelete"},
    ("V1StatefulSetUpdateStrategy", "type"): {"RollingUpdate", "OnDelete"},
    ("V1StatefulSetSpec", "pod_management_policy"): {"OrderedReady",
                                                     "Parallel"},
    ("V1PersistentVolumeClaimSpec", "access_modes"): {
        "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"},
}

# resource.Quantity's string form (k8s.io/apimachinery quantity.go).
QUANTITY_RE = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[mkMGTPE]|n|u)?$")
DURATION_RE = re.compile(
    r"^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_SUBDOMAIN_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PORT_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

_CONFIG = kubernetes.client.Configuration()
_CONFIG.client_side_validation = True


def _jsontype(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float %r" % v
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


class Checker:
    """Walks one document; findings go to self.errors."""

    def __init__(self, where):
        self.where = where
        self.errors = []

    def error(self, path, msg):
        self.errors.append("%s: %s: %s" % (self.where, path or "(top)", msg))

    def fields(self, type_name):
        """(fields {json: (type, python attr)}, required or None, model)."""
        if type_name in HAND_TYPES:
            f, req = HAND_TYPES[type_name]
            return {k: (t, k) for k, t in f.items()}, req, None
        cls = getattr(models, type_name, None)
        if cls is None:
            return None, None, None
        f = {cls.attribute_map[a]: (t, a) for a, t in cls.openapi_types.items()}
        for k, t in EXTRA_FIELDS.get(type_name, {}).items():
            f[k] = (t, k)
        return f, None, cls

    def check(self, value, type_name, path, owner=None):
        """Checks `value` against a type string; `owner` is (model, attr)."""
        if value is None:
            return  # an optional field left empty (null) is fine
        if type_name == "str":
            if owner in QUANTITY:
                self.quantity(value, path)
            elif not isinstance(value, str):
                self.error(path, "%s where a string goes" % _jsontype(value))
            elif owner in ENUMS and value not in ENUMS[owner]:
                self.error(path, "%r is not one of %s" %
                           (value, sorted(ENUMS[owner])))
            return
        if type_name in ("int", "float"):
            ok = isinstance(value, int) and not isinstance(value, bool)
            if type_name == "float":
                ok = ok or isinstance(value, float)
            if not ok:
                self.error(path, "%s where %s goes" %
                           (_jsontype(value),
                            "an int" if type_name == "int" else "a number"))
            return
        if type_name == "bool":
            if not isinstance(value, bool):
                self.error(path, "%s where a bool goes" % _jsontype(value))
            return
        if type_name == "datetime":
            if not isinstance(value, str):
                self.error(path, "%s where a timestamp goes" % _jsontype(value))
            return
        if type_name == DURATION:
            if not isinstance(value, str) or not DURATION_RE.match(value):
                self.error(path, "%r is not a duration such as 30s" % (value,))
            return
        if type_name == "freeform":
            return
        if type_name == "intorstr" or (
                type_name == "object" and owner in INT_OR_STRING):
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                self.error(path, "%s where an int or a string goes" %
                           _jsontype(value))
            return
        if type_name == "object":
            self.error(path, "no schema for this field (%s.%s)" % owner)
            return
        m = re.match(r"^list\[(.*)\]$", type_name)
        if m:
            if not isinstance(value, list):
                self.error(path, "%s where a list goes" % _jsontype(value))
                return
            for i, item in enumerate(value):
                if owner in ENUMS and isinstance(item, str) and \
                        item not in ENUMS[owner]:
                    self.error("%s[%d]" % (path, i), "%r is not one of %s" %
                               (item, sorted(ENUMS[owner])))
                    continue
                self.check(item, m.group(1), "%s[%d]" % (path, i), owner)
            return
        m = re.match(r"^dict\(str, (.*)\)$", type_name)
        if m:
            if not isinstance(value, dict):
                self.error(path, "%s where a map goes" % _jsontype(value))
                return
            for k, v in value.items():
                if not isinstance(k, str):
                    self.error(path, "key %r is not a string" % (k,))
                if owner in QUANTITY:
                    self.quantity(v, "%s.%s" % (path, k))
                else:
                    self.check(v, m.group(1), "%s.%s" % (path, k), owner)
            return
        self.object(value, type_name, path)

    def quantity(self, value, path):
        if isinstance(value, bool) or value is None:
            self.error(path, "%s where a quantity goes" % _jsontype(value))
        elif isinstance(value, (int, float)):
            return  # a JSON number is a valid Quantity
        elif not isinstance(value, str) or not QUANTITY_RE.match(value):
            self.error(path, "%r is not a quantity (e.g. \"18Gi\", \"500m\")" %
                       (value,))

    def object(self, value, type_name, path):
        fields, required, cls = self.fields(type_name)
        if fields is None:
            self.error(path, "no schema for type %s" % type_name)
            return
        if not isinstance(value, dict):
            self.error(path, "%s where a %s object goes" %
                       (_jsontype(value), type_name))
            return
        for k, v in value.items():
            sub = "%s.%s" % (path, k) if path else str(k)
            if k not in fields:
                self.error(sub, "unknown field of %s" % type_name)
                continue
            t, attr = fields[k]
            self.check(v, t, sub, (type_name, attr))
        if required is not None:
            for r in required:
                if value.get(r) is None:
                    self.error(path, "missing required field %r of %s" %
                               (r, type_name))
            return
        # The model's own required checks: construct it with client side
        # validation on (nested values stay plain; setters only check them
        # for None).
        kwargs = {}
        for k, v in value.items():
            if k in fields and fields[k][1] in cls.openapi_types:
                kwargs[fields[k][1]] = v
        try:
            cls(local_vars_configuration=_CONFIG, **kwargs)
        except ValueError as e:
            self.error(path, "%s: %s" % (type_name, e))
        except TypeError as e:
            self.error(path, "%s: %s" % (type_name, e))


def _m(x):
    """x if it is a map, else an empty one (the type check reports it)."""
    return x if isinstance(x, dict) else {}


def _l(x):
    """The maps in x if it is a list, else none."""
    return [i for i in x if isinstance(i, dict)] if isinstance(x, list) else []


def _pod_specs(doc):
    """(path, pod template) of a workload."""
    if doc.get("kind") in ("DaemonSet", "StatefulSet", "Deployment"):
        return [("spec.template", _m(_m(doc.get("spec")).get("template")))]
    return []


def _semantic(doc, c):
    """Checks the API server (or the kubelet) makes beyond the types."""
    meta = _m(doc.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not DNS_SUBDOMAIN_RE.match(name) or \
            len(name) > 253:
        c.error("metadata.name", "missing or not a DNS subdomain: %r" % (name,))
    docs_meta = [("metadata", meta)] + [
        (p + ".metadata", _m(t.get("metadata"))) for p, t in _pod_specs(doc)]
    for where, m in docs_meta:
        for k, v in _m(m.get("labels")).items():
            if not isinstance(k, str):
                continue
            prefix, _, nm = k.rpartition("/")
            if (prefix and not DNS_SUBDOMAIN_RE.match(prefix)) or \
                    not LABEL_NAME_RE.match(nm) or len(nm) > 63:
                c.error("%s.labels" % where, "bad label key %r" % k)
            if isinstance(v, str) and (len(v) > 63 or
                                       not LABEL_VALUE_RE.match(v)):
                c.error("%s.labels.%s" % (where, k), "bad label value %r" % v)
    for p, tmpl in _pod_specs(doc):
        sel = _m(_m(_m(doc.get("spec")).get("selector")).get("matchLabels"))
        labels = _m(_m(tmpl.get("metadata")).get("labels"))
        for k, v in sel.items():
            if labels.get(k) != v:
                c.error("spec.selector", "selector %s=%s does not match the "
                        "template's labels" % (k, v))
        pod = _m(tmpl.get("spec"))
        for i, ctr in enumerate(_l(pod.get("containers"))):
            where = "%s.spec.containers[%d]" % (p, i)
            ports = _l(ctr.get("ports"))
            named = {pt.get("name") for pt in ports}
            for pt in ports:
                if pt.get("name") is not None and \
                        not PORT_NAME_RE.match(str(pt["name"])):
                    c.error(where + ".ports", "bad port name %r" % pt["name"])
                if pod.get("hostNetwork") and \
                        pt.get("hostPort") not in (None, pt.get("containerPort")):
                    c.error(where + ".ports",
                            "with hostNetwork hostPort must equal containerPort")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                pr = ctr.get(probe)
                if not isinstance(pr, dict):
                    continue
                handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc")
                            if pr.get(h) is not None]
                if len(handlers) != 1:
                    c.error("%s.%s" % (where, probe),
                            "needs exactly one handler, has %s" % handlers)
                for h in handlers:
                    port = _m(pr.get(h)).get("port")
                    if isinstance(port, str) and port not in named:
                        c.error("%s.%s.%s.port" % (where, probe, h),
                                "named port %r not declared by the container"
                                % port)
                    if isinstance(port, int) and not 1 <= port <= 65535:
                        c.error("%s.%s.%s.port" % (where, probe, h),
                                "port %d out of range" % port)


def _service_ports(docs, report):
    """A Service's named targetPort must exist in a container it selects."""
    workloads = [d for d in docs if _pod_specs(d)]
    for svc in docs:
        if svc.get("kind") != "Service":
            continue
        spec = _m(svc.get("spec"))
        sel = _m(spec.get("selector"))
        where = "Service/%s" % _m(svc.get("metadata")).get("name")
        if not sel:
            continue
        names = set()
        matched = False
        for w in workloads:
            for _, tmpl in _pod_specs(w):
                labels = _m(_m(tmpl.get("metadata")).get("labels"))
                if all(labels.get(k) == v for k, v in sel.items()):
                    matched = True
                    for ctr in _l(_m(tmpl.get("spec")).get("containers")):
                        for pt in _l(ctr.get("ports")):
                            names.add(pt.get("name"))
        if not matched:
            report("%s: spec.selector: selects no workload rendered with it"
                   % where)
            continue
        for pt in _l(spec.get("ports")):
            tp = pt.get("targetPort")
            if isinstance(tp, str) and tp not in names:
                report("%s: spec.ports: targetPort %r is no port of the "
                       "selected pods" % (where, tp))


def check_documents(docs, source="<input>"):
    """Returns the findings for a list of parsed documents."""
    errors = []
    for n, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            errors.append("%s#%d: not a map" % (source, n))
            continue
        key = (doc.get("apiVersion"), doc.get("kind"))
        where = "%s %s/%s" % (source, doc.get("kind"),
                              _m(doc.get("metadata")).get("name"))
        c = Checker(where)
        if key not in KINDS:
            c.error("", "unknown apiVersion/kind %s %s" % key)
        else:
            c.object(doc, KINDS[key], "")
            _semantic(doc, c)
        errors.extend(c.errors)
    _service_ports([d for d in docs if isinstance(d, dict)],
                   lambda m: errors.append("%s %s" % (source, m)))
    return errors


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    errors = []
    count = 0
    for path in argv[1:]:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path) as f:
                text = f.read()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
        count += len(docs)
        errors.extend(check_documents(docs, path))
    for e in errors:
        print(e)
    print("k8s_check: %d manifests, %d findings" % (count, len(errors)),
          file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
