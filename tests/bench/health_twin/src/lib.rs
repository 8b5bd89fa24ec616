//! A minimal health answer: every request of the listener is answered locally
//! from its `:path` alone, 200 `OK` for the LB check and 404 for anything else.
//! No state, no shared data, no clock: what answering a check costs a proxy-wasm
//! filter at least. drain-gate's LB check is compared with it (`make cost`).

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};

struct Root;
struct Check;

impl Context for Root {}
impl RootContext for Root {
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Check))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Context for Check {}
impl HttpContext for Check {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let path = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, ":path");
        let status = match path {
            Ok(Some(p)) if p == b"/health_check.html" => 200,
            _ => 404,
        };
        let headers = vec![("content-type", "text/plain; charset=utf-8")];
        let _ = hostcalls::send_http_response(status, headers, Some(b"OK\n"));
        Action::Pause
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}
