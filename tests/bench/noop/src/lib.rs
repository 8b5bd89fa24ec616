//! A filter that returns Continue everywhere: the cost of being a wasm filter.
//! Loaded as an HTTP filter by default; with the plugin configuration
//! `network` it is a network filter (one context per connection), the floor
//! of drain-gate's `traffic_tcp` role.

use proxy_wasm::traits::{Context, HttpContext, RootContext, StreamContext};
use proxy_wasm::types::ContextType;

#[derive(Default)]
struct Root {
    network: bool,
}
struct Stream;

impl Context for Root {}
impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        self.network = self.get_plugin_configuration().as_deref() == Some(b"network".as_slice());
        true
    }
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream))
    }
    fn create_stream_context(&self, _: u32) -> Option<Box<dyn StreamContext>> {
        Some(Box::new(Stream))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(if self.network {
            ContextType::StreamContext
        } else {
            ContextType::HttpContext
        })
    }
}
impl Context for Stream {}
impl HttpContext for Stream {}
impl StreamContext for Stream {}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}
