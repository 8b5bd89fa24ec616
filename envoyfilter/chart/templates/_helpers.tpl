{{/* Labels of every object of the chart. */}}
{{- define "drain-gate.labels" -}}
app.kubernetes.io/name: drain-gate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* A duration value ("120s") in milliseconds. The schema already checked its form. */}}
{{- define "drain-gate.ms" -}}
{{- $digits := regexFind "^[0-9]+" (toString .) -}}
{{- $unit := trimPrefix $digits (toString .) -}}
{{- mul (int64 $digits) (get (dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000) $unit) -}}
{{- end -}}

{{/* The ranges the plugin itself enforces at load (src/config.rs), refused
     here at render so a bad value never reaches a running gateway. */}}
{{- define "drain-gate.validate" -}}
{{- $c := .Values.config -}}
{{- range $key := list "drain_timeout" "min_drain" "lb_buffer" "tick" "lb_down_timeout" -}}
{{- if hasKey $c $key -}}
{{- if gt (int64 (include "drain-gate.ms" (get $c $key))) 3600000 -}}
{{- fail (printf "drain-gate: config.%s: %q is above the maximum 60m" $key (get $c $key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $key := list "drain_timeout" "lb_down_timeout" -}}
{{- if and (hasKey $c $key) (eq (int64 (include "drain-gate.ms" (get $c $key))) 0) -}}
{{- fail (printf "drain-gate: config.%s: %q is below the minimum 1ms" $key (get $c $key)) -}}
{{- end -}}
{{- end -}}
{{- if gt (int64 (include "drain-gate.ms" (include "drain-gate.scrapeInterval" .))) 60000 -}}
{{- fail (printf "drain-gate: config.scrape_interval (or observability.podMonitorInterval): %q is above the maximum 1m" (include "drain-gate.scrapeInterval" .)) -}}
{{- end -}}
{{- if hasKey $c "tick" -}}
{{- $tick := int64 (include "drain-gate.ms" $c.tick) -}}
{{- if or (lt $tick 10) (gt $tick 10000) -}}
{{- fail (printf "drain-gate: config.tick: %q is outside 10ms..10s" $c.tick) -}}
{{- end -}}
{{- end -}}
{{- if gt (int64 (include "drain-gate.ms" ($c.min_drain | default "0s"))) (int64 (include "drain-gate.ms" ($c.drain_timeout | default "120s"))) -}}
{{- fail "drain-gate: config.min_drain must not exceed config.drain_timeout" -}}
{{- end -}}
{{- if ne ($c.draining_new_requests | default "serve") "refuse" -}}
{{- if eq ($c.draining_grpc_requests | default "serve") "refuse" -}}
{{- fail "drain-gate: config.draining_grpc_requests: \"refuse\" needs config.draining_new_requests: \"refuse\"" -}}
{{- end -}}
{{- if ne ($c.refused_requests | default "idempotent") "idempotent" -}}
{{- fail (printf "drain-gate: config.refused_requests: %q needs config.draining_new_requests: \"refuse\"" $c.refused_requests) -}}
{{- end -}}
{{- if eq ($c.refuse_with | default "response") "reset" -}}
{{- fail "drain-gate: config.refuse_with: \"reset\" needs config.draining_new_requests: \"refuse\"" -}}
{{- end -}}
{{- end -}}
{{- if and (ne .Values.form "wasmplugin") (or .Values.wasmPlugin.url .Values.wasmPlugin.canary.url) -}}
{{- fail "drain-gate: wasmPlugin.url and wasmPlugin.canary.url take effect with form wasmplugin only" -}}
{{- end -}}
{{- end -}}

{{/* The plugin configuration of one role. The health role gets every `config`
     value. The traffic roles (traffic, traffic_tcp) get only what they use
     (role, tick, draining_new_requests, refused_requests, draining_grpc_requests, refuse_with:
     one configuration for both), each checked
     here at render: a value the plugin would refuse never reaches a gateway
     (Envoy would keep the configuration it accepted last, and a fresh pod's
     filter would run its default_config, which counts nothing:
     envoyfilter/docs/forms.md, "When the module cannot load"). */}}
{{- define "drain-gate.configuration" -}}
{{- if eq .role "health" -}}
{{- toJson (merge (dict "role" "health" "scrape_interval" (include "drain-gate.scrapeInterval" .root)) .root.Values.config) -}}
{{- else -}}
{{- toJson (merge (dict "role" .role) (pick .root.Values.config "tick" "draining_new_requests" "refused_requests" "draining_grpc_requests" "refuse_with")) -}}
{{- end -}}
{{- end -}}

{{/* config.scrape_interval as the health role gets it: with
     observability.podMonitor, at least that PodMonitor's interval. */}}
{{- define "drain-gate.scrapeInterval" -}}
{{- $own := .Values.config.scrape_interval | default "0s" -}}
{{- $o := .Values.observability -}}
{{- if and $o.podMonitor (gt (int64 (include "drain-gate.ms" $o.podMonitorInterval)) (int64 (include "drain-gate.ms" $own))) -}}
{{- $o.podMonitorInterval -}}
{{- else -}}
{{- $own -}}
{{- end -}}
{{- end -}}

{{/* The longest a drain can hold the preStop hook, in seconds: drain_timeout
     + the longest CLOSING + scrape_interval + the hold's 5 s margin
     (src/config.rs default_wait_ms). */}}
{{- define "drain-gate.holdSeconds" -}}
{{- $c := .Values.config -}}
{{- $closing := int64 (include "drain-gate.ms" ($c.lb_buffer | default "10s")) -}}
{{- if eq ($c.close_after | default "lb_buffer") "lb_observed_down" -}}
{{- $closing = max $closing (int64 (include "drain-gate.ms" ($c.lb_down_timeout | default "60s"))) -}}
{{- end -}}
{{- $scrape := int64 (include "drain-gate.ms" (include "drain-gate.scrapeInterval" .)) -}}
{{- div (add (int64 (include "drain-gate.ms" ($c.drain_timeout | default "120s"))) $closing $scrape 5000 999) 1000 -}}
{{- end -}}

{{/* The labels the EnvoyFilters select: podSelector, and in the Gateway API
     form the Gateway's own pod label too (istiod's gateway-name). */}}
{{- define "drain-gate.workloadLabels" -}}
{{- $labels := deepCopy .Values.podSelector -}}
{{- if .Values.gatewayAPI.enabled -}}
{{- $_ := set $labels "gateway.networking.k8s.io/gateway-name" .Values.gatewayAPI.name -}}
{{- end -}}
{{- toYaml $labels -}}
{{- end -}}

{{/* A label map as k=v,k=v. */}}
{{- define "drain-gate.labelList" -}}
{{- $out := list -}}
{{- range $k, $v := . }}{{ $out = append $out (printf "%s=%s" $k $v) }}{{ end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The priority that puts the traffic filter first: the highest there is.
     istiod applies EnvoyFilters by ascending priority (an INSERT_FIRST applied
     later goes in front) and orders a WasmPlugin phase's plugins by
     descending priority. */}}
{{- define "drain-gate.firstPriority" -}}
2147483647
{{- end -}}

{{/* Where a WasmPlugin loads the module from: wasmPlugin.url, or the mounted file. */}}
{{- define "drain-gate.wasmPluginURL" -}}
{{- .Values.wasmPlugin.url | default (printf "file://%s" .Values.wasm.path) -}}
{{- end -}}

{{/* A WasmPlugin of the chart: name, the pods it selects, url/sha256, the role.
     dict: root, name, type (HTTP/NETWORK), role, rootId, url, sha256, labels (extra
     pod labels to select), ports (NETWORK: the ports it matches). It selects
     the EnvoyFilters' pods by their labels (never targetRefs): a file:// module
     exists only in pods that carry the mount, and the label comes with it. */}}
{{- define "drain-gate.wasmPlugin" -}}
{{- $root := .root -}}
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "drain-gate.labels" $root | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- merge (include "drain-gate.workloadLabels" $root | fromYaml) (.labels | default dict) | toYaml | nindent 6 }}
  url: {{ .url }}
  {{- with .sha256 }}
  sha256: {{ . }}
  {{- end }}
  {{- if hasPrefix "oci://" .url }}
  imagePullPolicy: {{ $root.Values.wasmPlugin.imagePullPolicy }}
  {{- end }}
  pluginName: {{ .rootId }}
  # The earliest place a WasmPlugin gets: its AUTHN phase, first in it. Only
  # istio.metadata_exchange and a CUSTOM AuthorizationPolicy's filters (a
  # shadow RBAC, then ext_authz) come before (envoyfilter/docs/counting.md, "What is
  # counted").
  phase: AUTHN
  priority: {{ include "drain-gate.firstPriority" $root }}
  type: {{ .type }}
  {{- with .ports }}
  # istiod puts a NETWORK plugin on every filter chain of the ports it matches,
  # HTTP ones included (before the HTTP connection manager): only these ports.
  match:
  - ports:
    {{- range . }}
    - number: {{ . }}
    {{- end }}
  {{- end }}
  # Covers a VM that fails while running; a module that cannot be fetched or
  # loaded is another matter (envoyfilter/docs/forms.md, "When the module cannot load").
  failStrategy: FAIL_OPEN
  # Only what the traffic roles use (see the health listener for the rest).
  pluginConfig:
    {{- include "drain-gate.configuration" (dict "role" .role "root" $root) | fromJson | toYaml | nindent 4 }}
{{- end -}}

{{/* The proxy-wasm vm_config both roles share (vm_id: see values.yaml `form`). */}}
{{- define "drain-gate.vmConfig" -}}
vm_id: {{ if eq .Values.form "wasmplugin" }}""{{ else }}drain-gate{{ end }}
runtime: envoy.wasm.runtime.v8
code:
  local: { filename: {{ .Values.wasm.path }} }
{{- end -}}


{{/* The canary's placeholder (envoyfilter/docs/rollout.md, "Canary a new image"): an
     EnvoyFilter that gives the canary WasmPlugin's ECDS filter, on the canary
     pods, a default configuration — drain-gate in the placeholder role, from
     the mounted module. Envoy runs it until the canary's own configuration
     arrives, and instead of it when the module was fetched but does not load
     (istiod sets no default: that filter would answer every request 500 while
     the health listener answers the LB 200). The placeholder passes requests on
     uncounted (the fleet's filter counts them) and keeps the pod out of the LB:
     a pod no LB check saw stays out (503 WAIT, waiting_for filter_config), an
     announced one drains once a request passed it (src/gate/placeholder/mod.rs). One
     patch per name istiod gives the filter: Istio 1.30's TrafficExtension
     translation, and 1.28/1.29's WasmPlugin name; the value is istiod's own
     entry (ADS, no initial fetch timeout, the wasm and RBAC type URLs) plus
     default_config. */}}
{{- define "drain-gate.canaryPlaceholder" -}}
{{- $ns := .Release.Namespace -}}
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata:
  name: drain-gate-traffic-canary-placeholder
  namespace: {{ $ns }}
  labels:
    {{- include "drain-gate.labels" . | nindent 4 }}
spec:
  workloadSelector:
    labels:
      {{- merge (include "drain-gate.workloadLabels" . | fromYaml) .Values.wasmPlugin.canaryLabel | toYaml | nindent 6 }}
  configPatches:
  {{- range $name := list (printf "extensions.istio.io/trafficextension/%s.drain-gate-traffic-canary~istio-translated-wasmplugin" $ns) (printf "extensions.istio.io/wasmplugin/%s.drain-gate-traffic-canary" $ns) }}
  - applyTo: HTTP_FILTER
    match:
      context: GATEWAY
      proxy:
        proxyVersion: {{ $.Values.proxyVersion | squote }}
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter:
              name: {{ $name }}
    patch:
      operation: REPLACE
      value:
        name: {{ $name }}
        config_discovery:
          config_source:
            ads: {}
            initial_fetch_timeout: 0s
            resource_api_version: V3
          default_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
            config:
              name: drain-gate-traffic-canary-placeholder
              root_id: drain_gate_placeholder
              failure_policy: FAIL_OPEN
              vm_config:
                {{- include "drain-gate.vmConfig" $ | nindent 16 }}
              configuration:
                "@type": type.googleapis.com/google.protobuf.StringValue
                value: {{ include "drain-gate.configuration" (dict "role" "placeholder" "root" $) | squote }}
          type_urls:
          - type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
          - type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC
  {{- end }}
{{- end -}}

{{/* The plugin configuration of one role as an ECDS resource: an
     EXTENSION_CONFIG patch that istiod serves over ECDS to the filter asking
     for it by name (drain-gate.configDiscovery), so that a change of a
     configuration value reaches the running filter without replacing the
     listener or filter chain it sits in (Envoy drains the connections of a
     replaced chain and closes them after --drain-time-s, Istio's
     drainDuration). istio-agent passes a module loaded from a local file on
     unchanged (it rewrites only remote code, pkg/wasm/convert.go).
     dict: root, name (the resource and filter name), plugin (the wasm
     PluginConfig name), rootId, role, policy, kind ("http" or "network"). */}}
{{- define "drain-gate.extensionConfig" -}}
- applyTo: EXTENSION_CONFIG
  match:
    context: GATEWAY
    proxy:
      proxyVersion: {{ .root.Values.proxyVersion | squote }}
  patch:
    operation: ADD
    value:
      name: {{ .name }}
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.{{ .kind }}.wasm.v3.Wasm
        config:
          name: {{ .plugin }}
          root_id: {{ .rootId }}
          failure_policy: {{ .policy }}
          vm_config:
            {{- include "drain-gate.vmConfig" .root | nindent 12 }}
          configuration:
            "@type": type.googleapis.com/google.protobuf.StringValue
            value: {{ include "drain-gate.configuration" (dict "role" .role "root" .root) | squote }}
{{- end -}}

{{/* The filter's side of drain-gate.extensionConfig: its configuration comes
     over ADS by the filter's name. Until it arrives, the listener warms (at
     most initial_fetch_timeout); a configuration Envoy refuses (a module that
     does not load) leaves the last one accepted running, and with none (a
     fresh pod) the filter runs default_config: an allow-all RBAC filter,
     which counts nothing (the health role then answers 503 WAIT: no traffic
     role registered) and, on the health listener, lets every request reach
     the catch-all 503 route: the LB never reads 200 from a health listener
     without drain-gate. dict: kind ("http" or "network"). */}}
{{- define "drain-gate.configDiscovery" -}}
config_discovery:
  config_source:
    ads: {}
    resource_api_version: V3
    initial_fetch_timeout: 10s
  default_config:
    "@type": type.googleapis.com/envoy.extensions.filters.{{ .kind }}.rbac.v3.RBAC
    {{ if eq .kind "http" }}rules_stat_prefix{{ else }}stat_prefix{{ end }}: drain_gate_fallback_
  type_urls:
  - type.googleapis.com/envoy.extensions.filters.{{ .kind }}.wasm.v3.Wasm
  - type.googleapis.com/envoy.extensions.filters.{{ .kind }}.rbac.v3.RBAC
{{- end -}}
