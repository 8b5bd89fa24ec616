"""A WasmPlugin converted the way istiod (pilot/pkg/model/wasm.go buildPluginConfig)
and istio-agent (pkg/wasm/convert.go: remote code rewritten to a local file)
do, and delivered over ECDS (a file config source instead of ADS)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from tests.harness.istio.envoyfilter import RBAC_HTTP, WASM_HTTP, hcms


def wasmplugin_resource_name(wp: dict) -> str:
    return f"extensions.istio.io/wasmplugin/{wp['metadata']['namespace']}.{wp['metadata']['name']}"


def wasmplugin_extension_config(wp: dict, local_file: Path, resource_version: str = "1") -> dict:
    """The ECDS TypedExtensionConfig Envoy receives for a HTTP WasmPlugin: as istiod
    builds it (buildPluginConfig/buildVMConfig: no vm_id, runtime v8, the
    resource-version environment variable, failStrategy -> failure_policy) after
    istio-agent fetched the module and rewrote the code to a local file."""
    spec = wp["spec"]
    assert spec.get("type", "HTTP") in ("HTTP", "UNSPECIFIED_PLUGIN_TYPE"), spec.get("type")
    env = {"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": resource_version}
    if spec.get("imagePullPolicy", "UNSPECIFIED_POLICY") != "UNSPECIFIED_POLICY":
        env["ISTIO_META_WASM_IMAGE_PULL_POLICY"] = spec["imagePullPolicy"]
    config = {
        "name": f"{wp['metadata']['namespace']}.{wp['metadata']['name']}",
        "root_id": spec.get("pluginName", ""),
        "vm_config": {
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": str(local_file)}},
            "environment_variables": {"key_values": env},
        },
        "failure_policy": {
            "FAIL_OPEN": "FAIL_OPEN",
            "FAIL_CLOSE": "FAIL_CLOSED",
            "FAIL_RELOAD": "FAIL_RELOAD",
        }[spec.get("failStrategy", "FAIL_CLOSE")],
    }
    if spec.get("pluginConfig"):
        config["configuration"] = {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": json.dumps(spec["pluginConfig"], separators=(",", ":")),
        }
    return {
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": wasmplugin_resource_name(wp),
        "typed_config": {"@type": WASM_HTTP, "config": config},
    }


def insert_wasmplugin(listeners: list[dict], wp: dict, ecds_path: Path) -> list[dict]:
    """istiod's gateway listeners with the WasmPlugin's ECDS filter just before
    the router (phase UNSPECIFIED_PHASE), on every HCM it built itself."""
    assert wp["spec"].get("phase", "UNSPECIFIED_PHASE") == "UNSPECIFIED_PHASE"
    out = copy.deepcopy(listeners)
    for listener in out:
        for hcm in hcms(listener, {}):
            filters = hcm["http_filters"]
            at = next(i for i, f in enumerate(filters) if f["name"] == "envoy.filters.http.router")
            filters.insert(
                at,
                {
                    "name": wasmplugin_resource_name(wp),
                    "config_discovery": {
                        # istiod: ADS with initial_fetch_timeout 0 (wait for it).
                        "config_source": {
                            "path_config_source": {"path": str(ecds_path)},
                            "resource_api_version": "V3",
                            "initial_fetch_timeout": "0s",
                        },
                        "type_urls": [WASM_HTTP, RBAC_HTTP],
                    },
                },
            )
    return out


def write_ecds(path: Path, extension_configs: list[dict]) -> None:
    path.write_text(yaml.safe_dump({"version_info": "1", "resources": extension_configs}, sort_keys=False))
