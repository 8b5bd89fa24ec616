"""What an Istio ingress gateway does with the files in envoyfilter/, reproduced
for a real Envoy on loopback, one module per concern:

- files: where the artifacts and fixtures are, the Envoy versions they run in,
  the labels and ports they name, their YAML.
- schema: CRD validation (jsonschema, strict like the API server), the CRDs'
  CEL rules (cel-python), built-in kinds against the Kubernetes schemas.
- deployment: the gateway Deployment, kubectl's strategic merge, what Istio's
  kube-gateway template renders for Gateway API and its ConfigMap overlays.
- envoyfilter: istiod's gateway listeners, EnvoyFilter patches applied to them,
  the ECDS resources istiod serves, which pods a policy applies to.
- wasmplugin: a WasmPlugin as istiod + istio-agent deliver it over ECDS.
- bootstrap: a gateway-like Envoy bootstrap holding those listeners, ECDS from files.
- oci: the OCI image, read the way istio-agent reads it.

What the tests use is imported here too: `istio.<name>`.
"""
from __future__ import annotations

from tests.harness.istio.bootstrap import (
    ecds_file,
    gateway_bootstrap,
    harness_ports,
    serve_extensions,
    wasm_filters,
)
from tests.harness.istio.deployment import (
    OVERLAY_KEYS,
    assert_prestop_drains,
    gateway_api_patched,
    gateway_api_rendered,
    proxy_container,
    strategic_patch,
)
from tests.harness.istio.envoyfilter import (
    HCM_NAME,
    WASM_HTTP,
    WASM_NETWORK,
    Xds,
    added_clusters,
    all_filters,
    apply_envoyfilters,
    custom_authz_filters,
    ecds_names,
    envoyfilter_order,
    extension_configs,
    extension_patch,
    gateway_http_filters,
    gateway_listener,
    gateway_xds,
    hcms,
    inline_extensions,
    plugin_config,
    selects_workload,
)
from tests.harness.istio.files import (
    CRDS,
    DRAIN_GATE_LABEL,
    ENVOY_MATRIX,
    ENVOYFILTER,
    GATEWAY_API,
    GATEWAY_API_FIXTURES,
    GATEWAY_LABELS,
    HAPROXY_HTTPCHK,
    HEALTH_PORT,
    ISTIO,
    ISTIO_ADMIN_PORT,
    KUBERNETES,
    NETSCALER,
    PASSTHROUGH_LISTENER_PORT,
    PASSTHROUGH_SERVER_PORT,
    POD_LABELS,
    PROXY_VERSION,
    REPO,
    SHARED,
    envoy_bin,
    load_docs,
    load_one,
    objects,
    yaml_files,
)
from tests.harness.istio.oci import istio_extract_compat
from tests.harness.istio.schema import (
    K8S_VERSIONS,
    cel_errors,
    crd_errors,
    crd_schemas,
    crd_validators,
    k8s_errors,
)
from tests.harness.istio.wasmplugin import (
    ecds_over_files,
    insert_wasmplugin,
    insert_wasmplugins,
    wasmplugin_extension_config,
    wasmplugin_fetch_failed,
    wasmplugin_resource_name,
    write_ecds,
)
