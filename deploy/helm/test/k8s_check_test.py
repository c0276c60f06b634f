#!/usr/bin/python3
"""k8s_check rejects what the API server would: each case takes a manifest
the checker accepts and breaks one thing in it, so the chart test's "0
findings" cannot come from a checker that accepts everything."""

import copy
import os
import sys
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_check  # noqa: E402

GOOD = """
apiVersion: v1
kind: Service
metadata: {name: db, labels: {app: db}}
spec:
  selector: {app: db}
  ports:
    - {name: grpc, port: 50051, targetPort: grpc, protocol: TCP}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: db}
spec:
  selector: {matchLabels: {app: db}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata: {labels: {app: db, enabled: "true"}}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
        - name: db
          image: "db:1"
          args: ["--dram_bytes=16G"]
          ports: [{name: grpc, containerPort: 50051}]
          readinessProbe: {grpc: {port: 50051}, periodSeconds: 5}
          livenessProbe: {tcpSocket: {port: grpc}}
          resources:
            requests: {cpu: 2, memory: 18Gi}
            limits: {memory: "18Gi", cpu: "500m"}
          securityContext: {capabilities: {add: [IPC_LOCK], drop: [ALL]}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: db}
spec: {maxUnavailable: "50%", selector: {matchLabels: {app: db}}}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: db}
spec:
  selector: {matchLabels: {app: db}}
  namespaceSelector: {matchNames: [default]}
  endpoints: [{port: metrics, path: /metrics, interval: 30s}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress:
    - ports: [{port: grpc, protocol: TCP}, {port: 2379}]
      from: [{namespaceSelector: {matchLabels: {team: kv}}}]
"""


def docs():
    return [d for d in yaml.safe_load_all(GOOD)]


def svc(d):
    return d[0]


def ds(d):
    return d[1]


def ctr(d):
    return d[1]["spec"]["template"]["spec"]["containers"][0]


def pdb(d):
    return d[2]


def smon(d):
    return d[3]


def netpol(d):
    return d[4]


class K8sCheckTest(unittest.TestCase):

    def findings(self, mutate):
        d = docs()
        mutate(d)
        return k8s_check.check_documents(d, "t")

    def assertRejects(self, mutate, *fragments):
        errors = self.findings(mutate)
        self.assertTrue(errors, "accepted")
        text = "\n".join(errors)
        for f in fragments:
            self.assertIn(f, text)

    def test_good_manifests_pass(self):
        self.assertEqual(k8s_check.check_documents(docs(), "t"), [])

    def test_float_where_int_goes(self):
        def m(d):
            ctr(d)["ports"][0]["containerPort"] = 50051.0
        self.assertRejects(m, "containerPort", "float 50051.0 where an int goes")

    def test_exponent_float_where_int_goes(self):
        # What Helm made of `{{ .Values.n }}` with n: 17179869184.
        def m(d):
            d[1]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = \
                yaml.safe_load("1.7179869184e+10")
        self.assertRejects(m, "terminationGracePeriodSeconds", "float")

    def test_string_where_int_goes(self):
        def m(d):
            svc(d)["spec"]["ports"][0]["port"] = "50051"
        self.assertRejects(m, "spec.ports[0].port", "string where an int goes")

    def test_bool_where_string_goes(self):
        def m(d):
            d[1]["spec"]["template"]["metadata"]["labels"]["enabled"] = True
        self.assertRejects(m, "labels.enabled", "bool where a string goes")

    def test_list_where_map_goes(self):
        def m(d):
            ctr(d)["resources"]["limits"] = ["18Gi"]
        self.assertRejects(m, "resources.limits", "list where a map goes")

    def test_map_where_list_goes(self):
        def m(d):
            ctr(d)["args"] = {"dram_bytes": "16G"}
        self.assertRejects(m, "args", "map where a list goes")

    def test_unknown_field(self):
        def m(d):
            ctr(d)["readinessProbes"] = ctr(d)["readinessProbe"]
        self.assertRejects(m, "readinessProbes", "unknown field of V1Container")

    def test_field_at_the_wrong_level(self):
        def m(d):
            d[1]["spec"]["hostNetwork"] = True
        self.assertRejects(m, "spec.hostNetwork", "unknown field of V1DaemonSetSpec")

    def test_missing_required_field(self):
        def m(d):
            del ctr(d)["name"]
        self.assertRejects(m, "V1Container", "`name`, must not be `None`")

    def test_missing_required_selector(self):
        def m(d):
            del ds(d)["spec"]["selector"]
        self.assertRejects(m, "V1DaemonSetSpec", "`selector`")

    def test_missing_grpc_probe_port(self):
        def m(d):
            ctr(d)["readinessProbe"]["grpc"] = {"service": ""}
        self.assertRejects(m, "missing required field 'port' of GRPCAction")

    def test_int_or_string(self):
        def m(d):
            pdb(d)["spec"]["maxUnavailable"] = 0.5
        self.assertRejects(m, "maxUnavailable", "where an int or a string goes")
        for ok in (1, "25%"):
            errs = self.findings(
                lambda d: pdb(d)["spec"].__setitem__("maxUnavailable", ok))
            self.assertEqual(errs, [])

    def test_quantity(self):
        def m(d):
            ctr(d)["resources"]["limits"]["memory"] = "18GB"
        self.assertRejects(m, "limits.memory", "is not a quantity")

        def b(d):
            ctr(d)["resources"]["limits"]["memory"] = True
        self.assertRejects(b, "limits.memory", "bool where a quantity goes")

    def test_enum(self):
        def m(d):
            d[1]["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirstWithHostNetwork"
        self.assertRejects(m, "dnsPolicy", "is not one of")

    def test_enum_list_and_malformed_documents(self):
        def m(d):
            d[1]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = {}
        self.assertRejects(m, "volumeMounts", "map where a list goes")

        def meta(d):
            svc(d)["metadata"] = ["db"]
        self.assertRejects(meta, "list where a V1ObjectMeta object goes")

    def test_selector_must_match_template(self):
        def m(d):
            ds(d)["spec"]["selector"]["matchLabels"]["app"] = "other"
        self.assertRejects(m, "does not match the template's labels")

    def test_probe_named_port_must_exist(self):
        def m(d):
            ctr(d)["livenessProbe"]["tcpSocket"]["port"] = "control"
        self.assertRejects(m, "named port 'control' not declared")

    def test_service_target_port_must_exist(self):
        def m(d):
            svc(d)["spec"]["ports"][0]["targetPort"] = "metrics"
        self.assertRejects(m, "targetPort 'metrics' is no port of the selected pods")

    def test_bad_label_value(self):
        def m(d):
            svc(d)["metadata"]["labels"]["app"] = "a b"
        self.assertRejects(m, "bad label value")

    def test_unknown_kind(self):
        def m(d):
            d[1]["apiVersion"] = "extensions/v1beta1"
        self.assertRejects(m, "unknown apiVersion/kind extensions/v1beta1 DaemonSet")

    def test_service_monitor(self):
        def unknown(d):
            smon(d)["spec"]["endpoints"][0]["intervall"] = "30s"
        self.assertRejects(unknown, "intervall", "unknown field of ServiceMonitorEndpoint")

        def missing(d):
            del smon(d)["spec"]["endpoints"]
        self.assertRejects(missing, "missing required field 'endpoints'")

        def duration(d):
            smon(d)["spec"]["endpoints"][0]["interval"] = 30
        self.assertRejects(duration, "is not a duration")

    def test_network_policy(self):
        def port(d):
            netpol(d)["spec"]["ingress"][0]["ports"][1]["port"] = 2379.5
        self.assertRejects(port, "ports[1].port")

        def policy_type(d):
            netpol(d)["spec"]["policyTypes"] = ["Ingres"]
        self.assertRejects(policy_type, "'Ingres' is not one of")

        def unknown(d):
            netpol(d)["spec"]["ingress"][0]["form"] = []
        self.assertRejects(unknown, "form")

    def test_seccomp_profile_type(self):
        def m(d):
            d[1]["spec"]["template"]["spec"]["securityContext"] = {
                "runAsNonRoot": True, "seccompProfile": {"type": "Default"}}
        self.assertRejects(m, "seccompProfile.type", "'Default' is not one of")

    def test_every_case_starts_from_an_accepted_manifest(self):
        # The mutations above change one field each; the untouched copy must
        # stay clean, or the rejections would prove nothing.
        d = docs()
        before = copy.deepcopy(d)
        self.assertEqual(k8s_check.check_documents(d, "t"), [])
        self.assertEqual(d, before)

    def test_main_exit_status(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(GOOD.replace("containerPort: 50051", "containerPort: 5.0e+4"))
        try:
            self.assertEqual(k8s_check.main(["k8s_check", f.name]), 1)
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
