// Command render renders a Helm chart the way `helm template` does, without
// Helm: the same template engine (Go's text/template with the sprig v3
// functions), Helm's value semantics and Helm's own template functions.
// deploy/helm/chart_test.sh builds it offline from Debian's Go packages
// (golang-go, golang-github-masterminds-sprig-dev,
// golang-github-ghodss-yaml-dev) in GOPATH mode and renders the chart with
// it.
//
// What it reproduces of Helm 3 (pkg/engine, pkg/chartutil, pkg/releaseutil):
//
//   - values files are read YAML -> JSON -> interface{} (sigs.k8s.io/yaml, of
//     which github.com/ghodss/yaml is the original), so every number is a
//     float64: `{{ .Values.n }}` prints 17179869184 as 1.7179869184e+10,
//     exactly as Helm does. Later files (-f) are coalesced over earlier ones
//     and over the chart's values.yaml (maps merge, null deletes a key);
//     --set parses integers as int64 like Helm's strvals;
//
//   - .Values, .Release, .Chart, .Capabilities (KubeVersion, APIVersions.Has),
//     .Template; missingkey=zero and "<no value>" erased from the output;
//
//   - Helm's functions besides sprig's (minus env/expandenv): include, tpl,
//     required, toYaml, fromYaml, toJson, fromJson, lookup (empty without a
//     cluster, as in `helm template`);
//
//   - every file under templates/ is parsed into one set (partials start
//     with "_"; NOTES.txt is not a manifest), each document must parse as
//     YAML, empty documents are dropped, and Chart.yaml's kubeVersion
//     constraint is checked against --kube_version.
//
//   - the coalesced values are validated against the chart's
//     values.schema.json with github.com/xeipuuv/gojsonschema, the validator
//     Helm 3 uses (Debian's golang-github-xeipuuv-gojsonschema-dev), before
//     anything renders (--skip_schema_validation skips it, like Helm's flag).
//
// What it does not: subcharts, .Files, hook ordering.
//
// Usage:
//
//	render --chart=DIR [-f values.yaml]... [--set a.b=c]... [--release=NAME]
//	       [--namespace=NS] [--kube_version=1.27.0] [--api_versions=G/V]...
//	       [--values_out=FILE] [--skip_schema_validation]
//
// The manifests go to stdout, each document preceded by "---" and a
// "# Source: CHART/templates/FILE" line, as `helm template` prints them.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"github.com/ghodss/yaml"
	"github.com/xeipuuv/gojsonschema"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// Chart is the part of Chart.yaml templates see as .Chart (Helm's
// chart.Metadata field names).
type Chart struct {
	APIVersion  string `json:"apiVersion"`
	Name        string `json:"name"`
	Version     string `json:"version"`
	AppVersion  string `json:"appVersion"`
	Description string `json:"description"`
	Type        string `json:"type"`
	KubeVersion string `json:"kubeVersion"`
}

// Release is .Release.
type Release struct {
	Name      string
	Namespace string
	Service   string
	IsInstall bool
	IsUpgrade bool
	Revision  int
}

// KubeVersion is .Capabilities.KubeVersion.
type KubeVersion struct {
	Version    string
	Major      string
	Minor      string
	GitVersion string
}

func (k KubeVersion) String() string { return k.Version }

// VersionSet is .Capabilities.APIVersions.
type VersionSet []string

// Has reports whether an "group/version" or "group/version/Kind" is known.
func (v VersionSet) Has(s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

// Capabilities is .Capabilities.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
}

// readValues parses one values file as Helm does: YAML to JSON, then JSON
// to map[string]interface{} (numbers become float64).
func readValues(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	vals := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return vals, nil
}

// coalesce merges src (the lower-priority values) into dst: maps merge
// recursively and any other dst value wins. With final (user values over the
// chart's), a null in dst deletes the key; between user files nulls are kept
// so that they still delete the chart's value.
func coalesce(dst, src map[string]interface{}, final bool) map[string]interface{} {
	for k, sv := range src {
		dv, present := dst[k]
		if !present {
			dst[k] = sv
			continue
		}
		if dv == nil {
			if final {
				delete(dst, k)
			}
			continue
		}
		dm, dok := dv.(map[string]interface{})
		sm, sok := sv.(map[string]interface{})
		if dok && sok {
			dst[k] = coalesce(dm, sm, final)
		}
	}
	if final {
		// A null the user wrote for a key the chart does not have goes too.
		for k, v := range dst {
			if v == nil {
				delete(dst, k)
			}
		}
	}
	return dst
}

// setValue applies one --set a.b.c=v (Helm's strvals, without lists):
// integers become int64, true/false bool, null deletes, the rest strings.
func setValue(vals map[string]interface{}, expr string) error {
	eq := strings.IndexByte(expr, '=')
	if eq <= 0 {
		return fmt.Errorf("--set %q: want key=value", expr)
	}
	keys := strings.Split(expr[:eq], ".")
	raw := expr[eq+1:]
	var v interface{} = raw
	switch {
	case raw == "true":
		v = true
	case raw == "false":
		v = false
	case raw == "null":
		v = nil
	default:
		if n, err := strconv.ParseInt(raw, 10, 64); err == nil &&
			(raw == "0" || !strings.HasPrefix(raw, "0")) {
			v = n
		}
	}
	m := vals
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
	return nil
}

// validateSchema is Helm's chartutil.ValidateAgainstSchema: the values as
// JSON against values.schema.json (YAML or JSON) with gojsonschema.
func validateSchema(chartDir string, vals map[string]interface{}) error {
	schema, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	schemaJSON, err := yaml.YAMLToJSON(schema)
	if err != nil {
		return fmt.Errorf("values.schema.json: %v", err)
	}
	valuesJSON, err := json.Marshal(vals)
	if err != nil {
		return err
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schemaJSON),
		gojsonschema.NewBytesLoader(valuesJSON))
	if err != nil {
		return fmt.Errorf("values.schema.json: %v", err)
	}
	if result.Valid() {
		return nil
	}
	var sb strings.Builder
	sb.WriteString("values don't meet the specifications of the schema(s):\n")
	for _, e := range result.Errors() {
		fmt.Fprintf(&sb, "- %s\n", e)
	}
	return errors.New(strings.TrimSuffix(sb.String(), "\n"))
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

// funcMap is sprig's plus Helm's; include and tpl close over the template
// set.
func funcMap(root **template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return v, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return v, errors.New(msg)
		}
		return v, nil
	}
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	f["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		if err := (*root).ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := (*root).Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", err
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	return f
}

// docSplit is Helm's releaseutil separator: "---" at the start of a line.
var docSplit = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// meaningful reports whether a document holds more than blank lines and
// comments.
func meaningful(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		t := strings.TrimSpace(line)
		if t != "" && !strings.HasPrefix(t, "#") {
			return true
		}
	}
	return false
}

func run() error {
	chartDir := flag.String("chart", "", "chart directory")
	release := flag.String("release", "hymcache", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	kubeVersion := flag.String("kube_version", "1.27.0", "Kubernetes version for .Capabilities")
	valuesOut := flag.String("values_out", "", "write the coalesced values here as JSON")
	skipSchema := flag.Bool("skip_schema_validation", false, "do not validate against values.schema.json")
	var valueFiles, sets, apiVersions listFlag
	flag.Var(&valueFiles, "f", "values file (repeatable; later ones win)")
	flag.Var(&sets, "set", "key.path=value (repeatable; applied after -f)")
	flag.Var(&apiVersions, "api_versions", "extra group/version for .Capabilities.APIVersions")
	flag.Parse()
	if *chartDir == "" {
		return errors.New("--chart is required")
	}

	var chart Chart
	data, err := os.ReadFile(filepath.Join(*chartDir, "Chart.yaml"))
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		return fmt.Errorf("Chart.yaml: %v", err)
	}
	kv, err := semver.NewVersion(*kubeVersion)
	if err != nil {
		return fmt.Errorf("--kube_version: %v", err)
	}
	if chart.KubeVersion != "" {
		c, err := semver.NewConstraint(chart.KubeVersion)
		if err != nil {
			return fmt.Errorf("Chart.yaml kubeVersion: %v", err)
		}
		if !c.Check(kv) {
			return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes v%s",
				chart.KubeVersion, kv)
		}
	}

	vals, err := readValues(filepath.Join(*chartDir, "values.yaml"))
	if err != nil {
		return err
	}
	user := map[string]interface{}{}
	for _, f := range valueFiles {
		v, err := readValues(f)
		if err != nil {
			return err
		}
		user = coalesce(v, user, false)
	}
	for _, s := range sets {
		if err := setValue(user, s); err != nil {
			return err
		}
	}
	vals = coalesce(user, vals, true)
	if !*skipSchema {
		if err := validateSchema(*chartDir, vals); err != nil {
			return err
		}
	}
	if *valuesOut != "" {
		out, err := json.MarshalIndent(vals, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*valuesOut, out, 0o644); err != nil {
			return err
		}
	}

	// Every file under templates/, named as Helm names them.
	var names []string
	tdir := filepath.Join(*chartDir, "templates")
	err = filepath.Walk(tdir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(*chartDir, p)
		names = append(names, rel)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	var root *template.Template
	root = template.New("gotpl").Option("missingkey=zero").Funcs(funcMap(&root))
	for _, n := range names {
		src, err := os.ReadFile(filepath.Join(*chartDir, n))
		if err != nil {
			return err
		}
		if _, err := root.New(chart.Name + "/" + n).Parse(string(src)); err != nil {
			return err
		}
	}

	minor := strconv.FormatUint(kv.Minor(), 10)
	apis := VersionSet{"v1", "apps/v1", "policy/v1", "batch/v1"}
	apis = append(apis, apiVersions...)
	top := map[string]interface{}{
		"Values": vals,
		"Chart":  chart,
		"Release": Release{Name: *release, Namespace: *namespace,
			Service: "Helm", IsInstall: true, Revision: 1},
		"Capabilities": Capabilities{
			KubeVersion: KubeVersion{Version: "v" + kv.String(),
				Major: strconv.FormatUint(kv.Major(), 10), Minor: minor,
				GitVersion: "v" + kv.String()},
			APIVersions: apis,
		},
	}

	var out strings.Builder
	for _, n := range names {
		base := filepath.Base(n)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		name := chart.Name + "/" + n
		top["Template"] = map[string]interface{}{
			"Name": name, "BasePath": chart.Name + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, top); err != nil {
			return err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		for _, doc := range docSplit.Split(text, -1) {
			if !meaningful(doc) {
				continue
			}
			var probe map[string]interface{}
			if err := yaml.Unmarshal([]byte(doc), &probe); err != nil {
				return fmt.Errorf("%s: rendered YAML does not parse: %v\n%s", name, err, doc)
			}
			fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.TrimSpace(doc))
		}
	}
	_, err = os.Stdout.WriteString(out.String())
	return err
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}
